"""The recipes the reference runs, under the names and defaults of
``transformer_engine.common.recipe`` (so ``autocast(recipe=...)`` takes TE's objects or these).

Only the attributes the reference reads are defined; a TE recipe object works as well (the
reference looks at its class name and these attributes). docs/low-precision.md lists the
recipes and their defaults.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Format", "DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling", "Float8BlockScaling",
           "NVFP4BlockScaling"]


class Format(enum.Enum):
    """FP8 element formats of the forward and the gradient operands (TE's ``Format``)."""

    E4M3 = "e4m3"
    E5M2 = "e5m2"
    HYBRID = "hybrid"  # E4M3 forward, E5M2 gradients


@dataclass
class DelayedScaling:
    """Per-tensor scales from the amax history of earlier steps (TE's defaults)."""

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    reduce_amax: bool = True


@dataclass
class Float8CurrentScaling:
    """Per-tensor scales from each tensor's own amax (TE's defaults)."""

    fp8_format: Format = Format.HYBRID


@dataclass
class MXFP8BlockScaling:
    """E4M3 blocks of 32 along each GEMM's K, one E8M0 (power-of-two) scale each (TE's
    defaults)."""

    fp8_format: Format = Format.E4M3


@dataclass
class Float8BlockScaling:
    """E4M3 with power-of-two fp32 scales per block: 1x128 blocks along K for the input and
    the gradient (``*_block_scaling_dim`` 1), 128x128 tiles for the weight (2): TE's
    defaults. The reference computes power-of-two scales only (TE's ``power_2_scale``
    default)."""

    fp8_format: Format = Format.E4M3
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1


@dataclass
class NVFP4BlockScaling:
    """E2M1 elements, one E4M3 scale per 16 elements along K (per 16x16 tile for the weight,
    ``disable_2d_quantization`` off) and one fp32 scale per tensor (TE's defaults). The
    reference runs it with the Hadamard transform and stochastic rounding off only
    (``disable_rht``, ``disable_stochastic_rounding``: what the harness asks for)."""

    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False
