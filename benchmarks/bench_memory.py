"""Peak memory of the sweep's parent process as the cells grow: ``ci`` against a 100,000-cell
sample of ``full``, the code of an earlier commit (``--baseline``) beside today's.

    python benchmarks/bench_memory.py [--verdicts 100000] [--baseline 8d13c37] [--source DIR]
                                      [--skip-baseline] [--out FILE]

Why this shape: running 100,000 real cells takes hours on this machine, but what the parent
does with them once they exist - fold the result stream, judge every verdict, write the
record and every report - does not depend on how the verdicts were made. So the script

1. runs one small real sweep (``sweep --preset full --sample 240`` on the reference, its
   result stream kept: ``--source`` reuses one), whose verdicts - every rank's checks, at the
   size a rank appends them - are the templates;
2. fabricates, per configuration, the run folder an interrupted sweep of that selection
   leaves: its record (``incomplete``, the verdicts so far, one launch naming every cell)
   and its result stream, one verdict per cell: a template of the same expectation, module
   and recipe where there is one, re-keyed onto the cell (id, axes, expectation, repro);
   ``ci`` is the whole ``ci`` preset the reference runs, ``full-100k`` the ``full`` sample
   (``--sample K``: the smallest K whose sample holds ``--verdicts`` cells the reference
   runs; the rest need TE or Megatron and are left out, as a real sweep leaves them);
3. times, for each code (the baseline's ``harness`` and ``reports`` taken from git into a
   temporary folder, then today's), ``python -m harness sweep --resume DIR`` on a fresh copy
   of the folder - every cell has its verdict, so nothing launches: the parent folds the
   stream, judges, writes the record and every report - then ``python -m harness report
   DIR``;
4. checks that both codes wrote the same record: the bytes of its cells equal, its other keys
   equal apart from the clock, the commit and where the backend was imported from.

Measured: the peak resident set of the parent process alone (``VmHWM`` of
``/proc/self/status``, read as it exits; the backend probe and the warm agent are other
processes and are reported beside, as the largest child), and the wall time. Results go to
``benchmarks/memory-<date>-<commit>.json`` (``--out``) with the date, the commit and the
machine.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import ROOT, machine, table  # noqa: E402

BACKEND = "harness.backends.reference"

#: run as ``python -c`` in the measured process: the CLI, and its own peak as it exits
_WRAPPER = """
import atexit, os, resource, sys, time
t0 = time.monotonic()
def _peak():
    with open("/proc/self/status") as f:
        hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))
    with open(os.environ["BENCH_MEMORY_OUT"], "w") as f:
        f.write(f"{hwm} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss} {time.monotonic() - t0:.3f}")
atexit.register(_peak)
from harness.cli import main
raise SystemExit(main(sys.argv[1:]))
"""

#: the source sweep: today's CLI with the run's stream kept (a complete run retires it)
_SOURCE = """
import sys
import harness.orchestration.sweep as sweep
sweep.retire = lambda *a, **k: None
from harness.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip() or "unknown"


def baseline_tree(rev: str, into: Path) -> Path:
    """``harness`` and ``reports`` (importable as ``harness_reports``) at ``rev`` under ``into``."""
    data = subprocess.run(["git", "archive", rev, "harness", "reports"], cwd=ROOT, capture_output=True,
                          check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    (into / "harness_reports").symlink_to(into / "reports")
    return into


def source_run(into: Path, sample: int) -> Path:
    """A real sweep of ``full --sample N`` whose result stream stays (the templates)."""
    subprocess.run([sys.executable, "-c", _SOURCE, "sweep", "--preset", "full", "--sample", str(sample), "--quiet",
                    "--out", str(into)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return into


def templates(src: Path) -> tuple[dict[str, Any], dict[tuple, list[dict[str, Any]]]]:
    """The source run's record head and its verdicts by (expect, module, recipe), coarser keys too."""
    from harness.records import recordfile

    head = {k: v for k, v in recordfile.read(src).items() if k != "cells"}
    by: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for line in (src / "cells.jsonl").read_text().splitlines():
        r = json.loads(line)["result"]
        ax = r["axes"]
        for key in ((r["expect"], ax["module"], ax.get("recipe")), (r["expect"], ax["module"]), (r["expect"],), ()):
            by[key].append(r)
    return head, by


def sample_for(verdicts: int, missing: set[str]) -> int:
    """The smallest ``--sample K`` of ``full`` whose cells hold ``verdicts`` that the reference runs."""
    from harness.vocabulary import matrix, selection

    ranked = sorted((hashlib.sha256(f"0:{c.id}".encode()).digest(), not (selection.requires(c) & missing))
                    for c in matrix.select("full"))
    runs = 0
    for k, (_, ok) in enumerate(ranked, 1):
        runs += ok
        if runs == verdicts:
            return k
    return len(ranked)


def fabricate(folder: Path, sel_args: dict[str, Any], head: dict[str, Any], by: dict[tuple, list]) -> int:
    """The run folder an interrupted sweep of the selection leaves, every cell with a verdict.
    Returns its number of cells."""
    from harness.records import recordfile
    from harness.records.record import CellResult
    from harness.records.fold import repro_command
    from harness.vocabulary import selection

    sel = {"preset": sel_args["preset"], "overrides": {}, "filter": None, **(
        {"sample": {"count": sel_args["sample"], "seed": 0}} if sel_args.get("sample") else {}), "examples": 0}
    cells, sel = selection.leave_out(selection.recorded(sel), sel, set(head["selection"]["left_out"]["requires"]))
    folder.mkdir(parents=True)

    def verdict(n: int, cell: Any) -> dict[str, Any]:
        ax = cell.serialize()
        pool = next(by[k] for k in ((cell.expect, cell.module, cell.recipe), (cell.expect, cell.module),
                                    (cell.expect,), ()) if by.get(k))
        r = dict(pool[n % len(pool)])
        r.update(id=cell.id, axes=ax, expect=cell.expect, repro=repro_command(cell.id, BACKEND, r.get("example")))
        return r

    counts: dict[str, int] = {}
    with open(folder / "cells.jsonl", "w") as f:
        for n, cell in enumerate(cells):
            r = verdict(n, cell)
            counts[r["status"]] = counts.get(r["status"], 0) + 1
            f.write(json.dumps({"backend": BACKEND, "launch": "ws4-0", "result": r}) + "\n")
    argv = ["sweep", "--preset", sel["preset"], *(["--sample", str(sel_args["sample"])] if sel_args.get("sample") else []),
            "--out", str(folder)]
    record = {**head, "status": "incomplete", "finished": None, "argv": argv,
              "command": " ".join(["python", "-m", "harness", *argv]), "selection": sel,
              "world_sizes": sorted({c.world_size for c in cells}),
              "launches": [{"world_size": 4, "cells": [c.id for c in cells], "exit_code": None, "duration_s": 0.0,
                            "log_dir": str(folder / "logs" / "ws4-0"), "attempt": 0, "note": None}],
              "counts": {**{s: 0 for s in head["counts"]}, **counts}}

    def lean() -> Iterator[dict[str, Any]]:
        with open(folder / "cells.jsonl") as f:
            for line in f:
                yield CellResult.from_dict(json.loads(line)["result"]).serialize(lean=True)

    recordfile.write(record, folder, lean())
    return len(cells)


def measure(code: Path, argv: list[str], scratch: Path) -> dict[str, Any]:
    """One CLI command in a fresh process running ``code``: its own peak, its largest child's, time, exit."""
    out = scratch / "peak.txt"
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(code), "BENCH_MEMORY_OUT": str(out)}
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _WRAPPER, *argv], cwd=scratch, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t
    peak, child, inside = out.read_text().split()
    return {"peak_mb": round(int(peak) / 1024, 1), "largest_child_mb": round(int(child) / 1024, 1),
            "wall_s": round(wall, 1), "in_process_s": float(inside), "exit": proc.returncode,
            **({"stderr_tail": proc.stderr[-2000:]} if proc.returncode not in (0, 1) else {})}


def record_digest(folder: Path) -> str:
    """A digest of the record's bytes: its cells as written, its other keys with the clock, the
    commit and the path the backend was imported from (the code's folder) masked."""
    text = gzip.decompress((folder / "results.json.gz").read_bytes())
    cut = text.rindex(b',"cells":[')
    head = json.loads(text[:cut] + b"}")
    head.update(started=None, finished=None, duration_s=None)
    head["environment"]["git_commit"] = None
    info = head["environment"].get("backend_info") or {}
    info.update({k: None for k in ("origin", "upstream_origin") if k in info})
    return hashlib.sha256(json.dumps(head, sort_keys=True).encode() + text[cut:]).hexdigest()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verdicts", type=int, default=100_000, help="cells of the large configuration")
    p.add_argument("--baseline", default="8d13c37", help="commit whose code is measured beside today's")
    p.add_argument("--skip-baseline", action="store_true", help="measure today's code only")
    p.add_argument("--source", type=Path, help="a run folder with a kept result stream (default: sweep one)")
    p.add_argument("--source-sample", type=int, default=240)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    today = datetime.date.today().isoformat()
    rev = commit()
    doc: dict[str, Any] = {"date": today, "commit": rev, "machine": machine(), "backend": BACKEND,
                           "measured": "peak resident set (VmHWM) of the parent process; wall seconds",
                           "configurations": {}}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp_:
        tmp = Path(tmp_)
        src = args.source or source_run(tmp / "source", args.source_sample)
        head, by = templates(src)
        doc["templates"] = {"source": f"sweep --preset full --sample {args.source_sample}"
                                      + (" (a run folder kept from an earlier run of this script: --source)" if args.source else ""),
                            "verdicts": len(by[()]),
                            "mean_stream_line_bytes": round((src / "cells.jsonl").stat().st_size / len(by[()]))}
        missing = set(head["selection"]["left_out"]["requires"])
        configs = {"ci": {"preset": "ci"},
                   f"full-{args.verdicts // 1000}k": {"preset": "full", "sample": sample_for(args.verdicts, missing)}}
        codes = {} if args.skip_baseline else {f"before ({args.baseline})": baseline_tree(args.baseline, tmp / "before")}
        codes[f"after ({rev})"] = ROOT
        for name, sel_args in configs.items():
            pristine = tmp / f"{name}-pristine"
            n = fabricate(pristine, sel_args, head, by)
            entry: dict[str, Any] = {"selection": sel_args, "cells": n,
                                     "stream_mb": round((pristine / "cells.jsonl").stat().st_size / 2**20, 1),
                                     "record_mb": round((pristine / "results.json.gz").stat().st_size / 2**20, 2)}
            digests = {}
            for code_name, code in codes.items():
                run = tmp / f"{name}-run"
                shutil.rmtree(run, ignore_errors=True)
                shutil.copytree(pristine, run)
                print(f"{name} ({n} cells), {code_name}: sweep --resume ...", flush=True)
                sweep = measure(code, ["sweep", "--resume", str(run), "--quiet"], tmp)
                print(f"  {sweep}", flush=True)
                report = measure(code, ["report", str(run)], tmp)
                print(f"  report: {report}", flush=True)
                digests[code_name] = record_digest(run)
                entry[code_name] = {"sweep_resume": sweep, "report": report,
                                    "files_mb": {f: round((run / f).stat().st_size / 2**20, 2)
                                                 for f in ("results.json.gz", "report.html", "junit.xml", "summary.md")}}
            entry["record_digest"] = digests
            entry["same_record"] = len(set(digests.values())) == 1
            doc["configurations"][name] = entry
            shutil.rmtree(pristine)
    small, large = doc["configurations"].values()
    rows = []
    for code_name in codes:
        s, l = small[code_name]["sweep_resume"], large[code_name]["sweep_resume"]
        ratio = round(l["peak_mb"] / s["peak_mb"], 2)
        doc.setdefault("ratio_large_to_ci", {})[code_name] = ratio
        rows.append([code_name, s["peak_mb"], s["wall_s"], l["peak_mb"], l["wall_s"], ratio,
                     small[code_name]["report"]["peak_mb"], large[code_name]["report"]["peak_mb"]])
    print(table(["code", "ci peak MB", "ci s", "large peak MB", "large s", "ratio", "report ci MB", "report large MB"],
                rows))
    out = args.out or HERE / f"memory-{today}-{rev}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
