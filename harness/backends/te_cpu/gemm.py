"""CPU GEMM numerics with the arithmetic TE's cuBLASLt calls promise on a GPU (CONTRACTS §5).

The kernels of the ``te-cpu`` backend (``harness.backends.te_cpu.extension`` adapts them to TE's
binding signatures). Importing it applies nothing (only ``harness.backends.te_cpu.backend``
does): these numerics are plain functions that the tests check in-process against float64
math.

TE's non-quantized GEMMs (``nvte_cublas_gemm`` / ``nvte_multi_tensor_gemm`` with
``CUBLAS_COMPUTE_32F``) multiply 16-bit operands exactly, accumulate in fp32 and round the
result - after the bias epilogue and the ``beta * D`` term - once to the output dtype. This
module does the same on CPU: operands are widened to fp32, the product is an fp32 GEMM, and
every epilogue term is added in fp32 before the single rounding.

fp32 operands: on CUDA TE runs them as TF32 (``CUBLAS_COMPUTE_32F_FAST_TF32`` in
``common/gemm/cublaslt_gemm.cu``). The default here is IEEE fp32 (``"ieee"``); the opt-in
``"tf32"`` mode rounds fp32 operands to TF32's 10 explicit mantissa bits (round to nearest,
ties to even) before the fp32 product, so a run can exercise TE's real fp32 tolerance
(u = 2^-11). 16-bit operands are exact in TF32, so the mode changes nothing for them.

Writes: the real kernels write through raw device pointers, invisible to autograd (no
version-counter bump, no view/in-place checks). Outputs here are written the same way,
through ``tensor.data`` (same storage, its own version counter), under ``torch.no_grad()``.

Layout: TE passes row-major tensors to a column-major GEMM, so in row-major terms
``D = op(B) @ op(A)`` where ``op`` transposes when its flag is set; ``A`` and ``B`` are
flattened to 2-D over their leading dimensions, as ``get_2d_dims`` does in TE's extension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from harness.cell.faults import GemmError
from harness.cell.quantized import round_to_tf32

#: the fp32 GEMM precisions this layer can emulate (see the module docstring)
FP32_MODES: tuple[str, ...] = ("ieee", "tf32")
#: dtypes a non-quantized TE GEMM takes as operands
OPERAND_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class GemmResult:
    """What one GEMM produced: the output and, in grad mode with a bias, the bias gradient."""

    out: torch.Tensor
    bias_grad: torch.Tensor | None = None


def operand(x: torch.Tensor, fp32_mode: str) -> torch.Tensor:
    """One GEMM operand as the tensor core sees it, widened to fp32 (exact for fp16/bf16)."""
    if x.dtype not in OPERAND_DTYPES:
        raise GemmError(f"GEMM operand of dtype {x.dtype} has no non-quantized CPU kernel "
                        f"(supported: {', '.join(str(d) for d in OPERAND_DTYPES)})")
    if x.dtype == torch.float32:
        return round_to_tf32(x) if fp32_mode == "tf32" else x
    return x.to(torch.float32)


def as_2d(x: torch.Tensor) -> torch.Tensor:
    """``x`` flattened over its leading dimensions, as TE's ``get_2d_dims`` does."""
    if x.dim() == 0:
        raise GemmError("GEMM operands need at least 1 dimension")
    return x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x


def output_shape(A: torch.Tensor, transa: bool, B: torch.Tensor, transb: bool) -> list[int]:
    """The shape TE's ``getGemmOutputShape`` gives ``D`` (leading dims of B kept unless ``transb``)."""
    a0, a1 = math.prod(A.shape[:-1]), A.shape[-1]
    b0, b1 = math.prod(B.shape[:-1]), B.shape[-1]
    if (a1 if transa else a0) != (b0 if transb else b1):
        raise GemmError(f"Invalid matrix dimensions for GEMM (A=({a0},{a1}), transa={transa}, "
                        f"B=({b0},{b1}), transb={transb})")
    rows = [b1] if transb else list(B.shape[:-1])
    return rows + [a0 if transa else a1]


@torch.no_grad()
def gemm(A: torch.Tensor, transa: bool, B: torch.Tensor, transb: bool, *, out_dtype: torch.dtype,
         out: torch.Tensor | None = None, bias: torch.Tensor | None = None, grad: bool = False,
         accumulate: bool = False, alpha: float = 1.0, beta: float | None = None,
         fp32_mode: str = "ieee") -> GemmResult:
    """``D = alpha * op(B) @ op(A) [+ bias] [+ beta * D]``, fp32 accumulation, one rounding.

    Args:
        A, B: the operands as TE passes them (row-major, any leading dims).
        transa, transb: TE's layout flags (``"TN"`` forward, ``"NN"`` dgrad, ``"NT"`` wgrad).
        out_dtype: dtype of ``D``.
        out: write ``D`` here (its shape must be TE's output shape); allocated when None.
        bias: forward: added to every row of ``D``; with ``grad``: only its presence matters,
            the bias gradient (sum of ``op(B)`` over the reduction) is returned.
        accumulate: ``D += ...`` (``beta`` defaults to 1), else ``beta`` must be 0.
        fp32_mode: ``"ieee"`` or ``"tf32"`` for fp32 operands.

    Returns:
        The output and the bias gradient (grad mode with a bias, else None).

    Raises:
        GemmError: mismatched shapes, an output of the wrong shape or dtype, bad ``beta``.
    """
    if fp32_mode not in FP32_MODES:
        raise GemmError(f"unknown fp32 GEMM mode {fp32_mode!r} (choose from {', '.join(FP32_MODES)})")
    shape = output_shape(A, transa, B, transb)
    if beta is None:
        beta = 1.0 if accumulate else 0.0
    elif not accumulate and beta != 0.0:
        raise GemmError("Trying to use non-zero beta while not accumulating into D tensor.")
    if out is None:
        out = torch.empty(shape, dtype=out_dtype, device=B.device)
    else:
        if list(out.shape) != shape:
            raise GemmError(f"GEMM output has invalid dims (expected {shape}, got {list(out.shape)})")
        if out.dtype != out_dtype:
            raise GemmError(f"GEMM output has invalid dtype (expected {out_dtype}, found {out.dtype})")
    dest = out.data  # raw-memory writes, as the CUDA kernel does (module docstring)
    a2, b2 = as_2d(A.data), as_2d(B.data)
    bias_grad = None
    if bias is not None and grad:
        bias_grad = torch.zeros(B.shape[-1], dtype=out_dtype, device=B.device)
    if A.numel() == 0 or B.numel() == 0:
        # TE's extension: an empty reduction or operand writes zeros unless accumulating
        if dest.numel() and not accumulate:
            dest.zero_()
        return GemmResult(out, bias_grad)
    a = operand(a2, fp32_mode)
    b = operand(b2, fp32_mode)
    acc = torch.matmul(b.t() if transb else b, a.t() if transa else a)
    if alpha != 1.0:
        acc = acc * alpha
    if bias is not None and not grad and bias.numel():
        acc = acc + bias.to(torch.float32)
    if beta != 0.0:
        acc = acc + beta * dest.reshape(acc.shape).to(torch.float32)
    dest.copy_(acc.reshape(shape).to(out_dtype))
    if bias_grad is not None:
        # cuBLASLt's BGRADB epilogue: the reduction over the GEMM's k dimension of op(B),
        # accumulated in fp32 from the exact (widened) operand
        bias_grad.copy_(b2.to(torch.float32).sum(0).to(out_dtype))
    return GemmResult(out, bias_grad)


def grouped_gemm(A: Sequence[torch.Tensor], transa: bool, B: Sequence[torch.Tensor], transb: bool, *,
                 out_dtype: torch.dtype, outs: Sequence[torch.Tensor] | None = None,
                 single_output: torch.Tensor | None = None, biases: Sequence[torch.Tensor] | None = None,
                 grad: bool = False, accumulate: bool = False, fp32_mode: str = "ieee") -> list[GemmResult]:
    """One :func:`gemm` per group, as TE's ``te_general_grouped_gemm`` runs them.

    Args:
        A, B: the groups' operands (a group may have no rows: its output is zeros, or
            untouched when accumulating, and its bias gradient zeros).
        outs: one output per group; or ``single_output``: one buffer the groups' outputs
            fill one after another (TE's ``single_output=True``); or neither (allocated).
        biases: per group; an empty tensor means "no bias" (TE passes ``_empty_tensor()``).
        grad: the biases' presence asks for bias gradients instead of a bias add.

    Returns:
        Each group's output (a view into ``single_output`` when given) and bias gradient.

    Raises:
        GemmError: mismatched group counts or shapes, or a ``single_output`` of the wrong size.
    """
    n = len(A)
    if len(B) != n or (outs is not None and len(outs) != n) or (biases is not None and len(biases) != n):
        raise GemmError(f"grouped GEMM needs as many B, outputs and biases as A ({n} groups)")
    offset = 0
    results = []
    for i, (a, b) in enumerate(zip(A, B)):
        out = None if outs is None else outs[i]
        if single_output is not None:
            shape = output_shape(a, transa, b, transb)
            numel = math.prod(shape)
            flat = single_output.data.reshape(-1)
            if offset + numel > flat.numel():
                raise GemmError(f"single output of {flat.numel()} elements is too small for group {i}")
            out = flat[offset:offset + numel].view(shape)
            offset += numel
        bias = biases[i] if biases is not None and biases[i].numel() else None
        results.append(gemm(a, transa, b, transb, out_dtype=out_dtype, out=out, bias=bias, grad=grad,
                            accumulate=accumulate, fp32_mode=fp32_mode))
    return results
