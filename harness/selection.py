"""Selecting cells from command-line options: shared by the CLI commands and the external
launcher mode (which runs under a user's own torchrun, without the CLI)."""

from __future__ import annotations

import argparse
from typing import Any

from harness import matrix
from harness.exitcodes import UsageError


def add_selection(parser: argparse.ArgumentParser) -> None:
    """``--preset``, one option per axis, ``--filter``."""
    g = parser.add_argument_group("selection")
    g.add_argument("--preset", default="ci", help=f"cell preset: {', '.join(matrix.PRESETS)} (default: ci)")
    for opt, axis in matrix.AXIS_OPTIONS.items():
        g.add_argument(opt, dest=f"axis_{axis}", metavar="V[,V...]", help=f"restrict axis {axis}")
    g.add_argument("--filter", dest="filter_expr", help='boolean expression over axes, e.g. '
                   '\'module == "linear" and world_size >= 2\'')


def overrides(args: argparse.Namespace) -> dict[str, tuple]:
    out = {}
    for axis in matrix.AXIS_NAMES:
        text = getattr(args, f"axis_{axis}", None)
        if text is not None:
            out[axis] = matrix.parse_values(axis, text)
    return out


def select(args: argparse.Namespace) -> tuple[list[matrix.Cell], dict[str, Any]]:
    """The selected cells and the selection as the run record stores it.

    Raises:
        UsageError: the selection is empty.
        MatrixError: an unknown preset, axis value or a malformed filter.
    """
    ov = overrides(args)
    cells = matrix.select(args.preset, ov, args.filter_expr)
    if not cells:
        raise UsageError(f"the selection is empty (preset={args.preset!r}, overrides={ov}, "
                         f"filter={args.filter_expr!r})")
    return cells, {"preset": args.preset, "overrides": {k: list(v) for k, v in ov.items()},
                   "filter": args.filter_expr}


def check_shardable(cells: list[matrix.Cell], out_features: int) -> None:
    """Every distributed cell's world size can shard ``out_features`` rows.

    Raises:
        UsageError: some world size would leave a rank with only padding rows.
    """
    from harness.gtp import shard_rows

    for ws in sorted({c.world_size for c in cells if c.weight == "distributed"}):
        try:
            shard_rows(out_features, ws)
        except ValueError as exc:
            raise UsageError(f"{exc}; choose smaller world sizes") from exc
