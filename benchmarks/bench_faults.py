"""What a backend's crash or hang costs a sweep, and whose failure it is said to be.

Run from the repository root: ``python benchmarks/bench_faults.py`` (about 10 minutes on 2
CPU cores). It runs ``sweep --preset ci --recipes none`` three times, one after the other,
against ``fixtures/faults.py`` faulting the forward of every fp16 cell at world size >= 2
(``DW_FAULT_CELLS``): rank 1 raises, rank 0 hangs, rank 1 is SIGKILLed. For each it records
the exit code, the wall time, the cells per status, the faulted cells and the launches; and,
over the raise sweep's passing cells, how many times its predicted run time
(``harness.vocabulary.cost.run_seconds``) a cell took - what the hang bound's factor is
weighed against (docs/runner-faults.md). Results go to ``benchmarks/results-<date>.json``
(key ``faults``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import ROOT, machine, save

sys.path.insert(0, str(ROOT))
from harness.vocabulary import cost  # noqa: E402
from harness.vocabulary.matrix import Cell, compile_filter  # noqa: E402

FAULTED = 'dtype == "fp16" and world_size >= 2'
#: fault -> the rank that misbehaves
FAULTS = {"raise": 1, "hang": 0, "die": 1}


def sweep(mode: str, rank: int, out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """One fault's sweep over the recipe-free ``ci``: what it said and what it cost, and its
    run record."""
    env = {**os.environ, "DW_FAULT": mode, "DW_FAULT_RANK": str(rank), "DW_FAULT_CELLS": FAULTED,
           "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness", "sweep", "--preset", "ci", "--recipes", "none",
                           "--backend", "fixtures/faults.py", "--out", str(out), "--quiet"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    with gzip.open(out / "results.json.gz", "rt") as fh:
        record = json.load(fh)
    faulted = compile_filter(FAULTED)
    cells = record["cells"]
    hit = [c for c in cells if faulted(Cell.from_id(c["id"]))]
    others = [c for c in cells if not faulted(Cell.from_id(c["id"]))]
    return {"exit_code": proc.returncode, "wall_s": round(wall, 1), "cells": len(cells),
            "statuses": dict(Counter(c["status"] for c in cells)),
            "harness_error": sum(c["status"] == "harness_error" for c in cells),
            "faulted": len(hit), "faulted_statuses": dict(Counter(c["status"] for c in hit)),
            "others_not_met": sum(c["status"] not in ("pass", "xfail") for c in others),
            "launches": len(record["launches"])}, record


def prediction_ratios(record: dict[str, Any]) -> dict[str, Any]:
    """How many times its predicted run time each passing cell took (its ``duration_s``, from
    its start on its lane to its verdict; a launch's first cells include its lazy imports)."""
    ratios = sorted(c["duration_s"] / cost.run_seconds(Cell.from_id(c["id"]))
                    for c in record["cells"] if c["status"] == "pass" and c.get("duration_s"))
    return {"cells": len(ratios), "median": round(statistics.median(ratios), 2),
            "p99": round(ratios[int(0.99 * (len(ratios) - 1))], 1), "max": round(ratios[-1], 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="where the run folders go (default: a temporary folder)")
    args = p.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="bench-faults-"))
    result: dict[str, Any] = {"machine": machine(), "command": "python benchmarks/bench_faults.py"}
    for mode, rank in FAULTS.items():
        res, record = sweep(mode, rank, base / mode)
        result[mode] = res
        print(f"{mode}: {json.dumps(res)}", flush=True)
        if mode == "raise":
            result["prediction_ratio"] = prediction_ratios(record)
            print(f"duration / prediction: {json.dumps(result['prediction_ratio'])}", flush=True)
    result["hang_over_raise"] = round(result["hang"]["wall_s"] / result["raise"]["wall_s"], 2)
    print(f"hang / raise: {result['hang_over_raise']}")
    print(f"saved to {save('faults', result)}")


if __name__ == "__main__":
    main()
