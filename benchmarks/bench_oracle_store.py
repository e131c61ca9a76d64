"""The oracles kept on disk (``harness/cell/oracle_store.py``, ``DW_ORACLE_CACHE``): what a run
costs without the folder, with an empty one, and with the one a run of the same cells filled.

Run from the repository root: ``python benchmarks/bench_oracle_store.py [--command sweep|selftest]
[--preset ci] [--backend SPEC]`` (about three runs of the command: a few minutes for the
reference's ``sweep --preset ci``). One run, the three ways one after the other, each a new
process with nothing else changed:

1. ``none``: ``DW_ORACLE_CACHE`` unset - each rank process keeps its latest oracles in memory
   only (what a user's sweep does);
2. ``empty``: an empty folder - the run fills it, and its own later launches read it (the
   self-test's rounds; a sweep's ranks that meet a cell's inputs again in another process);
3. ``filled``: the folder the ``empty`` run filled - the suite's case: the same cells judged by
   another sweep.

CPU seconds are the run's and every process it waited for (``RUSAGE_CHILDREN``): the parent,
the torchrun agents and every rank. The agent server is not used (``DW_AGENT_SERVER`` unset),
so every launch's CPU is counted. Results go to ``benchmarks/results-<date>.json`` (key
``oracle_store``) and are printed as a markdown table; the three runs' records must agree
(the same cells, the same statuses), or the script says so and exits 1.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, children_cpu, machine, save, table


def _run(args: list[str], out: Path, cache: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DW_ORACLE_CACHE", "DW_AGENT_SERVER")}
    if cache is not None:
        env["DW_ORACLE_CACHE"] = str(cache)
    before, t0 = children_cpu(), time.monotonic()
    quiet = ["--quiet"] if args[0] == "sweep" else []
    proc = subprocess.run([sys.executable, "-m", "harness", *args, "--out", str(out), *quiet], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    wall, cpu = time.monotonic() - t0, children_cpu() - before
    with gzip.open(out / "results.json.gz", "rt") as fh:
        record = json.load(fh)
    statuses = {c["id"]: c["status"] for c in record["cells"]}
    return {"exit": proc.returncode, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cells": len(statuses),
            "kept": len(list(cache.glob("*.pkl"))) if cache is not None else 0,
            "kept_mb": round(sum(p.stat().st_size for p in cache.glob("*.pkl")) / 1e6, 1) if cache is not None else 0,
            "statuses": statuses}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--command", choices=("sweep", "selftest"), default="sweep")
    ap.add_argument("--preset", default="ci")
    ap.add_argument("--backend", default=None, help="sweep only: the backend (default: the reference)")
    args = ap.parse_args()
    cmd = [args.command, "--preset", args.preset] + (["--backend", args.backend] if args.backend else [])
    with tempfile.TemporaryDirectory(prefix="bench-oracles-") as tmp:
        cache = Path(tmp) / "oracles"
        cache.mkdir()
        ways = {}
        for way, folder in (("none", None), ("empty", cache), ("filled", cache)):
            ways[way] = _run(cmd, Path(tmp) / way, folder)
            print(f"{way}: exit {ways[way]['exit']}, {ways[way]['cpu_s']} CPU-s, {ways[way]['wall_s']} s",
                  file=sys.stderr)
    agree = len({json.dumps(w.pop("statuses"), sort_keys=True) for w in ways.values()}) == 1 and \
        len({w["exit"] for w in ways.values()}) == 1
    doc = {"machine": machine(), "command": "python benchmarks/bench_oracle_store.py " + " ".join(sys.argv[1:]),
           "run": " ".join(["python -m harness", *cmd]), "ways": ways, "records_agree": agree}
    path = save("oracle_store", doc)
    print(table(["DW_ORACLE_CACHE", "exit", "cells", "CPU-s", "wall (s)", "oracles kept", "their size (MB)"],
                [[w, r["exit"], r["cells"], r["cpu_s"], r["wall_s"], r["kept"], r["kept_mb"]] for w, r in ways.items()]))
    print(f"\nwritten to {path}")
    if not agree:
        print("the three runs' records disagree (cells, statuses or exit codes)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
