"""Seeded inputs of one cell: weights, per-rank activations, upstream grads and splits.

Every value is drawn from a seed that depends only on the cell (``Cell.seed``: not on its
weight kind or hook mode), the example, the rank and the microbatch - never on the backend - and is rounded to the cell's dtype before the
oracle sees it, so the float64 reference and the backend start from identical numbers.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import asdict, dataclass
from typing import Any

import torch

from harness.vocabulary.shape import Example

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def generator(seed: int, *path: Any) -> torch.Generator:
    """A CPU generator seeded by a stable hash of ``(seed, *path)``."""
    digest = hashlib.sha256(repr((seed, *path)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def randn(shape: tuple[int, ...], dtype: torch.dtype, seed: int, *path: Any, scale: float = 1.0) -> torch.Tensor:
    """Standard-normal values, scaled, then rounded to ``dtype`` (what both sides use)."""
    return (torch.randn(shape, generator=generator(seed, *path), dtype=torch.float32) * scale).to(dtype)


#: the block lengths the magnitude profile of a block-spanning cell alternates at (NVFP4's 16,
#: MXFP8's 32, FP8 block scaling's 128: ``harness.vocabulary.recipes.RecipeKind.block_length``)
PROFILE_BLOCKS: tuple[int, ...] = (16, 32, 128)


@functools.lru_cache(maxsize=16)
def profile(rows: int, cols: int) -> torch.Tensor:
    """The magnitude profile of a ``[rows, cols]`` operand (fp32 powers of two): element
    ``(i, j)`` is scaled by ``2^(sum_b ((i // b + j // b) mod 2) - 1)`` over
    :data:`PROFILE_BLOCKS`, from 1/2 to 4 - at every one of those lengths a checkerboard of
    ``b x b`` squares, one twice the other. So along either dimension neighbouring blocks of
    every length differ by a factor of 2 (a block of 32 holds two of 16, one of each, and its
    own term alternates; likewise at 128), in one direction in some rows and in the other in
    the next ``b`` rows; and neighbouring 2-D tiles of 16 or 128 likewise, in both directions.

    Why: with inputs of one magnitude neighbouring blocks of a power-of-two scaling recipe get
    the same scale unless their amaxes happen to straddle a power of two; with the profile
    neighbouring blocks' scales differ by design, and a block given a smaller neighbour's amax saturates whichever
    neighbour it takes. Measured on ``ci``'s block-spanning cells: the block mutants die either
    way, the weakest kill's error/bound ratio 3.1 to 3.6 times higher with it (docs/low-precision.md).
    A power of two scales exactly in every dtype, so the values stay those the cell's dtype holds.

    Kept per shape (a cell draws a few dozen operands of three shapes, and making one was
    most of the cost of drawing a block-spanning cell's inputs); callers never change it."""
    i = torch.arange(rows).unsqueeze(1)
    j = torch.arange(cols).unsqueeze(0)
    e = sum(((i // b + j // b) % 2) for b in PROFILE_BLOCKS) - 1
    return torch.ldexp(torch.ones(rows, cols), e.to(torch.int32))


def _profiled(t: torch.Tensor, on: bool) -> torch.Tensor:
    """``t`` (2-D, drawn in fp32) times the profile (:func:`profile`) when ``on``."""
    return t * profile(*t.shape) if on else t


def draw_splits(rows: int, groups: int, seed: int, rank: int, mb: int) -> list[int]:
    """Row splits over ``groups`` that differ per rank and microbatch, with empty groups.

    Rank 0's first microbatch always leaves at least one group empty (when there are at
    least two), so zero-row GEMMs are exercised in every grouped cell.
    """
    if groups == 1:
        return [rows]
    g = generator(seed, "splits", rank, mb)
    live = torch.rand(groups, generator=g) > 0.35
    if rank == 0 and mb == 0:
        live[int(torch.randint(groups, (1,), generator=g))] = False
    if not live.any():
        live[int(torch.randint(groups, (1,), generator=g))] = True
    probs = live.to(torch.float64) * torch.rand(groups, generator=g, dtype=torch.float64).add_(0.1)
    if rows == 0:
        return [0] * groups
    picks = torch.multinomial(probs, rows, replacement=True, generator=g)
    return torch.bincount(picks, minlength=groups).tolist()


def group_rows(splits: list[int]) -> list[slice]:
    """The rows of each group member, in order, from its row counts."""
    out, start = [], 0
    for n in splits:
        out.append(slice(start, start + n))
        start += n
    return out


@dataclass
class CellInputs:
    """Everything every rank needs to run, and the oracle to judge, one cell."""

    dtype: torch.dtype
    weights: list[torch.Tensor]           # full logical (out, in), one per group member
    biases: list[torch.Tensor]            # (out,) or empty
    x: list[list[torch.Tensor]]           # [rank][mb] (rows, in)
    dy: list[list[torch.Tensor]]          # [rank][mb] (rows, out)
    splits: list[list[list[int]]]         # [rank][mb] -> per-group rows
    norm: Norm | None = None              # the normalization before the GEMM, if any


@dataclass
class Norm:
    """A normalization's parameters as a cell draws them (CONTRACTS §1 ``LayerNormLinear``).

    ``gamma`` is the stored parameter: with ``zero_centered`` the applied scale is
    ``1 + gamma``, so it is drawn around 0 there and around 1 otherwise (the applied scales
    are alike either way). ``beta`` is None for RMSNorm.
    """

    kind: str                             # "LayerNorm" or "RMSNorm"
    zero_centered: bool
    gamma: torch.Tensor                   # (in,)
    beta: torch.Tensor | None             # (in,) or None
    eps: float = 1e-5

    @property
    def params(self) -> list[torch.Tensor]:
        """In the module's parameter order: ``layer_norm_weight``, then ``layer_norm_bias``."""
        return [self.gamma] + ([self.beta] if self.beta is not None else [])


def make_norm(seed: int, example: Example, dtype: torch.dtype, kind: str | None,
              zero_centered: bool) -> Norm | None:
    """The normalization's seeded parameters, rounded to ``dtype`` (None: no normalization)."""
    if kind is None:
        return None
    s = (seed, example.salt)
    shape = (example.in_features,)
    offset = 0.0 if zero_centered else 1.0
    gamma = (randn(shape, torch.float32, *s, "gamma", scale=0.5) + offset).to(dtype)
    beta = randn(shape, dtype, *s, "beta", scale=0.5) if kind == "LayerNorm" else None
    return Norm(kind, zero_centered, gamma, beta)


def make_inputs(seed: int, example: Example, dtype_name: str, world_size: int,
                microbatches: int, groups: int, bias: bool, norm: str | None = None,
                zero_centered: bool = False, unit: int = 1, profile: bool = False) -> CellInputs:
    """Every tensor of one cell; ``norm`` (``"LayerNorm"``/``"RMSNorm"``) adds the
    normalization's parameters (:func:`make_norm`). ``unit``: every group's rows are a
    multiple of it (``harness.vocabulary.shape.group_unit``: a recipe's alignment, or the span
    of two blocks; ``rows`` is). ``profile``: the weights, inputs and output gradients carry the
    block magnitude profile (:func:`profile`) along both dimensions (a block-spanning cell)."""
    dtype = DTYPES[dtype_name]
    e = example
    s = (seed, e.salt)

    def draw(shape: tuple[int, int], *path: Any, scale: float = 1.0) -> torch.Tensor:
        return _profiled(randn(shape, torch.float32, *s, *path, scale=scale), profile).to(dtype)

    weights = [draw((e.out_features, e.in_features), "w", i, scale=0.5) for i in range(groups)]
    biases = [randn((e.out_features,), dtype, *s, "b", i, scale=0.5) for i in range(groups)] if bias else []
    ranks = range(world_size)
    mbs = range(microbatches)
    x = [[draw((e.rows, e.in_features), "x", r, m) for m in mbs] for r in ranks]
    dy = [[draw((e.rows, e.out_features), "dy", r, m) for m in mbs] for r in ranks]
    splits = [[[n * unit for n in draw_splits(e.rows // unit, groups, hash_seed(s), r, m)] for m in mbs]
              for r in ranks]
    return CellInputs(dtype, weights, biases, x, dy, splits,
                      make_norm(seed, example, dtype, norm, zero_centered))


def hash_seed(parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & (2**63 - 1)


def main_grad_start(shape: tuple[int, ...], seed: int, name: str, rank: int | None) -> torch.Tensor:
    """The seeded non-zero value a DDP ``main_grad`` starts a step with (fp32).

    Replicated parameters pass ``rank=None`` so every rank starts from the same value.
    """
    return torch.randn(shape, generator=generator(seed, "main_grad", name, rank), dtype=torch.float32)
