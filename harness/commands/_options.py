"""Options shared by the commands that run cells (selection options: ``harness.vocabulary.selection``)."""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path

from harness.launcher.launch import CELL_TIMEOUT_HELP
from harness.records import runfolder
from harness.vocabulary.errors import UsageError


def add_run(parser: argparse.ArgumentParser, prefix: str = "run") -> None:
    g = parser.add_argument_group("running")
    g.add_argument("--backend", default="harness.backends.reference",
                   help="reference (the hook-safe reference, the default), prefix (the pre-fix behaviour), "
                        "te-cpu (TE's own code on CPU), te-cpu-tf32, transformer_engine.pytorch (real TE), "
                        "or any import path, module:attr or .py file; optionally @TREE")
    g.add_argument("--te-tree", metavar="PATH",
                   help="import TransformerEngine from this source tree (a git checkout, an unpacked "
                        "sdist, or a `patch-te` folder) instead of the installed one; the same as "
                        "--backend SPEC@PATH")
    add_out(g, prefix)
    add_timeout_and_device(g)
    g.add_argument("--ledger", default="auto", metavar="auto|none|FILE",
                   help="known-defects ledger: auto (the one shipped for the backend's upstream "
                        "package and version, if any), none, or a ledger file (default: auto)")


def backend_spec(args: argparse.Namespace) -> str:
    """Fold ``--te-tree PATH`` (or a ``DW_TE_TREE`` set in the environment) into
    ``args.backend`` (``te-cpu@/abs/PATH``, the form the run record, the repro lines and
    ``--resume`` carry) and return it.

    Raises:
        UsageError: the folder is not a TE tree, the backend already names a tree, or
            ``--te-tree`` comes with ``--resume`` (a resumed run takes the recorded backend).
    """
    from harness.orchestration.preflight import spec_with_tree
    from harness.vocabulary.errors import BackendError

    tree = getattr(args, "te_tree", None)
    if tree and getattr(args, "resume", None):
        raise UsageError("--te-tree cannot be combined with --resume: a resumed run uses the backend "
                         "(and tree) it recorded")
    if getattr(args, "resume", None):
        return args.backend
    try:
        args.backend = spec_with_tree(args.backend, tree)
    except BackendError as exc:
        raise UsageError(str(exc)) from exc
    args.te_tree = None
    return args.backend


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


def check_timeout(seconds: float | None) -> float | None:
    """A cell timeout, when given, must be a positive number of seconds (0 or less would end
    every launch); None leaves each cell its bound from its predicted cost.

    Raises:
        UsageError: otherwise.
    """
    if seconds is not None and not seconds > 0:
        raise UsageError(f"--cell-timeout must be > 0 seconds, got --cell-timeout={seconds:g}")
    return seconds


def add_timeout_and_device(g: argparse._ActionsContainer) -> None:
    g.add_argument("--cell-timeout", type=float, default=None, metavar="SECONDS", help=CELL_TIMEOUT_HELP)
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA + NCCL when present, else CPU + gloo")


def add_out(g: argparse._ActionsContainer, prefix: str, what: str = "run folder") -> None:
    """``--out DIR`` and ``--force`` (a folder that holds a run is never silently replaced)."""
    g.add_argument("--out", type=Path, help=f"{what} (default: runs/{prefix}-<timestamp>); a folder that "
                   "already holds a run is refused unless --force")
    g.add_argument("--force", action="store_true",
                   help="with --out: replace the run the folder holds (its record, stream, reports and logs)")


def run_dir(args: argparse.Namespace, prefix: str = "run") -> Path:
    """The run folder, created and proven writable (bad input otherwise).

    Raises:
        UsageError: ``--out`` names a folder that already holds a run (a record or a result
            stream) and neither ``--force`` nor ``--resume`` says what to do with it.
    """
    path = args.out or Path("runs") / f"{prefix}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"
    if args.out and not getattr(args, "resume", None) and runfolder.holds_run(path):
        if not getattr(args, "force", False):
            resume = " continue it with `sweep --resume DIR`, or" if prefix == "run" else ""
            raise UsageError(f"--out {str(path)!r} already holds a run:{resume} choose another folder, or pass "
                             "--force to replace it")
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
