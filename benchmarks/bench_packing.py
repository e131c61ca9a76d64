"""Sub-group packing against one launch per world size and one launch per configuration.

Run from the repository root: ``python benchmarks/bench_packing.py`` (about 8 minutes on
2 CPU cores; ``--quick`` for one repeat and smaller samples). Side by side, in one run:

1. the ``ci`` preset (world sizes 1, 2, 4) and a seeded sample of 500 cells of the ``full``
   preset (world sizes 1, 2, 4), each run as a whole sweep (``harness.orchestration.sweep.run_sweep``,
   record and stream included) twice: ``--packing off`` (one launch per world size) and
   ``--packing on`` (one launch of 4 ranks, sub-groups). The two modes alternate run by run
   (the machine may be shared); the table gives the median and the minimum of the repeats.
2. one launch per configuration (how TransformerEngine's distributed tests run): a seeded
   sample of cells, each in a launch of its own; its mean is extrapolated to the selection.

Results go to ``benchmarks/results-<date>.json`` (key ``packing``) and print as markdown.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import ROOT, machine, save, table
from bench_launch import one_launch_per_cell

sys.path.insert(0, str(ROOT))
from harness.vocabulary import matrix  # noqa: E402
from harness.launcher.launch import LaunchOptions  # noqa: E402
from harness.orchestration.sweep import SweepSpec, run_sweep  # noqa: E402
from harness.records.record import load  # noqa: E402

BACKEND = "harness.backends.reference"


def sweep_once(cells: list[matrix.Cell], run_dir: Path, packing: bool, device: str) -> dict[str, Any]:
    """One whole sweep of ``cells``; its wall time, statuses and launches."""
    opts = LaunchOptions(backend=BACKEND, run_dir=run_dir, device=device)
    spec = SweepSpec(cells=cells, backend=BACKEND, run_dir=run_dir, selection={"bench": True},
                     argv=["bench"], options=opts, packing=packing)
    t0 = time.monotonic()
    record = run_sweep(spec)
    wall = time.monotonic() - t0
    return {"wall_s": round(wall, 3), "statuses": dict(Counter(c.status for c in load(run_dir).cells)),
            "launches": [{"world_size": l.world_size, "cells": len(l.cells), "duration_s": l.duration_s}
                         for l in record.launches]}


def compare(name: str, cells: list[matrix.Cell], repeat: int, sample: int, tmp: Path, device: str) -> dict[str, Any]:
    print(f"\n## {name}: {len(cells)} cells, world sizes {sorted({c.world_size for c in cells})}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"per_world_size": [], "packed": []}
    for r in range(repeat):
        for mode, packing in (("per_world_size", False), ("packed", True)):
            res = sweep_once(cells, tmp / f"{name}-{mode}-{r}", packing, device)
            runs[mode].append(res)
            print(f"  {mode:15} run {r + 1}: {res['wall_s']:.1f} s, {res['statuses']}", flush=True)
    picked = random.Random(7).sample(cells, min(sample, len(cells)))
    single = one_launch_per_cell(picked, tmp / f"{name}-single", device)
    projected = single["mean_wall_per_cell_s"] * len(cells)
    print(f"  one launch per configuration: {single['mean_wall_per_cell_s']:.2f} s per cell over "
          f"{len(picked)} sampled -> {projected:.0f} s projected", flush=True)
    out: dict[str, Any] = {"selection": name, "cells": len(cells), "one_launch_per_configuration": single,
                           "one_launch_per_configuration_projected_s": round(projected, 1)}
    for mode, res in runs.items():
        walls = [x["wall_s"] for x in res]
        out[mode] = {"walls_s": walls, "median_s": round(statistics.median(walls), 3), "min_s": min(walls),
                     "runs": res}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each mode, alternating (default 3)")
    parser.add_argument("--sample", type=int, default=8, help="cells run one launch each (default 8)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="one repeat, 3 sampled cells, 100 full cells")
    args = parser.parse_args(argv)
    repeat, sample, n_full = (1, 3, 100) if args.quick else (args.repeat, args.sample, 500)
    env = machine()
    full = random.Random(11).sample(matrix.select("full"), n_full)
    selections = {"ci": matrix.select("ci"), f"full-sample-{n_full}": sorted(full, key=lambda c: c.world_size)}
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-packing-") as tmp:
        for name, cells in selections.items():
            results.append(compare(name, cells, repeat, sample, Path(tmp), args.device))
    rows = []
    for r in results:
        per_ws, packed = r["per_world_size"], r["packed"]
        rows.append([r["selection"], r["cells"], f"{per_ws['median_s']:.1f} (min {per_ws['min_s']:.1f})",
                     f"{packed['median_s']:.1f} (min {packed['min_s']:.1f})",
                     f"{per_ws['median_s'] / packed['median_s']:.2f}x",
                     f"~{r['one_launch_per_configuration_projected_s']:.0f}",
                     f"{r['one_launch_per_configuration_projected_s'] / packed['median_s']:.0f}x"])
    print()
    print(table(["selection", "cells", "one launch per world size, s", "packed, s", "packing speed-up",
                 "one launch per configuration, s (projected)", "packed vs per configuration"], rows))
    path = save("packing", {"machine": env, "loadavg_at_end": list(os.getloadavg()),
                            "repeat": repeat, "results": results})
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
