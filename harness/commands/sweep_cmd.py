"""``sweep``: run a selection under torchrun, write the run record and the reports."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

from harness.vocabulary import errors as exitcodes, matrix, selection
from harness.orchestration import preflight
from harness.records import provenance, recordfile
from harness.vocabulary import shard
from harness.judging import review as reviews
from harness.vocabulary.backend_specs import split_tree
from harness.commands import _options, _outcome
from harness.vocabulary.shape import Example
from harness.launcher.launch import LaunchOptions
from harness.records.record import CellResult, RunRecord
from harness.vocabulary.status import counts_text, label
from harness.orchestration.sweep import SweepSpec, run_sweep


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run the matrix under torchrun and gate on the result")
    sel = selection.add_selection(p)
    sel.add_argument("--examples", type=int, metavar="N",
                     help="also run N hypothesis-drawn shape/split examples per cell; a failure is "
                          "shrunk to its smallest example")
    judging = _options.add_backend(p)
    judging.add_argument("--fixes", metavar="ENTRY[,ENTRY...]",
                         help="review a change (e.g. a TE tree from --te-tree): the ledger entries it must fix "
                              "(ids, globs over ids, or 'all'). Green (exit 0) when each of them is fixed here "
                              "(selects cells, reproduces in none) and no cell fails without an entry (a "
                              "regression); an entry fixed here without being named is reported, never red. A "
                              "sweep of a TE tree is a review even without --fixes (no entry required, none stale)")
    control = _options.add_run_control(p)
    control.add_argument("--resume", type=Path, metavar="RUN_DIR",
                         help="continue a run in its folder: only the cells without a verdict in its result "
                              "stream run")
    control.add_argument("--rerun-failed", action="store_true",
                         help="with --resume: also rerun the cells whose verdict missed their expectation")
    control.add_argument("--packing", choices=("on", "off"), default="on",
                         help="on: cells of every world size dividing the largest share one launch, on "
                              "disjoint sub-groups side by side; off: one launch per world size")
    control.add_argument("--quiet", action="store_true", help="no per-cell progress")
    p.set_defaults(func=run)


class Progress:
    """One block per cell that misses its expectation; otherwise a counter line with the
    counts per status, the rate and an ETA (rewritten in place on a terminal, every 10 s or
    25 cells in a log); a line while torchrun starts or a cell runs long."""

    def __init__(self, quiet: bool, interval: float = 10.0) -> None:
        self.quiet = quiet
        self.tty = sys.stdout.isatty()
        self.counts: Counter = Counter()
        self.t0 = time.monotonic()
        self.said = self.t0
        self.interval = interval
        self.first_done: int | None = None

    def line(self, done: int, total: int) -> str:
        elapsed = time.monotonic() - self.t0
        counts = counts_text(self.counts)
        ran = done - (self.first_done or 0) + 1
        rate = ran / elapsed if elapsed > 0 else 0.0
        eta = f"ETA {(total - done) / rate:.0f} s" if rate > 0 and done < total else "done" if done >= total else ""
        return f"[{done:>5}/{total}] {counts} · {rate:.1f} cells/s · {eta}"

    def __call__(self, res: CellResult, done: int, total: int) -> None:
        self.counts[res.status] += 1
        if self.first_done is None:
            self.first_done = done
        if self.quiet:
            return
        if not res:
            print(f"\r[{done:>5}/{total}] {label(res.status).upper():7} {res.id}\n          {res.first_failure}\n"
                  f"          repro: {res.repro}", flush=True)
        now = time.monotonic()
        if self.tty:
            print(f"\r{self.line(done, total)[:150]:150}", end="", flush=True)
        elif done % 25 == 0 or done == total or now - self.said >= self.interval:
            print(self.line(done, total), flush=True)
        self.said = now

    def resuming(self, kept: Counter, todo: int) -> None:
        """A resumed run starts from the verdicts it has (their statuses): say so, and count them."""
        self.counts.update(kept)
        n = sum(kept.values())
        have = f" ({counts_text(kept)})" if n else ""
        print(f"dw-harness: resuming: {n} of {n + todo} cells have a verdict{have}; {todo} to run", flush=True)

    def waiting(self, what: str) -> None:
        """The launcher has nothing new to say for a while: say what it is waiting for."""
        if not self.quiet:
            print(("\n" if self.tty else "") + f"          ... {what}", flush=True)


def _resumed_selection(args: argparse.Namespace) -> tuple[list[matrix.Cell], dict]:
    """The recorded selection, backend and options of the run folder ``args.resume``.

    Raises:
        UsageError: the command line also selects cells (a resumed run is the recorded
            selection: options that would change it are refused, not dropped), or the folder
            holds no readable record.
    """
    extra = selection.given(args) + ["--examples"] * (args.examples is not None)
    if extra:
        raise exitcodes.UsageError(f"--resume continues the recorded selection; drop {', '.join(extra)} "
                                   "(or start a new run with --out)")
    try:
        previous = recordfile.read_head(args.resume)  # never its cells: a record may hold 100,000s
        previous = RunRecord.from_dict({**previous, "cells": []})
    except (OSError, ValueError, KeyError) as exc:
        raise exitcodes.UsageError(f"cannot resume {str(args.resume)!r}: no readable run record ({exc})") from exc
    args.out = args.resume
    args.backend = previous.backend
    # the resumed run is the recorded selection, not whatever the defaults are now
    sel = previous.selection
    args.examples = int(sel.get("examples", 0))
    # the shard is cut before anything is left out (as a fresh run cuts it); run() leaves the
    # same cells out again after the backend's probe
    cells = selection.recorded({**sel, "left_out": None})
    part = shard.Shard(**sel["shard"]) if sel.get("shard") else None
    cells, out = selection.apply_shard(cells, {"preset": sel.get("preset", "ci"), "overrides": sel.get("overrides", {}),
                                               "filter": sel.get("filter"),
                                               **({"sample": sel["sample"]} if sel.get("sample") else {})}, part)
    if sel.get("fixes") and args.fixes is None:  # a tree review without --fixes recorded []
        args.fixes = ",".join(sel["fixes"])
    return cells, out


def _check_same_code(run_dir: Path, backend: str, info) -> None:
    """A resumed run judges the code its record names: the same backend, upstream version and
    tree commit, dirty state and digest (``harness.records.provenance``); otherwise its verdicts would
    mix two versions of the code under one record.

    Raises:
        UsageError: the code changed since the record was written (naming both).
    """
    differs = provenance.differences(provenance.identity(recordfile.read_head(run_dir)),
                                     provenance.identity_of(backend, info.serialize()))
    if differs:
        raise exitcodes.UsageError(f"cannot resume {str(run_dir)!r}: its verdicts judged other code than now "
                                   f"({differs}); start a new run with --out")


def _about(info) -> str:
    """`` (transformer_engine 2.20.2, fp32 GEMMs tf32)`` for a backend that says so."""
    facts = [f"{info.upstream} {info.version}" if info.upstream else None,
             f"fp32 GEMMs {info.fp32_gemm}" if info.fp32_gemm != "ieee" else None]
    facts = [f for f in facts if f]
    return f" ({', '.join(facts)})" if facts else ""


def run(args: argparse.Namespace) -> int:
    if args.rerun_failed and not args.resume:
        raise exitcodes.UsageError("--rerun-failed needs --resume RUN_DIR")
    cells, sel = _resumed_selection(args) if args.resume else selection.select(args)
    if args.examples is None:
        args.examples = 0
    if args.examples < 0:
        raise exitcodes.UsageError(f"--examples must be >= 0, got --examples={args.examples}")
    sel["examples"] = args.examples
    selection.check_recipes(cells)  # before the backend's probe: bad input first, cheaply
    info, args.device = preflight.check_run(args.backend, args.device, {c.world_size for c in cells},
                                            {c.module for c in cells}, keep_warm=True,
                                            selected_recipes={c.recipe for c in cells},
                                            selected_weights={c.weight for c in cells})
    cells, sel = selection.leave_out(cells, sel, preflight.missing(info))
    selection.check_shardable(cells, Example().out_features)
    if args.resume:
        _check_same_code(args.resume, args.backend, info)
    ledger = _options.ledger_for(args.ledger, info)
    if args.fixes is not None:
        if ledger is None:
            raise exitcodes.UsageError("--fixes needs a ledger: --ledger FILE (the backend has no shipped one)")
        try:
            sel["fixes"] = reviews.required_entries([p for p in args.fixes.split(",") if p], ledger)
        except reviews.ReviewError as exc:
            raise exitcodes.UsageError(str(exc)) from exc
    elif ledger is not None and split_tree(args.backend)[1] is not None:
        # A TE tree is a change under review, even with no entry required: an entry it fixes
        # is good news ("fixed here"), not a stale line to delete from the release's ledger.
        sel["fixes"] = []
    run_dir = _options.run_dir(args)
    progress = Progress(args.quiet)
    opts = LaunchOptions(backend=args.backend, run_dir=run_dir.resolve(), cell_timeout=args.cell_timeout,
                         device=args.device, examples=args.examples, on_wait=progress.waiting)
    cells = matrix.PackedCells(cells)  # held for the whole run: a byte per axis, not a Cell
    spec = SweepSpec(cells=cells, backend=args.backend, run_dir=run_dir.resolve(), selection=sel,
                     argv=args.argv, options=opts,
                     resume=bool(args.resume), rerun_failed=args.rerun_failed, on_result=progress,
                     backend_info=info.serialize(), packing=args.packing == "on",
                     slots=preflight.gpu_slots(args.device, info.torch), ledger=ledger, on_resume=progress.resuming)
    about = f", ledger {ledger.path} ({len(ledger.entries)} entries)" if ledger else ""
    print(f"dw-harness: {len(cells)} cells, world sizes {sorted({c.world_size for c in cells})}, "
          f"backend {args.backend}{_about(info)}{about}, run folder {run_dir}", flush=True)
    left = selection.left_out_line(sel)
    if left:
        print(f"dw-harness: {left}", flush=True)
    try:
        record = run_sweep(spec)
    except KeyboardInterrupt:
        print(f"dw-harness: interrupted; continue with: python -m harness sweep --resume {shlex.quote(str(run_dir))}",
              file=sys.stderr, flush=True)
        raise
    finally:
        # also on Ctrl-C or a launch failure: render what is there, marked incomplete
        try:
            paths = _outcome.write_reports(recordfile.read_streamed(run_dir), run_dir)
        except (OSError, ValueError):
            paths = {}
    return _outcome.conclude(recordfile.read_streamed(run_dir), f"run record: {recordfile.path_in(run_dir)}", paths)
