"""``sweep``: run a selection under torchrun, write the run record and the reports."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

from harness import exitcodes, matrix, preflight, recordfile, review, selection, shard, tolerance
from harness import ledger as ledger_mod
from harness.backends import split_tree
from harness.commands import _options
from harness.shape import Example
from harness.launch import LaunchOptions
from harness.record import CellResult, RunRecord, load
from harness.status import HARNESS_ERROR, STATUSES, counts_text, label, run_exit_code
from harness.sweep import SweepSpec, run_sweep


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run the matrix under torchrun and gate on the result")
    selection.add_selection(p)
    _options.add_run(p)
    p.add_argument("--resume", type=Path, metavar="RUN_DIR",
                   help="continue a run: only the cells without a verdict in its result stream run")
    p.add_argument("--rerun-failed", action="store_true",
                   help="with --resume: also rerun the cells whose verdict missed their expectation")
    p.add_argument("--examples", type=int, default=0, metavar="N",
                   help="also run N hypothesis-drawn shape/split examples per cell; a failure is "
                        "shrunk to its smallest example")
    p.add_argument("--fixes", metavar="ENTRY[,ENTRY...]",
                   help="review a change (e.g. a TE tree from --te-tree): the ledger entries it must fix "
                        "(ids, globs over ids, or 'all'). Green (exit 0) when each of them is fixed here "
                        "(selects cells, reproduces in none) and no cell fails without an entry (a "
                        "regression); an entry fixed here without being named is reported, never red. A sweep "
                        "of a TE tree is a review even without --fixes (no entry required, none stale)")
    p.add_argument("--quiet", action="store_true", help="no per-cell progress")
    p.add_argument("--packing", choices=("on", "off"), default="on",
                   help="on: cells of every world size dividing the largest share one launch, on "
                        "disjoint sub-groups side by side; off: one launch per world size")
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

    def resuming(self, kept: list[CellResult], todo: int) -> None:
        """A resumed run starts from the verdicts it has: say so, and count them."""
        have = Counter(r.status for r in kept)
        self.counts.update(have)
        total = len(kept) + todo
        have = f" ({counts_text(have)})" if kept else ""
        print(f"dw-harness: resuming: {len(kept)} of {total} cells have a verdict{have}; {todo} to run", flush=True)

    def waiting(self, what: str) -> None:
        """The launcher has nothing new to say for a while: say what it is waiting for."""
        if not self.quiet:
            print(("\n" if self.tty else "") + f"          ... {what}", flush=True)


def summary(record: RunRecord) -> str:
    counts = record.counts
    per: dict[str, Counter] = {}
    for c in record.cells:
        per.setdefault(c.axes["module"], Counter())[c.status] += 1
    w = max([len("module")] + [len(m) for m in per])
    cols = [max(len(label(s)), 5) for s in STATUSES]
    lines = [f"{'module':{w}} " + " ".join(f"{label(s):>{c}}" for s, c in zip(STATUSES, cols))]
    for mod, cnt in [*per.items(), ("total", counts)]:
        lines.append(f"{mod:{w}} " + " ".join(f"{cnt.get(s, 0):>{c}}" for s, c in zip(STATUSES, cols)))
    if record.ledger:
        lines.append("")
        lines.append(f"ledger {record.ledger['path']}:")
        idw = max(len(e["id"]) for e in record.ledger["entries"]) if record.ledger["entries"] else 0
        for e in record.ledger["entries"]:
            state = ("STALE: no longer reproduces" if e["stale"] else
                     f"{len(e['known_cells'])} known, reproduced in {len(e['reproduced'])}/{len(e['selected'])} "
                     "selected cell(s)" if e["selected"] else "selects no cell of this run")
            mark = "*" if e.get("required") else " "
            lines.append(f" {mark}{e['id']:{idw}} {e['upstream']:20} {e.get('verdict', ''):14} {state}")
        rev = review.review(record.serialize())
        if rev is not None and (rev.required or rev.tree):
            lines += [""] + review_lines(rev)
    bad = [c for c in record.cells if not c]
    if bad:
        lines.append("")
        lines.append(f"{len(bad)} cell(s) did not meet their expectation:")
        for c in bad[:20]:
            lines.append(f"  {label(c.status).upper():7} {c.id}\n          {c.first_failure}\n          repro: {c.repro}")
        if len(bad) > 20:
            lines.append(f"  ... and {len(bad) - 20} more (see the report)")
    return "\n".join(lines)


def review_lines(rev: review.Review) -> list[str]:
    """The review's verdict: the tree, GREEN or RED with every reason, the entries fixed here."""
    out = []
    if rev.tree:
        t = rev.tree
        state = "" if t.get("commit") is None else f" at {t['commit'][:12]}{' (dirty)' if t.get('dirty') else ''}"
        out.append(f"TE tree under review: {t.get('path')}{state}, version {t.get('version')}")
    fixed = [e.id for e in rev.entries if e.verdict == review.FIXED]
    if rev.required:
        word = "GREEN" if rev.green else "RED"
        out.append(f"review {word}: {sum(e.required and e.verdict == review.FIXED for e in rev.entries)} of "
                   f"{len(rev.required)} required entries fixed here, {len(rev.regressions)} regression(s)"
                   + (f", {rev.harness_errors} harness error(s)" if rev.harness_errors else ""))
        out += [f"  {line}" for line in rev.reasons()[:20]]
    elif rev.regressions:
        out.append(f"{len(rev.regressions)} cell(s) fail without a ledger entry (regressions)")
    bonus = [i for i in fixed if i not in rev.required]
    if bonus:
        out.append(f"also fixed here (not required): {', '.join(bonus)}")
    return out


def gate(record: RunRecord) -> int:
    """The run's exit code; says which ledger entries are stale, and under review which
    required entries are not fixed (each fails the gate)."""
    for entry_id in record.stale_entries:
        print(f"dw-harness: {ledger_mod.stale_message(entry_id, record.ledger)}", file=sys.stderr)
    verdicts = {e["id"]: e["verdict"] for e in (record.ledger or {}).get("entries", [])}
    for entry_id in record.unfixed_entries:
        print(f"dw-harness: ledger entry {entry_id} must be fixed by this change but is {verdicts[entry_id]}",
              file=sys.stderr)
    return run_exit_code((c.status for c in record.cells),
                         stale=bool(record.stale_entries or record.unfixed_entries))


def write_reports(record: RunRecord, run_dir: Path) -> dict[str, Path]:
    """Render every report from the run record alone; a report failure never loses results."""
    from harness.reports import write_all

    try:
        return write_all(record.serialize(), run_dir)
    except Exception as exc:  # report rendering must not hide the verdict
        print(f"dw-harness: warning: report rendering failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return {}


def _resumed_selection(args: argparse.Namespace) -> tuple[list[matrix.Cell], dict]:
    """The recorded selection, backend and options of the run folder ``args.resume``."""
    try:
        previous = load(args.resume)
    except (OSError, ValueError) as exc:
        raise exitcodes.UsageError(f"cannot resume {str(args.resume)!r}: no readable run record ({exc})") from exc
    args.out = args.resume
    args.backend = previous.backend
    # the resumed run is the recorded selection, not whatever the defaults are now
    sel = previous.selection
    args.examples = int(sel.get("examples", 0))
    cells = selection.recorded(sel)
    part = shard.Shard(**sel["shard"]) if sel.get("shard") else None
    cells, out = selection.apply_shard(cells, {"preset": sel.get("preset", "ci"), "overrides": sel.get("overrides", {}),
                                               "filter": sel.get("filter"),
                                               **({"sample": sel["sample"]} if sel.get("sample") else {})}, part)
    if sel.get("fixes") is not None and args.fixes is None:
        args.fixes = ",".join(sel["fixes"])
    return cells, out


def _about(info) -> str:
    """`` (transformer_engine 2.20.2, fp32 GEMMs tf32)`` for a backend that says so."""
    facts = [f"{info.upstream} {info.version}" if info.upstream else None,
             f"fp32 GEMMs {info.fp32_gemm}" if info.fp32_gemm != "ieee" else None]
    facts = [f for f in facts if f]
    return f" ({', '.join(facts)})" if facts else ""


def run(args: argparse.Namespace) -> int:
    _options.backend_spec(args)
    if args.rerun_failed and not args.resume:
        raise exitcodes.UsageError("--rerun-failed needs --resume RUN_DIR")
    cells, sel = _resumed_selection(args) if args.resume else selection.select(args)
    if args.examples < 0:
        raise exitcodes.UsageError(f"--examples must be >= 0, got --examples={args.examples}")
    _options.check_timeout(args.cell_timeout)
    sel["examples"] = args.examples
    info, args.device = preflight.check_run(args.backend, args.device, {c.world_size for c in cells},
                                            {c.module for c in cells}, keep_warm=True)
    selection.check_shardable(cells, Example().out_features)
    ledger = _options.ledger_for(args.ledger, info)
    if args.fixes is not None:
        if ledger is None:
            raise exitcodes.UsageError("--fixes needs a ledger: --ledger FILE (the backend has no shipped one)")
        try:
            sel["fixes"] = review.required_entries([p for p in args.fixes.split(",") if p], ledger)
        except review.ReviewError as exc:
            raise exitcodes.UsageError(str(exc)) from exc
    elif ledger is not None and split_tree(args.backend)[1] is not None:
        # A TE tree is a change under review, even with no entry required: an entry it fixes
        # is good news ("fixed here"), not a stale line to delete from the release's ledger.
        sel["fixes"] = []
    run_dir = _options.run_dir(args)
    progress = Progress(args.quiet)
    opts = LaunchOptions(backend=args.backend, run_dir=run_dir.resolve(), cell_timeout=args.cell_timeout,
                         device=args.device, examples=args.examples, on_wait=progress.waiting)
    spec = SweepSpec(cells=cells, backend=args.backend, run_dir=run_dir.resolve(), selection=sel,
                     tolerance=tolerance.policy(info.fp32_gemm), argv=args.argv, options=opts,
                     resume=bool(args.resume), rerun_failed=args.rerun_failed, on_result=progress,
                     backend_info=info.serialize(), packing=args.packing == "on",
                     slots=preflight.gpu_slots(args.device, info.torch), ledger=ledger, on_resume=progress.resuming)
    about = f", ledger {ledger.path} ({len(ledger.entries)} entries)" if ledger else ""
    print(f"dw-harness: {len(cells)} cells, world sizes {sorted({c.world_size for c in cells})}, "
          f"backend {args.backend}{_about(info)}{about}, run folder {run_dir}", flush=True)
    try:
        record = run_sweep(spec)
    except KeyboardInterrupt:
        print(f"dw-harness: interrupted; continue with: python -m harness sweep --resume {shlex.quote(str(run_dir))}",
              file=sys.stderr, flush=True)
        raise
    finally:
        # also on Ctrl-C or a launch failure: render what is there, marked incomplete
        try:
            paths = write_reports(load(run_dir), run_dir)
        except (OSError, ValueError):
            paths = {}
    print()
    print(summary(record))
    print(f"\nrun record: {recordfile.path_in(run_dir)}")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    code = gate(record)
    if code == exitcodes.HARNESS_BUG:
        n = sum(c.status == HARNESS_ERROR for c in record.cells)
        print(f"dw-harness: {n} cell(s) hit a harness bug (status {HARNESS_ERROR}: not a verdict on the "
              "backend); please report it with the traceback in the report or the rank logs", file=sys.stderr)
    return code
