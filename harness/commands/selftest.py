"""``selftest``: the clean reference and every planted mutant; exit 1 unless all are caught."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import compare, exitcodes
from harness.commands import _options
from harness.launch import LaunchOptions
from harness.record import CellResult
from harness.selftest import CLEAN, run_selftest, table, write
from harness.sweep import environment, _now


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selftest", help="prove the harness kills every known fault class "
                       "(../shared/design/BUGS.md) with zero false alarms")
    _options.add_selection(p)
    p.add_argument("--out", type=Path, help="run folder (default: runs/selftest-<timestamp>)")
    p.add_argument("--cell-timeout", type=float, default=120.0, help="seconds a cell may take (default 120)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--examples", type=int, default=0, metavar="N",
                   help="hunt for false alarms: N hypothesis-drawn shapes per cell on the clean reference")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.record import RunRecord

    cells, selection = _options.select(args)
    run_dir = _options.run_dir(args, prefix="selftest").resolve()
    opts = LaunchOptions(backend=CLEAN, run_dir=run_dir, cell_timeout=args.cell_timeout, device=args.device)
    done = [0]

    def progress(backend: str, res: CellResult) -> None:
        done[0] += 1
        if backend == CLEAN and not res:
            print(f"FALSE ALARM on the clean reference: {res.id}\n  {res.first_failure}", flush=True)
        elif done[0] % 100 == 0:
            print(f"[{done[0]:>5}] ...", flush=True)

    started = _now()
    print(f"dw-harness selftest: {len(cells)} cells x (clean + mutants), run folder {run_dir}", flush=True)
    if args.examples < 0:
        raise exitcodes.UsageError(f"--examples must be >= 0, got --examples={args.examples}")
    selection["clean_examples"] = args.examples
    result = run_selftest(cells, opts, progress, clean_examples=args.examples)
    write(result, run_dir / "selftest.json")
    record = RunRecord(status="complete", started=started, finished=_now(), duration_s=result.duration_s,
                       command="python -m harness " + " ".join(args.argv), argv=args.argv, backend=CLEAN,
                       environment=environment(args.device), selection=selection,
                       tolerance=compare.policy(), world_sizes=sorted({c.world_size for c in cells}),
                       cells=result.clean)
    record.write(run_dir / "results.json")
    from reports import write_all

    paths = write_all(record.serialize(), run_dir, selftest=result.serialize())
    print()
    print(table(result))
    print(f"\nselftest record: {run_dir / 'selftest.json'} (done in {result.duration_s:.0f}s)")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if not result.ok:
        print("dw-harness: selftest FAILED: a mutant survived or the clean reference raised a false alarm",
              file=sys.stderr)
        return exitcodes.MISMATCH
    return exitcodes.OK
