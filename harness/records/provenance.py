"""What code a run judged: the backend, its upstream version, the TE tree and where the
compiled part came from, read from a run record (no torch; the CLI, ``merge`` and the
reports share it).

Two records judged the same code when these agree. ``sweep --resume`` and ``merge`` refuse
to join verdicts of different code into one record: a record names one commit, so a verdict
of another commit (or another dirty state of the same checkout, or another TE version)
inside it would misstate what was judged.

The compiled part (``compiled``, recorded by the backend probe): TE's Python calls a
compiled extension, ``transformer_engine_torch``. Under ``te-cpu`` that is the harness's CPU
layer; real TE imports a build. A tree judged with a build from another install runs the
tree's Python with someone else's C++: its C++ changes were never run, and every report says so.
"""

from __future__ import annotations

from typing import Any

from harness.te_tree import tree as te_tree

#: where ``transformer_engine_torch`` came from (``BackendInfo.extra["compiled"]["kind"]``)
COMPILED_TE_CPU, COMPILED_TREE, COMPILED_OTHER, COMPILED_INSTALLED = "te-cpu", "tree", "other", "installed"


def backend_info(record: dict[str, Any]) -> dict[str, Any]:
    """The backend probe's facts as the record stores them (``{}`` when it has none)."""
    return (record.get("environment") or {}).get("backend_info") or {}


def tree(record: dict[str, Any]) -> dict[str, Any] | None:
    """The TE tree the run judged (``harness.te_tree.tree.Tree`` as recorded), None: none."""
    return (backend_info(record).get("extra") or {}).get("te_tree")


def compiled(record: dict[str, Any]) -> dict[str, Any] | None:
    """Where the run's ``transformer_engine_torch`` came from (``{"kind", "path"}``), None: unknown."""
    return (backend_info(record).get("extra") or {}).get("compiled")


def compiled_text(record: dict[str, Any]) -> str | None:
    """Where the compiled part of a run that imported TE came from (None otherwise)."""
    c = compiled(record)
    if not c:
        return None
    kind, path = c.get("kind"), c.get("path")
    if kind == COMPILED_TE_CPU:
        return "te-cpu's CPU layer (TE's kernels stood in for on CPU)"
    if kind == COMPILED_TREE:
        return f"the tree's own build ({path})"
    if kind == COMPILED_OTHER:
        return f"{path}, from another install"
    return f"the installed build ({path})" if path else None


def foreign_build_warning(record: dict[str, Any]) -> str | None:
    """The warning a tree run with another install's compiled extension must carry."""
    c = compiled(record)
    if not tree(record) or not c or c.get("kind") != COMPILED_OTHER:
        return None
    return (f"the tree's Python ran with the compiled extension {c.get('path')} from another install: "
            "the tree's C++ changes were not run (build the tree in place, or judge its Python with --backend te-cpu)")


def identity(record: dict[str, Any]) -> dict[str, Any]:
    """What must agree for two records' verdicts to be one run's: the backend, the upstream
    package and version it ran, the tree's commit, dirty state and digest."""
    return identity_of(record.get("backend"), backend_info(record))


def identity_of(backend: str | None, info: dict[str, Any]) -> dict[str, Any]:
    """``identity`` of a run about to start: its backend and the probe's ``BackendInfo``."""
    return {"backend": backend, "upstream": info.get("upstream"), "version": info.get("version"),
            "tree": te_tree.identity((info.get("extra") or {}).get("te_tree"))}


def describe(ident: dict[str, Any]) -> str:
    """``te-cpu, transformer_engine 2.20.2, tree at 1a2b3c4d5e6f (dirty, state ...)`` for messages."""
    parts = [str(ident.get("backend"))]
    if ident.get("upstream"):
        parts.append(f"{ident['upstream']} {ident.get('version')}")
    t = ident.get("tree")
    if t:
        at = (f"commit {t['commit'][:12]}" if t.get("commit") else "a folder") + (
            f" (dirty, state {t.get('state')})" if t.get("dirty") else
            f" (state {t.get('state')})" if not t.get("commit") and t.get("state") else "")
        parts.append(f"tree {at}, version {t.get('version')}")
    return ", ".join(parts)


def differences(recorded: dict[str, Any], now: dict[str, Any]) -> str | None:
    """None when two identities judged the same code, else one phrase naming both."""
    if recorded == now:
        return None
    # an older record without probe facts cannot say; its backend string must still agree
    if recorded.get("upstream") is None and recorded.get("tree") is None and recorded.get("backend") == now.get("backend"):
        return None
    return f"{describe(recorded)} vs {describe(now)}"
