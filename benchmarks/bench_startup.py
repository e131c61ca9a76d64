"""The fixed start-up of a launch, in CPU seconds: a zero-cell launch, its agent started as a
new process beside the same launch forked from an agent server (``harness/rank/agent_server.py``).

Run from the repository root: ``python benchmarks/bench_startup.py [--backend te-cpu]
[--world-size 2] [--repeat 3]`` (about a minute for te-cpu). What a sweep pays before its first
cell, measured in one run, side by side:

1. the backend probe: a warm agent (``python -m harness.rank.agent --warm SPEC``) that
   preloads the ranks' dependencies, describes the backend from a forked child, and ends when
   no launch is handed to it;
2. a zero-cell launch: torchrun's agent and ``--world-size`` ranks over a plan holding one
   task of the backend and no lane - each rank imports the backend, joins the process groups,
   says it is ready and runs nothing.

CPU seconds are those of the agent and every process it waited for (its ranks, its probe's
child), from ``wait4`` (a new process: this script's child; a served one: the server's, which
reports them), the median of ``--repeat``. The server's own start-up (its one-time import of
torch and the dependencies) is measured once and reported beside. Results go to
``benchmarks/results-<date>.json`` (key ``startup``) and are printed as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, children_cpu, machine, save, table

sys.path.insert(0, str(ROOT))

from harness.launcher import served  # noqa: E402
from harness.launcher.warm import agent_env  # noqa: E402
from harness.vocabulary import matrix  # noqa: E402
from harness.vocabulary.backend_specs import resolve  # noqa: E402
from harness.vocabulary.plan import LaunchPlan, PlanTask  # noqa: E402


def _run(argv: list[str], env: dict[str, str], stdin: bytes | None) -> float:
    """CPU seconds of one agent run, new process or served (``env`` says which)."""
    before = children_cpu()
    os.environ.pop(served.SERVER_ENV, None)
    if served.SERVER_ENV in env:
        os.environ[served.SERVER_ENV] = env[served.SERVER_ENV]
    with tempfile.TemporaryFile() as log:
        agent = served.start_agent(argv, env=env, stdin=served.PIPE, stdout=log, stderr=served.STDOUT)
        assert agent.stdin is not None
        if stdin is not None:
            agent.stdin.write(stdin)
        agent.stdin.close()
        code = agent.wait(timeout=600)
        if code != 0:
            log.seek(0)
            raise SystemExit(f"{argv[:2]} exited with {code}:\n{log.read().decode(errors='replace')[-3000:]}")
    if isinstance(agent, served.ServedAgent):
        assert agent.cpu_s is not None
        return agent.cpu_s
    return children_cpu() - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="te-cpu")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.chdir(ROOT)
    work = Path(tempfile.mkdtemp(prefix="dw-startup-"))
    cell = matrix.select("smoke", {"module": ["linear"]})[0]
    for sub in ("plans", "ranks", "logs/zero"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    plan_path = work / "plans" / "zero.json"
    # the device a sweep's plan names on this machine (a CPU-only backend's, or no GPU): "cpu"
    LaunchPlan(work, "zero", [PlanTask(resolve(args.backend), cell.id)], [], exit_when_done=True,
               device="cpu").write(plan_path)
    launch_argv = ["--monitor-interval", "0.1", "--nproc-per-node", str(args.world_size),
                   "-m", "harness.rank.worker", "--plan", str(plan_path)]
    base = {k: v for k, v in agent_env().items() if k != served.SERVER_ENV}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH")) if p)

    sock = work / "agents.sock"
    t0 = time.monotonic()
    server = subprocess.Popen([sys.executable, "-m", "harness.rank.agent_server", "--socket", str(sock),
                               "--backends", args.backend], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=base, cwd=ROOT)
    assert server.stdout is not None and server.stdout.readline() == b"ready\n"
    server_wall = time.monotonic() - t0
    ways = {"new_process": base, "served": {**base, served.SERVER_ENV: str(sock)}}
    results: dict[str, dict[str, float]] = {}
    try:
        for way, env in ways.items():
            probe = [_run(["--warm", args.backend], env, None) for _ in range(args.repeat)]
            zero = [_run(launch_argv, env, None) for _ in range(args.repeat)]
            results[way] = {"probe_cpu_s": round(statistics.median(probe), 2),
                            "zero_cell_launch_cpu_s": round(statistics.median(zero), 2),
                            "total_cpu_s": round(statistics.median(probe) + statistics.median(zero), 2)}
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(timeout=60)
    doc = {"machine": machine(), "command": "python benchmarks/bench_startup.py " + " ".join(sys.argv[1:]),
           "backend": args.backend, "world_size": args.world_size, "repeat": args.repeat, "ways": results,
           "server_start": {"wall_s": round(server_wall, 2)}}
    path = save("startup", doc)
    rows = [[way, r["probe_cpu_s"], r["zero_cell_launch_cpu_s"], r["total_cpu_s"]] for way, r in results.items()]
    print(table(["agent", "probe (CPU-s)", "zero-cell launch (CPU-s)", "both (CPU-s)"], rows))
    print(f"\nthe server's own start-up: {server_wall:.1f} s wall, once per suite run; results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
