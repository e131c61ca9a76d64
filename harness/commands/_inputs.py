"""Every path, file and value a command line names, checked before anything slow (exit 2).

Why first, and here: a command's slow steps - the backend's probe (a subprocess that imports
torch and the backend: seconds, tens of seconds on a busy machine), a large preset's matrix,
a launch - must never be what tells a user that ``--out`` is a file, that ``--ledger`` names
nothing or that the TE tree does not compile. ``harness.cli.main`` calls :func:`check` on the
parsed options of every command before the command runs, so each command that takes an
option gets the same check (one implementation). A check reads the file system (and, for a TE
tree, git); it imports neither torch nor a backend and creates nothing, so a refused command
leaves no folder behind.
"""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path

from harness.judging import ledger as ledgers
from harness.judging import review as reviews
from harness.orchestration import preflight
from harness.records import runfolder
from harness.te_tree import tree as te_tree
from harness.vocabulary import backend_specs
from harness.vocabulary.backend_specs import BackendError, split_tree
from harness.vocabulary.errors import UsageError

#: namespace attribute -> option, for the options that name one file a command writes
OUTPUT_FILES = {"out_file": "--out", "html": "--html"}
#: namespace attribute -> option, for the options that name a folder a command writes reports into
OUTPUT_FOLDERS = {"to": "--to"}
#: the values of ``--ledger`` that are not files
LEDGER_WORDS = ("auto", "none")
#: the default parent of a run folder (``runs/<prefix>-<timestamp>``)
RUNS = Path("runs")


def check(args: argparse.Namespace) -> None:
    """Every check below that the command's options call for, in the order a user fixes them.

    A command that writes a run folder says so with ``run_folder`` (its prefix) in its
    parser's defaults (``harness.commands._options.add_out``).

    Raises:
        UsageError: the first bad input, in one line.
    """
    force_needs_out(args)
    if getattr(args, "run_folder", None) is not None:
        run_folder(args)
    for dest, option in OUTPUT_FILES.items():
        if getattr(args, dest, None) is not None:
            output_file(option, getattr(args, dest))
    for dest, option in OUTPUT_FOLDERS.items():
        if getattr(args, dest, None) is not None:
            output_folder(option, getattr(args, dest))
    if getattr(args, "cell_timeout", None) is not None:
        check_timeout(args.cell_timeout)
    if hasattr(args, "backend"):
        backend_needed(args)
        fixes_in_ledger(getattr(args, "fixes", None), ledger_file(getattr(args, "ledger", None)))
        if args.backend is not None:
            backend(args)
    if hasattr(args, "device"):
        gpu(args)


def force_needs_out(args: argparse.Namespace) -> None:
    """``--force`` replaces what ``--out DIR`` holds; without ``--out`` it would replace nothing
    and be silently ignored, which hides a typo in the command line.

    Raises:
        UsageError: ``--force`` without ``--out``.
    """
    if getattr(args, "force", False) and getattr(args, "out", None) is None:
        raise UsageError("--force replaces what --out DIR holds: without --out it does nothing; "
                         "name the folder with --out, or drop --force")


def run_folder(args: argparse.Namespace) -> None:
    """The run folder a command will write: ``--out DIR``, or the default under ``runs/``.

    A resumed sweep writes into the folder it resumes (read, and refused when it holds no
    record, by the command itself: it is fast), so ``--out`` beside ``--resume`` would be
    silently dropped.

    Raises:
        UsageError: ``--out`` with ``--resume``, or any refusal of :func:`out_folder`; the
            default's parent not writable.
    """
    if getattr(args, "resume", None) is not None:
        if args.out is not None:
            raise UsageError(f"--out cannot be combined with --resume: a resumed run continues in its own folder "
                             f"({str(args.resume)!r}); drop --out")
        return
    if args.out is None:
        problem = unwritable(RUNS)
        if problem:
            raise UsageError(f"the default run folder goes under {str(RUNS)!r}, which is not writable: {problem}; "
                             "choose another with --out DIR")
        return
    out_folder(args.out, bool(getattr(args, "force", False)), resume_hint=args.run_folder == "run")


def out_folder(path: Path, force: bool, resume_hint: bool = False) -> None:
    """``--out DIR`` as a run folder: a folder (or one that can be made) that this user may
    write, and nothing of anyone's is replaced without ``--force``: a folder that holds a run
    (its record or result stream) or any other file. A run writes ``summary.md``,
    ``report.html``, ``junit.xml``, ``logs/``, ... into its folder; in a folder of the user's
    own files those names would replace theirs.

    Raises:
        UsageError: a file, not writable, or (without ``force``) not empty.
    """
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {str(path)!r} is a file, not a folder: choose a folder")
    problem = unwritable(path)
    if problem:
        raise UsageError(f"--out {str(path)!r} is not writable: {problem}")
    if force or not path.is_dir():
        return
    if runfolder.holds_run(path):
        resume = " continue it with `sweep --resume DIR`, or" if resume_hint else ""
        raise UsageError(f"--out {str(path)!r} already holds a run:{resume} choose another folder, or pass "
                         "--force to replace it")
    others = sorted(p.name for p in path.iterdir())
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise UsageError(f"--out {str(path)!r} holds no run but other files ({shown}), which a run's "
                         "record, reports and logs could replace: choose a new or empty folder, or pass --force "
                         "to write into it")


def output_file(option: str, path: Path) -> None:
    """A file a command writes (``ledger report --out``, ``diff --html``): not a folder, in a
    folder this user may write.

    Raises:
        UsageError: otherwise.
    """
    if path.is_dir():
        raise UsageError(f"{option} {str(path)!r} is a folder, not a file: name the file to write")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{option} {str(path)!r} is not writable: the file is read-only for this user")
    problem = unwritable(path.parent)
    if problem:
        raise UsageError(f"{option} {str(path)!r} is not writable: {problem}")


def output_folder(option: str, path: Path) -> None:
    """A folder a command writes reports into (``report --to``): a folder, or one that can be
    made, that this user may write.

    Raises:
        UsageError: otherwise.
    """
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {str(path)!r} is a file, not a folder: choose a folder")
    problem = unwritable(path)
    if problem:
        raise UsageError(f"{option} {str(path)!r} is not writable: {problem}")


def unwritable(path: Path) -> str | None:
    """Why a folder cannot be written, or made, at ``path`` (None: it can, as far as the file
    system's permissions tell; the command's own write of a probe file stays the last word).
    Nothing is created: the nearest existing folder on the way is what is asked."""
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if existing.is_symlink() and not existing.exists():
        return f"{str(existing)!r} is a link to nothing"
    if not existing.is_dir():
        return f"{str(existing)!r} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{'it' if existing == path else repr(str(existing))} is read-only for this user"
    return None


def check_timeout(seconds: float) -> float:
    """A cell timeout must be a positive number of seconds (0 or less would end every launch).

    Raises:
        UsageError: otherwise.
    """
    if not seconds > 0:
        raise UsageError(f"--cell-timeout must be > 0 seconds, got --cell-timeout={seconds:g}")
    return seconds


def backend_needed(args: argparse.Namespace) -> None:
    """``--te-tree`` and a ledger file only mean something for a backend: where ``--backend``
    is optional (``list``) and absent, they would be silently ignored.

    Raises:
        UsageError: naming the option that needs ``--backend``.
    """
    if args.backend is not None:
        return
    if getattr(args, "te_tree", None):
        raise UsageError("--te-tree needs --backend (te-cpu or transformer_engine.pytorch)")
    if getattr(args, "ledger", "auto") not in (None, "auto"):
        raise UsageError("--ledger needs --backend: the ledger judges that backend's cells")


def ledger_file(option: str | None) -> ledgers.Ledger | None:
    """``--ledger FILE`` read and validated now (``harness.judging.ledger.load``), not after the
    probe, and returned; ``auto`` and ``none`` depend on the backend and wait for it (None).

    Raises:
        UsageError: the file is unreadable, empty or malformed (with a did-you-mean when the
            value looks like a mistyped ``auto`` or ``none``).
    """
    if option is None or option in LEDGER_WORDS:
        return None
    try:
        return ledgers.load(option)
    except ledgers.LedgerError as exc:
        near = difflib.get_close_matches(option, LEDGER_WORDS, n=1) if not Path(option).exists() else []
        raise UsageError(str(exc) + (f" - did you mean --ledger {near[0]}?" if near else "")) from exc


def fixes_in_ledger(fixes: str | None, ledger: ledgers.Ledger | None) -> None:
    """``--fixes`` against the ledger of a ``--ledger FILE`` (:func:`ledger_file`'s): each
    pattern names an entry of it, as the sweep would find after its probe. With ``auto`` the
    ledger depends on the backend (None here), and the sweep checks then.

    Raises:
        UsageError: the sweep's own line (``review.required_entries``), did-you-mean included.
    """
    if fixes is None or ledger is None:
        return
    try:
        reviews.required_entries([p for p in fixes.split(",") if p], ledger)
    except reviews.ReviewError as exc:
        raise UsageError(str(exc)) from exc


def backend_spec(args: argparse.Namespace) -> str:
    """Fold ``--te-tree PATH`` (or a ``DW_TE_TREE`` set in the environment) into
    ``args.backend`` (``te-cpu@/abs/PATH``, the form the run record, the repro lines and
    ``--resume`` carry) and return it. Idempotent: a spec that names a tree keeps it.

    Raises:
        UsageError: the folder is not a TE tree, the backend already names a tree, or
            ``--te-tree`` comes with ``--resume`` (a resumed run takes the recorded backend).
    """
    tree = getattr(args, "te_tree", None)
    if tree and getattr(args, "resume", None):
        raise UsageError("--te-tree cannot be combined with --resume: a resumed run uses the backend "
                         "(and tree) it recorded")
    if getattr(args, "resume", None):
        return args.backend
    try:
        args.backend = preflight.spec_with_tree(args.backend, tree)
    except BackendError as exc:
        raise UsageError(str(exc)) from exc
    args.te_tree = None
    return args.backend


def backend(args: argparse.Namespace) -> None:
    """What can be told of ``--backend`` without importing it: its TE tree (a folder holding
    TE, whose changed files compile), its ``.py`` file, and that its package is there
    (``backend_specs.unfound``: a mistyped name, with a did-you-mean). The rest (does it import, what it
    has) is the probe's; a resumed run's backend is the one it recorded, checked by the command.

    Raises:
        UsageError: in one line, with the way out.
    """
    spec = backend_spec(args)
    if getattr(args, "resume", None):
        return
    base, tree = split_tree(spec)
    if tree is not None:
        try:
            found = te_tree.inspect(tree)
        except te_tree.TreeError as exc:
            raise UsageError(f"--te-tree: {exc}") from exc
        broken = te_tree.syntax_error(found)
        if broken:
            raise UsageError(f"--te-tree: {broken}")
    if base.endswith(".py") and not Path(base).is_file():
        raise UsageError(f"backend file {base!r} does not exist")
    unfound = backend_specs.unfound(spec)
    if unfound is not None:
        raise UsageError(unfound)


def gpu(args: argparse.Namespace) -> None:
    """A command that runs cells on real TE (a GPU-only backend) or with ``--device cuda`` on a
    machine that has no GPU at all (``harness.orchestration.preflight.gpu_absence``): refused
    now, with the way out (``te-cpu``, ``--device cpu``), not after the probe. ``list``
    (which takes no ``--device``) may name real TE anywhere: it plans, it runs nothing.

    Raises:
        UsageError: in one line.
    """
    spec = "" if getattr(args, "resume", None) else (getattr(args, "backend", None) or "")
    preflight.check_gpu_backend(spec, args.device, preflight.gpu_absence())
