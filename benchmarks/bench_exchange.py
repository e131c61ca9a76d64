"""The ranks' per-cell exchange of results: ``all_gather_object`` against
``harness.rank.exchange.all_gather_objects``, side by side in one launch.

Run from the repository root: ``python benchmarks/bench_exchange.py`` (about a minute on 2 CPU
cores; ``--calls``, ``--reps``, ``--world-size``). One torchrun launch over a gloo group (the
ranks' control group is one): the two ways alternate, ``--reps`` rounds of ``--calls`` calls
each, with a payload of about the size of a te-cpu ``ci`` sweep's median rank result (2.5 KiB
pickled) and of its largest (12.6 KiB; the sizes are recorded). Each rank measures its own CPU time (user and system, from
``resource.getrusage``) and the wall time per call; rank 0 prints the medians over rounds of
the largest rank's figures. Results go to ``benchmarks/results-<date>.json`` (key ``exchange``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _common import ROOT, machine, save, table

sys.path.insert(0, str(ROOT))
from harness.vocabulary.plan import agent_command  # noqa: E402

RANKS = textwrap.dedent(r'''
    import json, pickle, resource, statistics, sys, time

    import torch.distributed as dist

    from harness.rank.exchange import all_gather_objects

    calls, reps = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()

    def cpu():
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime, u.ru_stime

    def gather_object(obj):
        out = [None] * size
        dist.all_gather_object(out, obj)
        return out

    ways = {"all_gather_object": gather_object,
            "exchange": lambda obj: all_gather_objects(obj, dist.group.WORLD, size)}
    payloads = {"median": {"checks": [f"{i:060d}" for i in range(40)]},
                "largest": {"checks": [f"{i:060d}" for i in range(205)]}}
    rows = []
    for pname, payload in payloads.items():
        for way in ways.values():  # warm both
            for _ in range(20):
                way(payload)
        runs = {name: [] for name in ways}
        for _ in range(reps):
            for name, way in ways.items():
                dist.barrier()
                (u0, s0), w0 = cpu(), time.perf_counter()
                for _ in range(calls):
                    way(payload)
                (u1, s1), w1 = cpu(), time.perf_counter()
                runs[name].append(((u1 - u0) / calls, (s1 - s0) / calls, (w1 - w0) / calls))
        for name, rs in runs.items():
            mine = [statistics.median(r[i] for r in rs) for i in range(3)]
            every = [None] * size
            dist.all_gather_object(every, mine)
            if rank == 0:
                worst = [max(e[i] for e in every) for i in range(3)]
                rows.append({"payload": pname, "bytes": len(pickle.dumps(payload, protocol=5)), "way": name,
                             "user_us": round(worst[0] * 1e6), "sys_us": round(worst[1] * 1e6),
                             "cpu_us": round((worst[0] + worst[1]) * 1e6), "wall_us": round(worst[2] * 1e6)})
    if rank == 0:
        print("ROWS " + json.dumps(rows))
    dist.destroy_process_group()
''')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "exchange_ranks.py"
        script.write_text(RANKS)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(agent_command("--nproc-per-node", str(args.world_size), str(script), str(args.calls),
                                            str(args.reps)), capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"the launch failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("ROWS "))[5:])
    print(table(["payload", "bytes", "way", "user µs/call", "system µs/call", "CPU µs/call", "wall µs/call"],
                [[r["payload"], r["bytes"], r["way"], r["user_us"], r["sys_us"], r["cpu_us"], r["wall_us"]]
                 for r in rows]))
    ways: dict = {}
    for r in rows:
        ways.setdefault(r["payload"], {})[r["way"]] = {k: v for k, v in r.items() if k not in ("payload", "way")}
    path = save("exchange", {"machine": machine(), "world_size": args.world_size, "calls": args.calls,
                             "reps": args.reps, "payloads": ways})
    print(f"saved: {path}")


if __name__ == "__main__":
    main()
