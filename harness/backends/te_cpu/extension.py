"""A CPU module standing in for TE's compiled ``transformer_engine_torch`` extension.

TE's Python code does ``import transformer_engine_torch as tex`` in ~50 modules. This module
is registered under that name inside a worker rank (never in the parent process) and holds:

- the enums TE reads at import time, with the values of TE's C headers
  (``transformer_engine.h``, ``fused_attn.h``, ``comm_gemm_overlap.h``,
  ``pytorch/csrc/common.h``);
- real CPU kernels for what the ``Linear``, ``LayerNormLinear``, ``GroupedLinear`` and
  ``ops.GroupedLinear`` paths call: ``generic_gemm`` and ``te_general_grouped_gemm``
  (numerics in :mod:`harness.backends.te_cpu.gemm`), ``layernorm_fwd``, ``layernorm_bwd``,
  ``rmsnorm_fwd`` and ``rmsnorm_bwd`` (numerics in :mod:`harness.backends.te_cpu.norm`), and the
  grouped-tensor path's ``splits_to_offsets_multi``, ``get_grouped_gemm_setup_workspace_size``
  and ``te_general_grouped_gemm_for_{grouped_tensor,discrete_in,discrete_out}`` (numerics in
  :mod:`harness.backends.te_cpu.grouped`), plus the version and device queries TE asks; quantized
  operands, output quantizers and the recipes' own kernels (``quantize``, ``dequantize``, the
  scale updates, ...) go to :mod:`harness.backends.te_cpu.quant` (``quant.bindings.KERNELS``);
- for every other name TE's Python sources reference (``STUBBED``), a stub that raises
  :class:`MissingCpuKernel` naming the extension function and the TE function that called
  it - when *called*, never silently. A name TE never references is an ``AttributeError``,
  as on the real extension (so TE's ``getattr(tex, name, default)`` probes keep working):
  a :class:`MissingExtensionAttribute` naming it, which the loader turns into one line
  when TE reads it at import time.

``build(te_root)`` builds the stand-in for a TE *source tree* (``--te-tree``): the stubs
are the names that tree's Python references, and each enum takes its members from the
tree's pybind11 binding and their values from its C headers where it has them (what
:mod:`harness.te_tree.scan` reads from the tree). Without them (a tree made from the wheel)
the built-in TE 2.20.2 enums stay. ``build`` returns the module and changes nothing here;
the loader registers it.
"""

from __future__ import annotations

import contextlib
import enum
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from harness.cell.faults import MissingCpuKernel, MissingExtensionAttribute
from harness.backends.te_cpu.refusal import missing
from harness.backends.te_cpu import gemm as _gemm
from harness.te_tree import scan as _scan
from harness.backends.te_cpu import cuda_surface, launch_memo
from harness.backends.te_cpu import grouped as _grouped
from harness.backends.te_cpu import norm as _norm

MODULE_NAME = _scan.MODULE_NAME
#: what ``get_cublasLt_version`` answers by default: cuBLASLt 12.9.1. Below 13.3 (130300)
#: ``GroupedLinear`` and ``ops.GroupedLinear`` stay on their split-quantize path
#: (``te_general_grouped_gemm``), whatever ``use_grouped_tensor`` asks for.
CUBLASLT_VERSION = 120901


def _grouped_gemm_minimum(capability: tuple[int, int]) -> int:
    """The lowest cuBLASLt with the grouped GEMM TE's grouped-tensor path needs on a device of
    ``capability``: 13.3 on Blackwell, 13.4 on Hopper (``is_module_grouped_tensor_path_supported``,
    ``is_op_fuser_grouped_tensor_path_supported``, ``check_grouped_gemm_requirements``)."""
    return 130300 if capability >= (10, 0) else 130400


#: the grouped GEMM's minimum on the device te-cpu presents by default (Hopper: 13.4); answer
#: it with :func:`cublaslt_version` to put BF16/FP16 grouped layers on that path
GROUPED_GEMM_CUBLASLT_VERSION = _grouped_gemm_minimum(cuda_surface.COMPUTE_CAPABILITY)


#: on Hopper TE's grouped-tensor paths take a recipe only at a later cuBLASLt than the grouped
#: GEMM's minimum (``is_module_grouped_tensor_path_supported``, ``is_op_fuser_grouped_tensor_path_supported``:
#: "13.5+ required for FP8 per-tensor current scaling on Hopper, and 13.6+ required for FP8 block
#: scaling on Hopper")
GROUPED_RECIPE_CUBLASLT_HOPPER: dict[str, int] = {"current": 130500, "blockwise": 130600}
#: the recipe of the cell running now (``present_recipe``)
_RECIPE = ["none"]


def present_recipe(recipe: str) -> None:
    """The recipe the cell running now uses (``backend.use_recipe``): the grouped GEMM's
    cuBLASLt answer follows it (:func:`grouped_gemm_cublaslt_version`)."""
    _RECIPE[0] = recipe


def grouped_gemm_cublaslt_version() -> int:
    """The lowest cuBLASLt at which TE takes its grouped-tensor path on the device and under the
    recipe presented now: ``harness.backends.te_cpu.device`` presents Blackwell (13.3) for a
    recipe that needs it, Hopper (13.4) otherwise; on Hopper, current scaling needs 13.5 and FP8
    block scaling 13.6 (:data:`GROUPED_RECIPE_CUBLASLT_HOPPER`)."""
    cap = cuda_surface.capability()
    minimum = _grouped_gemm_minimum(cap)
    if cap < (10, 0):
        minimum = max(minimum, GROUPED_RECIPE_CUBLASLT_HOPPER.get(_RECIPE[0], minimum))
    return minimum


#: what ``get_cudnn_version`` answers: cuDNN 9.12.0, TE 2.20's minimum (``MIN_CUDNN_VERSION``)
CUDNN_VERSION = 91200
#: ``get_num_cublas_streams``: TE's default number of compute streams for grouped GEMMs
NUM_CUBLAS_STREAMS = 4


def _is_private(name: str) -> bool:
    return name.startswith("_")


class _PybindEnumType(enum.EnumMeta):
    """Missing members raise :class:`MissingExtensionAttribute` naming the enum and member."""

    def __getattr__(cls, name: str) -> Any:
        if _is_private(name):
            parent = getattr(enum.EnumMeta, "__getattr__", None)
            if parent is not None:
                return parent(cls, name)
            raise AttributeError(name)
        members = cls.__dict__.get("_member_map_", {})
        if name in members:
            return members[name]
        raise MissingExtensionAttribute(f"{MODULE_NAME}.{cls.__name__}.{name}")


class _PybindEnum(enum.Enum, metaclass=_PybindEnumType):
    """An enum that behaves like a pybind11 ``py::enum_``: ``int()``-able, hashable by value,
    equal only to members of its own type (pybind11 enums do not compare equal to ints)."""

    def __int__(self) -> int:
        return int(self.value)

    def __index__(self) -> int:
        return int(self.value)

    def __hash__(self) -> int:
        return hash(int(self.value))


def _enum(name: str, members: dict[str, int]) -> type[_PybindEnum]:
    cls = _PybindEnum(name, members)  # type: ignore[call-overload]
    cls.__module__ = MODULE_NAME
    return cls


# transformer_engine.h (transformer_engine::DType) as exposed by NVTE_DECLARE_COMMON_PYBIND11_HANDLES
DType = _enum("DType", {"kByte": 0, "kInt32": 2, "kFloat32": 4, "kFloat16": 5, "kBFloat16": 6,
                        "kFloat8E4M3": 7, "kFloat8E5M2": 8, "kFloat4E2M1": 10})
# pytorch/csrc/common.h
FP8FwdTensors = _enum("FP8FwdTensors", {
    "GEMM1_INPUT": 0, "GEMM1_WEIGHT": 1, "GEMM1_OUTPUT": 2, "GEMM2_INPUT": 3, "GEMM2_WEIGHT": 4,
    "GEMM2_OUTPUT": 5, "GEMM3_INPUT": 6, "GEMM3_WEIGHT": 7, "GEMM3_OUTPUT": 8})
FP8BwdTensors = _enum("FP8BwdTensors", {
    "GRAD_OUTPUT1": 0, "GRAD_INPUT1": 1, "GRAD_OUTPUT2": 2, "GRAD_INPUT2": 3, "GRAD_OUTPUT3": 4,
    "GRAD_INPUT3": 5})
# fused_attn.h
NVTE_Fused_Attn_Backend = _enum("NVTE_Fused_Attn_Backend", {
    "NVTE_F16_arbitrary_seqlen": 1, "NVTE_FP8": 2, "NVTE_No_Backend": -1})
NVTE_Bias_Type = _enum("NVTE_Bias_Type", {
    "NVTE_NO_BIAS": 0, "NVTE_PRE_SCALE_BIAS": 1, "NVTE_POST_SCALE_BIAS": 2, "NVTE_ALIBI": 3})
NVTE_Mask_Type = _enum("NVTE_Mask_Type", {
    "NVTE_NO_MASK": 0, "NVTE_PADDING_MASK": 1, "NVTE_CAUSAL_MASK": 2, "NVTE_PADDING_CAUSAL_MASK": 3,
    "NVTE_CAUSAL_BOTTOM_RIGHT_MASK": 4, "NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK": 5})
NVTE_Softmax_Type = _enum("NVTE_Softmax_Type", {
    "NVTE_VANILLA_SOFTMAX": 0, "NVTE_OFF_BY_ONE_SOFTMAX": 1, "NVTE_LEARNABLE_SOFTMAX": 2})
NVTE_QKV_Format = _enum("NVTE_QKV_Format", {
    "NVTE_SBHD": 0, "NVTE_BSHD": 1, "NVTE_THD": 2, "NVTE_BSHD_2SBHD": 3, "NVTE_SBHD_2BSHD": 4,
    "NVTE_THD_2BSHD": 5, "NVTE_THD_2SBHD": 6, "NVTE_BHSD": 7, "NVTE_QKV_Format_NOT_SET": 8})
NVTE_QKV_Layout = _enum("NVTE_QKV_Layout", {name: i for i, name in enumerate((
    "NVTE_SB3HD", "NVTE_SBH3D", "NVTE_SBHD_SB2HD", "NVTE_SBHD_SBH2D", "NVTE_SBHD_SBHD_SBHD",
    "NVTE_BS3HD", "NVTE_BSH3D", "NVTE_BSHD_BS2HD", "NVTE_BSHD_BSH2D", "NVTE_BSHD_BSHD_BSHD",
    "NVTE_T3HD", "NVTE_TH3D", "NVTE_THD_T2HD", "NVTE_THD_TH2D", "NVTE_THD_THD_THD",
    "NVTE_SBHD_BSHD_BSHD", "NVTE_BSHD_SBHD_SBHD", "NVTE_THD_BSHD_BSHD", "NVTE_THD_SBHD_SBHD",
    "NVTE_Paged_KV_BSHD_BSHD_BSHD", "NVTE_Paged_KV_BSHD_SBHD_SBHD", "NVTE_Paged_KV_SBHD_BSHD_BSHD",
    "NVTE_Paged_KV_SBHD_SBHD_SBHD", "NVTE_Paged_KV_THD_BSHD_BSHD", "NVTE_Paged_KV_THD_SBHD_SBHD",
    "NVTE_BHSD_BHSD_BHSD", "NVTE_QKV_Layout_NOT_SET"))})
# transformer_engine.h
NVTEScalingMode = _enum("NVTEScalingMode", {
    "NVTE_DELAYED_TENSOR_SCALING": 0, "NVTE_MXFP8_1D_SCALING": 1, "NVTE_BLOCK_SCALING_1D": 2,
    "NVTE_BLOCK_SCALING_2D": 3, "NVTE_NVFP4_1D_SCALING": 4, "NVTE_INVALID_SCALING": 100})
# fused_router.h
NVTERoutingMapFormat = _enum("NVTERoutingMapFormat", {"BYTEMAP": 0, "BITMAP_U8": 1})
NVTEQBHistogramMode = _enum("NVTEQBHistogramMode", {"TWO_KERNEL": 0, "FUSED_ATOMIC": 1})
# comm_gemm_overlap.h
CommOverlapType = _enum("CommOverlapType", {"RS": 0, "AG": 1})

#: the built-in (TE 2.20.2) enums; a tree's own are on the module :func:`build` returns for it
ENUMS: tuple[type[_PybindEnum], ...] = (
    DType, FP8FwdTensors, FP8BwdTensors, NVTE_Fused_Attn_Backend, NVTE_Bias_Type, NVTE_Mask_Type,
    NVTE_Softmax_Type, NVTE_QKV_Format, NVTE_QKV_Layout, NVTEScalingMode, NVTERoutingMapFormat,
    NVTEQBHistogramMode, CommOverlapType)

#: TE DType member name -> torch dtype (``GetATenDType`` in TE's extension); the integer
#: types a tree's header adds (``kInt16``, ``kInt64``) map to theirs
_TORCH_DTYPE_NAMES: dict[str, torch.dtype] = {
    "kByte": torch.uint8, "kInt16": torch.int16, "kInt32": torch.int32, "kInt64": torch.int64,
    "kFloat32": torch.float32, "kFloat16": torch.float16, "kBFloat16": torch.bfloat16,
    "kFloat8E4M3": torch.float8_e4m3fn, "kFloat8E5M2": torch.float8_e5m2,
}

#: the fp32 GEMM mode of this process (set once by ``harness.backends.te_cpu.backend``)
_FP32_MODE = ["ieee"]


def set_fp32_mode(mode: str) -> None:
    if mode not in _gemm.FP32_MODES:
        raise ValueError(f"unknown fp32 GEMM mode {mode!r} (choose from {', '.join(_gemm.FP32_MODES)})")
    _FP32_MODE[0] = mode


def fp32_mode() -> str:
    return _FP32_MODE[0]


#: what ``get_cublasLt_version`` answers now (``set_cublaslt_version``)
_CUBLASLT = [CUBLASLT_VERSION]


def set_cublaslt_version(version: int) -> int:
    """Make ``get_cublasLt_version`` answer ``version`` (e.g. 130400 for cuBLASLt 13.4.0);
    returns the previous answer. No re-import needed: TE asks on every call that decides.

    When TE asks (2.20.2): ``GroupedLinear`` on every ``_GroupedLinear.forward``
    (``is_module_grouped_tensor_path_supported``), ``ops.GroupedLinear`` on every
    ``fuser_forward`` (``is_op_fuser_grouped_tensor_path_supported``); the backward follows
    the path its forward took (saved on the autograd context). Module construction does not
    ask. The grouped-tensor kernels below read the answer too, when they run - as the real
    library checks the run-time cuBLASLt version - so hold one answer over a forward *and*
    its backward (:func:`cublaslt_version`).
    """
    version = int(version)
    if version <= 0:
        raise ValueError(f"a cuBLASLt version is a positive integer (e.g. 130400), got {version}")
    previous, _CUBLASLT[0] = _CUBLASLT[0], version
    return previous


@contextlib.contextmanager
def cublaslt_version(version: int) -> Iterator[int]:
    """``with cublaslt_version(GROUPED_GEMM_CUBLASLT_VERSION): loss = model(x, m_splits)...``:
    the answer for the block (forward and backward), restored afterwards."""
    previous = set_cublaslt_version(version)
    try:
        yield version
    finally:
        _CUBLASLT[0] = previous


def _dtype_enum() -> type[_PybindEnum]:
    """The ``DType`` this process's TE reads values from: the one of the stand-in registered
    as ``transformer_engine_torch`` (a tree's, with the tree's values: TE's Python ``DType``
    copies them), else the built-in one."""
    mod = sys.modules.get(MODULE_NAME)
    if mod is not None and getattr(mod, "__file__", None) == __file__:
        return mod.DType  # type: ignore[no-any-return]
    return DType


def torch_dtype(te_dtype: Any) -> torch.dtype:
    """The torch dtype of a TE ``DType`` (TE's Python ``DType``, the stand-in's, or its value)
    as the process's stand-in numbers them (``GetATenDType``)."""
    key = _dtype_enum()(int(te_dtype))
    if key.name not in _TORCH_DTYPE_NAMES:
        raise MissingCpuKernel(f"TE dtype {key.name} has no CPU kernel output")
    return _TORCH_DTYPE_NAMES[key.name]


def _require_plain(name: str, **operands: Any) -> None:
    """A quantized storage where this kernel takes plain tensors (a norm's input, a GEMM
    operand :mod:`harness.backends.te_cpu.quant` does not take, such as NVFP4's) fails loudly."""
    for arg, t in operands.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise missing(name, f"{arg} is a {type(t).__name__}: quantized GEMM operand")


# ---- kernels ------------------------------------------------------------------------------
def generic_gemm(A: Any, transA: bool, B: Any, transB: bool, D: Any, quantizer: Any, output_dtype: Any,
                 bias: torch.Tensor | None, bias_type: Any, gelu: bool, gelu_in: Any, grad: bool,
                 workspace: torch.Tensor, workspace_size: int, accumulate: bool,
                 use_split_accumulator: bool, comm_overlap: Any = None, comm_type: Any = None,
                 extra_output: Any = None, bulk_overlap: bool = False, alpha: float = 1.0,
                 beta: float | None = None) -> list[Any]:
    """TE's ``gemm`` (``pytorch/csrc/extensions/gemm.cpp``): unquantized operands here, a
    quantized operand or an output quantizer in ``quant.bindings.generic_gemm``.

    Returns ``[D, bias_grad, pre_gelu_out, extra_output]`` as the real binding does.
    """
    if A is None or B is None:
        raise ValueError(f"Tensor {'A' if A is None else 'B'} has not been provided")
    if _quant.is_quantized(A) or _quant.is_quantized(B) or quantizer is not None:
        return _quant.generic_gemm(A, transA, B, transB, D, quantizer, output_dtype, bias, bias_type, gelu,
                                   gelu_in, grad, workspace, workspace_size, accumulate, use_split_accumulator,
                                   comm_overlap, comm_type, extra_output, bulk_overlap, alpha, beta)
    _require_plain("generic_gemm", A=A, B=B, D=D)
    if gelu:
        raise missing("generic_gemm", "GELU epilogue")
    if comm_overlap is not None or bulk_overlap:
        raise missing("generic_gemm", "comm+GEMM overlap (userbuffers)")
    out_dtype = torch_dtype(output_dtype) if output_dtype is not None else A.dtype
    res = _gemm.gemm(A, transA, B, transB, out_dtype=out_dtype, out=D, bias=bias, grad=grad,
                     accumulate=accumulate, alpha=alpha, beta=beta, fp32_mode=fp32_mode())
    return [res.out, res.bias_grad, None, extra_output]


def te_general_grouped_gemm(A: Sequence[Any], transa: bool, B: Sequence[Any], transb: bool,
                            D: list[torch.Tensor] | None, D_type: Any, m_splits: Sequence[int],
                            bias: list[torch.Tensor], bias_type: Any, single_output: bool,
                            pre_gelu_out: list[torch.Tensor], grad: bool,
                            workspace: list[torch.Tensor], workspaceSize: int, accumulate: bool,
                            use_split_accumulator: bool, math_sm_count: int) -> list[torch.Tensor]:
    """TE's ``te_general_grouped_gemm``: one GEMM per group, incl. empty groups.

    ``single_output``: ``D[0]`` is one buffer that the groups' outputs fill one after another.
    An empty bias tensor means "no bias"; with ``grad`` the bias list is filled with the
    bias gradients. Returns the bias list, as the binding does.
    """
    if single_output and D is None:
        raise ValueError("not implemented, D should be allocated for single output case.")
    if any(t.numel() for t in pre_gelu_out):
        raise missing("te_general_grouped_gemm", "GELU epilogue")
    if any(_quant.is_quantized(t) for t in (*A, *B)):
        return _quant.grouped_gemm(A, transa, B, transb, D, D_type, m_splits, bias, bias_type, single_output,
                                   grad, accumulate, use_split_accumulator)
    for a, b in zip(A, B):
        _require_plain("te_general_grouped_gemm", A=a, B=b)
    results = _gemm.grouped_gemm(A, transa, B, transb, out_dtype=torch_dtype(D_type),
                                 outs=None if single_output else D,
                                 single_output=D[0] if single_output else None, biases=bias,
                                 grad=grad, accumulate=accumulate, fp32_mode=fp32_mode())
    if grad:
        for b, res in zip(bias, results):
            if res.bias_grad is not None:
                b.data.copy_(res.bias_grad)
    return bias


def layernorm_fwd(input: Any, weight: Any, bias: torch.Tensor | None, eps: float, ln_out: Any,
                  quantizer: Any, otype: Any, sm_margin: int, zero_centered_gamma: bool) -> list[Any]:
    """TE's ``layernorm_fwd`` (``pytorch/csrc/extensions/normalization.cpp``): plain inputs; an
    output ``quantizer`` quantizes the result (``quant.bindings.norm_output``).

    Writes into ``ln_out`` when given, else allocates the output in ``otype``. ``sm_margin``
    only sizes the CUDA launch. Returns ``[out, mu, rsigma]`` (fp32 statistics), as the binding does.
    """
    _require_plain("layernorm_fwd", input=input, weight=weight, bias=bias)
    if quantizer is not None:
        return _quant.norm_output("layernorm_fwd", quantizer, otype, ln_out, lambda out_dtype: _norm.layernorm_fwd(
            input, weight, bias, eps, zero_centered_gamma=zero_centered_gamma, out_dtype=out_dtype, out=None))
    _require_plain("layernorm_fwd", ln_out=ln_out)
    res = _norm.layernorm_fwd(input, weight, bias, eps, zero_centered_gamma=zero_centered_gamma,
                              out_dtype=torch_dtype(otype), out=ln_out)
    return [res.out, res.mu, res.rsigma]


def rmsnorm_fwd(input: Any, weight: Any, eps: float, ln_out: Any, quantizer: Any, otype: Any,
                sm_margin: int, zero_centered_gamma: bool) -> list[Any]:
    """TE's ``rmsnorm_fwd``: as :func:`layernorm_fwd` without a bias.

    Returns ``[out, None, rsigma]``, as the binding does.
    """
    _require_plain("rmsnorm_fwd", input=input, weight=weight)
    if quantizer is not None:
        return _quant.norm_output("rmsnorm_fwd", quantizer, otype, ln_out, lambda out_dtype: _norm.rmsnorm_fwd(
            input, weight, eps, zero_centered_gamma=zero_centered_gamma, out_dtype=out_dtype, out=None))
    _require_plain("rmsnorm_fwd", ln_out=ln_out)
    res = _norm.rmsnorm_fwd(input, weight, eps, zero_centered_gamma=zero_centered_gamma,
                            out_dtype=torch_dtype(otype), out=ln_out)
    return [res.out, None, res.rsigma]


def layernorm_bwd(dz: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, rsigma: torch.Tensor,
                  gamma: torch.Tensor, sm_margin: int, zero_centered_gamma: bool, /) -> list[torch.Tensor]:
    """TE's ``layernorm_bwd`` (positional only: the binding names no arguments).

    Returns ``[dx, dgamma, dbeta]``: ``dx`` in ``x``'s dtype, the others in ``gamma``'s.
    """
    _require_plain("layernorm_bwd", dz=dz, x=x)
    res = _norm.layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma=zero_centered_gamma)
    return [res.dx, res.dgamma, res.dbeta]


def rmsnorm_bwd(dz: torch.Tensor, x: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                sm_margin: int, zero_centered_gamma: bool, /) -> list[torch.Tensor]:
    """TE's ``rmsnorm_bwd`` (positional only). Returns ``[dx, dgamma]``."""
    _require_plain("rmsnorm_bwd", dz=dz, x=x)
    res = _norm.rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma=zero_centered_gamma)
    return [res.dx, res.dgamma]


# ---- the grouped-tensor path ---------------------------------------------------------------
def splits_to_offsets_multi(split_sizes: torch.Tensor, device: Any, *, strides: Sequence[int],
                            include_leading_zero: Sequence[bool], dtypes: Sequence[torch.dtype],
                            bulk_allocate: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """TE's ``splits_to_offsets_multi`` (``pytorch/csrc/extensions/misc.cpp``): the split
    sizes as int64 on ``device`` and, per stride, their scaled running totals.

    Returns ``(split_sizes, [offsets, ...])`` as the binding does. ``device`` must be the CUDA
    device, which is the CPU here (``cuda_surface``): a CPU or CUDA ``device`` is accepted,
    and a split tensor marked as device-resident (``cuda_surface.on_device``) comes back as
    the plain CPU tensor it is.
    """
    if not (len(strides) == len(include_leading_zero) == len(dtypes)):
        raise RuntimeError("strides, include_leading_zero, and dtypes must have matching lengths, but got "
                           f"{len(strides)}, {len(include_leading_zero)}, and {len(dtypes)}.")
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type not in ("cuda", "cpu"):
        raise RuntimeError(f"device must be CUDA, but got {dev}.")
    sizes = cuda_surface.plain(split_sizes)
    if sizes.dtype != torch.int64:
        sizes = sizes.to(torch.int64)
    try:
        offsets = _grouped.splits_to_offsets(sizes, strides, include_leading_zero, dtypes, bulk_allocate)
    except _grouped.GroupedError as exc:
        raise RuntimeError(str(exc)) from None
    return sizes, offsets


def get_grouped_gemm_setup_workspace_size(num_tensors: int) -> int:
    """Bytes of the grouped GEMM's setup workspace (per-group pointer and dimension arrays);
    the CPU kernels do not use it, TE allocates it."""
    return _grouped.setup_workspace_size(int(num_tensors))


def _check_grouped_gemm_requirements(api: str) -> None:
    """``check_grouped_gemm_requirements``: the device and the *run-time* cuBLASLt version
    (what ``get_cublasLt_version`` answers now) must have the grouped GEMM."""
    sm, version = cuda_surface.capability(), _CUBLASLT[0]
    if sm < (9, 0):
        raise RuntimeError(f"{api} requires Hopper (SM90) or newer architecture.")
    if version < 130300:
        raise RuntimeError(f"{api} requires cuBLAS 13.3+, but run-time cuBLAS version is {version}")
    if sm < (10, 0) and version < 130400:
        raise RuntimeError(f"{api} on Hopper (SM90) requires cuBLAS 13.4+, but run-time cuBLAS version is "
                           f"{version}")


def _grouped_operand(name: str, arg: str, t: Any) -> tuple[list[_grouped.Member], list[torch.Tensor]]:
    """The members of a non-quantized ``GroupedTensorStorage`` operand (its row-wise data)."""
    if not hasattr(t, "num_tensors") or not hasattr(t, "rowwise_data"):
        raise TypeError(f"{name}: {arg} must be a GroupedTensor, got {type(t).__name__}")
    if t.quantizer is not None or t.scale_inv is not None or t.columnwise_scale_inv is not None:
        raise missing(name, f"{arg} is a quantized grouped tensor")
    if t.rowwise_data is None:
        raise missing(name, f"{arg} has no row-wise data")
    members = _grouped.layout(t.num_tensors, t.logical_shape, t.first_dims, t.last_dims, t.tensor_offsets)
    return members, _grouped.member_views(t.rowwise_data, members)


def _quantized_grouped(t: Any) -> bool:
    """A quantized ``GroupedTensorStorage`` (made by ``group_quantize``)."""
    return getattr(t, "quantizer", None) is not None and hasattr(t, "num_tensors")


def _discrete_operand(name: str, arg: str, tensors: Any) -> list[torch.Tensor]:
    for i, t in enumerate(tensors):
        _require_plain(name, **{f"{arg}[{i}]": t})
        if getattr(t, "_quantizer", None) is not None:  # TE's QuantizedTensor subclasses
            raise missing(name, f"{arg}[{i}] is a {type(t).__name__}: quantized GEMM operand")
    return [_gemm.as_2d(t) for t in tensors]


def _grouped_gemm_binding(name: str, api: str, A: Any, transa: bool, B: Any, transb: bool, D: Any, bias: Any,
                          bias_scale: torch.Tensor | None, alpha: torch.Tensor, beta: torch.Tensor, *,
                          discrete_a: bool = False, discrete_d: bool = False) -> Any:
    """The three grouped-GEMM bindings: resolve the operands (grouped tensors, or lists where
    the binding takes discrete A or D), run the GEMM of every group, then the bias add."""
    if discrete_d and bias is not None:
        raise RuntimeError("Bias is not supported for discrete output grouped GEMM.")
    if bias_scale is not None and bias is None:
        raise RuntimeError("bias_scale requires bias to be provided.")
    quantized = _quantized_grouped(B) or (any(map(_quant.is_quantized, A)) if discrete_a else _quantized_grouped(A))
    if quantized:  # the operands' members, each as the single-tensor GEMM reads it
        b = _quant_grouped.members(B)
        a = list(A) if discrete_a else _quant_grouped.members(A)
    else:
        b = _grouped_operand(name, "B", B)[1]
        a = _discrete_operand(name, "A", A) if discrete_a else _grouped_operand(name, "A", A)[1]
    d_members, d = ([], _discrete_operand(name, "D", D)) if discrete_d else _grouped_operand(name, "D", D)
    if not (len(a) == len(b) == len(d)):
        raise RuntimeError(f"Grouped GEMM requires A, B and D to have the same num_tensors "
                           f"(got {len(a)}, {len(b)} and {len(d)}).")
    _check_grouped_gemm_requirements(api)
    if quantized:
        _quant_grouped.check_operands(api, A, B, discrete_a, cuda_surface.capability())
    per_group = cuda_surface.capability() >= (10, 0)
    try:
        if quantized:
            _quant.grouped_tensor_gemm(a, transa, b, transb, d, alpha=alpha, beta=beta, per_group_alpha_beta=per_group)
        else:
            _grouped.grouped_gemm(a, transa, b, transb, d, alpha=alpha, beta=beta, per_group_alpha_beta=per_group,
                                  fp32_mode=fp32_mode())
        if bias is not None:  # the separate bias-add kernel TE runs after the GEMM (a second rounding)
            row_starts = [m.offset // m.cols if m.cols else 0 for m in d_members]
            scale = None if bias_scale is None else bias_scale.reshape(-1)
            _grouped.grouped_bias_add(d, _grouped_operand(name, "bias", bias)[1], scale, row_starts)
    except (_grouped.GroupedError, _gemm.GemmError) as exc:
        raise RuntimeError(f"{api}: {exc}") from None
    return D


def te_general_grouped_gemm_for_grouped_tensor(A: Any, transa: bool, B: Any, transb: bool, D: Any, bias: Any,
                                               bias_scale: torch.Tensor | None, alpha: torch.Tensor,
                                               beta: torch.Tensor, workspace_setup: torch.Tensor,
                                               workspace_cublas: torch.Tensor, use_split_accumulator: bool,
                                               math_sm_count: int) -> Any:
    """TE's ``te_general_grouped_gemm_for_grouped_tensor`` (``pytorch/csrc/extensions/gemm.cpp``):
    A, B and D are grouped tensors; ``D_i = alpha * op(B_i) @ op(A_i) + beta * D_i`` per group
    (``nvte_grouped_gemm``), then ``nvte_grouped_bias_add`` when ``bias`` is given (with
    ``bias_scale``: the scaled bias add). The workspaces and the split-accumulator / SM-count
    hints only steer CUDA. Returns ``D``, as the binding does."""
    return _grouped_gemm_binding("te_general_grouped_gemm_for_grouped_tensor", "nvte_grouped_gemm", A, transa, B,
                                 transb, D, bias, bias_scale, alpha, beta)


def te_general_grouped_gemm_for_discrete_in(A: Any, transa: bool, B: Any, transb: bool, D: Any, bias: Any,
                                            bias_scale: torch.Tensor | None, alpha: torch.Tensor,
                                            beta: torch.Tensor, workspace_setup: torch.Tensor,
                                            workspace_cublas: torch.Tensor, use_split_accumulator: bool,
                                            math_sm_count: int) -> Any:
    """``te_general_grouped_gemm_for_discrete_in``: A is a list of tensors (the per-group
    weights), B and D grouped tensors; otherwise as the grouped-tensor GEMM. Returns ``D``."""
    return _grouped_gemm_binding("te_general_grouped_gemm_for_discrete_in", "nvte_grouped_gemm_with_discrete_inputA",
                                 A, transa, B, transb, D, bias, bias_scale, alpha, beta, discrete_a=True)


def te_general_grouped_gemm_for_discrete_out(A: Any, transa: bool, B: Any, transb: bool, D: Any, bias: Any,
                                             bias_scale: torch.Tensor | None, alpha: torch.Tensor,
                                             beta: torch.Tensor, workspace_setup: torch.Tensor,
                                             workspace_cublas: torch.Tensor, use_split_accumulator: bool,
                                             math_sm_count: int) -> Any:
    """``te_general_grouped_gemm_for_discrete_out``: A and B grouped tensors, D a list of
    tensors (the per-group weight gradients, e.g. fp32 ``main_grad``s); no bias. Returns ``D``."""
    return _grouped_gemm_binding("te_general_grouped_gemm_for_discrete_out", "nvte_grouped_gemm_with_discrete_out",
                                 A, transa, B, transb, D, bias, bias_scale, alpha, beta, discrete_d=True)


# ---- version and device queries -----------------------------------------------------------
def get_cublasLt_version() -> int:
    return _CUBLASLT[0]


def get_cudnn_version() -> int:
    return CUDNN_VERSION


def get_num_cublas_streams() -> int:
    return NUM_CUBLAS_STREAMS


KERNELS: dict[str, Callable[..., Any]] = {
    "generic_gemm": generic_gemm,
    "te_general_grouped_gemm": te_general_grouped_gemm,
    "layernorm_fwd": layernorm_fwd,
    "layernorm_bwd": layernorm_bwd,
    "rmsnorm_fwd": rmsnorm_fwd,
    "rmsnorm_bwd": rmsnorm_bwd,
    "splits_to_offsets_multi": splits_to_offsets_multi,
    "get_grouped_gemm_setup_workspace_size": get_grouped_gemm_setup_workspace_size,
    "te_general_grouped_gemm_for_grouped_tensor": te_general_grouped_gemm_for_grouped_tensor,
    "te_general_grouped_gemm_for_discrete_in": te_general_grouped_gemm_for_discrete_in,
    "te_general_grouped_gemm_for_discrete_out": te_general_grouped_gemm_for_discrete_out,
    "get_cublasLt_version": get_cublasLt_version,
    "get_cudnn_version": get_cudnn_version,
    "get_num_cublas_streams": get_num_cublas_streams,
}
# the quantization surface (harness/backends/te_cpu/quant): quantize, dequantize, the recipes' updates, ...
from harness.backends.te_cpu.quant import bindings as _quant  # noqa: E402  (reads this module's names when called)
from harness.backends.te_cpu.quant import grouped as _quant_grouped  # noqa: E402

KERNELS.update(_quant.KERNELS)
KERNELS.update(_quant_grouped.KERNELS)


# ---- everything else: stubs that fail when called -----------------------------------------
def _stub_function(name: str) -> Callable[..., Any]:
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise missing(name)

    stub.__name__ = stub.__qualname__ = name
    stub.__module__ = MODULE_NAME
    stub.__doc__ = f"No CPU kernel: calling {MODULE_NAME}.{name} raises MissingCpuKernel."
    return stub


def _stub_class(name: str) -> type:
    """A class TE names in annotations or ``isinstance`` checks; instantiating it fails."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise missing(name)

    return _StubType(name, (), {"__init__": __init__, "__module__": MODULE_NAME,
                                "__doc__": f"No CPU implementation of {MODULE_NAME}.{name}."})


class _StubType(type):
    """A stub class's missing class attributes raise :class:`MissingExtensionAttribute`."""

    def __getattr__(cls, name: str) -> Any:
        if _is_private(name):
            raise AttributeError(name)
        raise MissingExtensionAttribute(f"{MODULE_NAME}.{cls.__name__}.{name}")


#: the other names TE 2.20.2's PyTorch sources reference on ``tex`` (``te_tree_scan.referenced_names``;
#: a test keeps this list complete for the installed TE). Capitalised ones are classes.
STUBBED: tuple[str, ...] = (
    "CommOverlap", "CommOverlapHelper", "CommOverlapP2P", "FP8TensorMeta", "LayerNorm",
    "bgrad_group_quantize", "bgrad_quantize", "bulk_overlap_ag_with_external_gemm",
    "clamped_dswiglu", "clamped_swiglu", "compute_amax", "convert_bshd_to_thd",
    "convert_thd_to_bshd", "copy_data_ptrs_to_device", "copy_to_kv_cache",
    "create_empty_quantized_tensor", "cusolvermp_ctx_create", "cusolvermp_ctx_destroy",
    "dbias_dgelu", "dbias_dqgelu", "dbias_drelu", "dbias_dsilu", "dbias_dsrelu", "dequantize",
    "device_supports_multicast", "dgeglu", "dgelu", "dglu", "dqgeglu", "dqgelu", "dreglu",
    "drelu", "dropout_bwd", "dropout_fwd", "dsilu", "dsituglu", "dsreglu", "dsrelu", "dswiglu",
    "ep_combine", "ep_combine_bwd", "ep_dispatch", "ep_dispatch_bwd", "ep_finalize",
    "ep_get_zero_copy", "ep_handle_mem_size", "ep_initialize", "ep_prepare",
    "ep_prepare_and_dispatch", "ep_zero_copy_supported", "fa_prepare_bwd", "fa_prepare_fwd",
    "fp8_block_scaling_compute_partial_amax", "fp8_block_scaling_partial_cast", "fp8_transpose",
    "fused_amax_and_scale_update_after_reduction", "fused_attn_bwd", "fused_attn_fwd",
    "fused_moe_aux_loss_bwd", "fused_moe_aux_loss_fwd", "fused_moe_aux_loss_fwd_graph_safe",
    "fused_multi_row_padding", "fused_multi_row_unpadding", "fused_qkv_rope_backward",
    "fused_qkv_rope_forward", "fused_rope_backward", "fused_rope_forward",
    "fused_score_for_moe_aux_loss_bwd", "fused_score_for_moe_aux_loss_fwd",
    "fused_topk_with_score_function_bwd", "fused_topk_with_score_function_fwd",
    "fused_topk_with_score_function_qb_fwd", "geglu", "gelu", "get_fused_attn_backend",
    "get_stream_priority_range", "glu",
    "group_quantize", "group_requantize_inplace", "grouped_mlp_experimental",
    "grouped_swizzle_for_gemm", "moe_permute_bwd", "moe_permute_fwd", "moe_unpermute_bwd",
    "moe_unpermute_fwd", "multi_tensor_adam",
    "multi_tensor_adam_capturable", "multi_tensor_adam_capturable_master",
    "multi_tensor_adam_fp8", "multi_tensor_adam_param_remainder",
    "multi_tensor_compute_scale_and_scale_inv", "multi_tensor_compute_scale_inv_e8m0",
    "multi_tensor_l2norm", "multi_tensor_scale", "multi_tensor_scale_tensor",
    "multi_tensor_sgd", "multi_tensor_swizzle_scales_for_gemm_unchecked_",
    "multi_tensor_transpose_to_bhsd", "multi_tensor_unscale_l2norm",
    "mxfp8_scaling_compute_partial_amax", "mxfp8_scaling_partial_cast", "newton_schulz",
    "nvfp4_2d_multi_tensor_transpose", "nvfp4_2d_scale_transpose", "nvfp4_compute_global_scale",
    "nvfp4_data_transpose", "nvfp4_group_quantize_with_amax",
    "nvfp4_multi_tensor_2d_partial_cast", "nvfp4_multi_tensor_compute_partial_amax",
    "nvfp4_multi_tensor_fused_scale", "nvfp4_quantize_with_amax", "qgeglu", "qgelu", "quantize",
    "reglu", "relu", "rmsnorm_bwd_add", "scaled_aligned_causal_masked_softmax_backward",
    "scaled_aligned_causal_masked_softmax_forward", "scaled_clamped_dswiglu",
    "scaled_clamped_swiglu", "scaled_dsituglu", "scaled_dsrelu", "scaled_dswiglu",
    "scaled_masked_softmax_backward", "scaled_masked_softmax_forward", "scaled_situglu",
    "scaled_softmax_backward", "scaled_softmax_forward", "scaled_srelu", "scaled_swiglu",
    "scaled_upper_triang_masked_softmax_backward", "scaled_upper_triang_masked_softmax_forward",
    "silu", "situglu", "split_quantize", "splits_to_offsets",
    "sreglu", "srelu", "swap_first_dims", "swiglu", "swizzle_scales_for_gemm_",
    "thd_copy_valid_tokens_from_per_split_to_rank_local", "thd_cp_rank_order_to_sequence_order",
    "thd_get_partitioned_indices", "thd_grad_correction", "thd_out_correction",
    "thd_read_half_tensor", "thd_read_second_half_lse", "thd_second_half_lse_correction",
    "thd_sequence_order_to_cp_rank_order", "ubuf_built_with_mpi",
)


def _module_getattr(name: str) -> Any:
    """PEP 562 ``__getattr__`` of the stand-in: an unknown name raises
    :class:`MissingExtensionAttribute` (an ``AttributeError``) naming it."""
    if _is_private(name):
        raise AttributeError(f"module {MODULE_NAME!r} has no attribute {name!r}")
    raise MissingExtensionAttribute(f"{MODULE_NAME}.{name}")


def build(te_root: Path | None = None) -> ModuleType:
    """A fresh ``transformer_engine_torch`` module: enums, kernels, queries and stubs.

    Args:
        te_root: a TE source tree's ``transformer_engine/`` folder to build the stand-in for
            (``harness.te_tree.tree``): the stubs are the names its Python references, the enums
            follow its bindings and headers (:mod:`harness.te_tree.scan`; built-in ones where
            it has none). None: TE 2.20.2 as installed (``STUBBED``, the built-in ``ENUMS``).

    Nothing in this module changes: a tree's enums are new classes on the returned module
    only. The kernels read TE's ``DType`` values through the stand-in the process has
    registered under ``transformer_engine_torch`` (:func:`torch_dtype`).
    """
    if te_root is None:
        return _assemble(ENUMS, STUBBED)
    te_root = Path(te_root)
    found = _scan.tree_enums(te_root, {cls.__name__: {m.name: int(m.value) for m in cls} for cls in ENUMS})
    # kept beside te-cpu's Triton launches when that folder is shared (the test suite's)
    referenced = _scan.referenced_names(te_root, launch_memo.folder()) - {"*"}
    builtin = [cls.__name__ for cls in ENUMS]
    # te-cpu's enums, then those the tree references and binds that te-cpu does not know
    names = builtin + sorted(n for n in referenced & set(found) if n not in builtin)
    return _assemble(tuple(_enum(name, found[name]) for name in names), referenced - set(names))


def _assemble(enums: Sequence[type[_PybindEnum]], stubbed: Iterable[str]) -> ModuleType:
    """The stand-in module with these enums, every kernel, and a stub for each other name."""
    mod = ModuleType(MODULE_NAME, __doc__)
    mod.__file__ = __file__
    mod.__getattr__ = _module_getattr  # type: ignore[attr-defined]
    for cls in enums:
        setattr(mod, cls.__name__, cls)
    for name, fn in KERNELS.items():
        setattr(mod, name, fn)
    for name in sorted(set(stubbed) - set(KERNELS)):
        setattr(mod, name, _stub_class(name) if name[0].isupper() else _stub_function(name))
    return mod
