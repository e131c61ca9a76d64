"""``sweep``: run a selection under torchrun, write the run record and the reports."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from harness import compare, exitcodes, matrix
from harness.commands import _options
from harness.inputs import Example
from harness.launch import LaunchOptions
from harness.record import GOOD_STATUSES, STATUSES, CellResult, RunRecord, load
from harness.sweep import SweepSpec, run_sweep


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run the matrix under torchrun and gate on the result")
    _options.add_selection(p)
    _options.add_run(p)
    p.add_argument("--resume", type=Path, metavar="RUN_DIR",
                   help="continue an interrupted run: only cells without a result run")
    p.add_argument("--examples", type=int, default=0, metavar="N",
                   help="also run N hypothesis-drawn shape/split examples per cell; a failure is "
                        "shrunk to its smallest example")
    p.add_argument("--quiet", action="store_true", help="no per-cell progress")
    p.set_defaults(func=run)


class Progress:
    """One line per cell that misses its expectation, a counter for the rest."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stdout.isatty()

    def __call__(self, res: CellResult, done: int, total: int) -> None:
        if self.quiet:
            return
        if not res:
            print(f"\r[{done:>5}/{total}] {res.status.upper():7} {res.id}\n          {res.first_failure}\n"
                  f"          repro: {res.repro}", flush=True)
        elif self.tty:
            print(f"\r[{done:>5}/{total}] {res.status:7} {res.id[:90]:90}", end="", flush=True)
        elif done % 25 == 0 or done == total:
            print(f"[{done:>5}/{total}] ...", flush=True)


def summary(record: RunRecord) -> str:
    counts = record.counts
    lines = [f"{'module':22} " + " ".join(f"{s:>7}" for s in STATUSES)]
    per: dict[str, Counter] = {}
    for c in record.cells:
        per.setdefault(c.axes["module"], Counter())[c.status] += 1
    for mod, cnt in per.items():
        lines.append(f"{mod:22} " + " ".join(f"{cnt.get(s, 0):>7}" for s in STATUSES))
    lines.append(f"{'total':22} " + " ".join(f"{counts.get(s, 0):>7}" for s in STATUSES))
    bad = [c for c in record.cells if not c]
    if bad:
        lines.append("")
        lines.append(f"{len(bad)} cell(s) did not meet their expectation:")
        for c in bad[:20]:
            lines.append(f"  {c.status.upper():7} {c.id}\n          {c.first_failure}\n          repro: {c.repro}")
        if len(bad) > 20:
            lines.append(f"  ... and {len(bad) - 20} more (see the report)")
    return "\n".join(lines)


def write_reports(record: RunRecord, run_dir: Path) -> dict[str, Path]:
    """Render every report from the run record alone; a report failure never loses results."""
    try:
        from reports import write_all
    except ImportError:
        return {}
    try:
        return write_all(record.serialize(), run_dir)
    except Exception as exc:  # report rendering must not hide the verdict
        print(f"dw-harness: warning: report rendering failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return {}


def _about(info) -> str:
    """`` (transformer_engine 2.20.2, fp32 GEMMs tf32)`` for a backend that says so."""
    facts = [f"{info.upstream} {info.version}" if info.upstream else None,
             f"fp32 GEMMs {info.fp32_gemm}" if info.fp32_gemm != "ieee" else None]
    facts = [f for f in facts if f]
    return f" ({', '.join(facts)})" if facts else ""


def run(args: argparse.Namespace) -> int:
    if args.resume:
        try:
            previous = load(args.resume)
        except (OSError, ValueError) as exc:
            raise exitcodes.UsageError(f"cannot resume {str(args.resume)!r}: no readable run record ({exc})") from exc
        args.out = args.resume
        args.backend = previous.backend
        # the resumed run is the recorded selection, not whatever the defaults are now
        sel = previous.selection
        args.examples = int(sel.get("examples", 0))
        cells = matrix.select(sel.get("preset", "ci"), {k: tuple(v) for k, v in sel.get("overrides", {}).items()},
                              sel.get("filter"))
        selection = {"preset": sel.get("preset", "ci"), "overrides": sel.get("overrides", {}),
                     "filter": sel.get("filter")}
    else:
        cells, selection = _options.select(args)
    if args.examples < 0:
        raise exitcodes.UsageError(f"--examples must be >= 0, got --examples={args.examples}")
    selection["examples"] = args.examples
    info = _options.probe(args)
    _options.check_shardable(cells, Example().out_features)
    run_dir = _options.run_dir(args)
    opts = LaunchOptions(backend=args.backend, run_dir=run_dir.resolve(), cell_timeout=args.cell_timeout,
                         device=args.device, examples=args.examples)
    spec = SweepSpec(cells=cells, backend=args.backend, run_dir=run_dir.resolve(), selection=selection,
                     tolerance=compare.policy(info.fp32_gemm), argv=args.argv, options=opts,
                     resume=bool(args.resume), on_result=Progress(args.quiet),
                     backend_info=info.serialize())
    print(f"dw-harness: {len(cells)} cells, world sizes {sorted({c.world_size for c in cells})}, "
          f"backend {args.backend}{_about(info)}, run folder {run_dir}", flush=True)
    try:
        record = run_sweep(spec)
    finally:
        # also on Ctrl-C: render what is there, marked incomplete
        try:
            partial = load(run_dir)
            paths = write_reports(partial, run_dir)
        except (OSError, ValueError):
            paths = {}
    print()
    print(summary(record))
    print(f"\nrun record: {run_dir / 'results.json'}")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return exitcodes.OK if all(c.status in GOOD_STATUSES for c in record.cells) else exitcodes.MISMATCH
