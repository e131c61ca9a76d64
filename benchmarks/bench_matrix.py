"""How long the matrix generator takes to select a preset, cold (a fresh process, as every
CLI call and rank is): today's ``harness`` package side by side with the package of an earlier
commit (``--baseline``, taken from git into a temporary folder), each selection in a fresh
process; between two commits with the same axes and constraints the two must select the very
same cells, in the same order.

    python benchmarks/bench_matrix.py [--baseline 47eb9cd] [--repeats 3]

Prints a markdown table (median seconds per selection) and stores the figures in
``benchmarks/results-<date>.json`` (key ``matrix``). Exits 1 if a selection differs.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from _common import ROOT, machine, save, table

#: the selections timed: (label, preset, overrides as the CLI would pass them)
SELECTIONS = (
    ("ci", "ci", None),
    ("ci, world sizes 1-8", "ci", {"world_size": [1, 2, 4, 8]}),
    ("ci, is_first_microbatch on", "ci", {"first_mb": [True]}),
    ("ci --weights megatron", "ci", {"weight": ["megatron"]}),
    ("full", "full", None),
    ("full, every weight", "full", {"weight": ["distributed", "plain", "gtp_async", "gtp_inplace", "gtp_cached",
                                              "gtp_nan", "gtp_pad16", "gtp_nograd", "gtp_tagged", "gtp_mcore"]}),
    ("full --filter 'module == \"linear\"'", "full", None, 'module == "linear"'),
)

#: run in a fresh interpreter (PYTHONPATH: the package to time): time one selection and print
#: its seconds and a digest of its cell ids in order
_PROBE = """
import hashlib, json, sys, time
from harness.vocabulary import matrix
preset, overrides, expr = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
t = time.perf_counter()
cells = matrix.select(preset, overrides, expr)
seconds = time.perf_counter() - t
print(json.dumps({"s": seconds, "n": len(cells),
                  "digest": hashlib.sha1("\\n".join(c.id for c in cells).encode()).hexdigest()}))
"""


def baseline_tree(commit: str, into: Path) -> Path:
    """The ``harness`` package at ``commit``, written under ``into``."""
    data = subprocess.run(["git", "archive", commit, "harness"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def probe(root: Path, preset: str, overrides: dict | None, expr: str | None) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, preset, json.dumps(overrides), json.dumps(expr)],
                         cwd=root, capture_output=True, text=True, check=True, env={"PYTHONPATH": str(root)}).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default="47eb9cd", help="commit whose harness package to compare")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    rows, figures, same = [], {"machine": machine(), "baseline": args.baseline, "selections": {}}, True
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp:
        roots = {"today": ROOT, f"baseline {args.baseline}": baseline_tree(args.baseline, Path(tmp))}
        for label, preset, overrides, *expr in SELECTIONS:
            runs = {name: [probe(root, preset, overrides, expr[0] if expr else None) for _ in range(args.repeats)]
                    for name, root in roots.items()}
            median = {name: statistics.median(r["s"] for r in rs) for name, rs in runs.items()}
            digests = {r["digest"] for rs in runs.values() for r in rs}
            same &= len(digests) == 1
            base = median[f"baseline {args.baseline}"]
            rows.append([label, runs["today"][0]["n"], f"{median['today']:.2f}", f"{base:.2f}",
                         f"{base / median['today']:.1f}x", "yes" if len(digests) == 1 else "NO"])
            figures["selections"][label] = {"cells": runs["today"][0]["n"], "median_s": median,
                                            "same_cells": len(digests) == 1}
    print(table(["selection", "cells", "today (s)", f"baseline {args.baseline} (s)", "speed-up", "same cells"], rows))
    print(f"\nstored in {save('matrix', figures)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
