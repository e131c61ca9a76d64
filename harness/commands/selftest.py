"""``selftest``: the clean reference and every planted mutant over a preset."""

from __future__ import annotations

import argparse

from harness.commands import _options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selftest", help="prove the harness kills every known fault class")
    _options.add_selection(p)
    p.add_argument("--out", help="run folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError("selftest is not implemented yet")
