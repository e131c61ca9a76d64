"""A GEMM of quantized operands, as TE's cuBLASLt call computes it, on CPU.

TE's ``generic_gemm`` computes, in row-major terms, ``D = alpha * op(B) @ op(A) + beta * D``
(``harness.backends.te_cpu.gemm``). With quantized operands cuBLASLt multiplies the stored low-precision
values, accumulates in fp32 and applies the scales (``common/gemm/cublaslt_gemm.cu``):

- per-tensor FP8 (``CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F``): the accumulator times
  ``scale_inv(A) * scale_inv(B)``;
- MXFP8 (``VEC32_UE8M0``) and NVFP4 (``VEC16_UE4M3``): every element times its block's
  scale - a power of two, or an E4M3 value times an E2M1 one: exact in fp32 - then the
  products accumulated; NVFP4's per-tensor factors (from the global amaxes) as ``alpha``;
- FP8 block scaling (``VEC128_32F`` / ``BLK128x128_32F``): the products of each 128-long
  block of K accumulated, the block's partial sum times both blocks' scales, the partial sums
  accumulated in fp32.

Here: each operand is decoded to fp32 exactly (an :class:`Operand`: the stored values, with
their K-block scales where they are not folded in exactly, and a per-tensor factor); the
products - exact in fp32 for every format - are accumulated in fp32 by an fp32 matmul; the
per-tensor factors and ``alpha`` multiply the accumulator; the bias and ``beta * D`` are
added in fp32; one rounding to the output dtype. What differs from a GPU is only the order of
the fp32 accumulation (and Hopper's reduced-precision FP8 accumulation inside a tensor-core
chain, which this models as fp32: see ``docs/low-precision.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from harness.cell.faults import QGemmError


@dataclass(frozen=True)
class Operand:
    """One GEMM operand decoded for the product, oriented ``[rows, K]`` (K last).

    ``values`` are exact fp32 (stored values, times their block scales where those are folded
    in exactly); ``k_scales`` (``[rows, K / k_block]``), when given, multiply each K block's
    partial sum; ``factor`` (a 0-d fp32 tensor) multiplies the accumulator; ``amax`` (NVFP4
    only) is the tensor amax the GEMM folds into ``alpha`` (``nvfp4.gemm_alpha``).
    """

    values: torch.Tensor
    factor: torch.Tensor
    k_scales: torch.Tensor | None = None
    k_block: int = 0
    amax: torch.Tensor | None = None


def plain_operand(x: torch.Tensor) -> Operand:
    """A non-quantized operand (already ``[rows, K]``), widened exactly to fp32."""
    return Operand(x.to(torch.float32), torch.ones((), dtype=torch.float32))


@torch.no_grad()
def accumulate(b: Operand, a: Operand) -> torch.Tensor:
    """``B @ A^T`` over K, fp32 accumulation of exact products, per-tensor factors applied:
    ``[rows(B), rows(A)]`` fp32."""
    if b.values.shape[-1] != a.values.shape[-1]:
        raise QGemmError(f"GEMM inputs have incompatible dimensions (K={b.values.shape[-1]} "
                         f"and K={a.values.shape[-1]})")
    if a.k_scales is None and b.k_scales is None:
        acc = torch.matmul(b.values, a.values.t())
    else:
        acc = _block_scaled(b, a)
    factor = (a.factor.to(torch.float32) * b.factor.to(torch.float32)).reshape(())
    return acc * factor if float(factor) != 1.0 else acc


def _block_scaled(b: Operand, a: Operand) -> torch.Tensor:
    """K-blocked accumulation: each block's fp32 partial sum times both blocks' scales, the
    scaled partials accumulated in fp32, block after block."""
    block = a.k_block or b.k_block
    k = a.values.shape[-1]
    nblocks = math.ceil(k / block)
    acc = torch.zeros(b.values.shape[0], a.values.shape[0], dtype=torch.float32)
    for j in range(nblocks):
        sl = slice(j * block, min(k, (j + 1) * block))
        part = torch.matmul(b.values[:, sl], a.values[:, sl].t())
        if b.k_scales is not None:
            part = part * b.k_scales[:, j:j + 1]
        if a.k_scales is not None:
            part = part * a.k_scales[:, j].reshape(1, -1)
        acc = acc + part
    return acc


@torch.no_grad()
def epilogue(acc: torch.Tensor, *, out_shape: list[int], out_dtype: torch.dtype, out: torch.Tensor | None,
             alpha: float, beta: float, bias: torch.Tensor | None) -> torch.Tensor:
    """``alpha * acc [+ bias] [+ beta * out]`` in fp32, rounded once into ``out`` (allocated in
    ``out_dtype`` when None), written through ``.data`` as the CUDA kernel writes raw memory."""
    if out is None:
        out = torch.empty(out_shape, dtype=out_dtype)
    elif list(out.shape) != list(out_shape):
        raise QGemmError(f"GEMM output has invalid dims (expected {out_shape}, got {list(out.shape)})")
    dest = out.data
    v = acc * alpha if alpha != 1.0 else acc
    if bias is not None and bias.numel():
        v = v + bias.to(torch.float32).reshape(1, -1)
    if beta != 0.0:
        v = v + beta * dest.reshape(v.shape).to(torch.float32)
    dest.copy_(v.reshape(out_shape).to(dest.dtype))
    return out
