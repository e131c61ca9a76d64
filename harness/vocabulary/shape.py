"""A cell's shapes, without torch: the CLI checks a selection against them before any rank
starts, and a command that launches ranks need not pay torch's import in its own process."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from harness.vocabulary import modules, recipes


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


#: the largest shapes ``--examples`` draws (``harness.cell.shape_search``): features and rows up to these
DRAWN_MAX = Example(in_features=40, out_features=48, rows=16)


def size_factor(example: Example) -> float:
    """How many times the default example's GEMM work ``example``'s is (at least 1): what a
    cell's predicted cost (``harness.vocabulary.cost``, fitted on the default shapes) scales by."""
    base = Example()
    work = example.rows * example.in_features * example.out_features
    return max(1.0, work / (base.rows * base.in_features * base.out_features))


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


def fitted(example: Example, module: str, bias: bool, recipe: str = "none", groups: int = 1) -> Example:
    """``example`` as a cell of ``module`` (with ``bias``, ``groups`` GEMMs) under ``recipe``
    runs it: the ``out_features`` the module accepts (``ModuleKind.out_features``), and under a
    recipe every feature count and the rows rounded up to the recipe's alignment
    (``RecipeKind.align``: a quantized GEMM's dimensions). A grouped cell's row splits are then
    drawn in units of the alignment (``harness.cell.inputs``), so its rows are at least one
    unit per group. A cell without a recipe keeps its example's shapes exactly."""
    align = recipes.KINDS[recipe].align
    out = modules.KINDS[module].out_features(example.out_features, bias)
    rows = max(example.rows, align * groups) if align > 1 else example.rows
    fit = {"in_features": _up(example.in_features, align), "out_features": _up(out, align),
           "rows": _up(rows, align)}
    changed = {k: v for k, v in fit.items() if v != getattr(example, k)}
    return replace(example, **changed) if changed else example
