"""FP8 block scaling (``Float8BlockScaling``): FP8 elements, one fp32 scale per block.

Blocks (``common/transpose/quantize_transpose_vector_blockwise.cu``, ``..._square_blockwise.cu``):
1D - 128 consecutive elements of a row (activations and gradients by default); 2D - 128x128
tiles (weights by default). Per block: amax (NaNs dropped), ``scale =
compute_scale_from_types<IType, OType>(amax, epsilon, pow_2)`` - TE's per-tensor rule
(:func:`.scaling.scale_from_amax`) with an infinite scale replaced by the *input* type's
largest value - the elements ``fp8(x * scale)``, and ``scale_inv = 1 / scale`` (in double for
1D, ``1.0f / scale`` for 2D; identical for the default power-of-two scales).

Layout (``Float8BlockQuantizer::create_tensor`` / ``get_scale_shape``): row-wise data has the
input's shape; column-wise data is stored transposed (``[cols, rows...]``: Hopper's FP8 GEMM is
TN-only) and quantized along the other dimension - for 1D, blocks of 128 input rows in each
column (a different quantization, not a transpose of the row-wise data); for 2D the same tiles
and scales, transposed. Scales: 1D row-wise ``[ceil(cols/128), roundup(rows, 4)]`` (already
transposed: "GEMM ready"), 1D column-wise ``[ceil(rows/128), roundup(cols, 4)]``, 2D row-wise
``[ceil(rows/128), roundup(ceil(cols/128), 4)]``, 2D column-wise ``[ceil(cols/128),
roundup(ceil(rows/128), 4)]``; padding zero here (uninitialized in TE).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import scaling
from .formats import Fp8Format, fp8_format
from .qgemm import Operand, QGemmError
from .tensors import new_tensor, roundup as _roundup

BLOCK = 128


def _dims(shape: list[int]) -> tuple[int, int]:
    k = shape[-1] if shape else 1
    return (math.prod(shape) // k if k else 0), k


def scale_shape(shape: list[int], columnwise: bool, dim: int) -> list[int]:
    """``Float8BlockQuantizer::get_scale_shape``."""
    m, k = _dims(shape)
    cb = lambda x: -(-x // BLOCK)  # noqa: E731
    if dim == 2:
        return [cb(k), _roundup(cb(m), 4)] if columnwise else [cb(m), _roundup(cb(k), 4)]
    return [cb(m), _roundup(k, 4)] if columnwise else [cb(k), _roundup(m, 4)]


def value_for_inf(input_dtype: torch.dtype) -> float:
    """The input type's largest finite value (``TypeInfo<IType>::max_finite_value``)."""
    return float(torch.finfo(input_dtype).max)


def _scales(amax: torch.Tensor, fmt: Fp8Format, quantizer: Any, input_dtype: torch.dtype) -> torch.Tensor:
    return scaling.scale_from_amax(amax, fmt.max, force_pow_2=bool(quantizer.force_pow_2_scales),
                                   epsilon=float(quantizer.amax_epsilon), value_for_inf=value_for_inf(input_dtype))


def _nan0(a: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(a), torch.zeros_like(a), a)


def quantize_1d(x: torch.Tensor, fmt: Fp8Format, quantizer: Any,
                input_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``x`` (fp32 ``[R, C]``) in blocks of 128 along C: (bytes ``[R, C]``, scale_inv
    ``[R, ceil(C/128)]`` in fp32)."""
    r, c = x.shape
    nb = -(-c // BLOCK)
    pad = torch.zeros(r, nb * BLOCK, dtype=torch.float32)
    pad[:, :c] = x
    blocks = pad.reshape(r, nb, BLOCK)
    scale = _scales(_nan0(blocks.abs()).amax(-1), fmt, quantizer, input_dtype)
    data = fmt.encode(blocks * scale.unsqueeze(-1)).reshape(r, nb * BLOCK)[:, :c]
    scale_inv = (1.0 / scale.to(torch.float64)).to(torch.float32)
    return data.contiguous(), scale_inv


def quantize_2d(x: torch.Tensor, fmt: Fp8Format, quantizer: Any,
                input_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (fp32 ``[R, C]``) in 128x128 tiles: (bytes ``[R, C]``, scale_inv
    ``[ceil(R/128), ceil(C/128)]``)."""
    r, c = x.shape
    br, bc = -(-r // BLOCK), -(-c // BLOCK)
    pad = torch.zeros(br * BLOCK, bc * BLOCK, dtype=torch.float32)
    pad[:r, :c] = x
    tiles = pad.reshape(br, BLOCK, bc, BLOCK)
    scale = _scales(_nan0(tiles.abs()).amax(dim=(1, 3)), fmt, quantizer, input_dtype)
    data = fmt.encode(tiles * scale[:, None, :, None]).reshape(br * BLOCK, bc * BLOCK)[:r, :c]
    scale_inv = torch.ones_like(scale) / scale
    return data.contiguous(), scale_inv


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)


def _store(buf: torch.Tensor, values: torch.Tensor) -> None:
    full = torch.zeros(buf.shape, dtype=torch.float32)
    full[:values.shape[0], :values.shape[1]] = values
    buf.copy_(full)


# ---- TE's Float8BlockwiseQTensor / ...Storage ---------------------------------------------------
def create(quantizer: Any, shape: list[int], fake_dtype: torch.dtype) -> Any:
    """``Float8BlockQuantizer::create_tensor``."""
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockwiseQTensor
    from transformer_engine.pytorch.tensor.storage.float8_blockwise_tensor_storage import (
        Float8BlockwiseQTensorStorage)
    dim = int(quantizer.block_scaling_dim)
    if dim not in (1, 2):
        raise RuntimeError("Unsupported block scaling dim.")
    t_shape = [shape[-1], *shape[:-1]] if shape else []
    rows, cols = quantizer.rowwise_usage, quantizer.columnwise_usage
    kwargs = dict(
        rowwise_data=torch.empty(shape, dtype=torch.uint8) if rows else None,
        rowwise_scale_inv=torch.empty(scale_shape(shape, False, dim), dtype=torch.float32) if rows else None,
        columnwise_data=torch.empty(t_shape, dtype=torch.uint8) if cols else None,
        columnwise_scale_inv=torch.empty(scale_shape(shape, True, dim), dtype=torch.float32) if cols else None,
        fp8_dtype=quantizer.dtype, quantizer=quantizer, is_2D_scaled=dim == 2)
    return new_tensor(Float8BlockwiseQTensor, Float8BlockwiseQTensorStorage, shape, fake_dtype, **kwargs)


def convert_and_update(quantizer: Any, tensor: Any) -> list[int]:
    """``Float8BlockQuantizer::convert_and_update_tensor``: buffers for the quantizer's usages."""
    dim = int(quantizer.block_scaling_dim)
    rd, cd = tensor._rowwise_data, tensor._columnwise_data
    if rd is None and cd is None:
        raise RuntimeError("Float8BlockwiseQTensor has no data.")
    shape = list(rd.shape) if rd is not None else [*cd.shape[1:], cd.shape[0]]
    t_shape = [shape[-1], *shape[:-1]] if shape else []
    if quantizer.rowwise_usage:
        if rd is None:
            tensor._rowwise_data = torch.empty(shape, dtype=torch.uint8)
        if tensor._rowwise_scale_inv is None:
            tensor._rowwise_scale_inv = torch.empty(scale_shape(shape, False, dim), dtype=torch.float32)
    else:
        tensor._rowwise_data = tensor._rowwise_scale_inv = None
    if quantizer.columnwise_usage:
        if cd is None:
            tensor._columnwise_data = torch.empty(t_shape, dtype=torch.uint8)
        if tensor._columnwise_scale_inv is None:
            tensor._columnwise_scale_inv = torch.empty(scale_shape(shape, True, dim), dtype=torch.float32)
    else:
        tensor._columnwise_data = tensor._columnwise_scale_inv = None
    tensor._fp8_dtype = quantizer.dtype
    tensor._is_2D_scaled = dim == 2
    return shape


@torch.no_grad()
def quantize_into(quantizer: Any, src: torch.Tensor, dst: Any, noop: torch.Tensor | None) -> None:
    """``Float8BlockQuantizer::quantize``: row-wise and/or column-wise data and scales."""
    if src.numel() == 0:
        return
    if noop is not None and float(noop.reshape(-1)[0]) == 1.0:
        return
    fmt = fp8_format(quantizer.dtype)
    x = _flat(src.to(torch.float32))
    two_d = int(quantizer.block_scaling_dim) == 2
    if two_d:
        data, sinv = quantize_2d(x, fmt, quantizer, src.dtype)
        if dst._rowwise_data is not None:
            dst._rowwise_data.copy_(data.reshape(dst._rowwise_data.shape))
            _store(dst._rowwise_scale_inv, sinv)
        if dst._columnwise_data is not None:
            dst._columnwise_data.copy_(data.t().contiguous().reshape(dst._columnwise_data.shape))
            _store(dst._columnwise_scale_inv, sinv.t())
        return
    if dst._rowwise_data is not None:
        data, sinv = quantize_1d(x, fmt, quantizer, src.dtype)
        dst._rowwise_data.copy_(data.reshape(dst._rowwise_data.shape))
        _store(dst._rowwise_scale_inv, sinv.t())
    if dst._columnwise_data is not None:
        data_t, sinv_t = quantize_1d(x.t().contiguous(), fmt, quantizer, src.dtype)
        dst._columnwise_data.copy_(data_t.reshape(dst._columnwise_data.shape))
        _store(dst._columnwise_scale_inv, sinv_t.t())


def _k_scales(tensor: Any, data: torch.Tensor, sinv: torch.Tensor) -> torch.Tensor:
    """Per (row of ``data``, 128-block of its columns) scale_inv, ``[rows, ceil(cols/128)]``."""
    rows, cols = data.shape
    nb = -(-cols // BLOCK)
    if tensor._is_2D_scaled:
        return sinv[:, :nb].repeat_interleave(BLOCK, dim=0)[:rows].contiguous()
    return sinv[:nb, :rows].t().contiguous()


def _side(tensor: Any, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if rowwise:
        return _flat(tensor._rowwise_data), tensor._rowwise_scale_inv
    return _flat(tensor._columnwise_data), tensor._columnwise_scale_inv


def operand(tensor: Any, rowwise: bool, name: str) -> Operand:
    """``CanonicalizeGemmInput`` for FP8 block scaling: row-wise data when the GEMM reads the
    tensor with K along its rows, else the (transposed) column-wise data; both K-last. The
    block scales multiply each 128-long K block's partial sum (:mod:`.qgemm`)."""
    if (tensor._rowwise_data if rowwise else tensor._columnwise_data) is None:
        raise RuntimeError(f"Input {name} is missing {'row' if rowwise else 'column'}-wise usage")
    data, sinv = _side(tensor, rowwise)
    if data.shape[-1] % 16:
        raise QGemmError("Leading dimension requirement on NVTE_BLOCK_SCALING GEMM. Caller must pad.")
    values = fp8_format(tensor._fp8_dtype).decode(data)
    return Operand(values.contiguous(), torch.ones((), dtype=torch.float32), _k_scales(tensor, data, sinv), BLOCK)


def decode(tensor: Any, rowwise: bool) -> torch.Tensor:
    """One side's data times its block scales, fp32, in the stored orientation."""
    data, sinv = _side(tensor, rowwise)
    values = fp8_format(tensor._fp8_dtype).decode(data)
    scales = _k_scales(tensor, data, sinv).repeat_interleave(BLOCK, dim=1)[:, :data.shape[1]]
    return values * scales


def dequantize(tensor: Any, out_dtype: torch.dtype) -> torch.Tensor:
    """The row-wise data decoded (else the column-wise data, transposed back), rounded once."""
    if tensor._rowwise_data is not None:
        return decode(tensor, True).reshape(tensor._rowwise_data.shape).to(out_dtype)
    if tensor._columnwise_data is None:
        raise RuntimeError("Cannot dequantize tensor without data.")
    cd = tensor._columnwise_data
    vals = decode(tensor, False).t().reshape(*cd.shape[1:], cd.shape[0])
    return vals.to(out_dtype)
