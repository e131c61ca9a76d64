"""``list``: what a selection expands to, with counts (``--json`` for machines); with
``--backend``, what that backend's ledger expects of each cell."""

from __future__ import annotations

import argparse
import json
from collections import Counter

from harness.vocabulary import errors as exitcodes, matrix, selection, shape
from harness.orchestration import preflight
from harness.vocabulary.backend_specs import BackendError
from harness.commands import _options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="print the cells a selection expands to")
    selection.add_selection(p)
    g = p.add_argument_group("backend and judging (optional): what a backend is expected to do")
    g.add_argument("--backend", help="also name, per cell, the known-defects ledger entries of this backend that "
                   "select it (te-cpu: TE 2.20's); the backend is imported in a subprocess, as sweep does")
    g.add_argument("--te-tree", metavar="PATH", help="as sweep's: the backend imports TE from this tree")
    g.add_argument("--ledger", default="auto", metavar="auto|none|FILE", help="as sweep's (default: auto)")
    p.add_argument_group("output").add_argument("--json", action="store_true", help="print the cells as JSON")
    p.set_defaults(func=run)


def _expected(args: argparse.Namespace, cells: list[matrix.Cell]) -> dict[str, list[str]] | None:
    """Cell id -> the ledger entries selecting it, for ``--backend`` (None without it)."""
    if args.backend is None:  # --te-tree and --ledger FILE without it: refused by _inputs.backend_needed
        return None
    try:
        info = preflight.check_backend(args.backend)
    except BackendError as exc:
        raise exitcodes.UsageError(str(exc)) from exc
    preflight.check_modules(info, {c.module for c in cells})
    ledger = _options.ledger_for(args.ledger, info)
    entries = ledger.entries if ledger else ()
    print(f"backend {args.backend}: {f'ledger {ledger.path}' if ledger else 'no ledger'}")
    return {c.id: [e.id for e in entries if e.selects(c.serialize())] for c in cells}


def _dims(cell: matrix.Cell) -> dict[str, object]:
    """The shapes ``cell`` runs with (its example fitted: ``shape.fitted``), the fewest rows a
    group with rows gets, and the blocks every quantized operand of every GEMM spans along each
    dimension it is blocked along under the cell's recipe (``shape.operand_blocks``; empty
    without blocks), with the rule's verdict (``shape.spans``: at least two along each)."""
    e = shape.fitted(shape.Example(), cell.module, cell.bias, cell.recipe, cell.num_gemms, cell.shape)
    rows = shape.smallest_group_rows(e, cell.recipe, cell.num_gemms, cell.shape, cell.module)
    return {"dims": {"in_features": e.in_features, "out_features": e.out_features, "rows": e.rows,
                     "group_rows_min": rows},
            "operand_blocks": shape.operand_blocks(cell.recipe, e.in_features, e.out_features, rows),
            "spans_blocks": shape.spans(cell.recipe, e.in_features, e.out_features, rows)}


def run(args: argparse.Namespace) -> int:
    cells, _ = selection.select(args)
    expected = _expected(args, cells)
    if args.json:
        print(json.dumps([{"id": c.id, "expect": c.expect, **c.serialize(), **_dims(c),
                           **({"ledger_entries": expected[c.id]} if expected is not None else {})} for c in cells],
                         indent=1))
        return 0
    for c in cells:
        notes = ["expected error"] * (c.expect == "error")
        if expected is not None and expected[c.id]:
            notes.append(f"may be known: {', '.join(expected[c.id])}")
        print(c.id + (f"  [{'; '.join(notes)}]" if notes else ""))
    print()
    print(matrix.describe(cells))
    if expected is not None:
        per = Counter(i for ids in expected.values() for i in ids)
        print(f"\n{sum(bool(ids) for ids in expected.values())} of {len(cells)} cell(s) are selected by a ledger "
              "entry (known there when they fail exactly its way):")
        for entry_id, n in per.most_common():
            print(f"  {n:5}  {entry_id}")
    return 0
