"""``ledger``: the known-defects ledgers (CONTRACTS §7).

``ledger list`` shows the shipped ledgers (or one file) and their entries; ``ledger check
FILE`` validates a ledger file; ``ledger report ENTRY --run RUN_DIR`` writes an
upstream-ready markdown bug report of an entry from a run that reproduced it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.vocabulary import errors as exitcodes
from harness.judging import ledger as ledgers
from harness.records.record import load


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ledger", help="known-defects ledgers: list, check, write an upstream report")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("list", help="the shipped ledgers (or FILE) and their entries")
    ls.add_argument("file", nargs="?", type=Path, help="a ledger file (default: every shipped one)")
    ls.set_defaults(func=run_list)
    ck = verbs.add_parser("check", help="validate a ledger file (exit 2 with the reason if it is malformed)")
    ck.add_argument("file", type=Path)
    ck.set_defaults(func=run_check)
    rp = verbs.add_parser("report", help="an upstream-ready markdown bug report of one entry")
    rp.add_argument("entry", help="the entry id")
    rp.add_argument("--run", type=Path, required=True, metavar="RUN_DIR",
                    help="a run folder whose sweep judged under the ledger (its cells are the evidence)")
    rp.add_argument("--out", dest="out_file", type=Path, metavar="FILE",
                    help="write the report here (default: standard output)")
    rp.set_defaults(func=run_report)


def _load(path: Path) -> ledgers.Ledger:
    try:
        return ledgers.load(path)
    except ledgers.LedgerError as exc:
        raise exitcodes.UsageError(str(exc)) from exc


def run_list(args: argparse.Namespace) -> int:
    if args.file:
        found = [_load(args.file)]
    else:
        try:
            found = ledgers.shipped()
        except ledgers.LedgerError as exc:
            raise exitcodes.UsageError(str(exc)) from exc
    for led in found:
        print(f"{led.path}: {led.package or 'any package'} {led.versions or ''} ({len(led.entries)} entries)")
        for e in led.entries:
            print(f"  {e.id:46} {e.kind:10} {e.upstream:20} {e.title}")
    return exitcodes.OK


def run_check(args: argparse.Namespace) -> int:
    led = _load(args.file)
    print(f"{led.path}: ok, {len(led.entries)} entries")
    return exitcodes.OK


def run_report(args: argparse.Namespace) -> int:
    from harness_reports import upstream

    try:
        record = load(args.run)
    except (OSError, ValueError) as exc:
        raise exitcodes.UsageError(f"cannot read run record {str(args.run)!r}: {exc}") from exc
    try:
        text = upstream.render(record.serialize(), args.entry)
    except KeyError as exc:
        raise exitcodes.UsageError(exc.args[0]) from exc
    except upstream.NoEvidence as exc:
        raise exitcodes.UsageError(str(exc)) from exc
    if args.out_file:
        args.out_file.write_text(text)
        print(f"report: {args.out_file}", file=sys.stderr)
    else:
        print(text, end="")
    return exitcodes.OK
