"""``list``: what a selection expands to, with counts (``--json`` for machines)."""

from __future__ import annotations

import argparse
import json

from harness import matrix, selection


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="print the cells a selection expands to")
    selection.add_selection(p)
    p.add_argument("--json", action="store_true", help="print the cells as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cells, _ = selection.select(args)
    if args.json:
        print(json.dumps([{"id": c.id, "expect": c.expect, **c.serialize()} for c in cells], indent=1))
        return 0
    for c in cells:
        print(c.id + ("  [expected error]" if c.expect == "error" else ""))
    print()
    print(matrix.describe(cells))
    return 0
