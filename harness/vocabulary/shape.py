"""A cell's shapes, without torch: the CLI checks a selection against them before any rank
starts, and a command that launches ranks need not pay torch's import in its own process.

The ``shape`` axis says which shapes a cell runs with (:data:`KINDS`): ``base``, the
example's (every cell before the axis), or ``blocks``, the shapes that make every quantized
operand of every GEMM span at least two blocks of its recipe along every dimension it is
blocked along, with a ragged edge where TE pads (:func:`operand_blocks`, :func:`spans`: the
rule, written here once; docs/low-precision.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from harness.vocabulary import modules, recipes

__all__ = ["Example", "ShapeKind", "KINDS", "NAMES", "fitted", "span", "group_unit", "operand_blocks",
           "spans", "smallest_group_rows"]


@dataclass(frozen=True)
class Example:
    """The shapes a cell runs with; hypothesis draws others with ``--examples``.

    ``out_features`` defaults to 30 so that GTP shards need tail padding at world sizes 4
    and 8 and none at 1 and 2; ``rows`` are per rank and microbatch.
    """

    in_features: int = 24
    out_features: int = 30
    rows: int = 12
    salt: int = 0

    def serialize(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Example":
        return cls(**{k: int(v) for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ShapeKind:
    """One value of the ``shape`` axis.

    Attributes:
        name: the axis value; a cell id names it (``-s<name>``) unless it is ``base``.
        summary: one line for ``list`` and the docs.
        spans_blocks: the cell's shapes are stretched to :func:`span` along every blocked
            dimension (only under a recipe that scales blocks: ``recipes.RecipeKind.blocked``).
        profile: the cell's inputs carry a block magnitude profile (``harness.cell.inputs``):
            neighbouring blocks of 16, 32 and 128 elements along each dimension differ by
            powers of two, so that neighbouring blocks have different scales by design, not
            only where their amaxes happen to straddle a power of two (docs/low-precision.md).
    """

    name: str
    summary: str
    spans_blocks: bool = False
    profile: bool = False


_ALL = (
    ShapeKind("base", "the example's shapes (24 x 30, 12 rows; under a recipe aligned to it)"),
    ShapeKind("blocks", "every quantized operand of every GEMM spans at least two blocks of the recipe "
              "along each blocked dimension, with a ragged edge where TE pads (block recipes only)",
              spans_blocks=True, profile=True),
)
KINDS: dict[str, ShapeKind] = {k.name: k for k in _ALL}
NAMES: tuple[str, ...] = tuple(KINDS)


#: the largest shapes ``--examples`` draws (``harness.cell.shape_search``): features and rows up to these
DRAWN_MAX = Example(in_features=40, out_features=48, rows=16)


def size_factor(example: Example) -> float:
    """What a cell's predicted cost (``harness.vocabulary.cost``, fitted on the default shapes)
    scales by with ``example``'s shapes: the square root of how many times the default
    example's GEMM work theirs is (at least 1). Not the work itself: at these sizes a GEMM's
    time is mostly the fixed cost of a call, and a ``blocks`` cell of 272-wide groups, 9,300
    times the default work, runs in tens of seconds, not hours (docs/runner-faults.md)."""
    base = Example()
    work = example.rows * example.in_features * example.out_features
    return max(1.0, work / (base.rows * base.in_features * base.out_features)) ** 0.5


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


def span(recipe: str) -> int:
    """The size the ``blocks`` shape gives every blocked dimension under ``recipe``: two whole
    blocks and one more alignment unit - ``2 * block_length + align`` (MXFP8 96: three blocks of
    32, whose three scales TE pads to four and whose rows it pads to 128; FP8 block scaling 272:
    two blocks of 128 and a short third of 16, two 128 x 128 weight tiles and a short third each
    way; NVFP4 48: three blocks of 16, three scales padded to four). 0 for a recipe without
    blocks (``none`` and the per-tensor recipes: one scale per tensor, nothing to span)."""
    kind = recipes.KINDS[recipe]
    return 2 * kind.block_length + kind.align if kind.blocked else 0


def group_unit(recipe: str, shape: str = "base", module: str = "linear") -> int:
    """Every group's rows are a multiple of this (``harness.cell.inputs.draw_splits`` draws in
    units of it): the recipe's alignment, or under ``blocks`` the :func:`span`, so that every
    group that has rows spans two blocks along them (its wgrad GEMM's K); on a grouped-tensor
    path that, rounded up to the recipe's ``member_rows`` (TE's grouped MXFP8 and FP8
    block-scaling quantizers take whole 128-row members)."""
    kind = recipes.KINDS[recipe]
    unit = span(recipe) if KINDS[shape].spans_blocks and kind.blocked else kind.align
    if modules.KINDS[module].path == "grouped_tensor" and kind.quantized:
        unit = _up(unit, kind.member_rows)
    return unit


def fitted(example: Example, module: str, bias: bool, recipe: str = "none", groups: int = 1,
           shape: str = "base") -> Example:
    """``example`` as a cell of ``module`` (with ``bias``, ``groups`` GEMMs) under ``recipe``
    and ``shape`` runs it: the ``out_features`` the module accepts (``ModuleKind.out_features``),
    and under a recipe every feature count and the rows rounded up to the recipe's alignment
    (``RecipeKind.align``: a quantized GEMM's dimensions). Under ``blocks`` every feature count
    is at least :func:`span` and the rows at least one :func:`group_unit` per group, in whole
    units. A grouped cell's row splits are then drawn in units of :func:`group_unit`
    (``harness.cell.inputs``), so its rows are at least one unit per group. A cell without a
    recipe keeps its example's shapes exactly."""
    align = recipes.KINDS[recipe].align
    out = modules.KINDS[module].out_features(example.out_features, bias)
    unit = group_unit(recipe, shape, module)
    low = span(recipe) if KINDS[shape].spans_blocks else 0
    rows = max(example.rows, unit * groups) if unit > 1 else example.rows
    fit = {"in_features": max(_up(example.in_features, align), low),
           "out_features": max(_up(out, align), low), "rows": _up(rows, unit)}
    changed = {k: v for k, v in fit.items() if v != getattr(example, k)}
    return replace(example, **changed) if changed else example


def smallest_group_rows(example: Example, recipe: str, groups: int, shape: str = "base",
                        module: str = "linear") -> int:
    """The fewest rows a group that has rows can get in a cell of ``example`` (fitted): all of
    them with one group, else one :func:`group_unit` (the splits are drawn in whole units)."""
    return example.rows if groups == 1 else min(example.rows, group_unit(recipe, shape, module))


def operand_blocks(recipe: str, in_features: int, out_features: int, group_rows: int) -> dict[str, dict[str, int]]:
    """Every quantized operand of every GEMM of a linear layer under ``recipe`` (``y = x W^T``,
    ``dx = dy W``, ``dW = dy^T x``; a grouped layer's per group, with ``group_rows`` the fewest
    rows of a group that has any) and how many blocks it spans along each dimension it is
    blocked along: 1-D blocks (``block_length``) lie along the GEMM's K - the features for the
    forward and dgrad operands, the rows for the wgrad's - and a weight in 2-D tiles
    (``weight_tile``) is blocked along both of its dimensions in both GEMMs that read it. Empty
    for a recipe without blocks."""
    kind = recipes.KINDS[recipe]
    if not kind.blocked:
        return {}
    n = lambda size, block: -(-size // block)  # noqa: E731 - a short last block is a block
    b, t = kind.block_length, kind.weight_tile
    tiles = {"out_features": n(out_features, t), "in_features": n(in_features, t)} if t else None
    return {
        "forward.input": {"in_features": n(in_features, b)},
        "forward.weight": tiles or {"in_features": n(in_features, b)},
        "dgrad.output_grad": {"out_features": n(out_features, b)},
        "dgrad.weight": tiles or {"out_features": n(out_features, b)},
        "wgrad.output_grad": {"rows": n(group_rows, b)},
        "wgrad.input": {"rows": n(group_rows, b)},
    }


def spans(recipe: str, in_features: int, out_features: int, group_rows: int, blocks: int = 2) -> bool:
    """The rule the ``blocks`` shape meets: every quantized operand of every GEMM spans at least
    ``blocks`` blocks along every dimension it is blocked along (:func:`operand_blocks`). True
    for a recipe without blocks (no blocked dimension: one scale per tensor)."""
    return all(count >= blocks for dims in operand_blocks(recipe, in_features, out_features, group_rows).values()
               for count in dims.values())
