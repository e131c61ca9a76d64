"""``selftest``: the clean reference and every planted mutant; exit 1 unless all are caught."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from harness.judging import assemble, gate
from harness.vocabulary import errors as exitcodes, selection
from harness.orchestration import preflight
from harness.records import runfolder, runinfo
from harness.commands import _options
from harness.vocabulary.shape import Example
from harness.launcher.launch import LaunchOptions
from harness.records.record import CellResult
from harness.orchestration.selftest import CLEAN, run_selftest, table, write
from harness.records.stream import ResultStream


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selftest", help="prove the harness kills every known fault class "
                       "(docs/fault-classes.md) with zero false alarms")
    selection.add_selection(p)
    _options.add_out(p, "selftest", "run folder")
    _options.add_timeout_and_device(p)
    p.add_argument("--examples", type=int, default=0, metavar="N",
                   help="hunt for false alarms: N hypothesis-drawn shapes per cell on the clean reference")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cells, sel = selection.select(args)
    if args.examples < 0:
        raise exitcodes.UsageError(f"--examples must be >= 0, got --examples={args.examples}")
    _options.check_timeout(args.cell_timeout)
    info, args.device = preflight.check_run(CLEAN, args.device, {c.world_size for c in cells}, {c.module for c in cells},
                                             keep_warm=True)
    selection.check_shardable(cells, Example().out_features)
    run_dir = _options.run_dir(args, prefix="selftest").resolve()
    opts = LaunchOptions(backend=CLEAN, run_dir=run_dir, cell_timeout=args.cell_timeout, device=args.device)
    done = [0]

    def progress(backend: str, res: CellResult) -> None:
        done[0] += 1
        if backend == CLEAN and not res:
            print(f"FALSE ALARM on the clean reference: {res.id}\n  {res.first_failure}", flush=True)
        elif done[0] % 100 == 0:
            print(f"[{done[0]:>5}] ...", flush=True)

    started = runinfo.now()
    print(f"dw-harness selftest: {len(cells)} cells x (clean + mutants), run folder {run_dir}", flush=True)
    sel["clean_examples"] = args.examples
    result = run_selftest(cells, opts, progress, clean_examples=args.examples)
    write(result, run_dir / "selftest.json")
    record = assemble.start(backend=CLEAN, argv=args.argv, selection=sel, device=args.device,
                            backend_info=info.serialize(), world_sizes=[c.world_size for c in cells], started=started)
    assemble.judge(record, result.clean, None)
    record.status, record.finished, record.duration_s = "complete", runinfo.now(), result.duration_s
    record.write(run_dir)
    from harness_reports import write_all

    paths = write_all(record.serialize(), run_dir, selftest=result.serialize())
    fold_streams(run_dir)
    print()
    print(table(result))
    print(f"\nselftest record: {run_dir / 'selftest.json'} (done in {result.duration_s:.0f}s)")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if gate.exit_code(record.serialize()) == exitcodes.HARNESS_BUG:
        print(f"dw-harness: selftest: the harness failed on {result.harness_errors} clean cell(s) (status "
              "harness_error, a harness bug); see the report", file=sys.stderr)
        return exitcodes.HARNESS_BUG
    if not result.ok:
        print("dw-harness: selftest FAILED: a mutant survived or the clean reference raised a false alarm",
              file=sys.stderr)
        return exitcodes.MISMATCH
    return exitcodes.OK


def fold_streams(run_dir: Path) -> None:
    """A finished self-test keeps every verdict, the mutants' included, at a fraction of the
    size: the result stream (every mutant cell with every rank's checks, ~20 MB for ``ci``)
    is gzipped to ``cells.jsonl.gz``, and the ranks' event reports, folded into those
    verdicts, go; the launch logs and plans are gzipped (``harness.records.runfolder``).
    ``selftest.json`` and the record hold what the reports show."""
    ResultStream(run_dir).compress()
    shutil.rmtree(run_dir / "ranks", ignore_errors=True)
    runfolder.fold_launch_files(run_dir)

