"""CPU LayerNorm / RMSNorm numerics with the arithmetic of TE's own normalization kernels.

The kernels behind ``layernorm_fwd/bwd`` and ``rmsnorm_fwd/bwd`` of the te-cpu extension
(:mod:`harness.backends.te_cpu.extension` adapts them to TE's binding signatures). Plain torch
functions: they import nothing from the CPU layer, so a test may load this file by path
without applying the layer to its process.

TE's non-quantized norms (``common/normalization/{layernorm,rmsnorm}``, the default "Te"
backend, not cuDNN) widen every operand to fp32 (``compute_t = float``) and round once:

- forward: per row, the statistics in fp32 - ``mu = mean(x)`` and ``rsigma =
  rsqrt(mean((x - mu)^2) + eps)`` (LayerNorm), ``rsigma = rsqrt(mean(x^2) + eps)`` (RMSNorm);
  then ``z = g * xhat + beta`` in fp32 with ``xhat = (x - mu) * rsigma`` (``x * rsigma``),
  rounded once to the output dtype. ``mu`` and ``rsigma`` stay fp32 (TE saves them for the
  backward). ``g`` is ``gamma``, or ``gamma + 1`` in fp32 with ``zero_centered_gamma``;
- backward, from the saved fp32 statistics: ``dy = g * dz``, ``dx = rsigma * (dy -
  mean(dy * xhat) * xhat - mean(dy))`` (RMSNorm: without the ``mean(dy)`` term) rounded to
  ``x``'s dtype; ``dgamma = sum_rows(dz * xhat)`` and ``dbeta = sum_rows(dz)``, reduced over
  the rows in fp32 and rounded to ``gamma``'s dtype.

Shapes follow TE's extension: the input is flattened to 2-D over its leading dimensions
(``get_2d_dims``), the output keeps the input's shape, the statistics have one value per
row. A preallocated output is written through ``.data`` (raw memory, invisible to autograd,
as the CUDA kernel writes it - see :mod:`harness.backends.te_cpu.gemm`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from harness.cell.faults import NormError

#: dtypes TE's non-quantized norm kernels take and produce
NORM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class NormForward:
    """A forward's output and its fp32 row statistics (``mu`` is None for RMSNorm)."""

    out: torch.Tensor
    mu: torch.Tensor | None
    rsigma: torch.Tensor


@dataclass(frozen=True)
class NormBackward:
    """A backward's gradients (``dbeta`` is None for RMSNorm)."""

    dx: torch.Tensor
    dgamma: torch.Tensor
    dbeta: torch.Tensor | None


def _check_dtype(what: str, t: torch.Tensor) -> None:
    if t.dtype not in NORM_DTYPES:
        raise NormError(f"{what} of dtype {t.dtype} has no non-quantized CPU norm kernel "
                        f"(supported: {', '.join(str(d) for d in NORM_DTYPES)})")


def _rows(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """``x`` as fp32 rows (``get_2d_dims``), checked against ``gamma`` as TE's API checks it."""
    _check_dtype("input", x)
    _check_dtype("gamma", gamma)
    if x.dim() == 0:
        raise NormError("x must be 2D tensor.")
    if gamma.dim() != 1 or gamma.shape[0] != x.shape[-1]:
        raise NormError("Gamma must have the same hidden size.")
    return x.reshape(-1, x.shape[-1]).to(torch.float32)


def _scale(gamma: torch.Tensor, zero_centered_gamma: bool) -> torch.Tensor:
    """The applied scale in fp32: ``gamma + 1`` is formed after widening, as TE's kernels do."""
    g = gamma.to(torch.float32)
    return g + 1.0 if zero_centered_gamma else g


def _write(x: torch.Tensor, z: torch.Tensor, out_dtype: torch.dtype,
           out: torch.Tensor | None) -> torch.Tensor:
    """``z`` (fp32 rows) rounded once into a new output of ``x``'s shape, or into ``out``."""
    if out is None:
        return z.reshape(x.shape).to(out_dtype)
    _check_dtype("output", out)
    if out.shape != x.shape:
        raise NormError("Output tensor must have the same shape as x.")
    out.data.copy_(z.reshape(x.shape).to(out.dtype))  # raw-memory write (module docstring)
    return out


@torch.no_grad()
def layernorm_fwd(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None, eps: float, *,
                  zero_centered_gamma: bool, out_dtype: torch.dtype,
                  out: torch.Tensor | None = None) -> NormForward:
    """LayerNorm forward: statistics and the affine map in fp32, one rounding of the output.

    Args:
        x: input, normalized over its last dimension.
        gamma, beta: per-feature scale and shift (TE requires both, of the same shape/dtype).
        zero_centered_gamma: the applied scale is ``gamma + 1``.
        out_dtype: dtype of a new output; ``out``: write into this tensor instead (its dtype).

    Raises:
        NormError: shapes or dtypes TE's kernel rejects.
    """
    if beta is None or beta.shape != gamma.shape:
        raise NormError("Gamma and Beta must have the same shape.")
    if beta.dtype != gamma.dtype:
        raise NormError(f"Gamma and Beta must have the same dtype. Gamma dtype: {gamma.dtype}, "
                        f"Beta dtype: {beta.dtype}")
    if eps < 0:
        raise NormError("Epsilon must be non-negative.")
    rows = _rows(x, gamma)
    mu = rows.mean(dim=1)
    centered = rows - mu[:, None]
    rsigma = torch.rsqrt(centered.square().mean(dim=1) + eps)
    z = _scale(gamma, zero_centered_gamma) * (centered * rsigma[:, None]) + beta.to(torch.float32)
    return NormForward(_write(x, z, out_dtype, out), mu, rsigma)


@torch.no_grad()
def rmsnorm_fwd(x: torch.Tensor, gamma: torch.Tensor, eps: float, *, zero_centered_gamma: bool,
                out_dtype: torch.dtype, out: torch.Tensor | None = None) -> NormForward:
    """RMSNorm forward: ``rsigma`` from the mean of squares in fp32, one rounding of the output.

    Arguments and errors as :func:`layernorm_fwd` (no ``beta``; ``mu`` is None).
    """
    if eps < 0:
        raise NormError("Epsilon must be non-negative.")
    rows = _rows(x, gamma)
    rsigma = torch.rsqrt(rows.square().mean(dim=1) + eps)
    z = _scale(gamma, zero_centered_gamma) * (rows * rsigma[:, None])
    return NormForward(_write(x, z, out_dtype, out), None, rsigma)


def _check_backward(dz: torch.Tensor, x: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                    mu: torch.Tensor | None) -> torch.Tensor:
    """``x`` as fp32 rows, with the operand checks of TE's backward APIs."""
    rows = _rows(x, gamma)
    if dz.dtype != gamma.dtype:
        raise NormError(f"dz ({dz.dtype}) must have gamma's dtype ({gamma.dtype})")
    if dz.shape != x.shape:
        raise NormError(f"dz {list(dz.shape)} must have x's shape {list(x.shape)}")
    for name, stat in (("rsigma", rsigma), ("mu", mu)):
        if stat is not None and (stat.dtype != torch.float32 or stat.shape != (rows.shape[0],)):
            raise NormError(f"{name} must be a float32 tensor of one value per row ({rows.shape[0]}), "
                            f"got {stat.dtype} {list(stat.shape)}")
    return rows


def _backward(dz: torch.Tensor, x: torch.Tensor, xhat: torch.Tensor, rsigma: torch.Tensor,
              gamma: torch.Tensor, zero_centered_gamma: bool, centered: bool) -> NormBackward:
    """The shared backward from fp32 ``xhat``; ``centered`` (LayerNorm) adds the mean terms."""
    dzf = dz.reshape(xhat.shape).to(torch.float32)
    dy = _scale(gamma, zero_centered_gamma) * dzf
    proj = (dy * xhat).mean(dim=1, keepdim=True) * xhat
    if centered:
        proj = proj + dy.mean(dim=1, keepdim=True)
    dx = (rsigma[:, None] * (dy - proj)).reshape(x.shape).to(x.dtype)
    dgamma = (dzf * xhat).sum(dim=0).to(gamma.dtype)
    dbeta = dzf.sum(dim=0).to(gamma.dtype) if centered else None
    return NormBackward(dx, dgamma, dbeta)


@torch.no_grad()
def layernorm_bwd(dz: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, rsigma: torch.Tensor,
                  gamma: torch.Tensor, *, zero_centered_gamma: bool) -> NormBackward:
    """LayerNorm backward from the forward's fp32 ``mu``/``rsigma``: ``dx`` in ``x``'s dtype,
    ``dgamma``/``dbeta`` in ``gamma``'s, all computed in fp32 (module docstring).

    Raises:
        NormError: shapes or dtypes TE's kernel rejects (``dz`` must have ``gamma``'s dtype).
    """
    rows = _check_backward(dz, x, rsigma, gamma, mu)
    xhat = (rows - mu[:, None]) * rsigma[:, None]
    return _backward(dz, x, xhat, rsigma, gamma, zero_centered_gamma, centered=True)


@torch.no_grad()
def rmsnorm_bwd(dz: torch.Tensor, x: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor, *,
                zero_centered_gamma: bool) -> NormBackward:
    """RMSNorm backward from the forward's fp32 ``rsigma`` (``dbeta`` is None).

    Raises:
        NormError: as :func:`layernorm_bwd`.
    """
    rows = _check_backward(dz, x, rsigma, gamma, None)
    return _backward(dz, x, rows * rsigma[:, None], rsigma, gamma, zero_centered_gamma, centered=False)
