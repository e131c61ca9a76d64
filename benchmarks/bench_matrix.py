"""How long the matrix generator takes to select a preset, cold (a fresh process, as every
CLI call and rank is): today's feasibility search side by side with the search of an earlier
commit (``--baseline``), both over today's axes and constraints - only
``matrix._component_feasible`` is swapped - so the two must select the very same cells.

    python benchmarks/bench_matrix.py [--baseline 0540404] [--repeats 3]

Prints a markdown table (median seconds per selection) and stores the figures in
``benchmarks/results-<date>.json`` (key ``matrix``). Exits 1 if a selection differs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from _common import ROOT, machine, save, table

#: the selections timed: (label, preset, overrides as the CLI would pass them)
SELECTIONS = (
    ("ci", "ci", None),
    ("ci, world sizes 1-8", "ci", {"world_size": [1, 2, 4, 8]}),
    ("ci, is_first_microbatch on", "ci", {"first_mb": [True]}),
    ("ci --weights megatron", "ci", {"weight": ["megatron"]}),
)

#: run in a fresh interpreter: optionally replace the search with the baseline's source, then
#: time one selection and print its seconds and a digest of its cell ids
_PROBE = """
import hashlib, json, sys, time
from harness import matrix
source = sys.argv[1]
if source:
    ns = dict(vars(matrix)); exec(source, ns); matrix._component_feasible = ns["_component_feasible"]
preset, overrides = sys.argv[2], json.loads(sys.argv[3])
t = time.perf_counter()
cells = matrix.select(preset, overrides)
seconds = time.perf_counter() - t
print(json.dumps({"s": seconds, "n": len(cells),
                  "digest": hashlib.sha1("\\n".join(c.id for c in cells).encode()).hexdigest()}))
"""


def baseline_search(commit: str) -> str:
    """The source of ``_component_feasible`` at ``commit``."""
    text = subprocess.run(["git", "show", f"{commit}:harness/matrix.py"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    start = text.index("def _component_feasible(")
    return text[start:text.index("\ndef ", start + 1)]


def probe(source: str, preset: str, overrides: dict | None) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, source, preset, json.dumps(overrides)], cwd=ROOT,
                         capture_output=True, text=True, check=True, env={"PYTHONPATH": str(ROOT)}).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default="0540404", help="commit whose feasibility search to compare")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    searches = {"today": "", f"baseline {args.baseline}": baseline_search(args.baseline)}
    rows, figures, same = [], {"machine": machine(), "baseline": args.baseline, "selections": {}}, True
    for label, preset, overrides in SELECTIONS:
        runs = {name: [probe(src, preset, overrides) for _ in range(args.repeats)] for name, src in searches.items()}
        median = {name: statistics.median(r["s"] for r in rs) for name, rs in runs.items()}
        digests = {r["digest"] for rs in runs.values() for r in rs}
        same &= len(digests) == 1
        base = median[f"baseline {args.baseline}"]
        rows.append([label, runs["today"][0]["n"], f"{median['today']:.2f}", f"{base:.2f}",
                     f"{base / median['today']:.1f}x", "yes" if len(digests) == 1 else "NO"])
        figures["selections"][label] = {"cells": runs["today"][0]["n"], "median_s": median, "same_cells": len(digests) == 1}
    print(table(["selection", "cells", "today (s)", f"baseline {args.baseline} (s)", "speed-up", "same cells"], rows))
    print(f"\nstored in {save('matrix', figures)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
