"""Per-tensor FP8 (``DelayedScaling`` and ``Float8CurrentScaling``): one fp32 scale a tensor.

TE's cast kernels (``common/cast/fp8/quantize_fp8.cuh``, ``common/transpose/cast_transpose.cu``)
compute ``fp8(float(x) * scale)`` - the product rounded to fp32, then the saturating FP8 cast
(:mod:`.formats`) - write ``scale_inv = 1 / scale`` and, where the tensor carries an amax
(delayed scaling), raise it to the input's largest magnitude (an atomic max: the amax keeps
growing over every cast until the recipe's update zeroes it). The column-wise data of a
per-tensor tensor is the row-wise data transposed (the input flattened to 2-D over its
leading dimensions), under the same scale. Dequantizing multiplies by ``scale_inv`` in fp32
(``dequantize_fp8.cuh``).
"""

from __future__ import annotations

from typing import Any

import torch

from . import scaling
from .formats import Fp8Format, fp8_format
from .qgemm import Operand, QGemmError
from .tensors import new_tensor


def cast(x: torch.Tensor, scale: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """``x`` scaled and cast to ``fmt``'s bytes, same shape (module docstring)."""
    return fmt.encode(x.to(torch.float32) * scale.to(torch.float32).reshape(()))


def transpose_2d(data: torch.Tensor) -> torch.Tensor:
    """``[d0, ..., dn]`` -> ``[dn, d0*...*d(n-1)]`` contiguous (TE's ``make_transpose_shape``
    keeps the leading dims: ``[dn, d0, ..., d(n-1)]``)."""
    if data.dim() == 0:
        return data.clone()
    flat = data.reshape(-1, data.shape[-1])
    return flat.t().contiguous().reshape(data.shape[-1], *data.shape[:-1])


def decode(data: torch.Tensor, scale_inv: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """Bytes times ``scale_inv`` in fp32 (TE's dequantize before the output rounding)."""
    return fmt.decode(data) * scale_inv.to(torch.float32).reshape(())


# ---- TE's Float8Tensor / Float8TensorStorage (the extension's Float8Quantizer and
# ---- Float8CurrentScalingQuantizer: pytorch/csrc/quantizer.cpp) ----------------------------

def non_tn() -> bool:
    """Whether the presented device takes non-TN FP8 GEMMs (Blackwell): then a per-tensor FP8
    tensor keeps its row-wise data for both usages and no transpose (``nvte_is_non_tn_fp8_gemm_supported``)."""
    from transformer_engine.pytorch.utils import is_non_tn_fp8_gemm_supported
    return bool(is_non_tn_fp8_gemm_supported())


#: what an uninitialized FP8 code reads as on te-cpu: 0xFF, NaN in both E4M3 and E5M2
UNINITIALIZED_CODE = 0xFF


def _uninitialized(shape: list[int], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Memory TE allocates and does not write (``create_tensor``): NaN codes, a NaN scale. On a
    GPU it holds whatever the allocator had; here a read of it shows in the values instead of
    depending on the CPU allocator's leftovers (a buffer nobody fills: docs/megatron.md)."""
    if dtype == torch.uint8:
        return torch.full(shape, UNINITIALIZED_CODE, dtype=torch.uint8)
    return torch.full(shape, float("nan"), dtype=dtype)


def _transpose_shape(shape: list[int]) -> list[int]:
    return [shape[-1], *shape[:-1]] if shape else []


def create(quantizer: Any, shape: list[int], fake_dtype: torch.dtype, *, delayed: bool) -> Any:
    """``Float8Quantizer::create_tensor`` / ``Float8CurrentScalingQuantizer::create_tensor``:
    uninitialized data (and transpose where the device needs one); ``scale_inv`` is
    ``1 / scale`` for delayed scaling, uninitialized for current scaling (:func:`_uninitialized`)."""
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor
    from transformer_engine.pytorch.tensor.storage.float8_tensor_storage import Float8TensorStorage
    nt = non_tn()
    data = _uninitialized(shape) if (quantizer.rowwise_usage or nt) else None
    transpose = _uninitialized(_transpose_shape(shape)) if (quantizer.columnwise_usage and not nt) else None
    scale_inv = torch.reciprocal(quantizer.scale) if delayed else _uninitialized([1], torch.float32)
    return new_tensor(Float8Tensor, Float8TensorStorage, shape, fake_dtype, data=data, fp8_scale_inv=scale_inv,
                      fp8_dtype=quantizer.dtype, data_transpose=transpose, quantizer=quantizer)


def convert_and_update(quantizer: Any, tensor: Any) -> list[int]:
    """``convert_and_update_tensor``: give an existing Float8Tensor the buffers the
    quantizer's usages need (allocating or dropping data and transpose); returns its shape."""
    nt = non_tn()
    need_data = quantizer.rowwise_usage or nt
    need_t = quantizer.columnwise_usage and not nt
    if not (need_data or need_t):
        raise RuntimeError("Invalid usages for Float8Quantizer.")
    data, t = tensor._data, tensor._transpose
    if data is None and t is None:
        raise RuntimeError("Float8Tensor has no data.")
    shape = list(data.shape) if t is None else [*t.shape[1:], t.shape[0]]
    if data is not None and t is not None and list(data.shape) != shape:
        raise RuntimeError(f"FP8 data (shape={list(data.shape)}) and transpose (shape={list(t.shape)}) do not match")
    if data is not None and not need_data:
        tensor._data = None
    elif data is None and need_data:
        tensor._data = _uninitialized(shape)
    if t is not None and not need_t:
        tensor._transpose = None
    elif t is None and need_t:
        tensor._transpose = _uninitialized(_transpose_shape(shape))
    tensor._transpose_invalid = not need_t
    tensor._fp8_dtype = quantizer.dtype
    return shape


@torch.no_grad()
def quantize_into(quantizer: Any, src: torch.Tensor, dst: Any, noop: torch.Tensor | None, *,
                  delayed: bool, amax_value: torch.Tensor | None = None) -> None:
    """Fill ``dst`` from ``src`` (``Float8Quantizer::quantize`` / ``Float8CurrentScalingQuantizer::
    quantize_impl``). Delayed: the quantizer's scale, its amax raised to ``src``'s. Current: the
    amax of ``src`` (or ``amax_value``), all-reduced (MAX) over the quantizer's group when it
    asks, the scale from it (:func:`scaling.scale_from_amax`). A set ``noop`` flag skips it all."""
    if src.numel() == 0:
        return
    if dst._data is None and dst._transpose is not None:
        raise NotImplementedError("Columnwise-only per-tensor FP8 quantization is not implemented; "
                                  "the cast-transpose kernel requires rowwise output storage.")
    if noop is not None and float(noop.reshape(-1)[0]) == 1.0:
        return
    fmt = fp8_format(quantizer.dtype)
    if delayed:
        scale = quantizer.scale.to(torch.float32)
        quantizer.amax.copy_(torch.maximum(quantizer.amax, scaling.amax(src).reshape(quantizer.amax.shape)))
    else:
        amax = scaling.amax(src) if amax_value is None else amax_value.to(torch.float32).reshape(1).clone()
        if quantizer.with_amax_reduction:
            import torch.distributed as dist
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=quantizer._canonicalized_amax_reduction_group())
        scale = scaling.scale_from_amax(amax, fmt.max, force_pow_2=bool(quantizer.force_pow_2_scales),
                                        epsilon=float(quantizer.amax_epsilon))
    data = cast(src.reshape(dst._data.shape), scale, fmt)
    dst._data.copy_(data)
    if dst._transpose is not None and not dst._transpose_invalid:
        dst._transpose.copy_(transpose_2d(data))
    dst._scale_inv.copy_(scaling.reciprocal(scale).reshape(dst._scale_inv.shape))


@torch.no_grad()
def quantize_grouped(quantizer: Any, srcs: list[torch.Tensor], dsts: list[Any], amax_out: torch.Tensor,
                     scale_out: torch.Tensor, noop: torch.Tensor | None) -> None:
    """Grouped current scaling (``group_quantize`` of ``extensions/cast.cpp``:
    ``nvte_group_compute_amax_with_config``, the optional all-reduce of the amax buffer,
    ``nvte_group_compute_scale_from_amax``, then ``nvte_group_quantize``): each member's amax
    (an empty member's is 0), the whole ``[num_tensors]`` amax buffer all-reduced (MAX) once
    when the quantizer asks, each member's scale from its amax (:func:`scaling.scale_from_amax`:
    amax 0 gives 1), and each member cast - row-wise data and/or the transpose, which TE's
    grouped kernel writes without the row-wise data too. A set ``noop`` flag skips it all
    (the cached scale kept). ``amax_out`` / ``scale_out`` are the grouped tensor's buffers."""
    if noop is not None and float(noop.reshape(-1)[0]) == 1.0:
        return
    fmt = fp8_format(quantizer.dtype)
    amax = torch.cat([scaling.amax(s).reshape(1) for s in srcs])  # an empty member's: 0
    if quantizer.with_amax_reduction:
        import torch.distributed as dist
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=quantizer._canonicalized_amax_reduction_group())
    amax_out.copy_(amax.reshape(amax_out.shape))
    for i, (src, dst) in enumerate(zip(srcs, dsts)):
        scale = scaling.scale_from_amax(amax[i].reshape(1), fmt.max, force_pow_2=bool(quantizer.force_pow_2_scales),
                                        epsilon=float(quantizer.amax_epsilon))
        scale_out[i].copy_(scale.reshape(()))
        dst._scale_inv.copy_(scaling.reciprocal(scale).reshape(dst._scale_inv.shape))
        if src.numel() == 0:
            continue
        data = cast(src, scale, fmt)
        if dst._data is not None:
            dst._data.copy_(data.reshape(dst._data.shape))
        if dst._transpose is not None:
            dst._transpose.copy_(transpose_2d(data).reshape(dst._transpose.shape))


def dequantize(tensor: Any, out_dtype: torch.dtype) -> torch.Tensor:
    """``tex.dequantize`` of a per-tensor FP8 tensor (its row-wise data)."""
    if tensor._data is None:
        raise RuntimeError("Input tensor has no row-wise data to dequantize")
    return decode(tensor._data, tensor._scale_inv, fp8_format(tensor._fp8_dtype)).to(out_dtype)


def operand(tensor: Any, rowwise: bool, name: str) -> Operand:
    """The GEMM operand ``CanonicalizeGemmInput`` takes from a per-tensor FP8 tensor, as
    ``[rows, K]``. ``rowwise``: the GEMM reads the tensor with K along its rows (``transa``
    for A, ``not transb`` for B): the row-wise data. Otherwise Hopper needs the column-wise
    data (the transpose; "Input A is missing column-wise usage" without it), while Blackwell
    reads the row-wise data in any layout, or the transpose with the mirrored flag."""
    fmt = fp8_format(tensor._fp8_dtype)
    data = tensor._data
    t = tensor._transpose if not tensor._transpose_invalid else None
    if data is None and t is None:
        raise RuntimeError(f"Input {name} does not hold any data!")
    nt = non_tn()
    if rowwise and data is not None:
        buf, k_last = data, True
    elif rowwise and nt:
        buf, k_last = t, False
    elif rowwise:
        raise RuntimeError(f"Input {name} is missing row-wise usage")
    elif t is not None and not (nt and data is not None):
        buf, k_last = t, True
    elif nt:
        buf, k_last = data, False
    else:
        raise RuntimeError(f"Input {name} is missing column-wise usage")
    if buf.shape[-1] % 16:
        raise QGemmError(f"Leading dimension requirement on {name} for FP8 GEMM. Caller must pad.")
    mat = fmt.decode(buf).reshape(-1, buf.shape[-1])
    mat = mat if k_last else mat.t()
    return Operand(mat.contiguous(), tensor._scale_inv.to(torch.float32).reshape(()))
