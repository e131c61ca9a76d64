"""The quantization surface of TE's compiled extension, with TE's binding signatures.

Registered into ``harness.backends.te_cpu.extension`` (``KERNELS``). Each function follows the
binding of the same name in TE's ``pytorch/csrc/extensions/*.cpp`` (cited per function); the
format-specific work is done by the family modules of :mod:`harness.backends.te_cpu.quant`
(:mod:`.tensors` says which). A quantizer or tensor of a family te-cpu has no kernels for,
and an option a kernel cannot honour faithfully on CPU, raise ``MissingCpuKernel`` naming it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Callable, Sequence

import torch

from harness.backends.te_cpu.quant import qgemm, scaling
from harness.backends.te_cpu.quant.tensors import family, is_quantized, storage_module

__all__ = ["KERNELS", "is_quantized", "generic_gemm", "grouped_gemm", "grouped_tensor_gemm", "norm_output"]


_MODULES: dict[str, ModuleType] = {}


def _module(name: str) -> ModuleType:
    """A module by name, imported once (``importlib.import_module`` costs a lookup per call)."""
    mod = _MODULES.get(name)
    if mod is None:
        mod = _MODULES[name] = importlib.import_module(name)
    return mod


def _ext() -> ModuleType:
    """``harness.backends.te_cpu.extension`` (imported when called: it imports this module)."""
    return _module("harness.backends.te_cpu.extension")


def _family_module(name: str) -> ModuleType:
    return _module(f"harness.backends.te_cpu.quant.{name}")


def _quantizer_impl(quantizer: Any, binding: str) -> tuple[ModuleType, dict[str, Any]]:
    """The family module of ``quantizer`` and the options its functions take."""
    fam = family(quantizer)
    if fam is None:
        raise _ext().missing(binding, f"quantizer {type(quantizer).__name__}")
    options: dict[str, Any] = {"delayed": fam.recipe == "delayed"} if fam.module == "per_tensor" else {}
    return _family_module(fam.module), options


def _tensor_module(tensor: Any, binding: str) -> ModuleType:
    name = storage_module(tensor)
    if name is None:
        raise _ext().missing(binding, f"quantized tensor {type(tensor).__name__}")
    return _family_module(name)


def _torch_dtype(te_dtype: Any) -> torch.dtype:
    return _ext().torch_dtype(te_dtype)


def create_tensor(quantizer: Any, shape: Sequence[int], fake_dtype: torch.dtype, binding: str) -> Any:
    """``Quantizer::create_tensor``: an uninitialized quantized tensor of ``shape``."""
    module, options = _quantizer_impl(quantizer, binding)
    return module.create(quantizer, [int(s) for s in shape], fake_dtype, **options)


def quantize_into(quantizer: Any, src: torch.Tensor, dst: Any, noop: torch.Tensor | None, binding: str,
                  **extra: Any) -> Any:
    """``convert_and_update_tensor`` then ``Quantizer::quantize``: fill ``dst`` from ``src``."""
    module, options = _quantizer_impl(quantizer, binding)
    module.convert_and_update(quantizer, dst)
    module.quantize_into(quantizer, src, dst, noop, **options, **extra)
    return dst


# ---- cast.cpp -------------------------------------------------------------------------------
def quantize(tensor: torch.Tensor, quantizer: Any, output: Any = None, noop_flag: torch.Tensor | None = None) -> Any:
    """``quantize`` (``extensions/cast.cpp``): into ``output`` (converted to the quantizer's
    usages) or a new tensor of ``tensor``'s shape, fake dtype ``tensor.dtype``."""
    src = tensor.contiguous()
    dst = output if output is not None else create_tensor(quantizer, list(src.shape), src.dtype, "quantize")
    quantize_into(quantizer, src, dst, noop_flag, "quantize")
    return dst


def dequantize(input: Any, otype: Any) -> torch.Tensor:
    """``dequantize``: the row-wise data decoded, rounded once to ``otype``."""
    return _tensor_module(input, "dequantize").dequantize(input, _torch_dtype(otype))


def create_empty_quantized_tensor(quantizer: Any, shape: Sequence[int], dtype: torch.dtype, device: Any,
                                  pin_memory: bool = False) -> Any:
    """``create_empty_quantized_tensor``: ``Quantizer::create_tensor`` (on the CPU)."""
    return create_tensor(quantizer, shape, dtype, "create_empty_quantized_tensor")


def split_quantize(tensor: torch.Tensor, split_sections: Sequence[int], quantizer_list: Sequence[Any],
                   disable_bulk_allocation: bool = False) -> list[Any]:
    """``split_quantize``: ``tensor`` split along dim 0 by ``split_sections``, each part
    quantized by its quantizer into a new tensor (fake dtype ``tensor.dtype``). Bulk
    allocation only places the parts' buffers in one allocation; values are the same."""
    if len(quantizer_list) != len(split_sections):
        raise RuntimeError(f"Expected {len(split_sections)} quantizers, but got {len(quantizer_list)}")
    src = tensor.contiguous()
    if src.dim() == 0:
        raise RuntimeError("Input tensor has 0 dims")
    if sum(int(s) for s in split_sections) > src.shape[0]:
        raise RuntimeError(f"Attempted to split tensor with shape={list(src.shape)} along dim 0 with "
                           f"split_sections={list(split_sections)}")
    out, start = [], 0
    for rows, q in zip(split_sections, quantizer_list):
        part = src[start:start + int(rows)]
        start += int(rows)
        dst = create_tensor(q, list(part.shape), src.dtype, "split_quantize")
        quantize_into(q, part, dst, None, "split_quantize")
        out.append(dst)
    return out


def fp8_transpose(input: torch.Tensor, otype: Any, out: torch.Tensor | None = None) -> torch.Tensor:
    """``fp8_transpose`` (``extensions/transpose.cpp``): FP8 bytes ``[d0.., dn]`` -> ``[dn, d0..]``."""
    shape = list(input.shape)
    t_shape = [shape[-1], *shape[:-1]] if shape else []
    if out is None:
        out = torch.empty(t_shape, dtype=torch.uint8)
    if input.numel() == 0:
        return out
    out.copy_(input.reshape(-1, shape[-1]).t().reshape(t_shape))
    return out


def swap_first_dims(tensor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``swap_first_dims`` (``extensions/transpose.cpp``): ``[d0, d1, ...]`` -> ``[d1, d0, ...]``,
    contiguous (TE's NVFP4 all-gather reorders gathered column-wise data with it)."""
    src = tensor.contiguous()
    if src.dim() < 2:
        raise RuntimeError(f"Invalid input tensor dimensions (shape={list(src.shape)})")
    swapped = src.transpose(0, 1)
    if out is None:
        return swapped.contiguous()
    out.copy_(swapped)
    return out


def bgrad_quantize(grad_output: torch.Tensor, quantizer: Any) -> list[Any]:
    """``bgrad_quantize`` (``extensions/bias.cpp``): the bias gradient (column sums, fp32
    accumulation, rounded to the gradient's dtype - as the fused dbias kernels and
    ``at::sum_out`` both do) and the quantized gradient."""
    g = grad_output.contiguous()
    width = g.shape[-1]
    grad_bias = g.reshape(-1, width).to(torch.float32).sum(0).to(g.dtype)
    if quantizer is None:
        return [grad_bias, g]
    return [grad_bias, quantize(g, quantizer)]


# ---- recipe.cpp -----------------------------------------------------------------------------
def compute_amax(tensor: torch.Tensor, amax: torch.Tensor) -> None:
    """``compute_amax``: ``amax`` (1 fp32 element) set to ``tensor``'s largest magnitude."""
    if amax.dtype != torch.float32 or amax.numel() != 1:
        raise RuntimeError("amax must be a float tensor with exactly one element")
    amax.copy_(scaling.amax(tensor).reshape(amax.shape))


def fused_amax_and_scale_update_after_reduction(amax_reduction_buffer: torch.Tensor,
                                                amax_histories: Sequence[torch.Tensor],
                                                scales: Sequence[torch.Tensor], amax_compute_algo: str,
                                                fp8_dtype: Any, margin: float) -> None:
    """``fused_amax_and_scale_update_after_reduction``: delayed scaling's step for every
    (history, scale) pair, in place; the reduction buffer holds their newest amaxes in order
    (``scaling.delayed_update``)."""
    fmt = _family_module("formats").fp8_format(fp8_dtype)
    scaled_max = scaling.delayed_scaled_max(fmt.max, margin)
    buffer = amax_reduction_buffer.reshape(-1) if amax_reduction_buffer is not None and \
        amax_reduction_buffer.numel() else None
    offset = 0
    for history, scale in zip(amax_histories, scales):
        if history.dim() != 2 or history.dtype != torch.float32 or scale.dtype != torch.float32:
            raise RuntimeError("amax history must be 2-D fp32 and scale fp32")
        n = history.shape[1]
        if scale.numel() != n:
            raise RuntimeError(f"Expected {n} elements, Found {scale.numel()}.")
        newest = buffer[offset:offset + n] if buffer is not None else None
        scaling.delayed_update(history, scale.reshape(-1), newest, algo=amax_compute_algo, scaled_max=scaled_max)
        offset += n


# ---- gemm.cpp -------------------------------------------------------------------------------
def _operand(t: Any, rowwise: bool, name: str) -> qgemm.Operand:
    if not is_quantized(t):
        x = _gemm_2d(t)
        return qgemm.plain_operand(x if rowwise else x.t())
    return _tensor_module(t, "generic_gemm").operand(t, rowwise, name)


def _gemm_2d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t


def _logical_shape(t: Any) -> list[int]:
    """The logical shape of a GEMM operand (a quantized tensor's, not its buffers')."""
    return [int(s) for s in t.size()]


def gemm_output_shape(a_shape: list[int], transa: bool, b_shape: list[int], transb: bool) -> list[int]:
    """TE's ``getGemmOutputShape`` (leading dims of B kept unless ``transb``)."""
    a0, a1 = _prod(a_shape[:-1]), a_shape[-1]
    b0, b1 = _prod(b_shape[:-1]), b_shape[-1]
    if (a1 if transa else a0) != (b0 if transb else b1):
        raise RuntimeError(f"Invalid matrix dimensions for GEMM (A=({a0},{a1}), transa={transa}, "
                           f"B=({b0},{b1}), transb={transb})")
    rows = [b1] if transb else list(b_shape[:-1])
    return rows + [a0 if transa else a1]


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def generic_gemm(A: Any, transA: bool, B: Any, transB: bool, D: Any, quantizer: Any, output_dtype: Any,
                 bias: torch.Tensor | None, bias_type: Any, gelu: bool, gelu_in: Any, grad: bool,
                 workspace: Any, workspace_size: int, accumulate: bool, use_split_accumulator: bool,
                 comm_overlap: Any = None, comm_type: Any = None, extra_output: Any = None,
                 bulk_overlap: bool = False, alpha: float = 1.0, beta: float | None = None) -> list[Any]:
    """``gemm`` (``extensions/gemm.cpp``) with quantized operands or an output quantizer.

    The operands are taken as ``CanonicalizeGemmInput`` takes them (A row-wise when ``transA``,
    else column-wise; B row-wise unless ``transB``), decoded and multiplied by :mod:`.qgemm`.
    An output quantizer gets the high-precision output quantized (TE's unfused path). A bias
    gradient with a quantized B (cuBLASLt's BGRADB epilogue) is not needed by TE's paths here
    and fails loudly.
    """
    ext = _ext()
    if gelu:
        raise ext.missing("generic_gemm", "GELU epilogue")
    if comm_overlap is not None or bulk_overlap:
        raise ext.missing("generic_gemm", "comm+GEMM overlap (userbuffers)")
    if bias is not None and grad and is_quantized(B):
        raise ext.missing("generic_gemm", "bias gradient (BGRADB) of a quantized operand")
    if is_quantized(D):
        raise ext.missing("generic_gemm", "quantized output buffer")
    if beta is None:
        beta = 1.0 if accumulate else 0.0
    elif not accumulate and beta != 0.0:
        raise RuntimeError("Trying to use non-zero beta while not accumulating into D tensor. "
                           "Beta has nothing to be applied to.")
    a_shape, b_shape = _logical_shape(A), _logical_shape(B)
    shape = gemm_output_shape(a_shape, transA, b_shape, transB)
    out_dtype = _torch_dtype(output_dtype) if output_dtype is not None else _fake_dtype(A)
    if D is not None and output_dtype is not None and D.dtype != out_dtype:
        raise RuntimeError(f"GEMM output has invalid dtype (expected {out_dtype}, found {D.dtype})")
    hp_out = D if quantizer is None else None
    bias_grad = None
    if bias is not None and grad:
        bias_grad = torch.zeros(b_shape[-1], dtype=out_dtype)
    if _prod(a_shape) == 0 or _prod(b_shape) == 0:
        out = hp_out if hp_out is not None else torch.empty(shape, dtype=out_dtype)
        if out.numel() and not accumulate:
            out.data.zero_()
    else:
        _check_block_pair(A, B)
        a = _operand(A, transA, "A")
        b = _operand(B, not transB, "B")
        if a.amax is not None or b.amax is not None:
            alpha = _nvfp4_alpha(a, b, float(alpha), out_dtype)
        acc = qgemm.accumulate(b, a)
        out = qgemm.epilogue(acc, out_shape=shape, out_dtype=out_dtype, out=hp_out, alpha=float(alpha),
                             beta=float(beta), bias=None if grad else bias)
        if bias_grad is not None:
            bias_grad.copy_(_gemm_2d(B).to(torch.float32).sum(0).to(out_dtype))
    if quantizer is not None:
        out = quantize(out, quantizer, D)
    return [out, bias_grad, None, extra_output]


#: the families whose GEMM path ``CanonicalizeGemmInput`` takes only when both operands have it
_PAIRED = ("mxfp8", "nvfp4")


def _check_block_pair(A: Any, B: Any) -> None:
    """``CanonicalizeGemmInput`` (``cublaslt_gemm.cu``): an MXFP8 or NVFP4 operand has a path
    only beside another of its format (``mxfp8 = is_mxfp_scaling(A) && is_mxfp_scaling(B)``,
    ``nvfp4`` likewise); beside anything else - an unquantized tensor, another format - it
    falls through to "A has unsupported scaling mode" (A checked first) or B's."""
    fa, fb = (storage_module(t) if is_quantized(t) else None for t in (A, B))
    for name, mine, other in (("A", fa, fb), ("B", fb, fa)):
        if mine in _PAIRED and mine != other:
            raise RuntimeError(f"{name} has unsupported scaling mode")


def _nvfp4_alpha(a: qgemm.Operand, b: qgemm.Operand, alpha: float, out_dtype: torch.dtype) -> float:
    """An NVFP4 GEMM's ``alpha`` with both tensor amaxes folded in (``cublaslt_gemm.cu``:
    both operands NVFP4, :func:`_check_block_pair`; no FP16 output)."""
    if a.amax is None or b.amax is None:
        raise RuntimeError(f"{'A' if a.amax is not None else 'B'} has unsupported scaling mode")
    if out_dtype == torch.float16:
        raise RuntimeError("FP4 GEMM does not support FP16 output!")
    return _family_module("nvfp4").gemm_alpha(alpha, a.amax, b.amax)


def _fake_dtype(t: Any) -> torch.dtype:
    """The dtype TE gives a GEMM output without ``output_dtype``: A's (a quantized tensor's
    fake dtype)."""
    return getattr(t, "_dtype", None) or t.dtype


def grouped_gemm(A: Sequence[Any], transa: bool, B: Sequence[Any], transb: bool, D: list[torch.Tensor] | None,
                 D_type: Any, m_splits: Sequence[int], bias: list[torch.Tensor], bias_type: Any,
                 single_output: bool, grad: bool, accumulate: bool, use_split_accumulator: bool) -> list[torch.Tensor]:
    """``te_general_grouped_gemm`` with quantized operands: one :func:`generic_gemm` per group
    (``nvte_multi_tensor_gemm`` runs the groups' cuBLASLt GEMMs one by one), an empty bias
    meaning none; with ``single_output`` the groups' outputs fill ``D[0]`` one after another."""
    out_dtype = _torch_dtype(D_type)
    offset = 0
    for i, (a, b) in enumerate(zip(A, B)):
        shape = gemm_output_shape(_logical_shape(a), transa, _logical_shape(b), transb)
        if single_output:
            n = _prod(shape)
            dest = D[0].data.reshape(-1)[offset:offset + n].view(shape)
            offset += n
        else:
            dest = D[i] if D is not None else None
        b_i = bias[i] if bias is not None and bias[i].numel() else None
        _, bgrad, _, _ = generic_gemm(a, transa, b, transb, dest, None, D_type, b_i, bias_type, False, None, grad,
                                      None, 0, accumulate, use_split_accumulator)
        if grad and bgrad is not None:
            bias[i].data.copy_(bgrad)
    del out_dtype
    return bias


def grouped_tensor_gemm(A: Sequence[Any], transa: bool, B: Sequence[Any], transb: bool, D: Sequence[torch.Tensor], *,
                        alpha: torch.Tensor, beta: torch.Tensor, per_group_alpha_beta: bool) -> None:
    """cuBLASLt's grouped GEMM (``nvte_grouped_gemm*``) with quantized members: per group,
    ``D_i = alpha_i * op(B_i) @ op(A_i) + beta_i * D_i`` as :func:`generic_gemm` computes one
    quantized GEMM - each operand read as ``CanonicalizeGemmInput`` reads a single tensor, exact
    products, fp32 accumulation, one rounding into ``D_i`` (``alpha`` / ``beta``: one per group on
    Blackwell, one for all on Hopper). A member with an empty reduction gets ``beta * D_i``."""
    a_vals, b_vals = alpha.reshape(-1).tolist(), beta.reshape(-1).tolist()
    for i, (a, b, d) in enumerate(zip(A, B, D)):
        al = a_vals[i if per_group_alpha_beta else 0]
        be = b_vals[i if per_group_alpha_beta else 0]
        if d.numel() == 0:
            continue
        generic_gemm(a, transa, b, transb, d, None, None, None, None, False, None, False, None, 0, be != 0.0,
                     False, alpha=al, beta=be)


# ---- normalization.cpp ----------------------------------------------------------------------
def norm_output(binding: str, quantizer: Any, otype: Any, ln_out: Any,
                compute: Callable[[torch.Tensor | torch.dtype], Any]) -> list[Any]:
    """``layernorm_fwd`` / ``rmsnorm_fwd`` with an output quantizer (``extensions/normalization.cpp``).

    Delayed scaling's quantizer runs TE's fully fused kernel: the norm's fp32 value is scaled
    and cast to FP8 directly (no rounding to the output dtype first) and the amax is taken of
    the fp32 value. Every other quantizer gets the norm in the output dtype, then quantized
    (current scaling's fused amax is the amax of that rounded output: the same numbers).
    ``compute(dtype)`` runs the norm into a new tensor of ``dtype``.
    """
    fam = family(quantizer)
    if fam is None:
        raise _ext().missing(binding, f"output quantizer {type(quantizer).__name__}")
    out_dtype = _torch_dtype(otype)
    if fam.recipe == "delayed":
        res = compute(torch.float32)
        dst = ln_out if ln_out is not None else create_tensor(quantizer, list(res.out.shape), out_dtype, binding)
        quantize_into(quantizer, res.out, dst, None, binding)
    else:
        res = compute(out_dtype)
        dst = quantize(res.out, quantizer, ln_out)
    return [dst, getattr(res, "mu", None), res.rsigma]


KERNELS: dict[str, Callable[..., Any]] = {
    "quantize": quantize,
    "dequantize": dequantize,
    "create_empty_quantized_tensor": create_empty_quantized_tensor,
    "split_quantize": split_quantize,
    "fp8_transpose": fp8_transpose,
    "swap_first_dims": swap_first_dims,
    "bgrad_quantize": bgrad_quantize,
    "compute_amax": compute_amax,
    "fused_amax_and_scale_update_after_reduction": fused_amax_and_scale_update_after_reduction,
}
