"""Launch overhead before and after confining launches to loopback, side by side.

Run from the repository root: ``python benchmarks/bench_loopback.py`` (about 6 minutes on 2
CPU cores; ``--reps``, ``--quick``). Two launchers are compared:

- ``standalone``: what launches used before, ``python -m torch.distributed.run --standalone``
  (a dynamic c10d rendezvous; its stores listen on every interface);
- ``loopback``: ``python -m harness.rank.agent`` (``harness/rank/agent.py``: a static rendezvous
  on a store pre-bound to 127.0.0.1, gloo pinned to the loopback interface).

Measured for each: (1) the floor, a launch whose ranks only join a gloo group and leave, at
world sizes 1, 2 and 4, split by torchrun's own log (``LOGLEVEL=INFO``) into the agent's part
- from the command's start to "Starting worker group" (interpreter, torch import,
rendezvous) plus from the ranks' end to the command's exit; within it the rendezvous, where
the two launchers differ by design, is the least noisy number - and the ranks' part (their
imports and process group); (2) a real harness launch
(``launch_cells``, 10 cells at world size 2), with its start-up (torchrun start, rendezvous,
rank imports, process group) taken from rank 0's log. The launchers alternate rep by rep so
that load from other jobs on a shared machine falls on both alike; medians and minima are
reported. Results go to ``benchmarks/results-<date>.json`` (key ``loopback``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import ROOT, machine, save, table
from bench_launch import floor_command, run_cells

sys.path.insert(0, str(ROOT))
from harness.vocabulary import matrix  # noqa: E402
from harness.vocabulary.plan import agent_command

#: launcher name -> the command prefix that takes torchrun's options and the script
LAUNCHERS: dict[str, list[str]] = {
    "standalone": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"],
    "loopback": agent_command(),
}


_LOG_TIME = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*?\] (.*)$")


def _clock(t: float) -> float:
    """Seconds since local midnight, the clock torchrun's log lines are stamped with."""
    d = datetime.datetime.fromtimestamp(t)
    return d.hour * 3600 + d.minute * 60 + d.second + d.microsecond / 1e6


def floor_once(launcher: list[str], world_size: int) -> dict[str, float]:
    """One floor launch: its wall time, the agent's part (before and after the ranks), the ranks'."""
    env = {**os.environ, "LOGLEVEL": "INFO"}
    t0 = time.time()
    proc = subprocess.run(floor_command(world_size, launcher), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=True, timeout=300, env=env)
    t1 = time.time()
    stamps = {}
    for line in proc.stderr.splitlines():
        m = _LOG_TIME.match(line)
        for key, text in (("rdzv_start", "Rendezvous'ing worker group"), ("rdzv_end", "Rendezvous complete"),
                          ("ranks_start", "Starting worker group"), ("ranks_end", "worker group successfully")):
            if m and text in m.group(4) and key not in stamps:
                stamps[key] = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    start, end = stamps["ranks_start"] - _clock(t0), _clock(t1) - stamps["ranks_end"]
    return {"wall_s": t1 - t0, "agent_s": start + end, "agent_start_s": start, "agent_end_s": end,
            "rendezvous_s": stamps["rdzv_end"] - stamps["rdzv_start"], "ranks_s": stamps["ranks_end"] - stamps["ranks_start"]}


def harness_once(launcher: list[str], cells: list[matrix.Cell], run_dir: Path) -> dict[str, Any]:
    """One harness launch of ``cells`` (``launch_cells``) started by ``launcher``."""
    original = loopback.command
    # scoped: the harness builds its torchrun command through loopback.command
    loopback.command = lambda *torchrun_args: [*launcher, *torchrun_args]
    try:
        res = run_cells(cells, run_dir, "cpu")
    finally:
        loopback.command = original
    assert not set(res["statuses"]) & {"fail", "error", "timeout"}, res["statuses"]
    return {"wall_s": res["wall_s"], "startup_s": res["launches"][0].get("startup_s")}


def alternate(reps: int, measure: Callable[[str, int], Any]) -> dict[str, list[Any]]:
    """``measure(launcher, rep)`` for every launcher, ``reps`` rounds, launchers alternating."""
    out: dict[str, list[Any]] = {name: [] for name in LAUNCHERS}
    for rep in range(reps):
        order = list(LAUNCHERS) if rep % 2 == 0 else list(reversed(LAUNCHERS))
        for name in order:
            out[name].append(measure(name, rep))
    return out


def summary(values: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(values), 3), "min_s": round(min(values), 3),
            "values_s": [round(v, 3) for v in values]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="runs per launcher and point (default 5)")
    ap.add_argument("--cells", type=int, default=10, help="cells in the harness launch (default 10)")
    ap.add_argument("--quick", action="store_true", help="2 reps, world sizes 1 and 2 only")
    args = ap.parse_args(argv)
    reps, sizes = (2, (1, 2)) if args.quick else (args.reps, (1, 2, 4))
    cells = random.Random(0).sample(matrix.select("full", {"world_size": (2,)}), args.cells)
    out: dict[str, Any] = {"machine": machine(), "argv": sys.argv[1:], "reps": reps, "floor": [], "harness": {}}
    t_begin = time.time()
    for ws in sizes:
        runs = alternate(reps, lambda name, rep, ws=ws: floor_once(LAUNCHERS[name], ws))
        out["floor"].append({"world_size": ws, **{name: {part: summary([r[part] for r in res]) for part in res[0]}
                                                  for name, res in runs.items()}})
        print(f"floor ws{ws}: " + ", ".join(f"{n} agent median {statistics.median(r['agent_s'] for r in res):.2f}s, "
                                            f"wall {statistics.median(r['wall_s'] for r in res):.2f}s"
                                            for n, res in runs.items()), flush=True)
    with tempfile.TemporaryDirectory(prefix="dw-bench-loopback-") as tmp:
        runs = alternate(reps, lambda name, rep: harness_once(LAUNCHERS[name], cells, Path(tmp) / f"{name}-{rep}"))
    for name, res in runs.items():
        out["harness"][name] = {"wall": summary([r["wall_s"] for r in res]),
                                "startup": summary([r["startup_s"] for r in res if r["startup_s"] is not None])}
        print(f"harness {len(cells)} cells ws2, {name}: median {out['harness'][name]['wall']['median_s']:.2f}s",
              flush=True)
    out["total_s"] = round(time.time() - t_begin, 1)
    path = save("loopback", out)
    print(report(out, len(cells)))
    print(f"\nresults: {path.relative_to(ROOT)}")
    return 0


def report(out: dict[str, Any], n_cells: int) -> str:
    names = list(LAUNCHERS)

    def row(label: str, entry: dict[str, Any], part: str) -> list[str]:
        before, after = (entry[n][part] for n in names)
        return [label, f"{before['median_s']:.2f} (min {before['min_s']:.2f})",
                f"{after['median_s']:.2f} (min {after['min_s']:.2f})", f"{after['median_s'] - before['median_s']:+.2f}"]

    rows = []
    for f in out["floor"]:
        rows += [row(f"floor ws {f['world_size']}: torchrun agent", f, "agent_s"),
                 row(f"floor ws {f['world_size']}: of which rendezvous", f, "rendezvous_s"),
                 row(f"floor ws {f['world_size']}: ranks", f, "ranks_s"),
                 row(f"floor ws {f['world_size']}: wall", f, "wall_s")]
    rows += [row(f"harness, {n_cells} cells ws 2: start-up", out["harness"], "startup"),
             row(f"harness, {n_cells} cells ws 2: wall", out["harness"], "wall")]
    return (f"\n### Launch overhead: before (`{names[0]}`) and after (`{names[1]}`), median of {out['reps']} "
            "alternating runs, seconds\n\n"
            + table(["launch", f"{names[0]} (before)", f"{names[1]} (after)", "after - before"], rows))


if __name__ == "__main__":
    raise SystemExit(main())
