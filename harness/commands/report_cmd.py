"""``report RUN_DIR``: re-render every report from a run record alone."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

from harness.vocabulary import errors as exitcodes
from harness.records import recordfile
from harness.records.record import SCHEMA, load
from harness.vocabulary.status import counts_text


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="render HTML/JUnit/markdown from a run record")
    p.add_argument("run", type=Path, help="run folder, or its results.json.gz / results.json")
    p.add_argument("--to", type=Path, help="output folder (default: the run folder)")
    p.add_argument("--margins", action="store_true",
                   help="print the worst error/bound ratio per dtype and tensor kind (over every "
                        "hypothesis example) instead of rendering; exit 1 if one is above 1")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness_reports import write_all

    try:
        if args.margins:
            return _print_margins(load(args.run))
        # the cells read from the file one at a time, on each pass: never the whole list
        record = recordfile.read_streamed(args.run)
        if record.get("schema") != SCHEMA:  # what ``load`` refuses, refused here too
            raise ValueError(f"unsupported run record schema={record.get('schema')!r} (expected {SCHEMA})")
    except (OSError, ValueError) as exc:
        raise exitcodes.UsageError(f"cannot read run record {str(args.run)!r}: {exc}") from exc
    out = args.to or (args.run if args.run.is_dir() else args.run.parent)
    out.mkdir(parents=True, exist_ok=True)
    for kind, path in write_all(record, out).items():
        print(f"{kind}: {path}")
    return exitcodes.OK


def _print_margins(record: Any) -> int:
    """The clean margin of a run: worst error/bound per (dtype, tensor kind), with how many
    cells and examples it is the worst over (a cell with ``--examples N`` ran N + 1)."""
    from harness.orchestration.sensitivity import worst_ratios

    examples = int((record.selection or {}).get("examples", 0) or 0)
    cells = [c for c in record.cells if c.status in ("pass", "fail")]
    worst = worst_ratios(cells)
    counts: dict[tuple[str, str], int] = {}
    total = 0
    for c in cells:
        runs = examples + 1 if c.example_ratios is not None else 1
        total += runs
        for kind in c.ratios():
            counts[(c.axes["dtype"], kind)] = counts.get((c.axes["dtype"], kind), 0) + runs
    print(f"{'dtype':6} {'tensor kind':12} {'worst ratio':>11} {'examples':>9}")
    for (d, kind), ratio in sorted(worst.items()):
        print(f"{d:6} {kind:12} {ratio:>11.3g} {counts[(d, kind)]:>9}")
    print(f"{total} examples over {len(cells)} cells; world sizes {record.world_sizes}")
    left = Counter(c.status for c in record.cells if c.status not in ("pass", "fail"))
    if left:
        print(f"not counted: {sum(left.values())} cells whose values were not judged ({counts_text(left)})")
    return exitcodes.MISMATCH if any(r > 1 for r in worst.values()) else exitcodes.OK
