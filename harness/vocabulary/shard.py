"""``--shard K/N``: a deterministic, cost-balanced 1/N of a selection.

Every shard of a selection is computed from the same list of cells in the same way, on any
machine, so N CI jobs (or nodes) that each run ``--shard K/N`` cover the selection exactly
once between them. Cells are dealt by longest-processing-time first (``harness.vocabulary.cost``) to
the shard with the least expected work, ties to the lower shard; each shard keeps its
cells in selection order. ``merge`` joins the shards' run folders again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from harness.vocabulary.cost import cell_cost
from harness.vocabulary.errors import UsageError
from harness.vocabulary.matrix import Cell

_SPEC = re.compile(r"^(\d+)/(\d+)$")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def serialize(self) -> dict[str, int]:
        return {"index": self.index, "count": self.count}

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """``K/N`` with 1 <= K <= N.

        Raises:
            UsageError: anything else.
        """
        m = _SPEC.match(text.strip())
        if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
            raise UsageError(f"--shard must be K/N with 1 <= K <= N, got --shard={text!r}")
        return cls(int(m.group(1)), int(m.group(2)))


def assign(cells: Sequence[Cell], count: int) -> list[int]:
    """The shard (0-based) of every cell of ``cells``."""
    load = [0.0] * count
    out = [0] * len(cells)
    for i in sorted(range(len(cells)), key=lambda i: (-cell_cost(cells[i]), i)):
        k = min(range(count), key=lambda k: (load[k], k))
        out[i] = k
        load[k] += cell_cost(cells[i])
    return out


def select(cells: Sequence[Cell], shard: Shard | None) -> list[Cell]:
    """The cells of ``shard`` (all of them without one), in selection order."""
    if shard is None or shard.count == 1:
        return list(cells)
    owner = assign(cells, shard.count)
    return [c for c, k in zip(cells, owner) if k == shard.index - 1]
