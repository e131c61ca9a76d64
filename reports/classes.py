"""Failure classes of a run: failing cells grouped by what failed, not by where.

A class is the set of failed checks (per-member and per-microbatch names folded:
``weight3.main_grad`` -> ``weight*.main_grad``) plus, for a cell that raised, the exception
type, its first line with numbers folded, and the innermost frame of the backend's package
in its traceback (e.g. ``transformer_engine/pytorch/module/grouped_linear.py:backward``).
Every failing cell of a run falls in exactly one class. A ``known`` cell (its failures all
explained by the known-defects ledger, CONTRACTS §7) still failed, so it is classed too, apart
from the unexplained failures and labelled with the entries that explain it: a class of known
cells shows what an entry really covers, and a class that mixes them with unexplained cells
would hide which is which. Pure function of the run record;
``python -m harness_reports.classes RUN_DIR`` prints the classes as a markdown table.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.records import recordfile

from ._common import BAD_STATUSES

_MEMBER = re.compile(r"^(weight|bias|mb)\d*\.")
_NUMBER = re.compile(r"\d+(\.\d+)?(e-?\d+)?")
_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\S+)')


@dataclass(frozen=True)
class Signature:
    """What a failing cell shows, with per-member and numeric detail folded away."""

    status: str
    checks: tuple[str, ...]
    exception: str | None = None
    raised_at: str | None = None
    #: the ledger entries that explain a ``known`` cell (empty for an unexplained failure)
    known: tuple[str, ...] = ()


@dataclass
class FailureClass:
    signature: Signature
    cells: list[str] = field(default_factory=list)
    #: how many of the class's cells have each axis value (to describe where it occurs)
    axes: dict[str, Counter] = field(default_factory=dict)


def _fold(name: str) -> str:
    return _MEMBER.sub(lambda m: f"{m.group(1)}*.", name)


def _raised_at(traceback: str, package: str) -> str | None:
    frames = [(f, fn) for f, fn in _FRAME.findall(traceback or "") if f"/{package}/" in f.replace("\\", "/")]
    if not frames:
        return None
    path, fn = frames[-1]
    path = path.replace("\\", "/")
    return f"{path[path.rindex('/' + package + '/') + 1:]}:{fn}"


def signature(cell: dict[str, Any], package: str = "transformer_engine") -> Signature:
    """The signature of one failing cell (union over its ranks)."""
    checks: set[str] = set()
    exception = raised_at = None
    for rank in cell.get("ranks") or []:
        for c in rank.get("comparisons") or []:
            if not c.get("ok") and c.get("name") != "exception":
                checks.add(_fold(c["name"]))
        err = rank.get("error")
        if err and exception is None:
            exception = f"{err.get('type')}: {_NUMBER.sub('#', err.get('message') or '')}"
            raised_at = _raised_at(err.get("traceback") or "", package)
    known = tuple(cell.get("known") or ()) if cell["status"] == "known" else ()
    return Signature(cell["status"], tuple(sorted(checks)), exception, raised_at, known)


def failure_classes(record: dict[str, Any], package: str = "transformer_engine") -> list[FailureClass]:
    """Every failing cell of ``record`` (bad or ``known``) in exactly one class, largest class first."""
    classes: dict[Signature, FailureClass] = {}
    for cell in record.get("cells") or []:
        if cell.get("status") not in BAD_STATUSES and cell.get("status") != "known":
            continue
        sig = signature(cell, package)
        fc = classes.setdefault(sig, FailureClass(sig))
        fc.cells.append(cell["id"])
        for axis, value in (cell.get("axes") or {}).items():
            fc.axes.setdefault(axis, Counter())[value] += 1
    return sorted(classes.values(), key=lambda c: (-len(c.cells), c.signature.checks, c.signature.known))


def _where(fc: FailureClass) -> str:
    """The axis values every cell of the class shares (what pins the class down)."""
    n = len(fc.cells)
    fixed = [f"{axis}={next(iter(cnt))}" for axis, cnt in fc.axes.items()
             if len(cnt) == 1 and axis not in ("num_gemms", "microbatches")]
    return ", ".join(fixed) or f"{n} cells"


def markdown(record: dict[str, Any], package: str = "transformer_engine") -> str:
    rows = ["| # | cells | status | failed checks | exception | raised at | common axes |",
            "|---:|---:|---|---|---|---|---|"]
    for i, fc in enumerate(failure_classes(record, package), 1):
        s = fc.signature
        status = f"{s.status} ({', '.join(s.known)})" if s.known else s.status
        rows.append(f"| {i} | {len(fc.cells)} | {status} | {', '.join(s.checks) or '—'} | "
                    f"{(s.exception or '—').replace('|', '/')} | {s.raised_at or '—'} | {_where(fc)} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness_reports.classes", description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder or its run record file")
    parser.add_argument("--package", default="transformer_engine",
                        help="whose frames locate an exception (default: transformer_engine)")
    parser.add_argument("--cells", action="store_true", help="also list each class's cells")
    args = parser.parse_args(argv)
    record = recordfile.read(args.run)
    print(markdown(record, args.package))
    if args.cells:
        for i, fc in enumerate(failure_classes(record, args.package), 1):
            print(f"\nclass {i}:")
            print("\n".join(f"  {c}" for c in fc.cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
