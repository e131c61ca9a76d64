"""``diff BASE NEW``: what changed between two run records; exit 1 on new failures."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.vocabulary import errors as exitcodes
from harness.records.record import load


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="compare two run records (gate against a baseline)")
    p.add_argument("base", type=Path, help="baseline run folder or run record file")
    p.add_argument("new", type=Path, help="new run folder or run record file")
    p.add_argument("--html", type=Path, help="also write an HTML diff here")
    p.add_argument("--ratio-growth", type=float, default=2.0,
                   help="flag passing cells whose error/bound ratio grew by this factor (default 2)")
    p.add_argument("--allow-missing", action="store_true",
                   help="do not fail on lost coverage (cells only in base, or newly skipped)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness_reports.diff import diff_records, render_diff_html, render_diff_text

    try:
        base, new = load(args.base).serialize(), load(args.new).serialize()
    except (OSError, ValueError) as exc:
        raise exitcodes.UsageError(f"cannot read run record: {exc}") from exc
    d = diff_records(base, new, ratio_growth=args.ratio_growth, allow_missing=args.allow_missing)
    print(render_diff_text(d))
    if args.html:
        args.html.write_text(render_diff_html(d, base, new))
        print(f"html: {args.html}")
    return d.exit_code
