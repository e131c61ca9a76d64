"""How fast the harness runs cells, against one torchrun launch per configuration.

Run from the repository root: ``python benchmarks/bench_launch.py`` (about 10 minutes on
2 CPU cores; ``--quick`` for a smaller version). It measures, in one run:

1. The headline on the ``ci`` preset (every cell, world sizes 1, 2 and 4):
   (a) the harness, ``harness.launcher.launch.launch_cells`` with one launch per world size;
   (b) the way TransformerEngine's distributed tests run, one torchrun launch per
   configuration (``launch_cells`` called with a single cell), on a seeded random sample
   of ``--sample`` cells of the same selection; its per-cell cost is extrapolated to the
   whole selection (printed as such).
   The same pair again on 100 cells at world size 2 (a seeded sample of the ``full`` preset).
2. How the wall time of one launch grows with the number of cells (10, 50, 100, 200 at
   world size 2) and with the world size (1, 2, 4, 8; the same 30 configurations each);
   each point is the fastest of ``--repeat`` runs (2), as the machine may be shared.
3. The floor of a launch: torchrun whose ranks only import torch and set up a gloo group.

Every launch is split into start-up (torchrun, rank imports, process group, until rank 0
starts its first cell), the first cell (cold: lazy imports, allocator), the other cells
and teardown (last result to the launch's end). Results go to
``benchmarks/results-<date>.json`` (key ``launch``) and are printed as markdown tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import ROOT, machine, save, table

sys.path.insert(0, str(ROOT))
from harness.vocabulary import matrix  # noqa: E402
from harness.vocabulary.plan import agent_command
from harness.launcher.launch import LaunchOptions, launch_cells  # noqa: E402

_LINE = re.compile(r"^\[rank0\] (\d+\.\d+) (start|done) ")


def _phases(log: Path, t_start: float, t_end: float) -> dict[str, float]:
    """Start-up / first cell / other cells / teardown of one launch, from rank 0's log."""
    starts, dones = [], []
    for line in log.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if m:
            (starts if m.group(2) == "start" else dones).append(float(m.group(1)))
    if not starts or not dones:
        return {}
    per_cell = [d - s for s, d in zip(starts, dones)]
    return {
        "startup_s": round(starts[0] - t_start, 3),
        "first_cell_s": round(per_cell[0], 3),
        "other_cells_s": round(dones[-1] - dones[0], 3),
        "median_cell_s": round(statistics.median(per_cell[1:]), 4) if len(per_cell) > 1 else None,
        "teardown_s": round(t_end - dones[-1], 3),
    }


def run_cells(cells: list[matrix.Cell], run_dir: Path, device: str) -> dict[str, Any]:
    """Run ``cells`` the harness way: one launch per world size, in order."""
    statuses: Counter = Counter()
    launches = []
    opts = LaunchOptions(backend="harness.backends.reference", run_dir=run_dir, device=device)
    t_all = time.time()
    for ws, group in matrix.plan(cells).items():
        t0 = time.time()
        records = launch_cells(ws, group, opts, lambda res: statuses.update([res.status]))
        t1 = time.time()
        for rec in records:
            launches.append({"world_size": ws, "cells": len(rec.cells), "wall_s": round(t1 - t0, 3),
                             **_phases(run_dir / rec.log_dir / "rank0.log", t0, t1)})
    wall = time.time() - t_all
    return {"cells": len(cells), "wall_s": round(wall, 3), "cells_per_s": round(len(cells) / wall, 3),
            "statuses": dict(statuses), "launches": launches}


def one_launch_per_cell(cells: list[matrix.Cell], tmp: Path, device: str) -> dict[str, Any]:
    """Each cell in a launch of its own (one torchrun per configuration)."""
    per = []
    for i, cell in enumerate(cells):
        res = run_cells([cell], tmp / f"single-{i}", device)
        per.append({"id": cell.id, "world_size": cell.world_size, "wall_s": res["wall_s"],
                    "statuses": res["statuses"], **{k: v for k, v in res["launches"][0].items()
                                                     if k.endswith("_s") and k != "wall_s"}})
    walls = [p["wall_s"] for p in per]
    mean = statistics.fmean(walls)
    return {"sampled": len(cells), "mean_wall_per_cell_s": round(mean, 3),
            "median_wall_per_cell_s": round(statistics.median(walls), 3),
            "cells_per_s": round(1 / mean, 4), "per_cell": per}


def fastest(run: Any, repeat: int) -> dict[str, Any]:
    """The fastest of ``repeat`` runs (the others are noise from a shared machine), with all walls."""
    runs = [run(r) for r in range(repeat)]
    best = min(runs, key=lambda res: res["wall_s"])
    return {**best, "walls_s": [res["wall_s"] for res in runs]}


def floor_command(world_size: int, launcher: list[str] | None = None) -> list[str]:
    """A launch whose ranks import torch, join a gloo group and leave.

    ``launcher``: the command prefix that takes torchrun's options (default: the harness's,
    ``harness.rank.agent``).
    """
    code = ("import torch, torch.distributed as d; d.init_process_group('gloo'); d.barrier(); "
            "d.destroy_process_group()")
    return [*(launcher or agent_command()), "--monitor-interval", "0.1", "--nproc-per-node", str(world_size),
            "--no-python", sys.executable, "-c", code]


def torchrun_floor(world_size: int, reps: int) -> dict[str, Any]:
    """torchrun whose ranks import torch, join a gloo group and leave: the least a launch costs."""
    walls = []
    for _ in range(reps):
        t0 = time.time()
        subprocess.run(floor_command(world_size), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True, timeout=300)
        walls.append(time.time() - t0)
    return {"world_size": world_size, "reps": reps, "walls_s": [round(w, 3) for w in walls],
            "median_s": round(statistics.median(walls), 3)}


def compare(name: str, cells: list[matrix.Cell], k: int, seed: int, tmp: Path, device: str) -> dict[str, Any]:
    print(f"\n## {name}: {len(cells)} cells, world sizes {sorted({c.world_size for c in cells})}", flush=True)
    harness = run_cells(cells, tmp / f"{name}-harness", device)
    print(f"harness: {harness['wall_s']:.1f}s for {len(cells)} cells, {harness['statuses']}", flush=True)
    sample = random.Random(seed).sample(cells, min(k, len(cells)))
    single = one_launch_per_cell(sample, tmp / f"{name}-single", device)
    projected = single["mean_wall_per_cell_s"] * len(cells)
    print(f"one launch per cell: {single['mean_wall_per_cell_s']:.2f}s per cell over {len(sample)} sampled "
          f"cells (seed {seed}) -> {projected:.0f}s projected for {len(cells)}", flush=True)
    return {"selection": name, "cells": len(cells), "harness": harness, "one_launch_per_cell": single,
            "sample_seed": seed, "projected_one_launch_per_cell_s": round(projected, 1),
            "speedup": round(projected / harness["wall_s"], 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=15, help="cells run one launch each (default 15)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--repeat", type=int, default=2, help="runs per scaling point, the fastest kept (default 2)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = ap.parse_args(argv)

    full_ws2 = random.Random(args.seed).sample(matrix.select("full", {"world_size": (2,)}), 200)
    ci = matrix.select("ci")
    if args.quick:
        ci, args.sample = ci[:20], 3
    t_begin = time.time()
    out: dict[str, Any] = {"machine": machine(), "argv": sys.argv[1:], "device": args.device}
    with tempfile.TemporaryDirectory(prefix="dw-bench-") as tmpname:
        tmp = Path(tmpname)
        out["headline"] = [
            compare("ci", ci, args.sample, args.seed, tmp, args.device),
            compare("ws2-100", full_ws2[:100], max(3, args.sample // 2), args.seed, tmp, args.device),
        ]
        print("\n## scaling with the number of cells (one launch, world size 2)", flush=True)
        out["scaling_cells"] = []
        for n in ((10, 50) if args.quick else (10, 50, 100, 200)):
            res = fastest(lambda r: run_cells(full_ws2[:n], tmp / f"cells-{n}-{r}", args.device), args.repeat)
            print(f"{n:4} cells: {res['wall_s']:.1f}s (runs: {res['walls_s']})", flush=True)
            out["scaling_cells"].append(res)
        print("\n## scaling with the world size (one launch, the same 30 configurations)", flush=True)
        out["scaling_world_size"] = []
        base = full_ws2[:30]
        for ws in ((1, 2) if args.quick else (1, 2, 4, 8)):
            cells = list({c.id: c for c in (dataclasses.replace(b, world_size=ws) for b in base)}.values())
            res = fastest(lambda r: run_cells(cells, tmp / f"ws-{ws}-{r}", args.device), args.repeat)
            print(f"ws {ws}: {res['wall_s']:.1f}s for {len(cells)} cells (runs: {res['walls_s']})", flush=True)
            out["scaling_world_size"].append({"world_size": ws, **res})
        out["torchrun_floor"] = [torchrun_floor(ws, 1 if args.quick else 3) for ws in (1, 2, 4)]
    out["total_s"] = round(time.time() - t_begin, 1)
    path = save("launch", out)
    print(report(out))
    print(f"\nresults: {path.relative_to(ROOT)}")
    return 0


def report(out: dict[str, Any]) -> str:
    parts = ["\n### Harness vs one torchrun launch per configuration\n"]
    rows = []
    for h in out["headline"]:
        s = h["one_launch_per_cell"]
        rows.append([h["selection"], h["cells"], h["harness"]["wall_s"], h["harness"]["cells_per_s"],
                     f"{s['mean_wall_per_cell_s']:.2f} (n={s['sampled']})", s["cells_per_s"],
                     h["projected_one_launch_per_cell_s"], f"{h['speedup']:.0f}x"])
    parts.append(table(["selection", "cells", "harness wall s", "harness cells/s",
                        "one-launch-per-cell s/cell (sampled)", "one-launch cells/s",
                        "one-launch projected s", "speedup"], rows))
    parts.append("\n(one-launch-per-cell: a seeded random sample run one launch each; its mean per-cell "
                 "wall time is extrapolated to the whole selection)\n")
    parts.append("### Where a launch's time goes (harness launches of the headline runs)\n")
    rows = []
    for h in out["headline"]:
        for la in h["harness"]["launches"]:
            rows.append([h["selection"], la["world_size"], la["cells"], la["wall_s"], la.get("startup_s"),
                         la.get("first_cell_s"), la.get("median_cell_s"), la.get("teardown_s")])
        single = h["one_launch_per_cell"]["per_cell"]
        rows.append([h["selection"] + " (one per cell, mean)", "mixed" if len({p["world_size"] for p in single}) > 1
                     else single[0]["world_size"], 1, statistics.fmean(p["wall_s"] for p in single),
                     statistics.fmean(p.get("startup_s", 0) for p in single),
                     statistics.fmean(p.get("first_cell_s", 0) for p in single), "-",
                     statistics.fmean(p.get("teardown_s", 0) for p in single)])
    parts.append(table(["run", "ws", "cells", "wall s", "start-up s", "first cell s", "median cell s",
                        "teardown s"], rows))
    parts.append("\n### One launch, world size 2: wall time vs number of cells\n")
    parts.append(table(["cells", "wall s", "cells/s", "start-up s", "median cell s", "teardown s"],
                       [[r["cells"], r["wall_s"], r["cells_per_s"], r["launches"][0].get("startup_s"),
                         r["launches"][0].get("median_cell_s"), r["launches"][0].get("teardown_s")]
                        for r in out["scaling_cells"]]))
    parts.append("\n### One launch, the same 30 configurations: wall time vs world size\n")
    parts.append(table(["world size", "cells", "wall s", "cells/s", "start-up s", "first cell s", "median cell s",
                        "teardown s"],
                       [[r["world_size"], r["cells"], r["wall_s"], r["cells_per_s"],
                         r["launches"][0].get("startup_s"), r["launches"][0].get("first_cell_s"),
                         r["launches"][0].get("median_cell_s"), r["launches"][0].get("teardown_s")]
                        for r in out["scaling_world_size"]]))
    parts.append("\n### Floor: torchrun whose ranks only import torch and join a gloo group\n")
    parts.append(table(["world size", "median wall s", "runs"],
                       [[f["world_size"], f["median_s"], f["walls_s"]] for f in out["torchrun_floor"]]))
    return "\n".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
