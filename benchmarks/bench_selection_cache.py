"""A new process's ``select("ci")``: made, against read back from the run's selection cache
(``DW_SELECTION_CACHE``, ``harness/vocabulary/selection_cache.py``), alternating.

Run from the repository root: ``python benchmarks/bench_selection_cache.py`` (under a minute
on 2 CPU cores; ``--reps``). Each measurement is a new Python process, as a sweep's parent or
a pytest process is: it imports the matrix, then times ``select`` (CPU time of the process,
``time.process_time``); the two ways alternate, the cached one reading the file the first
made. Results go to ``benchmarks/results-<date>.json`` (key ``selection_cache``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from _common import ROOT, machine, save, table

PROBE = ("import json, time; from harness.vocabulary import matrix; t = time.process_time(); "
         "cells = matrix.select('ci'); print(json.dumps([time.process_time() - t, len(cells)]))")


def _select(cache: str | None) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if k != "DW_SELECTION_CACHE"}
    if cache is not None:
        env["DW_SELECTION_CACHE"] = cache
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True)
    seconds, cells = json.loads(proc.stdout)
    return seconds, cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"made": [], "read back": []}
    counts: set[int] = set()
    with tempfile.TemporaryDirectory() as cache:
        _select(cache)  # fills the folder
        for _ in range(args.reps):
            for way, folder in (("made", None), ("read back", cache)):
                seconds, cells = _select(folder)
                times[way].append(seconds)
                counts.add(cells)
    if len(counts) != 1:
        sys.exit(f"the two ways selected different numbers of cells: {sorted(counts)}")
    medians = {way: statistics.median(t) * 1000 for way, t in times.items()}
    print(table(["way", "median CPU ms", "min", "max"],
                [[way, medians[way], min(t) * 1000, max(t) * 1000] for way, t in times.items()]))
    path = save("selection_cache", {"machine": machine(), "reps": args.reps, "cells": counts.pop(),
                                    "ways": {way: {"median_cpu_ms": round(medians[way], 1),
                                                   "cpu_ms": [round(t * 1000, 1) for t in ts]}
                                             for way, ts in times.items()}})
    print(f"saved: {path}")


if __name__ == "__main__":
    main()
