"""Options shared by the commands that run cells (selection options: ``harness.vocabulary.selection``).

Every command's ``--help`` lists them in the same groups, in the order a user decides them:
the selection (which cells), then the backend and judging (what runs them, what is known),
then run control (where the run goes and how it is run). What is checked of them before the
command runs is ``harness.commands._inputs``.
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path

from harness.commands import _inputs
from harness.launcher.launch import CELL_TIMEOUT_HELP
from harness.records import runfolder
from harness.vocabulary.errors import UsageError


def add_backend(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The "backend and judging" group: ``--backend``, ``--te-tree``, ``--ledger``; returned so a
    command adds its own judging options to it."""
    g = parser.add_argument_group("backend and judging")
    g.add_argument("--backend", default="harness.backends.reference",
                   help="reference (the hook-safe reference, the default), prefix (the pre-fix behaviour), "
                        "te-cpu (TE's own code on CPU), te-cpu-tf32, transformer_engine.pytorch (real TE, on a GPU), "
                        "or any import path, module:attr or .py file; optionally @TREE")
    g.add_argument("--te-tree", metavar="PATH",
                   help="import TransformerEngine from this source tree (a git checkout, an unpacked "
                        "sdist, or a `patch-te` folder) instead of the installed one; the same as "
                        "--backend SPEC@PATH")
    g.add_argument("--ledger", default="auto", metavar="auto|none|FILE",
                   help="known-defects ledger: auto (the one shipped for the backend's upstream "
                        "package and version, if any), none, or a ledger file (default: auto)")
    return g


def add_run_control(parser: argparse.ArgumentParser, prefix: str = "run",
                    what: str = "run folder") -> argparse._ArgumentGroup:
    """The "run control" group: ``--out``, ``--force``, ``--cell-timeout``, ``--device``;
    returned so a command adds its own (``--resume``, ``--quiet``, ...) to it."""
    g = parser.add_argument_group("run control")
    add_out(parser, g, prefix, what)
    g.add_argument("--cell-timeout", type=float, default=None, metavar="SECONDS", help=CELL_TIMEOUT_HELP)
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA + NCCL when present, else CPU + gloo")
    return g


def add_out(parser: argparse.ArgumentParser, group: argparse._ActionsContainer, prefix: str,
            what: str = "run folder") -> None:
    """``--out DIR`` and ``--force``: a folder that holds a run, or anything else, is never
    silently written into. ``run_folder`` (the default folder's prefix) in the parser's
    defaults tells ``harness.commands._inputs.check`` that ``--out`` is a run folder."""
    group.add_argument("--out", type=Path, metavar="DIR",
                       help=f"{what} (default: runs/{prefix}-<timestamp>); a folder that already holds a run, "
                            "or other files, is refused unless --force")
    group.add_argument("--force", action="store_true",
                       help="with --out: replace the run the folder holds (its record, stream, reports and logs), "
                            "or write into a folder of other files")
    parser.set_defaults(run_folder=prefix)


def ledger_for(option: str, info) -> "Ledger | None":
    """The ledger a run uses (``harness.judging.ledger.choose``); a bad ledger file is bad input.

    Raises:
        UsageError: the file is unreadable or malformed.
    """
    from harness.judging import ledger as ledgers

    try:
        return ledgers.choose(option, info.upstream, info.version)
    except ledgers.LedgerError as exc:
        raise UsageError(str(exc)) from exc


def run_dir(args: argparse.Namespace, prefix: str = "run") -> Path:
    """The run folder, created and proven writable (bad input otherwise). Checked again here,
    after the probe, as ``_inputs.check`` checked it before: the folder may have changed since.

    Raises:
        UsageError: ``--out`` names a folder that already holds a run or other files and
            neither ``--force`` nor ``--resume`` says what to do with it; it cannot be written.
    """
    path = args.out or Path("runs") / f"{prefix}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"
    if args.out and not getattr(args, "resume", None):
        force = bool(getattr(args, "force", False))
        _inputs.out_folder(path, force, resume_hint=prefix == "run")
        if force and runfolder.holds_run(path):
            runfolder.clear(path)
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
