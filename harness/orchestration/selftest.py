"""Self-validation: the clean reference and every planted mutant over one selection.

A harness earns trust by going red on every known fault class and never on correct code.
All backends share one packed launch (``harness.vocabulary.packing``: the process groups do not depend
on the backend). A mutant only runs the cells of the modules it changes (and, for a fault of the FP8 path, of
the recipes it can show under): for the others its classes *are* the reference's, so their
verdicts are the clean run's by construction.

A mutant counts as killed only when a failing check is evidence of its own fault (its
``evidence`` patterns: a check name or the text of the expected exception); a kill by an
unrelated crash is reported as ``unrelated`` and fails the self-test like a survivor.

One kill is enough, so a mutant runs in up to four rounds, each only while no cell has killed
it by evidence: the first ``COVER_ROUNDS[0]`` cells of a pairwise-covering part of its cells
(every pair of values of any two axes that its cells hold appears in one of them,
``first_round``: about a quarter of them), then up to ``COVER_ROUNDS[1]`` cells of it, then the
rest of that part, then every other cell. The verdict is the one a run over every cell gives
(a survivor has run them all); ``killing cells`` counts the kills among the cells it ran. The
sensitivity search takes four launches of its own, so these rounds add none.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import heapq
from itertools import combinations

from harness.vocabulary import fault_classes, matrix
from harness.orchestration import sensitivity
from harness.vocabulary import packing
from harness.launcher.launch import LaunchOptions, Task, launch_tasks
from harness.records.record import CellResult
from harness.vocabulary.status import HARNESS_ERROR
from harness.records.stream import ResultStream

CLEAN = "harness.backends.reference"
#: where a mutant's first two rounds end in its pairwise cover (the ``ci`` self-test of
#: 2026-12-06: 29 of 38 mutants killed in the first 8 cells, 5 more by the 24th, 4 in the rest
#: of the cover); on TE's side only the first (a round there is a te-cpu launch of its own)
COVER_ROUNDS = (8, 24)
MUTANT_PREFIX = "harness.backends.reference.mutants:"


@dataclass
class MutantVerdict:
    name: str
    description: str
    verdict: str                          # killed | unrelated | survived
    killing_cells: list[str] = field(default_factory=list)
    first_check: str | None = None
    evidence: list[str] = field(default_factory=list)
    cells_run: int = 0
    #: how many rounds it ran (1: killed in its cover's first ``COVER_ROUNDS[0]`` cells; then
    #: one per further end of ``COVER_ROUNDS`` it needed, one for the rest of its pairwise
    #: cover, and a last one if it needed every other cell, or survived them all)
    rounds: int = 1

    @property
    def killed(self) -> bool:
        return self.verdict == "killed"


@dataclass
class SelftestResult:
    mutants: list[MutantVerdict]
    clean: list[CellResult]
    duration_s: float
    max_ratio_per_dtype: dict[str, float]
    thresholds: list[sensitivity.Threshold] = field(default_factory=list)
    #: perturbation cells that raised or timed out (a harness or reference bug)
    anomalies: list[str] = field(default_factory=list)
    #: the part in TE's own code: the clean patched tree's cells (judged under TE's ledger) and
    #: the tree (None: not run)
    te_clean: list[CellResult] = field(default_factory=list)
    te_tree: str | None = None

    @property
    def false_alarms(self) -> int:
        return sum(1 for c in [*self.clean, *self.te_clean] if not c)

    @property
    def score(self) -> float:
        return sum(m.killed for m in self.mutants) / len(self.mutants) if self.mutants else 1.0

    @property
    def harness_errors(self) -> int:
        """Clean cells the harness itself failed on (exit 3: the self-test proves nothing then)."""
        return sum(1 for c in self.clean if c.status == HARNESS_ERROR)

    @property
    def ok(self) -> bool:
        return self.false_alarms == 0 and all(m.killed for m in self.mutants) and not self.blind \
            and not self.anomalies

    @property
    def blind(self) -> list[sensitivity.Threshold]:
        """Tensor kinds no planted error up to the top of the ladder was caught in."""
        return [t for t in self.thresholds if t.smallest_caught is None]

    def serialize(self) -> dict[str, Any]:
        return {
            "score": self.score, "false_alarms": self.false_alarms, "ok": self.ok,
            "duration_s": self.duration_s, "clean_cells": len(self.clean),
            "te": {"tree": self.te_tree, "clean_cells": len(self.te_clean),
                   "false_alarms": sum(1 for c in self.te_clean if not c)} if self.te_tree else None,
            "max_ratio_per_dtype": self.max_ratio_per_dtype,
            "sensitivity": sensitivity.serialize(self.thresholds), "sensitivity_anomalies": self.anomalies,
            "mutants": [{**asdict(m), "killed": m.killed} for m in self.mutants],
        }


def _judge(mutant: fault_classes.FaultClass, results: list[CellResult]) -> MutantVerdict:
    v = MutantVerdict(mutant.name, mutant.description, "survived", cells_run=len(results))
    for res in results:
        if res:
            continue
        v.killing_cells.append(res.id)
        found = fault_classes.evidence_found(mutant, [c for r in res.ranks for c in r.comparisons])
        if found and not v.evidence:
            v.evidence = found[:3]
            name, _, message = found[0].partition(": ")
            first = message if message.startswith(name) else found[0]
            v.first_check = first.splitlines()[0][:300]
    if v.killing_cells:
        v.verdict = "killed" if v.evidence else "unrelated"
        if not v.evidence:
            v.first_check = next(r.first_failure for r in results if not r)
    return v


def first_round(cells: list[matrix.Cell]) -> list[matrix.Cell]:
    """A part of ``cells`` holding every pair of axis values that ``cells`` hold (a greedy
    cover, deterministic: ties go to the earlier cell), in the cells' order."""
    def pairs(c: matrix.Cell) -> frozenset:
        return frozenset(combinations(sorted((k, repr(v)) for k, v in c.serialize().items()), 2))

    held = [pairs(c) for c in cells]
    need = set().union(*held) if held else set()
    # lazy greedy: a cell's gain only shrinks, so a stale heap key is an upper bound and the
    # first cell whose fresh gain still tops the heap is the plain greedy's choice (ties: the
    # earlier cell) - linear-ish in the cells, not quadratic (a `full` selection has 62,640)
    heap = [(-len(h), i) for i, h in enumerate(held)]
    heapq.heapify(heap)
    chosen: set[int] = set()
    while need:
        _, i = heapq.heappop(heap)
        fresh = (-len(held[i] & need), i)
        if heap and fresh > heap[0]:
            heapq.heappush(heap, fresh)
            continue
        chosen.add(i)
        need -= held[i]
    return [c for i, c in enumerate(cells) if i in chosen]


def max_ratios(results: list[CellResult]) -> dict[str, float]:
    """The largest error/bound ratio of any value check, per cell dtype (the margin)."""
    out: dict[str, float] = {}
    for (d, _), ratio in sensitivity.worst_ratios(results).items():
        out[d] = max(out.get(d, 0.0), ratio)
    return out


@dataclass
class TeSide:
    """The self-test's part in TE's own code on CPU: the cells that need TE (TE's and Megatron's
    installers, Megatron's expert layer), judged on te-cpu over the project's patched TE tree -
    the clean backend there - and the faults planted in it (``fault_classes.TE``)."""

    tree: str
    cells: list[matrix.Cell]
    opts: LaunchOptions
    #: the cells the clean backend fails for a known defect of TE or Megatron (not the fix's:
    #: ``ledger.apply`` under the shipped ledger) are no false alarm
    judge: Callable[[list[CellResult]], list[CellResult]] = lambda results: results

    @property
    def clean(self) -> str:
        return f"te-cpu@{self.tree}"

    def spec(self, fault: str) -> str:
        return f"{TE_MUTANT_PREFIX}{fault}@{self.tree}"


#: the backend of a fault planted in TE's own code (``harness.backends.te_cpu.mutants``)
TE_MUTANT_PREFIX = "harness.backends.te_cpu.mutants:"


def _mutation(clean: str, cells: list[matrix.Cell], faults: dict[str, tuple[fault_classes.FaultClass, str]],
              opts: LaunchOptions, progress: Callable[[str, CellResult], None], clean_examples: int = 0,
              search: sensitivity.Search | None = None,
              cover_rounds: tuple[int, ...] = COVER_ROUNDS) -> tuple[list[CellResult], list[MutantVerdict]]:
    """``clean`` and each fault's backend over ``cells`` (a fault over its own cells, in rounds
    while nothing killed it by evidence: its pairwise cover's cells up to each of
    ``cover_rounds``, the rest of the cover, then every other cell); the clean results and each
    fault's verdict."""
    stream = ResultStream(opts.run_dir)
    since = stream.size()
    tasks = [Task(clean, c, clean_examples) for c in cells]
    later: dict[str, list[list[matrix.Cell]]] = {}  # a mutant's rounds still to run, if not killed
    for name, (m, spec) in faults.items():
        mine = [c for c in cells if m.runs_in(c)]
        cover = first_round(mine)
        ends = [*cover_rounds, len(cover)]
        tasks += [Task(spec, c, 0) for c in cover[:ends[0]]]
        covered = set(cover)
        later[name] = [cover[a:b] for a, b in zip(ends, ends[1:])] + [[c for c in mine if c not in covered]]
    if search is not None:
        tasks += search.tasks()
    latest: dict[tuple[str, str], CellResult] = {}
    rounds = dict.fromkeys(faults, 1)

    def results_of(backend: str) -> list[CellResult]:
        return [res for (b, _), res in latest.items() if b == backend]

    while tasks:
        for width, members in packing.launch_groups([t.cell for t in tasks]):
            launch_tasks(width, [tasks[i] for i in members], opts, progress)
        # the verdicts come from the result stream alone, one per (backend, cell)
        verdicts, since = stream.read_since(since)
        latest.update((v.key, v.result) for v in verdicts)
        tasks = []
        if search is not None:
            if search.pending:
                search.observe(latest)
            tasks = search.tasks()
        for name, pending in later.items():  # not killed by evidence yet: its next round
            m, spec = faults[name]
            if _judge(m, results_of(spec)).killed:
                pending.clear()
            while pending:
                round_cells = pending.pop(0)
                rounds[name] += 1  # an empty round (a short cover's) counts too
                if round_cells:
                    tasks += [Task(spec, c, 0) for c in round_cells]
                    break
        later = {n: p for n, p in later.items() if p}
    verdicts = []
    for name, (m, spec) in faults.items():
        v = _judge(m, results_of(spec))
        v.rounds = rounds[name]
        verdicts.append(v)
    return results_of(clean), verdicts


def run_selftest(cells: list[matrix.Cell], opts: LaunchOptions,
                 progress: Callable[[str, CellResult], None] = lambda b, r: None,
                 clean_examples: int = 0, te: TeSide | None = None) -> SelftestResult:
    """Run the clean reference and every mutant over ``cells``; judge each mutant; then
    measure the detection threshold (``harness.orchestration.sensitivity``; its first round shares the
    mutants' launches, each later round is one more launch per launch group). ``te``: the part in
    TE's own code (the clean patched tree and the faults planted there, over its cells).

    ``clean_examples`` hypothesis-drawn shapes per cell hunt for false alarms on the clean
    reference (mutants need no extra examples: one kill is enough).
    """
    t0 = time.monotonic()
    search = sensitivity.Search(cells)
    faults = {name: (m, MUTANT_PREFIX + name) for name, m in fault_classes.REFERENCE.items()}
    clean, verdicts = _mutation(CLEAN, cells, faults, opts, progress, clean_examples, search)
    te_clean: list[CellResult] = []
    if te is not None:
        te_faults = {name: (m, te.spec(name)) for name, m in fault_classes.TE.items()}
        # no search rides along on TE's side: a round is a launch of its own there
        te_clean, te_verdicts = _mutation(te.clean, te.cells, te_faults, te.opts, progress,
                                          cover_rounds=COVER_ROUNDS[:1])
        te_clean = te.judge(te_clean)
        verdicts += te_verdicts
    return SelftestResult(verdicts, clean, round(time.monotonic() - t0, 2),
                          max_ratios(clean), search.thresholds(clean), search.anomalies,
                          te_clean=te_clean, te_tree=te.tree if te is not None else None)


def table(result: SelftestResult) -> str:
    lines = [f"{'mutant':28} {'verdict':9} {'killing cells':>13}  first failing check (evidence)"]
    for m in result.mutants:
        lines.append(f"{m.name:28} {m.verdict:9} {len(m.killing_cells):>6}/{m.cells_run:<6}  "
                     f"{(m.first_check or '-').splitlines()[0][:110]}")
    lines.append("")
    te = (f"; TE's own code on the patched tree {result.te_tree}: {len(result.te_clean)} cells, "
          f"{sum(1 for c in result.te_clean if not c)} false alarm(s)") if result.te_tree else ""
    lines.append(f"mutation score {result.score:.0%} ({sum(m.killed for m in result.mutants)}/"
                 f"{len(result.mutants)} killed by evidence of their fault); clean reference: "
                 f"{len(result.clean)} cells, {sum(1 for c in result.clean if not c)} false alarm(s){te}")
    for c in [*result.clean, *result.te_clean]:
        if not c:  # a false alarm: the cell, and why, with its repro
            lines.append(f"FALSE ALARM {c.id}: {(c.first_failure or c.status).splitlines()[0][:300]}")
            lines.append(f"  repro: {c.repro}")
    later = [f"round {n}: {', '.join(names)}" for n in range(2, len(COVER_ROUNDS) + 3)
             if (names := [m.name for m in result.mutants if m.rounds == n])]
    lines.append(f"each mutant ran first on {COVER_ROUNDS[0]} cells of a pairwise-covering part of its cells, "
                 f"then on up to {COVER_ROUNDS[1]} of them (TE's side: no such round), the rest of them, every "
                 f"other cell, while nothing killed it; later rounds: {'; '.join(later) or 'none'}")
    ratios = ", ".join(f"{d} {r:.3g}" for d, r in sorted(result.max_ratio_per_dtype.items()))
    lines.append(f"largest error/bound ratio on the clean reference per dtype: {ratios or '-'}")
    if result.thresholds:
        lines += ["", "sensitivity: the smallest relative error k*u planted in one tensor kind (k a power "
                  "of 2, u the unit roundoff of the value's dtype) that a value check catches",
                  sensitivity.table(result.thresholds)]
    for t in result.blind:
        lines.append(f"BLIND: no {t.kind} error in {t.dtype} cells was caught up to k = {sensitivity.LADDER[-1]:g}")
    for a in result.anomalies:
        lines.append(f"ANOMALY: a planted value error made a cell raise: {a}")
    return "\n".join(lines)


def write(result: SelftestResult, path: Path) -> None:
    path.write_text(json.dumps(result.serialize(), indent=1))
