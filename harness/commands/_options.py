"""Options shared by the commands that select cells or run them."""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
from typing import Any

from harness import matrix, weights
from harness.exitcodes import UsageError


def add_selection(parser: argparse.ArgumentParser) -> None:
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
    ov = overrides(args)
    cells = matrix.select(args.preset, ov, args.filter_expr)
    if not cells:
        raise UsageError(f"the selection is empty (preset={args.preset!r}, overrides={ov}, "
                         f"filter={args.filter_expr!r})")
    why = weights.unavailable({c.weight for c in cells})
    if why is not None:
        raise UsageError(why)
    return cells, {"preset": args.preset, "overrides": {k: list(v) for k, v in ov.items()},
                   "filter": args.filter_expr}


def add_run(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("running")
    g.add_argument("--backend", default="harness.reference",
                   help="import path, module:attr, or a .py file (default: harness.reference)")
    g.add_argument("--out", type=Path, help="run folder (default: runs/<timestamp>)")
    g.add_argument("--cell-timeout", type=float, default=120.0, help="seconds a cell may take (default 120)")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA + NCCL when present, else CPU + gloo")


def run_dir(args: argparse.Namespace, prefix: str = "run") -> Path:
    """The run folder, created and proven writable (bad input otherwise)."""
    path = args.out or Path("runs") / f"{prefix}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"output directory {str(path)!r} is not writable: {exc.strerror or exc}") from exc
    if not os.access(path, os.W_OK):
        raise UsageError(f"output directory {str(path)!r} is not writable")
    return path


def check_shardable(cells: list[matrix.Cell], out_features: int) -> None:
    from harness.weights import KINDS, shard_rows

    for weight, ws in sorted({(c.weight, c.world_size) for c in cells if c.distributed}):
        try:
            shard_rows(out_features, ws, KINDS[weight].pad_multiple)
        except ValueError as exc:
            raise UsageError(f"weight {weight}: {exc}; choose smaller world sizes") from exc
