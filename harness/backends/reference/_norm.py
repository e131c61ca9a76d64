"""The normalization in front of ``LayerNormLinear``'s GEMM: LayerNorm or RMSNorm.

TE's numerics (CONTRACTS §1): statistics and arithmetic in fp32, the output rounded to the
input's dtype - the GEMM and the weight gradient then see that rounded output. The
parameters stay plain: only the linear layer's ``weight`` may be distributed, so this part
has no distributed-weight handling and nothing a saved-tensor hook can strip.

The arithmetic is a pair of ``ReferenceImpl`` methods (``norm_forward`` / ``norm_backward``)
so a mutant can get one of its gradients wrong the way the GEMM mutants do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

F32 = torch.float32


@dataclass
class NormCall:
    """What one normalization forward hands to its backward that is not a tensor."""

    impl: Any                         # the module's ReferenceImpl
    kind: str                         # "LayerNorm" or "RMSNorm"
    zero_centered: bool
    eps: float


@dataclass
class NormGrads:
    """A normalization's gradients: input, ``layer_norm_weight``, ``layer_norm_bias``."""

    dx: torch.Tensor | None
    dgamma: torch.Tensor | None
    dbeta: torch.Tensor | None


def statistics(x: torch.Tensor, call: NormCall) -> tuple[torch.Tensor, torch.Tensor]:
    """``(xhat, rstd)`` in fp32: ``xhat = (x - mean) * rstd`` (RMSNorm: ``x * rstd``)."""
    xf = x.to(F32)
    centred = xf - xf.mean(-1, keepdim=True) if call.kind == "LayerNorm" else xf
    rstd = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + call.eps)
    return centred * rstd, rstd


def scale_of(gamma: torch.Tensor, call: NormCall) -> torch.Tensor:
    """The applied scale in fp32: ``gamma``, or ``1 + gamma`` when zero-centered."""
    g = gamma.to(F32)
    return g + 1.0 if call.zero_centered else g


def forward(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None,
            call: NormCall) -> torch.Tensor:
    """``xhat * scale + beta`` in fp32, rounded once to ``x``'s dtype."""
    xhat, _ = statistics(x, call)
    h = xhat * scale_of(gamma, call)
    if beta is not None:
        h = h + beta.to(F32)
    return h.to(x.dtype)


def backward(dh: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None,
             call: NormCall) -> NormGrads:
    """The three gradients in fp32, each rounded once to its tensor's dtype."""
    xhat, rstd = statistics(x, call)
    dhf = dh.to(F32)
    g = dhf * scale_of(gamma, call)
    dx = g - xhat * (g * xhat).mean(-1, keepdim=True)
    if call.kind == "LayerNorm":
        dx = dx - g.mean(-1, keepdim=True)
    dgamma = (dhf * xhat).sum(0).to(gamma.dtype)
    dbeta = dhf.sum(0).to(beta.dtype) if beta is not None else None
    return NormGrads((dx * rstd).to(x.dtype), dgamma, dbeta)


class Normalize(torch.autograd.Function):
    """The normalization as one autograd node; saves only plain tensors (hook-safe)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, call: NormCall, gamma: torch.Tensor,
                beta: torch.Tensor | None = None) -> torch.Tensor:
        ctx.call = call
        ctx.has_beta = beta is not None
        ctx.save_for_backward(x, gamma, *([beta] if beta is not None else []))
        return call.impl.norm_forward(x, gamma, beta, call)

    @staticmethod
    def backward(ctx: Any, dh: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        call: NormCall = ctx.call
        saved = ctx.saved_tensors
        x, gamma = saved[0], saved[1]
        beta = saved[2] if ctx.has_beta else None
        grads = call.impl.norm_backward(dh.contiguous(), x, gamma, beta, call)
        dx = grads.dx if ctx.needs_input_grad[0] else None
        return (dx, None, grads.dgamma, *((grads.dbeta,) if ctx.has_beta else ()))
