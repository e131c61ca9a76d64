"""A TransformerEngine *source tree* to judge instead of the installed wheel.

A tree is a folder holding TE's ``transformer_engine/`` package at its root: a git checkout
of TE at any commit, an unpacked TE sdist, or a folder ``python -m harness patch-te`` made
from the installed wheel. ``--backend SPEC@TREE`` (or ``--te-tree TREE``) puts the tree first
on ``sys.path`` in the probe and in every rank (``harness.backends.load_backend``) and names
it in :data:`ENV`, which ``te-cpu`` follows (its version check, its extension stand-in).

Where the version comes from (what TE's repository and its sdist contain): the repository
keeps it in ``build_tools/VERSION.txt`` (``build_tools/te_version.py`` reads it; the sdist's
``MANIFEST.in`` ships ``build_tools/*.txt``), an sdist also says it in ``PKG-INFO``; a tree
made from a wheel has what ``patch-te`` writes into ``build_tools/VERSION.txt``.

No torch import here: the parent process validates trees with it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: the environment variable that names the tree to the backend inside a rank or the probe
ENV = "DW_TE_TREE"
#: what makes a folder a TE tree
MARKER = Path("transformer_engine", "pytorch", "__init__.py")
EXPECTED = "a TE source tree (git checkout or unpacked sdist) containing transformer_engine/pytorch"
#: where the version is read from, first found wins (relative to the tree's root)
VERSION_FILES = (Path("build_tools", "VERSION.txt"), Path("transformer_engine", "VERSION.txt"))
UNKNOWN = "unknown"
KINDS = ("git", "folder")


class TreeError(ValueError):
    """The folder is not a usable TE tree (one line, says what was expected)."""


@dataclass(frozen=True)
class Tree:
    """A TE source tree as the run record shows it."""

    path: str  #: absolute path of the tree's root (the folder holding ``transformer_engine/``)
    commit: str | None  #: ``git rev-parse HEAD``; None when the tree is not a git checkout
    dirty: bool | None  #: tracked files differ from ``commit`` (untracked ones do not count); None without git
    version: str  #: ``build_tools/VERSION.txt`` (or ``transformer_engine/VERSION.txt``, ``PKG-INFO``), else "unknown"
    kind: str  #: "git" or "folder"

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


def _is_checkout_root(root: Path) -> bool:
    """The tree is a git work tree's top level (not a folder inside some other repository)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or not top.strip():
        return False
    try:
        return Path(top.strip()).resolve() == root.resolve()
    except OSError:
        return False


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
    if _is_checkout_root(root):
        commit = (_git(root, "rev-parse", "HEAD") or "").strip() or None
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
        dirty = bool(status.strip()) if status is not None else None
        return Tree(path=str(root), commit=commit, dirty=dirty, version=version, kind="git")
    return Tree(path=str(root), commit=None, dirty=None, version=version, kind="folder")


def from_env() -> Tree | None:
    """The tree :data:`ENV` names in this process, None when it is unset or empty.

    Raises:
        TreeError: the variable names a folder that is not a TE tree.
    """
    value = os.environ.get(ENV, "")
    return inspect(value) if value else None


__all__ = ["ENV", "EXPECTED", "Tree", "TreeError", "inspect", "from_env", "read_version"]
