"""``selftest``: the clean reference and every planted mutant; exit 1 unless all are caught.

The cells that need TE (TE's and Megatron's installers, Megatron's expert layer) cannot run
on the reference: where TE and Megatron-Core are installed they form the self-test's part in
TE's own code - te-cpu on the project's patched tree (made in the run folder, ``te-fixed``), the
faults planted there, and Megatron's expert layer with Megatron's weight too (its distributed
weight); elsewhere they are left out with one line, as a sweep leaves them out."""

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
from harness.orchestration.selftest import CLEAN, TeSide, run_selftest, table, write
from harness.judging import ledger as ledgers
from harness.te_tree import patch as te_patch, tree as te_tree
from harness.vocabulary import fault_classes, matrix, modules, weights
from harness.records.stream import ResultStream


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selftest", help="prove the harness kills every known fault class "
                       "(docs/fault-classes.md) with zero false alarms")
    selection.add_selection(p).add_argument(
        "--examples", type=int, default=0, metavar="N",
        help="hunt for false alarms: N hypothesis-drawn shapes per cell on the clean reference")
    _options.add_run_control(p, "selftest", "run folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cells, sel = selection.select(args)
    if args.examples < 0:
        raise exitcodes.UsageError(f"--examples must be >= 0, got --examples={args.examples}")
    info, args.device = preflight.check_run(CLEAN, args.device, {c.world_size for c in cells}, {c.module for c in cells},
                                             keep_warm=True)
    te_cells = [c for c in cells if selection.requires(c) or _te_fault_runs(c)]
    cells, sel = selection.leave_out(cells, sel, preflight.missing(info))
    selection.check_shardable(cells, Example().out_features)
    run_dir = _options.run_dir(args, prefix="selftest").resolve()
    opts = LaunchOptions(backend=CLEAN, run_dir=run_dir, cell_timeout=args.cell_timeout, device=args.device)
    te = _te_side(te_cells, sel, run_dir, args.cell_timeout)
    if te is None and te_cells:
        print(f"dw-harness selftest: {selection.left_out_line(sel)} (TE's part of the self-test needs "
              f"TE and Megatron-Core: python -m harness install)", flush=True)
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
    result = run_selftest(cells, opts, progress, clean_examples=args.examples, te=te)
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


def _te_fault_runs(cell: matrix.Cell) -> bool:
    """Whether a fault planted in TE's own code on CPU (``fault_classes.TE``) runs on ``cell``:
    such a cell joins the self-test's part in TE's code even when the reference runs it too
    (a fault of te-cpu's kernels, shown by the block-spanning cells)."""
    return any(f.runs_in(cell) for f in fault_classes.TE.values())


def _te_side(te_cells: list, sel: dict, run_dir: Path, cell_timeout: float | None) -> TeSide | None:
    """The self-test's part in TE's own code, where TE and Megatron-Core are installed (None
    elsewhere): the selection's cells that need TE, and Megatron's expert layer with Megatron's
    weight (the layer's distributed weight, which the selection's default weights leave out),
    on te-cpu over the project's patched tree, made now in the run folder."""
    if not te_cells or weights.megatron_missing() is not None:
        return None
    layered = matrix.select(sel.get("preset", "ci"), {**{k: tuple(v) for k, v in (sel.get("overrides") or {}).items()},
                                                      "module": modules.LAYERS, "weight": ("megatron",)},
                            sel.get("filter"))
    cells = list(dict.fromkeys([*te_cells, *layered]))
    tree = run_dir / "te-fixed"
    te_patch.make(tree)
    version = te_tree.inspect(str(tree)).version
    ledger = ledgers.choose(None, "transformer_engine", version)

    def judge(results: list[CellResult]) -> list[CellResult]:
        return ledgers.apply(results, ledger, judge_stale=False)[0] if ledger is not None else results

    opts = LaunchOptions(backend=f"te-cpu@{tree}", run_dir=run_dir, cell_timeout=cell_timeout, device="cpu")
    return TeSide(str(tree), cells, opts, judge)


def fold_streams(run_dir: Path) -> None:
    """A finished self-test keeps every verdict, the mutants' included, at a fraction of the
    size: the result stream (every mutant cell with every rank's checks, ~20 MB for ``ci``)
    is gzipped to ``cells.jsonl.gz``, and the ranks' event reports, folded into those
    verdicts, go; the launch logs and plans are gzipped (``harness.records.runfolder``).
    ``selftest.json`` and the record hold what the reports show."""
    ResultStream(run_dir).compress()
    shutil.rmtree(run_dir / "ranks", ignore_errors=True)
    runfolder.fold_launch_files(run_dir)

