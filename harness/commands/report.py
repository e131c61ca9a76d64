"""``report RUN_DIR``: re-render every report from a run record alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import exitcodes
from harness.record import load


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="render HTML/JUnit/markdown from a run record")
    p.add_argument("run", type=Path, help="run folder, or its results.json.gz / results.json")
    p.add_argument("--to", type=Path, help="output folder (default: the run folder)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.reports import write_all

    try:
        record = load(args.run)
    except (OSError, ValueError) as exc:
        raise exitcodes.UsageError(f"cannot read run record {str(args.run)!r}: {exc}") from exc
    out = args.to or (args.run if args.run.is_dir() else args.run.parent)
    out.mkdir(parents=True, exist_ok=True)
    for kind, path in write_all(record.serialize(), out).items():
        print(f"{kind}: {path}")
    return exitcodes.OK
