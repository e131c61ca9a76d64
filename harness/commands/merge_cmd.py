"""``merge RUN_DIR...``: join the run folders of ``sweep --shard K/N`` into one run record."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.commands import _options, _outcome
from harness.orchestration.merge import merge


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("merge", help="join the run folders of a sharded sweep (sweep --shard K/N) "
                       "into one run record and its reports")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR", help="the shards' run folders, all N")
    _options.add_out(p, p.add_argument_group("run control"), "merged", "run folder of the merged record")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    record = merge(args.runs, args.argv)  # refuses (exit 2) before anything is written
    run_dir = _options.run_dir(args, prefix="merged")
    path = record.write(run_dir)
    paths = _outcome.write_reports(record, run_dir)
    return _outcome.conclude(record, f"run record: {path} ({record.selection['merged_shards']} shards, "
                             f"{record.status})", paths)
