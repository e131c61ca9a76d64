"""TE's grouped quantization on CPU: ``group_quantize``, ``bgrad_group_quantize``, and the
quantized operands of the grouped GEMMs.

TE's grouped-tensor path (``GroupedLinear(use_grouped_tensor=True)``, ``ops.GroupedLinear`` on
cuBLASLt's grouped GEMM) quantizes a whole ``[total_rows, K]`` activation or gradient at once,
into one ``GroupedTensorStorage`` whose members are the groups' rows (``extensions/cast.cpp``
``group_quantize``; the buffers from ``Quantizer::create_grouped_tensor`` in ``csrc/quantizer.cpp``).
What each member gets, per recipe - TE's grouped kernels, read at the 2.20 development line:

- **FP8 current scaling** (``cast/fp8/group_quantize_fp8.cuh``, ``group_amax_fp8.cuh``): one amax
  per member (``nvte_group_compute_amax_with_config``), the ``[num_tensors]`` amax buffer
  all-reduced once where the quantizer asks, one scale per member from it
  (``nvte_group_compute_scale_from_amax``), each member cast under its scale, its transpose as
  the column-wise data (Hopper; Blackwell keeps row-wise data only). The scale-inverse buffer is
  shared by both usages.
- **MXFP8** (``cast/mxfp8/group_quantize_mxfp8.cuh``): with varying first dimensions the grouped
  tensor is quantized "as a single tensor" of ``total_rows`` rows - 32-element blocks along each
  row, and down each column in 32-row blocks of the whole tensor - and its scales laid out as the
  whole tensor's, the column-wise ones in per-member tiles. TE checks only that ``total_rows`` is
  a multiple of 128; its test of the kernel (``tests/cpp/operator/test_cast_mxfp8_grouped.cu``)
  runs members whose rows are multiples of 128 and skips any other. For such members the layout
  is each member's own MXFP8 layout, member after member - what ``GroupedTensorStorage.
  split_into_quantized_tensors`` reads - and every block lies inside one member. te-cpu
  quantizes exactly those; a member of any other row count raises ``MissingCpuKernel`` (what
  TE's kernel makes of a 32-row block across two members is not modelled).
- **FP8 block scaling** (``cast/fp8_blockwise/group_quantize_fp8_blockwise.cuh``, Hopper only):
  per member, 1x128 blocks (or 128x128 tiles) and compact scales, member after member; a member
  whose rows are not a multiple of 128 stops the kernel ("Grouped FP8 block-scaling quantize:
  each tensor's first dimension must be a multiple of 128 (VARYING_FIRST_DIM)." - a device-side
  error on a GPU, a RuntimeError here).
- **NVFP4**: only with the random Hadamard transform ("graph safe grouped quant kernel for
  non-RHT path is not ready yet"), which te-cpu does not build, and never 2-D ("2D scaling
  grouped quant kernel is not ready yet"): TE's messages, raised as TE raises them.
- Delayed scaling has no grouped kernel: TE's error.

So a member is quantized by the family's single-tensor kernel into views of the grouped
buffers (TE's ``split_into_quantized_tensors``: per-member storages over the same memory) - the
same numbers TE's grouped kernels write for the members above, and the quantized GEMM reads
each member as it reads a single tensor (:func:`members`).
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

import torch

from harness.backends.te_cpu import refusal

from . import per_tensor
from .tensors import family

#: the row multiple of a member that TE's grouped MXFP8 and FP8 block-scaling kernels take
#: (module docstring)
MEMBER_ROWS = 128


def _missing(detail: str) -> Exception:
    """``MissingCpuKernel`` for what TE's grouped quantization does that te-cpu does not build."""
    return refusal.missing("group_quantize", detail)


def _grouped_class(internal: bool) -> type:
    """``grouped_tensor_python_class``: the storage class for an internal quantizer, else the
    tensor subclass."""
    if internal:
        return importlib.import_module("transformer_engine.pytorch.tensor.storage.grouped_tensor_storage"
                                       ).GroupedTensorStorage
    return importlib.import_module("transformer_engine.pytorch.tensor.grouped_tensor").GroupedTensor


def _offsets(num_tensors: int, first_dims: torch.Tensor | None, tensor_offsets: torch.Tensor | None,
             logical_first_dim: int, last_dim: int) -> torch.Tensor | None:
    """``resolve_grouped_tensor_offsets``: the precomputed offsets (``num_tensors + 1`` int64
    element offsets), else built from ``first_dims`` (a leading 0, then the running sums times
    the last dimension); None for uniform members."""
    if tensor_offsets is not None:
        if tensor_offsets.dtype != torch.int64 or tensor_offsets.numel() != num_tensors + 1:
            raise RuntimeError(f"tensor_offsets must be an int64 tensor with {num_tensors + 1} elements")
        return tensor_offsets
    if first_dims is None:
        return None
    if first_dims.dtype != torch.int64 or first_dims.numel() != num_tensors:
        raise RuntimeError(f"first_dims must be an int64 tensor with {num_tensors} elements")
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(first_dims.to(torch.int64), 0) * last_dim])


def _create(quantizer: Any, num_tensors: int, shape: list[int], dtype: torch.dtype, first_dims: torch.Tensor | None,
            offsets: torch.Tensor | None) -> Any:
    """``Quantizer::create_grouped_tensor`` of the quantizer's family: the flat buffers TE
    allocates (data ``total`` bytes a usage; scales sized from the logical total shape, with FP8
    block scaling's 2-D column-wise slack) and TE's Python class around them."""
    fam = family(quantizer)
    rows, cols = shape
    total = rows * cols
    u8 = lambda n: torch.empty(n, dtype=torch.uint8)  # noqa: E731
    f32 = lambda n: torch.empty(n, dtype=torch.float32)  # noqa: E731
    kw: dict[str, Any] = dict(data=None, columnwise_data=None, scale_inv=None, columnwise_scale_inv=None,
                              amax=None, columnwise_amax=None, scale=None, with_gemm_swizzled_scales=False)
    if fam.recipe == "current":
        nt = per_tensor.non_tn()
        rowwise, columnwise = quantizer.rowwise_usage or nt, quantizer.columnwise_usage and not nt
        shared = f32(num_tensors) if rowwise or columnwise else None
        kw.update(data=u8(total) if rowwise else None, columnwise_data=u8(total) if columnwise else None,
                  scale_inv=shared if rowwise else None, columnwise_scale_inv=shared if columnwise else None,
                  amax=f32(num_tensors), scale=f32(num_tensors))
    elif fam.recipe == "mxfp8":
        def scales(columnwise: bool) -> torch.Tensor:
            return torch.zeros(int(torch.tensor(quantizer.get_scale_shape(shape, columnwise)).prod()), dtype=torch.uint8)
        kw.update(data=u8(total) if quantizer.rowwise_usage else None,
                  columnwise_data=u8(total) if quantizer.columnwise_usage else None,
                  scale_inv=scales(False) if quantizer.rowwise_usage else None,
                  columnwise_scale_inv=scales(True) if quantizer.columnwise_usage else None,
                  with_gemm_swizzled_scales=bool(quantizer.optimize_for_gemm))
    elif fam.recipe == "blockwise":
        blocks_x = -(-cols // MEMBER_ROWS)

        def scales(columnwise: bool) -> torch.Tensor:
            n = int(torch.tensor(quantizer.get_scale_shape(shape, columnwise)).prod())
            if columnwise and int(quantizer.block_scaling_dim) == 2 and num_tensors > 1:
                n += blocks_x * 4 * (num_tensors - 1)  # sum_t roundup(blocks_y_t, 4) <= ...
            return torch.zeros(n, dtype=torch.float32)
        kw.update(data=u8(total) if quantizer.rowwise_usage else None,
                  columnwise_data=u8(total) if quantizer.columnwise_usage else None,
                  scale_inv=scales(False) if quantizer.rowwise_usage else None,
                  columnwise_scale_inv=scales(True) if quantizer.columnwise_usage else None)
    else:
        raise AssertionError(fam)
    return _grouped_class(bool(quantizer.internal))(
        shape=tuple(shape), stride=[cols, 1], dtype=dtype, num_tensors=num_tensors, quantizer=quantizer,
        first_dims=first_dims, last_dims=None, tensor_offsets=offsets, **kw)


def _check(quantizer: Any, binding: str) -> str:
    """The family's recipe, where TE's grouped quantization has a kernel for it; TE's error
    (or ``MissingCpuKernel``) otherwise."""
    fam = family(quantizer)
    if fam is None or fam.recipe == "delayed":
        raise RuntimeError(f"{binding}: only supports MXFP8, NVFP4, Float8CurrentScalingQuantizer, or "
                           "Float8Blockwise quantizer.")
    if fam.recipe == "nvfp4":
        if quantizer.with_2d_quantization:
            raise RuntimeError("2D scaling grouped quant kernel is not ready yet")
        if not quantizer.with_rht:
            raise RuntimeError("graph safe grouped quant kernel for non-RHT path is not ready yet")
        raise _missing("NVFP4 grouped quantization with the random Hadamard transform")
    if fam.recipe == "mxfp8" and getattr(quantizer, "with_2d_quantization", False):
        raise _missing("MXFP8 2D block quantization (enable_2d_quantization)")
    return fam.recipe


def _check_members(recipe: str, total_rows: int, rows: Sequence[int]) -> None:
    """The member geometry TE's grouped MXFP8 and FP8 block-scaling kernels take (module docstring)."""
    if recipe == "mxfp8":
        if total_rows % MEMBER_ROWS:
            raise RuntimeError("First logical dimension of a grouped tensor must be divisible by 128.")
        if any(r % MEMBER_ROWS for r in rows):
            raise _missing(f"MXFP8 grouped quantization of members whose rows are not multiples of 128 "
                           f"(rows {list(rows)}: TE's kernel is tested on such members only)")
    if recipe == "blockwise" and any(r % MEMBER_ROWS for r in rows):
        raise RuntimeError("Grouped FP8 block-scaling quantize: each tensor's first dimension must be a "
                           "multiple of 128 (VARYING_FIRST_DIM).")


def members(grouped: Any) -> list[Any]:
    """A grouped tensor's members as single tensors over its buffers (TE's own
    ``split_into_quantized_tensors``): quantized storages for a quantized grouped tensor,
    ``[rows, cols]`` views otherwise."""
    return grouped.split_into_quantized_tensors()


def _member_rows(grouped: Any) -> list[int]:
    return [int(m.size(0)) if hasattr(m, "size") else int(m.shape[0]) for m in members(grouped)]


@torch.no_grad()
def group_quantize(tensor: torch.Tensor, quantizer: Any, num_tensors: int, first_dims: torch.Tensor | None,
                   last_dims: torch.Tensor | None = None, tensor_offsets: torch.Tensor | None = None,
                   noop_flag: torch.Tensor | None = None, output: Any = None) -> Any:
    """``group_quantize`` (``extensions/cast.cpp``): ``tensor`` (2-D) as a quantized grouped
    tensor of ``num_tensors`` members (``first_dims``: their rows; None: equal members), into
    ``output`` when given (uniform members only, made by the same quantizer) or a new one."""
    if tensor.dim() != 2:
        raise RuntimeError("Tensor must be 2D")
    if last_dims is not None:
        raise _missing("grouped quantization with varying last dimensions")
    recipe = _check(quantizer, "group_quantize")
    shape = [int(tensor.shape[0]), int(tensor.shape[1])]
    if output is not None:
        if first_dims is not None or tensor_offsets is not None:
            raise RuntimeError("group_quantize: output reuse currently requires uniform tensor shapes.")
        if int(output.num_tensors) != num_tensors:
            raise RuntimeError("group_quantize: output has a different number of tensors.")
        if list(output.logical_shape) != shape:
            raise RuntimeError("group_quantize: output has an incompatible logical shape.")
        if output.quantizer is not quantizer:
            raise RuntimeError("group_quantize: output must have been created by the same quantizer.")
        grouped = output
    else:
        grouped = _create(quantizer, num_tensors, shape, tensor.dtype, first_dims,
                          _offsets(num_tensors, first_dims, tensor_offsets, shape[0], shape[1]))
    if shape[0] == 0 or shape[1] == 0:
        return grouped
    if not _has_data(grouped):
        # the first check of each grouped kernel (cast/mxfp8/group_quantize_mxfp8.cuh,
        # cast/fp8/group_quantize_fp8.cuh, cast/fp8_blockwise/group_quantize_fp8_blockwise.cuh):
        # a quantizer asked for neither usage (e.g. a backward that needs neither dgrad nor wgrad)
        raise RuntimeError("Either rowwise or columnwise output data need to be allocated.")
    parts = members(grouped)
    rows = [int(p.size(0)) for p in parts]
    _check_members(recipe, shape[0], rows)
    src = tensor.contiguous()
    srcs, start = [], 0
    for r in rows:
        srcs.append(src[start:start + r])
        start += r
    if recipe == "current":
        per_tensor.quantize_grouped(quantizer, srcs, parts, grouped.amax, grouped.scale, noop_flag)
        return grouped
    module = importlib.import_module(f"harness.backends.te_cpu.quant.{recipe if recipe == 'mxfp8' else 'blockwise'}")
    for part, s in zip(parts, srcs):
        module.quantize_into(quantizer, s, part, noop_flag)
    return grouped


@torch.no_grad()
def bgrad_group_quantize(tensor: torch.Tensor, quantizer: Any, num_tensors: int, first_dims: torch.Tensor | None,
                         last_dims: torch.Tensor | None = None,
                         tensor_offsets: torch.Tensor | None = None) -> tuple[Any, torch.Tensor]:
    """``bgrad_group_quantize`` (``extensions/cast.cpp``, ``nvte_group_quantize_dbias``): the
    grouped quantization of ``tensor`` and each member's bias gradient - its column sums,
    accumulated in fp32, rounded once to ``tensor``'s dtype - as ``[num_tensors, K]``. MXFP8 and
    FP8 block scaling only, as TE."""
    if tensor.dim() != 2:
        raise RuntimeError("Tensor must be 2D")
    if last_dims is not None:
        raise RuntimeError("bgrad_group_quantize: varying last dim is not supported because the underlying "
                           "MXFP8 dbias kernel requires a constant last dimension across grouped tensors.")
    fam = family(quantizer)
    if fam is None or fam.recipe not in ("mxfp8", "blockwise"):
        raise RuntimeError("bgrad_group_quantize: only MXFP8 and FP8 block-scaling quantizers are supported.")
    grouped = group_quantize(tensor, quantizer, num_tensors, first_dims, None, tensor_offsets)
    cols = int(tensor.shape[1])
    if tensor.shape[0] == 0 or cols == 0:
        return grouped, torch.zeros(num_tensors, cols, dtype=tensor.dtype)
    src, start, sums = tensor.contiguous(), 0, []
    for r in _member_rows(grouped):
        sums.append(src[start:start + r].to(torch.float32).sum(0))
        start += r
    return grouped, torch.stack(sums).to(tensor.dtype)


# ---- the grouped GEMM's operand checks (common/gemm/cublaslt_grouped_gemm.cu) --------------------

def _mode(t: Any) -> tuple[str, str, bool]:
    """An operand's (element kind ``fp8`` / ``fp4`` / ``hp``, NVTE scaling mode, swizzled scales):
    a grouped tensor's from its quantizer's family, a single tensor's from its storage class."""
    from .tensors import storage_module
    if hasattr(t, "num_tensors"):
        quantizer = t.quantizer
        fam = family(quantizer) if quantizer is not None else None
        module = fam.module if fam is not None else None
        two_d = module == "blockwise" and int(quantizer.block_scaling_dim) == 2
    else:
        module = storage_module(t)
        two_d = module == "blockwise" and bool(t._is_2D_scaled)
    swizzled = bool(getattr(t, "_with_gemm_swizzled_scales", False))
    return {None: ("hp", "NVTE_DELAYED_TENSOR_SCALING", False),
            "per_tensor": ("fp8", "NVTE_DELAYED_TENSOR_SCALING", swizzled),
            "mxfp8": ("fp8", "NVTE_MXFP8_1D_SCALING", swizzled),
            "nvfp4": ("fp4", "NVTE_NVFP4_1D_SCALING", swizzled),
            "blockwise": ("fp8", "NVTE_BLOCK_SCALING_2D" if two_d else "NVTE_BLOCK_SCALING_1D", swizzled)}[module]


def _has_data(t: Any) -> bool:
    if hasattr(t, "num_tensors"):
        return t.rowwise_data is not None or t.columnwise_data is not None
    return True


def check_operands(api: str, A: Any, B: Any, discrete_a: bool, sm: tuple[int, int]) -> None:
    """The cross-operand checks of TE's grouped GEMMs, in TE's order and words: A (a grouped
    tensor, or the list of discrete weights) and B must both be low-precision or both not
    (``nvte_grouped_gemm_with_discrete_inputA``), both FP8 or both not, both NVFP4 or both not,
    the same family of block scaling (``validate_grouped_gemm_inputs``), and scaling modes that
    pair (``validate_grouped_gemm_scaling_modes``: FP8 block scaling 1-D by 1-D, 1-D by 2-D or 2-D
    by 1-D, Hopper only). The common library's "scales must be swizzled" never fires from the
    bindings: ``extensions/gemm.cpp`` swizzles an operand's MXFP8 / NVFP4 scales first where they
    are not (``multi_tensor_swizzle_scales_for_gemm``, ``maybe_swizzle_grouped_tensor``); the
    GEMM here reads either layout (each storage says which)."""
    a_modes = [_mode(t) for t in A] if discrete_a else [_mode(A)] if _has_data(A) else []
    b_modes = [_mode(B)] if _has_data(B) else []
    a_rep = a_modes[0] if a_modes else None
    if discrete_a and a_rep is not None and b_modes:
        (a_kind, _, _), (b_kind, _, _) = a_rep, b_modes[0]
        if (a_kind != "hp") != (b_kind != "hp"):
            raise RuntimeError("Grouped GEMM: A and B must both be low-precision (FP8/NVFP4) or both not.")
    modes = (a_modes[:1] if discrete_a else a_modes) + b_modes
    if modes:
        ref = modes[0]
        for kind, mode, swizzled in modes:
            if (kind == "fp8") != (ref[0] == "fp8"):
                raise RuntimeError("Grouped GEMM: A and B must both be FP8 or both be non-FP8.")
            if (kind == "fp4") != (ref[0] == "fp4"):
                raise RuntimeError("Grouped GEMM: A and B must both be NVFP4 or both be non-NVFP4.")
            if (mode == "NVTE_MXFP8_1D_SCALING") != (ref[1] == "NVTE_MXFP8_1D_SCALING"):
                raise RuntimeError("Grouped GEMM: A and B must both use MXFP8 scaling or both not.")
            if (mode == "NVTE_NVFP4_1D_SCALING") != (ref[1] == "NVTE_NVFP4_1D_SCALING"):
                raise RuntimeError("Grouped GEMM: A and B must both use NVFP4 scaling or both not.")
            if mode.startswith("NVTE_BLOCK") != ref[1].startswith("NVTE_BLOCK"):
                raise RuntimeError("Grouped GEMM: A and B must both use FP8 block scaling or both not.")
    if a_rep is not None and b_modes:
        a_mode, b_mode = a_rep[1], b_modes[0][1]
        if a_mode == b_mode == "NVTE_BLOCK_SCALING_2D":
            raise RuntimeError(f"{api}: Only 1D by 1D, 1D by 2D, and 2D by 1D FP8 block scaling grouped GEMM is "
                               "supported, but got 2D by 2D.")
        block = a_mode.startswith("NVTE_BLOCK") or b_mode.startswith("NVTE_BLOCK")
        if (block and not (a_mode.startswith("NVTE_BLOCK") and b_mode.startswith("NVTE_BLOCK"))) or \
                (not block and a_mode != b_mode):
            raise RuntimeError(f"{api}: incompatible A/B scaling modes.")
        if block and not (9, 0) <= sm < (10, 0):
            raise RuntimeError(f"{api}: FP8 block scaling grouped GEMM is only supported on Hopper (SM90-SM99), "
                               f"not SM{sm[0]}{sm[1]}.")


def group_requantize_inplace(grouped_x: Any, quantizer: Any, num_tensors: int, first_dims: torch.Tensor,
                             otype: Any, tensor_offsets: torch.Tensor | None = None,
                             return_dequantized: bool = False) -> Any:
    """``group_requantize_inplace``: the column-wise copy of an MXFP8 grouped tensor that
    arrived quantized row-wise (FP8 token dispatch, ``ops.GroupedLinear`` with a prequantized
    input or gradient). No cell hands ``ops.GroupedLinear`` a quantized input, and te-cpu has
    no kernel for it: it raises ``MissingCpuKernel``."""
    raise _missing("group_requantize_inplace (a prequantized grouped input)")


KERNELS = {
    "group_quantize": group_quantize,
    "bgrad_group_quantize": bgrad_group_quantize,
    "group_requantize_inplace": group_requantize_inplace,
}
