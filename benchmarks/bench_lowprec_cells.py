"""Cost of a low-precision cell against its ``none`` twin on te-cpu, as a sweep pays it.

    python benchmarks/bench_lowprec_cells.py [--repeats 2] [--out FILE]

The cells are every recipe cell of ``ci`` (each recipe on the modules it is judged on, the
``first_mb`` cells included); each one's twin is the same cell with ``recipe=none`` (same
module, weight, hooks, world size, ...). Both lists run interleaved (cell, twin, cell, twin)
in one te-cpu sweep per repeat, so the two sides share the machine's state; a cell's cost is
the ``duration_s`` its run record gives it (its whole verdict on every rank: module steps,
oracle, checks, hook-free twin, the rank exchange), the median over the repeats. Reported per
recipe: the ratio of the summed costs, and the median of the per-pair ratios, over every pair
and over the pairs where both cells pass (TE 2.20.2 fails many of these cells, the twins
included, and a cell that stops at its first error is cheaper: the passing pairs are the
whole path's cost). No ledger: the statuses are recorded beside. Results go
to ``benchmarks/lowprec-cells-<date>.json`` (``--out``).

``bench_lowprec.py`` measures one TE ``Linear`` step in isolation (the quantization kernels'
own cost); this script measures what a user waits for.
"""

from __future__ import annotations

import argparse
import datetime
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import machine  # noqa: E402


def pairs() -> list[tuple[Any, Any]]:
    from harness.vocabulary import matrix

    cells = [c for c in matrix.select("ci") if c.recipe != "none"]
    return [(c, dataclasses.replace(c, recipe="none")) for c in cells]


def sweep(cells: list[Any], run_dir: Path) -> dict[str, tuple[float, str]]:
    """One te-cpu sweep of ``cells``: cell id -> (duration_s, status)."""
    from harness.launcher.launch import LaunchOptions
    from harness.orchestration.sweep import SweepSpec, run_sweep
    from harness.records import recordfile

    spec = SweepSpec(cells=cells, backend="te-cpu", run_dir=run_dir, selection={"benchmark": "lowprec-cells"},
                     argv=sys.argv, options=LaunchOptions(backend="te-cpu", run_dir=run_dir))
    run_sweep(spec)  # returns the record's head: its cells are on disk
    return {c["id"]: (c["duration_s"], c["status"]) for c in recordfile.cells_of(run_dir)}


def _ratios(pairs: list[tuple[str, str]], cost: dict[str, float]) -> dict[str, Any]:
    """The low-precision cells' summed cost over their twins', and the median pair's ratio."""
    if not pairs:
        return {"cells": 0}
    lp, tw = sum(cost[a] for a, _ in pairs), sum(cost[b] for _, b in pairs)
    return {"cells": len(pairs), "lowp_s": round(lp, 3), "twins_s": round(tw, 3), "sum_ratio": round(lp / tw, 2),
            "median_pair_ratio": round(statistics.median(cost[a] / cost[b] for a, b in pairs), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / f"lowprec-cells-{datetime.date.today().isoformat()}.json")
    args = ap.parse_args()
    os.environ.pop("DW_TE_CPU_LAUNCH_CACHE", None)  # every Triton launch interpreted, on both sides
    todo = pairs()
    order = [c for pair in todo for c in pair]
    runs: dict[str, list[float]] = defaultdict(list)
    statuses: dict[str, str] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-lowprec-cells-") as tmp:
        for i in range(args.repeats):
            for cid, (dur, status) in sweep(order, Path(tmp) / f"run{i}").items():
                runs[cid].append(dur)
                statuses[cid] = status
    cost = {cid: statistics.median(v) for cid, v in runs.items()}
    per: dict[str, dict[str, Any]] = {}
    for recipe in sorted({c.recipe for c, _ in todo}):
        mine = [(c.id, t.id) for c, t in todo if c.recipe == recipe]
        passing = [(a, b) for a, b in mine if statuses[a] == statuses[b] == "pass"]
        per[recipe] = {**_ratios(mine, cost), "passing_pairs": _ratios(passing, cost),
                       "lowp_statuses": dict(Counter(statuses[a] for a, _ in mine)),
                       "twin_statuses": dict(Counter(statuses[b] for _, b in mine))}
        print(recipe, per[recipe], flush=True)
    every = [(c.id, t.id) for c, t in todo]
    doc = {"machine": machine(), "repeats": args.repeats, "pairs": len(todo),
           "wall_s": round(time.perf_counter() - started, 1),
           "all": _ratios(every, cost),
           "all_passing_pairs": _ratios([(a, b) for a, b in every if statuses[a] == statuses[b] == "pass"], cost),
           "per_recipe": per}
    print("all", doc["all"], "passing pairs", doc["all_passing_pairs"])
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
