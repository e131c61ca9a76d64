"""The measured detection threshold: the smallest planted error each check family catches.

Every planted fault of the mutants is caught by an exact check or far above its bound; that
says nothing of how *small* an error the harness sees. ``harness.backends.reference.perturb`` plants
a relative error ``k * u`` in one tensor kind; this module bisects ``k`` over a ladder of
powers of two, per recipe, cell dtype and tensor kind, with every kind of a round in one
backend (the kinds do not feed each other). ``k`` is caught when any cell of that recipe and
dtype fails a value check of that kind; the answer is the smallest ladder value caught and the largest
missed, both measured. A cell's error in a kind grows with ``k`` (each planted value moves
monotonically with ``k``, every rounding after it is monotone, and the clean value is within
its bound): a cell that missed at ``k`` misses at every smaller one, which is what the
bisection rests on. So a probe below a miss does not run that cell again: once a round caught
a kind, the rounds below it run only the cells that caught it. Cells with a saved-tensor hook
are left out where a hooks-off cell has the kind: their twin check proves their values bitwise
equal to the hooks-off cell's, so they catch exactly what it catches; a kind that only hooked
cells of a dtype have (``ci`` has fp32 input gradients only under hooks) is searched on those.
Cells expected to raise have no values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from harness.launcher.launch import Task
from harness.vocabulary.matrix import Cell
from harness.records.record import CellResult, tensor_kind
from harness.vocabulary.perturbation import KINDS, RECIPE_NAMES as RECIPES, format_spec

BACKEND_PREFIX = "harness.backends.reference.perturb:"
#: a searched row: (recipe, cell dtype, tensor kind)
Key = tuple[str, str, str]
#: k in units of u: 1, 2, 4, ..., 1024
LADDER: tuple[float, ...] = tuple(2.0**j for j in range(11))


def worst_ratios(results: Iterable[CellResult]) -> dict[tuple[str, str], float]:
    """The largest error/bound ratio per (cell dtype, tensor kind): the clean margin (over
    every hypothesis example a cell ran, when it ran some)."""
    out: dict[tuple[str, str], float] = {}
    for res in results:
        d = res.axes["dtype"]
        for kind, ratio in res.ratios().items():
            out[(d, kind)] = max(out.get((d, kind), 0.0), ratio)
    return out


@dataclass
class Threshold:
    """One row of the sensitivity table."""

    dtype: str
    kind: str
    recipe: str = "none"
    smallest_caught: float | None = None     # None: not caught at the top of the ladder
    largest_missed: float | None = None      # None: caught at the bottom
    catching_cell: str | None = None
    worst_clean_ratio: float | None = None
    tried: list[float] = field(default_factory=list)


@dataclass
class _Bracket:
    lo: int = -1                  # largest ladder index known missed
    hi: int = len(LADDER)         # smallest ladder index known caught
    cell: str | None = None

    @property
    def open(self) -> bool:
        return self.hi - self.lo > 1

    @property
    def mid(self) -> int:
        return (self.lo + self.hi) // 2


class Search:
    """Bisection of ``k`` for every (dtype, kind) the cells have, one backend per round."""

    def __init__(self, cells: Sequence[Cell]) -> None:
        runnable = [c for c in cells if c.expect != "error"]
        #: the cells each (recipe, dtype, kind) is searched on: the hooks-off ones, or the
        #: hooked ones where a selection has no hooks-off cell with that kind. A recipe has no
        #: bias_grad row: the bias gradient sums the unquantized gradient, as without one.
        self.cells_for: dict[Key, list[Cell]] = {}
        for hooked in (False, True):
            found: dict[Key, list[Cell]] = {}
            for c in runnable:
                if (c.hooks != "off") != hooked:
                    continue
                for kind in KINDS:
                    if (kind != "input_grad" or c.input_grad) and (kind != "bias_grad" or c.bias) \
                            and (kind != "bias_grad" or c.recipe == "none"):
                        found.setdefault((c.recipe, c.dtype, kind), []).append(c)
            for key, found_cells in found.items():
                self.cells_for.setdefault(key, found_cells)
        self.brackets = {key: _Bracket() for key in self.cells_for}
        self.tried: dict[Key, list[float]] = {key: [] for key in self.cells_for}
        #: per row, each cell's largest ladder index it missed at (it misses at every smaller one)
        self.missed: dict[Key, dict[str, int]] = {key: {} for key in self.cells_for}
        self._round: dict[Key, float] = {}
        self.anomalies: list[str] = []

    @property
    def cells(self) -> list[Cell]:
        """Every cell some (dtype, kind) is searched on."""
        return list({c.id: c for cs in self.cells_for.values() for c in cs}.values())

    @property
    def pending(self) -> bool:
        """A round's tasks were handed out and await :meth:`observe`."""
        return bool(self._round)

    def tasks(self) -> list[Task]:
        """The next round: one backend planting every open bracket's midpoint."""
        self._round = {key: LADDER[b.mid] for key, b in self.brackets.items() if b.open}
        if not self._round:
            return []
        backend = self.backend()
        return [Task(backend, c, 0) for c in self._round_cells()]

    def candidates(self, key: Key) -> list[Cell]:
        """The cells that may catch ``key`` at its bracket's midpoint: those not known to miss
        there (a miss at that ``k`` or above)."""
        mid = self.brackets[key].mid
        return [c for c in self.cells_for[key] if self.missed[key].get(c.id, -1) < mid]

    def _round_cells(self) -> list[Cell]:
        return list({c.id: c for key in self._round for c in self.candidates(key)}.values())

    def backend(self) -> str:
        return BACKEND_PREFIX + format_spec(self._round)

    def observe(self, results: Mapping[tuple[str, str], CellResult]) -> None:
        """Narrow each bracket of the round from the round's verdicts ((backend, id) -> result)."""
        backend = self.backend()
        ran = self._round_cells()
        caught: dict[Key, str] = {}
        for key in self._round:
            mid = self.brackets[key].mid
            for c in self.candidates(key):
                res = results.get((backend, c.id))
                if res is None or res.status not in ("pass", "fail"):   # no values: nothing known
                    continue
                if any(tensor_kind(check.name) == key[2] and not check.ok
                       for rank in res.ranks for check in rank.comparisons):
                    caught.setdefault(key, c.id)
                else:
                    self.missed[key][c.id] = max(mid, self.missed[key].get(c.id, -1))
        for c in ran:
            res = results.get((backend, c.id))
            if res is not None and res.status not in ("pass", "fail"):   # a scaled value never raises
                self.anomalies.append(f"{c.id} ({backend}): {res.status}: {res.first_failure}")
        for key, k in self._round.items():
            b = self.brackets[key]
            self.tried[key].append(k)
            if key in caught:
                b.hi, b.cell = b.mid, caught[key]
            else:
                b.lo = b.mid
        self._round = {}

    def thresholds(self, clean: Iterable[CellResult]) -> list[Threshold]:
        """One row per (recipe, dtype, kind) searched - the cells without a recipe first - and
        its worst clean ratio over the cells of that recipe."""
        clean = list(clean)
        ratios = {r: worst_ratios(x for x in clean if x.axes.get("recipe", "none") == r)
                  for r in {key[0] for key in self.brackets}}
        order = {r: i for i, r in enumerate(RECIPES)}
        rows = []
        for (r, d, kind), b in sorted(self.brackets.items(),
                                      key=lambda kv: (order[kv[0][0]], kv[0][1], KINDS.index(kv[0][2]))):
            rows.append(Threshold(
                d, kind, r,
                smallest_caught=LADDER[b.hi] if b.hi < len(LADDER) else None,
                largest_missed=LADDER[b.lo] if b.lo >= 0 else None,
                catching_cell=b.cell, worst_clean_ratio=ratios[r].get((d, kind)),
                tried=list(self.tried[(r, d, kind)])))
        return rows


def table(rows: Sequence[Threshold]) -> str:
    """The sensitivity table as printed by ``selftest``."""
    lines = [f"{'recipe':8} {'dtype':6} {'tensor kind':12} {'smallest k caught':>17} {'largest k missed':>16} "
             f"{'worst clean ratio':>17}  caught first in"]
    for r in rows:
        caught = f"{r.smallest_caught:g}" if r.smallest_caught else f"> {LADDER[-1]:g}"
        missed = f"{r.largest_missed:g}" if r.largest_missed else f"< {LADDER[0]:g}"
        ratio = f"{r.worst_clean_ratio:.3g}" if r.worst_clean_ratio is not None else "-"
        lines.append(f"{r.recipe:8} {r.dtype:6} {r.kind:12} {caught:>17} {missed:>16} {ratio:>17}  "
                     f"{r.catching_cell or '-'}")
    return "\n".join(lines)


def serialize(rows: Sequence[Threshold]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
