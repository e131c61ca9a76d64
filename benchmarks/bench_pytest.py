"""Wall time of the cell tests through pytest: ``-n 0`` vs ``-n 2`` vs ``-n auto``.

Run from the repository root: ``python benchmarks/bench_pytest.py`` (a few minutes). Each
mode runs ``python -m pytest cases/test_cells.py -q -n MODE`` on the ``ci`` preset (the
plugin's default: 208 cells, world sizes 1, 2 and 4) against ``harness.backends.reference``, in a
fresh process, one after the other. Results go to ``benchmarks/results-<date>.json`` (key
``pytest``) and are printed as a markdown table.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from typing import Any

from _common import ROOT, machine, save, table

_SUMMARY = re.compile(r"(\d+) (passed|failed|xfailed|xpassed|error|errors|skipped|deselected)")


def run_mode(mode: str, extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "cases/test_cells.py", "-q", "-p", "no:randomly", "-n", mode, *extra]
    load = os.getloadavg()[0]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    wall = time.time() - t0
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {k: int(n) for n, k in _SUMMARY.findall(last)}
    return {"mode": mode, "command": " ".join(["python", "-m", "pytest", *cmd[3:]]), "exit_code": proc.returncode,
            "wall_s": round(wall, 2), "counts": counts, "summary": last, "loadavg_1m_before": round(load, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="0,2,auto", help="comma-separated -n values (default 0,2,auto)")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments, e.g. --world-sizes 1,2")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"machine": machine(), "runs": []}
    for mode in args.modes.split(","):
        res = run_mode(mode, args.pytest_args)
        print(f"-n {mode}: {res['wall_s']:.1f}s  exit {res['exit_code']}  {res['summary']}", flush=True)
        out["runs"].append(res)
    path = save("pytest", out)
    base = out["runs"][0]["wall_s"]
    print()
    print(table(["command", "wall s", "vs first", "tests", "exit"],
                [[f"`{r['command']}`", r["wall_s"], f"{base / r['wall_s']:.2f}x",
                  sum(v for k, v in r["counts"].items() if k != "deselected"), r["exit_code"]]
                 for r in out["runs"]]))
    print(f"\nresults: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
