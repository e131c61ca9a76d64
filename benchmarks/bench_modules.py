"""What the new module values (``LayerNormLinear``'s two, the grouped-tensor paths' two) cost
the ``ci`` preset: the whole CLI sweep with every module value, side by side with the same
sweep restricted to the three modules it had before (``--modules
linear,grouped_linear,ops_grouped_linear``, the same 325 cells as then).

    python benchmarks/bench_modules.py [--backend reference] [--repeats 3] [--baseline REV]

With ``--baseline REV`` the "before" sweep is commit REV's own ``ci`` preset, run from a git
worktree of it (``PYTHONPATH`` puts its ``harness`` first; the report renderers, installed
from this checkout, are today's in both) - the literal "today's ``ci``" before the change.
The two sweeps alternate, ``--repeats`` times each, so a change in the machine's load hits
both alike; the median of each is compared. The goal (reported, not enforced): the full ``ci``
takes at most 1.25x the three-module one. Stores the figures in
``benchmarks/results-<date>.json`` (key ``modules``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, machine, save, table

BEFORE = "linear,grouped_linear,ops_grouped_linear"
GOAL = 1.25


def _sweep(backend: str, out: Path, modules: str | None, tree: Path | None = None) -> float:
    """Wall time of one whole ``sweep --preset ci`` (of the checkout at ``tree``, if given)."""
    cmd = [sys.executable, "-m", "harness", "sweep", "--preset", "ci", "--backend", backend,
           "--quiet", "--out", str(out)]
    if modules:
        cmd += ["--modules", modules]
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree else None
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree or ROOT, capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="reference")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline", default="", help="commit whose own ci preset is 'before'")
    args = p.parse_args()
    times: dict[str, list[float]] = {"before": [], "all": []}
    with tempfile.TemporaryDirectory() as tmp:
        tree = None
        if args.baseline:
            tree = Path(tmp) / "baseline"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.baseline], cwd=ROOT,
                           check=True, capture_output=True)
        try:
            for i in range(args.repeats):
                times["before"].append(_sweep(args.backend, Path(tmp) / f"before{i}",
                                              None if tree else BEFORE, tree))
                times["all"].append(_sweep(args.backend, Path(tmp) / f"all{i}", None))
        finally:
            if tree:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                               capture_output=True)
    label = f"ci of {args.baseline} (before)" if tree else "ci, three modules (before)"
    before, after = statistics.median(times["before"]), statistics.median(times["all"])
    ratio = after / before
    print(table(["sweep", "cells", "median s", "runs s"], [
        [label, "325", f"{before:.1f}", ", ".join(f"{t:.1f}" for t in times["before"])],
        ["ci, all seven module values", "426", f"{after:.1f}", ", ".join(f"{t:.1f}" for t in times["all"])],
    ]))
    print(f"\nratio {ratio:.2f} (goal <= {GOAL})")
    save("modules" + (f"-vs-{args.baseline}" if tree else ""),
         {"machine": machine(), "backend": args.backend, "baseline": args.baseline or None, "times_s": times,
                     "median_before_s": before, "median_all_s": after, "ratio": ratio, "goal": GOAL})
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    raise SystemExit(main())
