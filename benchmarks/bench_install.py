"""The README test command's set-up (venv, pip, ``python -m harness install``) on a fresh clone:
the environment compiled on every core, against on one (``harness install --jobs 1``, which
compiles what pip would have, one file after another).

Run from the repository root: ``python benchmarks/bench_install.py`` (about 4 minutes on 2 CPU
cores; ``--reps``). Each set-up is a fresh clone of HEAD in a temporary folder with a new
virtual environment; the two ways alternate. Each stage's wall time and CPU time (user and
system of its processes) are recorded. Results go to ``benchmarks/results-<date>.json``
(key ``install``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, children_cpu, machine, save, table

#: the README's set-up, stage by stage (the test command before its pytest call)
STAGES: tuple[tuple[str, str], ...] = (
    ("venv", "python3 -m venv .venv"),
    ("pip", '. .venv/bin/activate && pip install --no-compile torch==2.13.0 -e ".[test]"'),
    ("harness install", ". .venv/bin/activate && python -m harness install{jobs}"),
)
WAYS = {"every core": "", "one core": " --jobs 1"}


def _set_up(jobs: str) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="dw-bench-install-") as tmp:
        repo = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        stages = {}
        for name, command in STAGES:
            wall, cpu = time.monotonic(), children_cpu()
            proc = subprocess.run(["bash", "-c", command.format(jobs=jobs)], cwd=repo, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"{name} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
            stages[name] = {"wall_s": round(time.monotonic() - wall, 2), "cpu_s": round(children_cpu() - cpu, 2)}
        stages["total"] = {k: round(sum(s[k] for s in stages.values()), 2) for k in ("wall_s", "cpu_s")}
        return stages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, dict[str, float]]]] = {way: [] for way in WAYS}
    for rep in range(args.reps):
        for way in (list(WAYS) if rep % 2 == 0 else list(reversed(WAYS))):
            runs[way].append(_set_up(WAYS[way]))
            print(f"{way}: {runs[way][-1]['total']}", flush=True)
    names = [name for name, _ in STAGES] + ["total"]
    medians = {way: {name: {k: round(statistics.median(r[name][k] for r in rs), 2) for k in ("wall_s", "cpu_s")}
                     for name in names} for way, rs in runs.items()}
    print(table(["way", *(f"{n} wall s" for n in names), "total CPU s"],
                [[way, *(m[n]["wall_s"] for n in names), m["total"]["cpu_s"]] for way, m in medians.items()]))
    path = save("install", {"machine": machine(), "reps": args.reps, "median": medians, "runs": runs})
    print(f"saved: {path}")


if __name__ == "__main__":
    main()
