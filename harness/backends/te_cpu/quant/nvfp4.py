"""NVFP4 (``NVFP4BlockScaling``): E2M1 elements, one E4M3 scale per 16 elements, one fp32
tensor scale from the tensor's amax.

TE's kernel (``common/cast/nvfp4/core_nvfp4.cuh``, ``quantize_transpose_nvfp4.cuh``), with
every product and quotient an fp32 operation:

- the tensor's amax (largest magnitude) and its encode scale ``S_enc = 448 * 6 / amax``
  (``compute_global_encode_scaling_factor_FP4``: at most fp32's max; amax 0: 1), decode
  scale ``S_dec = 1 / S_enc`` (computed in double, stored as fp32);
- per block of 16 consecutive elements (1-D), or per 16x16 tile (2-D, TE's weights): the
  block's amax and its E4M3 scale ``e4m3(block_amax * (S_enc * fp32(1 / 6)))``
  (``compute_decoding_scaling_factor``: saturating, round to nearest even);
- each element ``e2m1(x * min(1 / (fp32(scale) * S_dec), fp32 max))``: round to nearest
  even, saturating at 6 (``cvt.rn.satfinite.e2m1x2.f32``).

Row-wise data has blocks along the last dimension, shape ``[rows, cols / 2]`` bytes (two
codes a byte), scales ``[roundup(rows, 128), roundup(cols / 16, 4)]`` E4M3 bytes. Column-wise
data is the row-wise quantization of the transpose (``[cols, rows / 2]``, scales
``[roundup(cols, 128), roundup(rows / 16, 4)]``), from the same amax. Scales are stored in the
GEMM's swizzled layout only where TE's 2-D kernel writes them so (a 2-D quantizer on Blackwell
with both dimensions multiples of 128 and ``optimize_for_gemm``); otherwise linear.

The GEMM (``common/gemm/cublaslt_gemm.cu``, ``recipe/nvfp4.cu``) multiplies ``code * scale``
products (exact in fp32) and applies ``alpha * amax_A * amax_B * fp32(1 / (6 * 6 * 448 *
448))`` to the accumulator (:func:`gemm_alpha`). ``tex.dequantize`` decodes ``code * (scale
* amax * fp32(1 / (6 * 448)))``.

The random Hadamard transform, stochastic rounding, row-scaled amaxes and the 4over6 variant
are not built: a quantizer asking for one raises ``MissingCpuKernel`` naming it
(docs/low-precision.md says why).
"""

from __future__ import annotations

from typing import Any

import torch

from . import swizzle as _swz
from .formats import E4M3, E2M1_MAX, e2m1_decode, e2m1_encode, pack_fp4, unpack_fp4
from .qgemm import Operand
from .tensors import missing as _missing, new_tensor, roundup as _roundup

BLOCK = 16
FP8_MAX = 448.0
F32 = torch.float32
FP32_MAX = torch.finfo(F32).max
#: ``1.0f / 6.0f`` and the GEMM's and the dequantize's ``factor_inv``, fp32 constants
_FP4_MAX_INV = torch.tensor(1.0 / 6.0, dtype=F32)
_GEMM_FACTOR_INV = torch.tensor(1.0, dtype=F32) / torch.tensor(6.0 * 6.0 * FP8_MAX * FP8_MAX, dtype=F32)
_DEQ_FACTOR_INV = torch.tensor(1.0, dtype=F32) / torch.tensor(6.0 * FP8_MAX, dtype=F32)


def _dims(shape: list[int]) -> tuple[int, int]:
    rows = 1
    for s in shape[:-1]:
        rows *= int(s)
    return rows, int(shape[-1]) if shape else 1


def scale_shape(shape: list[int], columnwise: bool) -> list[int]:
    """``NVFP4Quantizer::get_scale_shape``."""
    rows, cols = _dims(shape)
    if cols % BLOCK:
        raise RuntimeError(f"Last dim for NVFP4 must be divisible by {BLOCK} (got dim={cols})")
    if rows % BLOCK:
        raise RuntimeError(f"NVFP4 requires tensor dims that are divisible by {BLOCK} (got shape={shape})")
    if columnwise:
        return [_roundup(cols, 128), _roundup(rows // BLOCK, 4)]
    return [_roundup(rows, 128), _roundup(cols // BLOCK, 4)]


def encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """``S_enc`` from the tensor's fp32 amax (0-d fp32)."""
    a = amax.to(F32).reshape(())
    s = torch.tensor(FP8_MAX * E2M1_MAX, dtype=F32) / a
    s = torch.clamp(s, max=FP32_MAX)
    return torch.where((a == 0) | (s == 0), torch.ones((), dtype=F32), s)


def _amax(x: torch.Tensor) -> torch.Tensor:
    a = x.to(F32).abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return a.amax() if a.numel() else torch.zeros((), dtype=F32)


def _block_amax(x: torch.Tensor, tile: bool) -> torch.Tensor:
    """Per element block ``[R, C / 16]``: the block's amax (1-D), or its 16x16 tile's (2-D)."""
    r, c = x.shape
    a = x.to(F32).abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    if not tile:
        return a.reshape(r, c // BLOCK, BLOCK).amax(-1)
    tiles = a.reshape(r // BLOCK, BLOCK, c // BLOCK, BLOCK).amax(dim=(1, 3))
    return tiles.repeat_interleave(BLOCK, dim=0)


def quantize_rows(x: torch.Tensor, amax: torch.Tensor, tile: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``x`` (``[R, C]``) in blocks of 16 along C (16x16 tiles when ``tile``), with the
    tensor amax ``amax``: (packed E2M1 bytes ``[R, C / 2]``, E4M3 scale bytes ``[R, C / 16]``)."""
    r, c = x.shape
    s_enc = encode_scale(amax)
    s_dec = torch.tensor(1.0 / float(s_enc), dtype=torch.float64).to(F32)
    dec_b = _block_amax(x, tile) * (s_enc * _FP4_MAX_INV)
    scale_bytes = E4M3.encode(torch.clamp(dec_b, max=FP32_MAX))
    scale = E4M3.decode(scale_bytes)
    inv = torch.clamp(torch.ones((), dtype=F32) / (scale * s_dec), max=FP32_MAX)
    scaled = x.to(F32).reshape(r, c // BLOCK, BLOCK) * inv.unsqueeze(-1)
    return pack_fp4(e2m1_encode(scaled.reshape(r, c))), scale_bytes


def decode_rows(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``code * scale`` (fp32, exact) of packed data ``[R, C / 2]`` and linear scales."""
    codes = e2m1_decode(unpack_fp4(data))
    r, c = codes.shape
    s = E4M3.decode(scales[:r, :c // BLOCK].contiguous())
    return (codes.reshape(r, c // BLOCK, BLOCK) * s.unsqueeze(-1)).reshape(r, c)


def gemm_alpha(alpha: float, amax_a: torch.Tensor, amax_b: torch.Tensor) -> float:
    """``compute_nvfp4_per_tensor_scale_kernel``: ``alpha * amax_A * amax_B * factor_inv``,
    fp32 operations left to right."""
    out = torch.tensor(alpha, dtype=F32) * amax_a.to(F32).reshape(()) * amax_b.to(F32).reshape(())
    return float(out * _GEMM_FACTOR_INV)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


# ---- TE's NVFP4Tensor / NVFP4TensorStorage (pytorch/csrc/quantizer.cpp NVFP4Quantizer) --------
def _swizzled(quantizer: Any, shape: list[int]) -> bool:
    """``nvfp4_emits_gemm_swizzled_scales`` (no RHT: only the plain 2-D kernel writes them)."""
    from harness.backends.te_cpu import cuda_surface
    rows, cols = _dims(shape)
    major = cuda_surface.capability()[0]
    return bool(quantizer.optimize_for_gemm) and bool(quantizer.with_2d_quantization) and \
        not quantizer.with_rht and rows % 128 == 0 and cols % 128 == 0 and 10 <= major <= 11


def create(quantizer: Any, shape: list[int], fake_dtype: torch.dtype) -> Any:
    """``NVFP4Quantizer::create_tensor``."""
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Tensor
    from transformer_engine.pytorch.tensor.storage.nvfp4_tensor_storage import NVFP4TensorStorage
    _refuse_options(quantizer)
    rows, cols = _dims(shape)
    row_s, col_s = scale_shape(shape, False), scale_shape(shape, True)
    r, c = quantizer.rowwise_usage, quantizer.columnwise_usage
    kwargs = dict(
        rowwise_data=torch.empty([*shape[:-1], cols // 2], dtype=torch.uint8) if r else None,
        rowwise_scale_inv=torch.empty(row_s, dtype=torch.uint8) if r else None,
        columnwise_data=torch.empty([cols, rows // 2], dtype=torch.uint8) if c else None,
        columnwise_scale_inv=torch.empty(col_s, dtype=torch.uint8) if c else None,
        amax_rowwise=torch.zeros(1, dtype=F32) if r else None,
        amax_columnwise=torch.zeros(1, dtype=F32) if c else None,
        fp4_dtype=quantizer.dtype, quantizer=quantizer,
        with_gemm_swizzled_scales=_swizzled(quantizer, shape))
    return new_tensor(NVFP4Tensor, NVFP4TensorStorage, shape, fake_dtype, **kwargs)


def _logical_shape(tensor: Any) -> list[int]:
    rd, cd = tensor._rowwise_data, tensor._columnwise_data
    if rd is not None:
        shape = [*rd.shape[:-1], rd.shape[-1] * 2]
        if cd is not None and _dims(shape) != (cd.shape[1] * 2, cd.shape[0]):
            raise RuntimeError(f"NVFP4 row-wise data (shape={shape}) and column-wise data "
                               f"(shape={[cd.shape[1] * 2, cd.shape[0]]}) do not match")
        return shape
    if cd is None:
        raise RuntimeError("NVFP4Tensor has no data.")
    return [cd.shape[1] * 2, cd.shape[0]]


def convert_and_update(quantizer: Any, tensor: Any) -> list[int]:
    """``NVFP4Quantizer::convert_and_update_tensor``: buffers for the quantizer's usages."""
    _refuse_options(quantizer)
    shape = _logical_shape(tensor)
    rows, cols = _dims(shape)
    tensor._with_gemm_swizzled_scales = _swizzled(quantizer, shape)
    tensor._row_scaled_nvfp4 = False
    tensor._nvfp4_use_4over6 = False
    tensor._nvfp4_e4m3_max = 448
    for usage, data, sc, am, columnwise, dshape in (
            (quantizer.rowwise_usage, "_rowwise_data", "_rowwise_scale_inv", "_amax_rowwise", False,
             [*shape[:-1], cols // 2]),
            (quantizer.columnwise_usage, "_columnwise_data", "_columnwise_scale_inv", "_amax_columnwise", True,
             [cols, rows // 2])):
        if usage:
            if getattr(tensor, data) is None:
                setattr(tensor, data, torch.empty(dshape, dtype=torch.uint8))
            if getattr(tensor, sc) is None:
                setattr(tensor, sc, torch.empty(scale_shape(shape, columnwise), dtype=torch.uint8))
            if getattr(tensor, am) is None or getattr(tensor, am).numel() != 1:
                setattr(tensor, am, torch.zeros(1, dtype=F32))
        else:
            for attr in (data, sc, am):
                setattr(tensor, attr, None)
    return shape


def _refuse_options(quantizer: Any) -> None:
    for attr, detail in (("with_rht", "NVFP4 random Hadamard transform (with_rht)"),
                         ("stochastic_rounding", "NVFP4 stochastic rounding"),
                         ("row_scaled_nvfp4", "row-scaled NVFP4 (row_scaled_nvfp4)"),
                         ("nvfp4_use_4over6", "NVFP4 4over6 block selection")):
        if getattr(quantizer, attr, False):
            raise _missing(detail)


@torch.no_grad()
def quantize_into(quantizer: Any, src: torch.Tensor, dst: Any, noop: torch.Tensor | None) -> None:
    """``NVFP4Quantizer::quantize``: the amax (max-reduced over the quantizer's group where it
    asks), then row-wise and/or column-wise data and scales from ``src``."""
    _refuse_options(quantizer)
    if noop is not None and float(noop.reshape(-1)[0]) == 1.0:
        return
    x = _flat(src.to(F32)) if src.numel() else src.reshape(0, src.shape[-1] if src.dim() else 0)
    amax = _amax(x).reshape(1).clone()
    if getattr(quantizer, "with_amax_reduction", False):
        import torch.distributed as dist
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=quantizer.amax_reduction_group)
    for am in (dst._amax_rowwise, dst._amax_columnwise):
        if am is not None:
            am.copy_(amax)
    if src.numel() == 0:
        return
    tile = bool(quantizer.with_2d_quantization)
    swizzled = bool(dst._with_gemm_swizzled_scales)
    if dst._rowwise_data is not None:
        data, scales = quantize_rows(x, amax, tile)
        dst._rowwise_data.copy_(data.reshape(dst._rowwise_data.shape))
        _store_scales(dst._rowwise_scale_inv, scales, swizzled)
    if dst._columnwise_data is not None:
        data_t, scales_t = quantize_rows(x.t().contiguous(), amax, tile)
        dst._columnwise_data.copy_(data_t.reshape(dst._columnwise_data.shape))
        _store_scales(dst._columnwise_scale_inv, scales_t, swizzled)


def _store_scales(buf: torch.Tensor, scales: torch.Tensor, swizzled: bool) -> None:
    """``scales`` into the padded buffer (zero padding), swizzled if asked (the column-wise
    scales are the transpose's row-wise scales: the same layout)."""
    full = torch.zeros(buf.shape, dtype=torch.uint8)
    full[:scales.shape[0], :scales.shape[1]] = scales
    buf.copy_(_swz.swizzle(full) if swizzled else full)


def _linear(buf: torch.Tensor, swizzled: bool) -> torch.Tensor:
    return _swz.unswizzle(buf) if swizzled else buf


def decode_rowwise(tensor: Any) -> torch.Tensor:
    """The row-wise data as ``code * scale`` fp32 ``[rows, cols]`` (flattened), exact."""
    return decode_rows(_flat(tensor._rowwise_data),
                       _linear(tensor._rowwise_scale_inv, tensor._with_gemm_swizzled_scales))


def decode_columnwise(tensor: Any) -> torch.Tensor:
    """The column-wise data (the transpose's quantization) as ``code * scale``, ``[cols, rows]``."""
    return decode_rows(tensor._columnwise_data,
                       _linear(tensor._columnwise_scale_inv, tensor._with_gemm_swizzled_scales))


def dequantize(tensor: Any, out_dtype: torch.dtype) -> torch.Tensor:
    """``tex.dequantize`` (``dequantize_nvfp4.cuh``): the row-wise data, each value ``code *
    fp32(fp32(scale * amax) * fp32(1 / (6 * 448)))`` rounded once to ``out_dtype``."""
    if tensor._rowwise_data is None:
        raise RuntimeError("Cannot dequantize NVFP4 tensor without rowwise data.")
    data = _flat(tensor._rowwise_data)
    codes = e2m1_decode(unpack_fp4(data))
    r, c = codes.shape
    scales = E4M3.decode(_linear(tensor._rowwise_scale_inv, tensor._with_gemm_swizzled_scales)[:r, :c // BLOCK]
                         .contiguous())
    final = scales * tensor._amax_rowwise.to(F32).reshape(()) * _DEQ_FACTOR_INV
    vals = (codes.reshape(r, c // BLOCK, BLOCK) * final.unsqueeze(-1)).reshape(r, c)
    return vals.to(out_dtype).reshape([*tensor._rowwise_data.shape[:-1], c])


def operand(tensor: Any, rowwise: bool, name: str) -> Operand:
    """``CanonicalizeGemmInput`` for NVFP4 (TN only): the row-wise data when the GEMM reads the
    tensor with K along its rows, else the column-wise data (the transpose's quantization);
    the amax of the data read goes to :func:`gemm_alpha`."""
    one = torch.ones((), dtype=F32)
    if rowwise:
        if tensor._rowwise_data is None:
            raise RuntimeError(f"Input {name} is missing row-wise usage")
        return Operand(decode_rowwise(tensor).contiguous(), one, amax=tensor._amax_rowwise)
    if tensor._columnwise_data is None:
        raise RuntimeError(f"Input {name} is missing column-wise usage")
    return Operand(decode_columnwise(tensor).contiguous(), one, amax=tensor._amax_columnwise)
