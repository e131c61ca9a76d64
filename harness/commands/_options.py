"""Options shared by the commands that select cells or run them."""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
from typing import Any

from harness import matrix
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
    from harness.gtp import shard_rows

    for ws in sorted({c.world_size for c in cells if c.weight == "distributed"}):
        try:
            shard_rows(out_features, ws)
        except ValueError as exc:
            raise UsageError(f"{exc}; choose smaller world sizes") from exc


def probe(args: argparse.Namespace) -> Any:
    """Validate ``--backend`` without importing it here, and settle ``--device`` for it.

    Returns the ``harness.backends.BackendInfo``; ``args.device`` becomes ``cpu`` for a
    backend that computes only on CPU (``te-cpu``) when ``auto`` was asked.

    Raises:
        BackendError: the backend cannot be imported by the ranks (one line, what to install).
        UsageError: ``--device cuda`` with a CPU-only backend.
    """
    from harness.backends import probe_backend

    info = probe_backend(args.backend)
    if info.device is not None and args.device != info.device:
        if args.device != "auto":
            raise UsageError(f"backend {args.backend!r} computes on {info.device} only: "
                             f"use --device {info.device} (or auto), not --device {args.device}")
        args.device = info.device
    return info
