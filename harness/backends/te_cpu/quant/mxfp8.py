"""MXFP8 (``MXFP8BlockScaling``): FP8 elements, one E8M0 scale per 32 consecutive elements.

TE's kernel (``common/cast/mxfp8/quantize_mxfp8.cuh``), per block of 32: the block's amax
(largest magnitude of the fp32 input values, NaNs dropped by ``fmaxf``), its E8M0 exponent
``float_to_e8m0(amax * (1 / fp8_max))`` (rounded up to a power of two: :mod:`.formats`), and
each element ``fp8(x * 2^(127 - e))`` - a power-of-two factor, so only the FP8 cast rounds.
Row-wise data has blocks along the last dimension (scales ``[roundup(rows, 128),
roundup(cols / 32, 4)]``); column-wise data has the same shape as the input, blocks along
the first (flattened) dimension (scales ``[roundup(rows / 32, 4), roundup(cols, 128)]``). The
two are quantized independently from the input (not transposes of each other). The padding of
the scale buffers is left uninitialized by TE; here it is zero. With
``optimize_for_gemm`` the scales are written in the GEMM's swizzled layout (:mod:`.swizzle`).
A value decodes to ``fp8 * 2^(e - 127)``, exact in fp32.
"""

from __future__ import annotations

from typing import Any

import torch

from . import swizzle as _swz
from .formats import Fp8Format, e8m0_decode, e8m0_reciprocal, e8m0_round_up, fp8_format
from .qgemm import Operand
from .tensors import missing as _missing, new_tensor, roundup as _roundup

BLOCK = 32


def scale_shape(shape: list[int], columnwise: bool) -> list[int]:
    """``MXFP8Quantizer::get_scale_shape``."""
    cols = shape[-1]
    rows = 1
    for s in shape[:-1]:
        rows *= s
    if cols % BLOCK or rows % BLOCK:
        raise RuntimeError(f"MXFP8 requires tensor dims that are divisible by {BLOCK} (got shape={shape})")
    if columnwise:
        return [_roundup(rows // BLOCK, 4), _roundup(cols, 128)]
    return [_roundup(rows, 128), _roundup(cols // BLOCK, 4)]


def _block_amax(blocks: torch.Tensor) -> torch.Tensor:
    a = blocks.abs()
    return torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(dim=-1)


def quantize_blocks(x: torch.Tensor, fmt: Fp8Format) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``x`` (fp32 ``[R, C]``) in blocks of 32 along C: (FP8 bytes ``[R, C]``, E8M0
    exponents ``[R, C / 32]``)."""
    r, c = x.shape
    blocks = x.to(torch.float32).reshape(r, c // BLOCK, BLOCK)
    rcp = torch.tensor(1.0 / fmt.max, dtype=torch.float32)
    exps = e8m0_round_up(_block_amax(blocks) * rcp)
    data = fmt.encode(blocks * e8m0_reciprocal(exps).unsqueeze(-1))
    return data.reshape(r, c), exps


def decode_blocks(data: torch.Tensor, exps: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """Inverse of :func:`quantize_blocks` up to the cast: ``fp8 * 2^(e - 127)`` in fp32 (exact)."""
    r, c = data.shape
    vals = fmt.decode(data).reshape(r, c // BLOCK, BLOCK) * e8m0_decode(exps[:r, :c // BLOCK]).unsqueeze(-1)
    return vals.reshape(r, c)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


# ---- TE's MXFP8Tensor / MXFP8TensorStorage (pytorch/csrc/quantizer.cpp MXFP8Quantizer) --------
def create(quantizer: Any, shape: list[int], fake_dtype: torch.dtype) -> Any:
    """``MXFP8Quantizer::create_tensor``."""
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Tensor
    from transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage import MXFP8TensorStorage
    row_s, col_s = scale_shape(shape, False), scale_shape(shape, True)
    rows = quantizer.rowwise_usage
    cols = quantizer.columnwise_usage
    kwargs = dict(
        rowwise_data=torch.empty(shape, dtype=torch.uint8) if rows else None,
        columnwise_data=torch.empty(shape, dtype=torch.uint8) if cols else None,
        rowwise_scale_inv=torch.empty(row_s, dtype=torch.uint8) if rows else None,
        columnwise_scale_inv=torch.empty(col_s, dtype=torch.uint8) if cols else None,
        fp8_dtype=quantizer.dtype, quantizer=quantizer,
        with_gemm_swizzled_scales=bool(quantizer.optimize_for_gemm))
    return new_tensor(MXFP8Tensor, MXFP8TensorStorage, shape, fake_dtype, **kwargs)


def convert_and_update(quantizer: Any, tensor: Any) -> list[int]:
    """``MXFP8Quantizer::convert_and_update_tensor``: buffers for the quantizer's usages."""
    rd, cd = tensor._rowwise_data, tensor._columnwise_data
    if rd is None and cd is None:
        raise RuntimeError("MXFP8Tensor has no data.")
    shape = list(cd.shape if cd is not None else rd.shape)
    if rd is not None and cd is not None and list(rd.shape) != shape:
        raise RuntimeError(f"MXFP8 row-wise data (shape={list(rd.shape)}) and column-wise data "
                           f"(shape={shape}) do not match")
    for usage, data_attr, scale_attr, columnwise in (
            (quantizer.rowwise_usage, "_rowwise_data", "_rowwise_scale_inv", False),
            (quantizer.columnwise_usage, "_columnwise_data", "_columnwise_scale_inv", True)):
        if usage:
            if getattr(tensor, data_attr) is None:
                setattr(tensor, data_attr, torch.empty(shape, dtype=torch.uint8))
            if getattr(tensor, scale_attr) is None:
                setattr(tensor, scale_attr, torch.empty(scale_shape(shape, columnwise), dtype=torch.uint8))
        else:
            setattr(tensor, data_attr, None)
            setattr(tensor, scale_attr, None)
    tensor._fp8_dtype = quantizer.dtype
    tensor._with_gemm_swizzled_scales = bool(quantizer.optimize_for_gemm)
    return shape


@torch.no_grad()
def quantize_into(quantizer: Any, src: torch.Tensor, dst: Any, noop: torch.Tensor | None) -> None:
    """``MXFP8Quantizer::quantize``: row-wise and/or column-wise data and scales from ``src``."""
    if src.numel() == 0:
        return
    if getattr(quantizer, "with_2d_quantization", False):
        raise _missing("MXFP8 2D block quantization (enable_2d_quantization)")
    if noop is not None and float(noop.reshape(-1)[0]) == 1.0:
        return
    fmt = fp8_format(quantizer.dtype)
    x = _flat(src.to(torch.float32))
    swizzled = bool(dst._with_gemm_swizzled_scales)
    if dst._rowwise_data is not None:
        data, exps = quantize_blocks(x, fmt)
        dst._rowwise_data.copy_(data.reshape(dst._rowwise_data.shape))
        _store_scales(dst._rowwise_scale_inv, exps, swizzled, columnwise=False)
    if dst._columnwise_data is not None:
        data_t, exps_t = quantize_blocks(x.t().contiguous(), fmt)
        dst._columnwise_data.copy_(data_t.t().reshape(dst._columnwise_data.shape))
        _store_scales(dst._columnwise_scale_inv, exps_t.t(), swizzled, columnwise=True)


def _store_scales(buf: torch.Tensor, exps: torch.Tensor, swizzled: bool, *, columnwise: bool) -> None:
    """Write ``exps`` into the padded buffer (zero padding), swizzled if asked."""
    full = torch.zeros(buf.shape, dtype=torch.uint8)
    full[:exps.shape[0], :exps.shape[1]] = exps
    if swizzled:
        full = _swz.swizzle_columnwise(full) if columnwise else _swz.swizzle(full)
    buf.copy_(full)


def _linear_scales(buf: torch.Tensor, swizzled: bool, *, columnwise: bool) -> torch.Tensor:
    if not swizzled:
        return buf
    return _swz.unswizzle_columnwise(buf) if columnwise else _swz.unswizzle(buf)


def decode_rowwise(tensor: Any) -> torch.Tensor:
    """The row-wise data as fp32 ``[rows, cols]`` (flattened), exact."""
    data = _flat(tensor._rowwise_data)
    exps = _linear_scales(tensor._rowwise_scale_inv, tensor._with_gemm_swizzled_scales, columnwise=False)
    return decode_blocks(data, exps, fp8_format(tensor._fp8_dtype))


def decode_columnwise(tensor: Any) -> torch.Tensor:
    """The column-wise data as fp32 ``[rows, cols]`` (flattened), exact."""
    data = _flat(tensor._columnwise_data)
    exps = _linear_scales(tensor._columnwise_scale_inv, tensor._with_gemm_swizzled_scales, columnwise=True)
    r, c = data.shape
    return decode_blocks(data.t().contiguous(), exps[:r // BLOCK, :c].t().contiguous(),
                         fp8_format(tensor._fp8_dtype)).t()


def dequantize(tensor: Any, out_dtype: torch.dtype) -> torch.Tensor:
    """``tex.dequantize`` (``dequantize_mxfp8.cuh``): the row-wise data when present, else the
    column-wise data, rounded once to ``out_dtype``."""
    if tensor._rowwise_data is not None:
        vals, shape = decode_rowwise(tensor), tensor._rowwise_data.shape
    elif tensor._columnwise_data is not None:
        vals, shape = decode_columnwise(tensor), tensor._columnwise_data.shape
    else:
        raise RuntimeError("Cannot dequantize tensor without rowwise data.")
    return vals.reshape(shape).to(out_dtype)


def operand(tensor: Any, rowwise: bool, name: str) -> Operand:
    """``CanonicalizeGemmInput`` for MXFP8: row-wise data (blocks along K) when the GEMM reads
    the tensor with K along its rows, else the column-wise data (blocks along the other dim)."""
    one = torch.ones((), dtype=torch.float32)
    if rowwise:
        if tensor._rowwise_data is None:
            raise RuntimeError(f"Input {name} is missing row-wise usage")
        return Operand(decode_rowwise(tensor).contiguous(), one)
    if tensor._columnwise_data is None:
        raise RuntimeError(f"Input {name} is missing column-wise usage")
    return Operand(decode_columnwise(tensor).t().contiguous(), one)
