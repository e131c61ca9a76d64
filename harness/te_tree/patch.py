"""The project's fix as a TE source tree: the installed wheel's (or a checkout's)
``transformer_engine/`` copied into a git repository of its own and the shipped patch
(``patches/transformer_engine-2.20.2-dw-fix.patch``) applied and committed - what ``patch-te``
makes, and what the self-test judges TE's own code against (torch-free: files and git)."""

from __future__ import annotations

import compileall
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.te_tree import tree as te_tree
from harness.vocabulary.errors import TreeError, UsageError

#: the fix shipped with the harness (written against TE 2.20.2's layout: a/transformer_engine/...)
PATCH = Path(__file__).resolve().parent / "patches" / "transformer_engine-2.20.2-dw-fix.patch"
DISTRIBUTION = "transformer_engine"
FIX_MESSAGE = "dw-harness: hook-safe DistributedWeight fix"
#: what git must not track in OUT: bytecode, and what ``git apply --reject`` leaves behind
GITIGNORE = "__pycache__/\n*.pyc\n*.rej\n*.orig\n"
_GIT_IDENTITY = ("-c", "user.name=dw-harness", "-c", "user.email=dw-harness@localhost",
                 "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false")


@dataclass
class Hunk:
    file: str
    header: str  #: the ``@@ -a,b +c,d @@ context`` line


@dataclass
class Outcome:
    """What ``git apply --reject`` did with a patch."""

    hunks: list[Hunk] = field(default_factory=list)  #: every hunk of the patch
    rejected: list[Hunk] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)  #: file -> git's reason, for files not applied at all


def parse_patch(text: str) -> list[Hunk]:
    """The hunks of a unified diff (``diff --git`` or plain ``---``/``+++`` headers), each
    with the path it patches (as ``git apply`` resolves it: ``b/`` stripped)."""
    hunks: list[Hunk] = []
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(.+) b/(.+)$", line)
            current = m.group(2) if m else None
        elif line.startswith("+++ "):
            target = line[4:].split("\t")[0].strip()
            if target != "/dev/null":
                current = target[2:] if target.startswith("b/") else target
        elif line.startswith("--- ") and current is None:
            source = line[4:].split("\t")[0].strip()
            current = source[2:] if source.startswith("a/") else source
        elif line.startswith("@@") and current is not None:
            hunks.append(Hunk(current, line.rstrip()))
    return hunks


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", *_GIT_IDENTITY, *args], cwd=cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {(proc.stderr or proc.stdout).strip()}")
    return proc


def apply_patch(repo: Path, patch: Path) -> Outcome:
    """``git apply --reject PATCH`` in ``repo``; which hunks did not apply, read from the
    ``.rej`` files git leaves and from the files git could not patch at all."""
    hunks = parse_patch(patch.read_text(errors="replace"))
    proc = _git(repo, "apply", "--reject", "--whitespace=nowarn", str(patch.resolve()), check=False)
    log = proc.stderr + proc.stdout
    touched = set(re.findall(r"^Applied patch (.+?) cleanly\.$", log, re.M))
    touched |= set(re.findall(r"^Applying patch (.+?) with \d+ rejects?\.\.\.$", log, re.M))
    outcome = Outcome(hunks=hunks)
    for file in dict.fromkeys(h.file for h in hunks):
        mine = [h for h in hunks if h.file == file]
        if file not in touched:  # git patched nothing of this file (missing, already exists, ...)
            reason = re.search(rf"^error: {re.escape(file)}: (.+)$", log, re.M)
            outcome.why[file] = reason.group(1) if reason else "not applied"
            outcome.rejected.extend(mine)
            continue
        rej = repo / f"{file}.rej"
        if rej.is_file():
            headers = [ln.rstrip() for ln in rej.read_text(errors="replace").splitlines() if ln.startswith("@@")]
            outcome.rejected.extend(Hunk(file, h) for h in headers)
    if proc.returncode != 0 and not outcome.rejected:  # git refused the patch as a whole
        last = log.strip().splitlines()[-1] if log.strip() else f"exit code {proc.returncode}"
        outcome.rejected = list(hunks)
        outcome.why = {h.file: last for h in hunks}
    return outcome


def _installed_package() -> tuple[Path, str]:
    """The installed wheel's ``transformer_engine/`` folder and version, without importing it.

    Raises:
        UsageError: TransformerEngine is not installed.
    """
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise UsageError("TransformerEngine is not installed: run `python -m harness install te`, "
                                   "or give --from TREE") from exc
    located = Path(str(dist.locate_file("transformer_engine")))
    if not (located / "pytorch" / "__init__.py").is_file():
        spec = importlib.util.find_spec("transformer_engine")
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        located = Path(locations[0]) if locations else located
    if not (located / "pytorch" / "__init__.py").is_file():
        raise UsageError(f"the installed transformer_engine {dist.version} has no pytorch package "
                                   f"at {located}")
    return located.resolve(), dist.version


def _copy_package(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo"), symlinks=True)


def _byte_compile(package: Path) -> None:
    """Byte-compile the tree's package once, as installing a wheel does (the ``__pycache__``
    folders are ignored by git, so the tree stays clean): otherwise every process that imports
    TE from the tree - each rank of each launch - compiles it again wherever Python may not
    write its caches (``PYTHONDONTWRITEBYTECODE``, common in containers): about 1.4 s of CPU
    per process measured for TE 2.20."""
    compileall.compile_dir(str(package), quiet=1)


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{str(out)!r} already exists and is not empty: give a new folder")


def make(out: Path, source: str | None = None, patch: Path | None = None,
         say: Callable[[str], None] = lambda line: None) -> tuple[Outcome, str]:
    """A patched tree in ``out`` (new or empty): ``source`` (a TE tree) or the installed wheel's
    package, committed, then ``patch`` (default: the shipped fix) applied and committed.

    Returns:
        What ``git apply`` did, and the tree's commit.

    Raises:
        UsageError: ``out`` is not new or empty, no patch, no git, no TE.
    """
    out = out.expanduser()
    _check_out(out)
    patch = (patch or PATCH).expanduser()
    if not patch.is_file():
        raise UsageError(f"patch file {str(patch)!r} does not exist")
    if not parse_patch(patch.read_text(errors="replace")):
        raise UsageError(f"patch file {str(patch)!r} has no hunk (not a unified diff?)")
    if shutil.which("git") is None:
        raise UsageError("patch-te needs git on PATH")
    if source:
        try:
            found = te_tree.inspect(source)
        except TreeError as exc:
            raise UsageError(f"--from: {exc}") from exc
        package, version = found.package, found.version
        where = f"from {found.path}" + (f" at {found.commit[:12]}" if found.commit else "")
        base_message = f"transformer-engine {version} {where}"
    else:
        package, version = _installed_package()
        base_message = f"transformer-engine {version} as installed"
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    _copy_package(package, out / "transformer_engine")
    (out / "build_tools").mkdir()
    (out / "build_tools" / "VERSION.txt").write_text(version + "\n")
    (out / ".gitignore").write_text(GITIGNORE)
    _git(out, "init", "-q")
    _git(out, "add", "-A")
    _git(out, "commit", "-q", "--no-verify", "-m", base_message)
    say(f"patch-te: {out}: {base_message} ({len(list((out / 'transformer_engine').rglob('*.py')))} Python files)")
    outcome = apply_patch(out, patch)
    if len(outcome.hunks) > len(outcome.rejected):
        _git(out, "add", "-A")
        message = FIX_MESSAGE if not outcome.rejected else (
            f"{FIX_MESSAGE} (partial: {len(outcome.rejected)} of {len(outcome.hunks)} hunks rejected)")
        _git(out, "commit", "-q", "--no-verify", "-m", message, "-m", f"patch: {patch.name}")
    commit = _git(out, "rev-parse", "HEAD").stdout.strip()
    _byte_compile(out / "transformer_engine")
    return outcome, commit
