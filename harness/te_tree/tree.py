"""A TransformerEngine *source tree* to judge instead of the installed wheel.

A tree is a folder holding TE's ``transformer_engine/`` package at its root: a git checkout
of TE at any commit, an unpacked TE sdist, or a folder ``python -m harness patch-te`` made
from the installed wheel. ``--backend SPEC@TREE`` (or ``--te-tree TREE``) puts the tree first
on ``sys.path`` in the probe and in every rank (``harness.rank.loading.load_backend``) and names
it in :data:`ENV`, which ``te-cpu`` follows (its version check, its extension stand-in).

Where the version comes from (what TE's repository and its sdist contain): the repository
keeps it in ``build_tools/VERSION.txt`` (``build_tools/te_version.py`` reads it; the sdist's
``MANIFEST.in`` ships ``build_tools/*.txt``), an sdist also says it in ``PKG-INFO``; a tree
made from a wheel has what ``patch-te`` writes into ``build_tools/VERSION.txt``.

No torch import here: the parent process validates trees with it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from harness.vocabulary.errors import TreeError

#: the environment variable that names the tree to the backend inside a rank or the probe
ENV = "DW_TE_TREE"
#: what makes a folder a TE tree
MARKER = Path("transformer_engine", "pytorch", "__init__.py")
EXPECTED = "a TE source tree (git checkout or unpacked sdist) containing transformer_engine/pytorch"
#: where the version is read from, first found wins (relative to the tree's root)
VERSION_FILES = (Path("build_tools", "VERSION.txt"), Path("transformer_engine", "VERSION.txt"))
UNKNOWN = "unknown"
KINDS = ("git", "folder")


@dataclass(frozen=True)
class Tree:
    """A TE source tree as the run record shows it."""

    path: str  #: absolute path of the tree's root (the folder holding ``transformer_engine/``)
    commit: str | None  #: ``git rev-parse HEAD`` of the repository holding the tree; None without git
    #: tracked files differ from ``commit``, or files git does not ignore are untracked (a new
    #: module counts; Python's bytecode does not); None without git
    dirty: bool | None
    version: str  #: ``build_tools/VERSION.txt`` (or ``transformer_engine/VERSION.txt``, ``PKG-INFO``), else "unknown"
    kind: str  #: "git" or "folder"
    #: the tree's path inside its git repository when the repository's root is above it ("" at the root)
    subdir: str | None = None
    #: digest of the code under review: a git tree's uncommitted changes (diff and untracked
    #: files), a plain folder's every file; two runs judged the same code when commit and state agree
    state: str | None = None

    @property
    def package(self) -> Path:
        """The tree's ``transformer_engine`` folder."""
        return Path(self.path) / "transformer_engine"

    def contains(self, file: str | os.PathLike[str] | None) -> bool:
        """Whether ``file`` lies inside this tree (symlinks resolved)."""
        if not file:
            return False
        try:
            Path(file).resolve().relative_to(Path(self.path).resolve())
        except ValueError:
            return False
        return True

    def short(self) -> str:
        """``/path (2.20.2, git 1a2b3c4d, dirty)`` for one-line messages."""
        facts = [self.version]
        if self.commit:
            facts.append(f"git {self.commit[:10]}{', dirty' if self.dirty else ''}")
        return f"{self.path} ({', '.join(facts)})"

    def serialize(self) -> dict[str, Any]:
        return asdict(self)


def identity(tree: dict[str, Any] | None) -> dict[str, Any] | None:
    """What makes two recorded trees the same code: commit, dirty state, its digest, version.
    (Not the path: the same checkout may sit elsewhere on another CI machine.)"""
    if not tree:
        return None
    return {k: tree.get(k) for k in ("commit", "dirty", "state", "version")}


def describe(tree: dict[str, Any] | None) -> str:
    """One line naming a recorded tree: ``/path at 1a2b3c4d5e6f (dirty), version 2.20.2``; the
    tree's folder in its repository when that is not the root; ``(not a git checkout)``."""
    if not tree:
        return "the installed TE (no tree)"
    if tree.get("commit"):
        inside = f" in its repository's {tree['subdir']}/" if tree.get("subdir") else ""
        state = f" (dirty, state {tree['state']})" if tree.get("dirty") else ""
        at = f"{inside} at {tree['commit'][:12]}{state}"
    else:
        at = f" (not a git checkout{', state ' + tree['state'] if tree.get('state') else ''})"
    return f"{tree.get('path')}{at}, version {tree.get('version')}"


def read_version(root: Path) -> str:
    """The TE version a tree states (see the module docstring), else ``"unknown"``."""
    for rel in VERSION_FILES:
        try:
            text = (root / rel).read_text(errors="replace").strip()
        except OSError:
            continue
        if text:
            return text.splitlines()[0].strip()
    try:
        for line in (root / "PKG-INFO").read_text(errors="replace").splitlines():
            if line.startswith("Version:") and line.partition(":")[2].strip():
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return UNKNOWN


def _git(root: Path, *args: str) -> str | None:
    """``git -C root ARGS`` stdout, or None when git is missing or the command fails."""
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _repository_root(root: Path) -> Path | None:
    """The top level of the git work tree holding ``root`` (itself or a folder above), or None."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or not top.strip():
        return None
    try:
        return Path(top.strip()).resolve()
    except OSError:
        return None


def _bytecode(path: str) -> bool:
    """Python's caches, which importing a tree writes: never a change under review."""
    return "__pycache__/" in path or path.endswith((".pyc", ".pyo"))


def _git_state(root: Path) -> tuple[bool | None, str | None]:
    """Whether the tree at ``root`` differs from its commit, and a digest of how: the diff of
    tracked files and every untracked file git does not ignore (bytecode aside), limited to
    the tree's own folder."""
    diff = _git(root, "diff", "HEAD", "--binary", "--", ".")
    untracked = _git(root, "ls-files", "--others", "--exclude-standard", "-z", "--", ".")
    if diff is None or untracked is None:
        return None, None
    new = sorted(p for p in untracked.split("\0") if p and not _bytecode(p))
    if not diff and not new:
        return False, None
    h = hashlib.sha256(diff.encode())
    for rel in new:
        h.update(rel.encode() + b"\0")
        try:
            h.update(hashlib.sha256((root / rel).read_bytes()).digest())
        except OSError:
            pass
    return True, h.hexdigest()[:16]


def _folder_state(root: Path) -> str:
    """A digest of every file of a plain folder's ``transformer_engine`` package (and its
    version files): the only identity an unpacked sdist or a patched copy has."""
    h = hashlib.sha256()
    files = sorted(p for p in (root / "transformer_engine").rglob("*") if p.is_file())
    files += [root / rel for rel in VERSION_FILES + (Path("PKG-INFO"),) if (root / rel).is_file()]
    for p in files:
        rel = p.relative_to(root).as_posix()
        if _bytecode(rel):
            continue
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def inspect(path: str | os.PathLike[str]) -> Tree:
    """Validate ``path`` as a TE tree and say what it is.

    Raises:
        TreeError: one line when ``path`` is not a folder holding ``transformer_engine/pytorch``.
    """
    raw = str(path)
    root = Path(os.path.expanduser(raw))
    if not root.is_dir():
        raise TreeError(f"TE tree {raw!r} is not a folder: expected {EXPECTED}")
    root = root.resolve()
    if not (root / MARKER).is_file():
        hint = ""
        if (root / "pytorch" / "__init__.py").is_file() and (root / "__init__.py").is_file():
            hint = f" (this looks like the transformer_engine package itself: give its parent {str(root.parent)!r})"
        raise TreeError(f"{str(root)!r} has no {MARKER.as_posix()}: expected {EXPECTED}{hint}")
    version = read_version(root)
    top = _repository_root(root)
    commit = (_git(root, "rev-parse", "HEAD") or "").strip() or None if top is not None else None
    if commit is not None:
        dirty, state = _git_state(root)
        subdir = root.relative_to(top).as_posix() if root != top else ""
        return Tree(path=str(root), commit=commit, dirty=dirty, version=version, kind="git",
                    subdir=subdir or None, state=state)
    return Tree(path=str(root), commit=None, dirty=None, version=version, kind="folder", state=_folder_state(root))


def syntax_error(tree: Tree) -> str | None:
    """The first syntax error among the Python files of a git tree's ``transformer_engine``
    package that differ from its commit (changed or untracked), in one line; None when they
    compile, or when the tree is no git checkout (an unpacked sdist: the backend's import
    says).

    Why: a typo in a file under review otherwise shows only when the backend's probe imports
    TE, after torch (tens of seconds on a busy machine); compiling the few changed files takes
    milliseconds, where every file of TE's package would take seconds (5 MB of source).
    """
    if tree.kind != "git" or not tree.dirty:
        return None
    root = Path(tree.path)
    changed = _git(root, "diff", "HEAD", "--name-only", "--relative", "--diff-filter=d", "-z", "--",
                   "transformer_engine")
    untracked = _git(root, "ls-files", "--others", "--exclude-standard", "-z", "--", "transformer_engine")
    names = sorted({n for n in f"{changed or ''}\0{untracked or ''}".split("\0") if n.endswith(".py")})
    for rel in names:
        path = root / rel
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            return f"TE tree {tree.path!r} does not import: SyntaxError: {exc.msg} ({path}, line {exc.lineno})"
        except (OSError, ValueError) as exc:
            return f"TE tree {tree.path!r} does not import: {path}: {exc}"
    return None


def from_env() -> Tree | None:
    """The tree :data:`ENV` names in this process, None when it is unset or empty.

    Raises:
        TreeError: the variable names a folder that is not a TE tree.
    """
    value = os.environ.get(ENV, "")
    return inspect(value) if value else None


__all__ = ["ENV", "EXPECTED", "Tree", "TreeError", "describe", "identity", "inspect", "from_env", "read_version",
           "syntax_error"]
