"""Importing the installed ``transformer_engine.pytorch`` with the CPU layer in place.

TE's PyTorch package needs two compiled pieces (CONTRACTS §6): ``libtransformer_engine.so``,
loaded with ctypes by ``transformer_engine/common/__init__.py``, and the
``transformer_engine_torch`` extension, loaded by ``common.load_framework_extension``.

- The core library: TE skips its load (and the PyPI packaging sanity check) when
  ``NVTE_PROJECT_BUILDING`` is set - TE's own switch, set here for the import only.
- The extension: the module :func:`harness.backends.te_cpu.extension.build` returns (for the tree,
  if any) is registered as ``transformer_engine_torch`` - the one place the process learns
  which stand-in, and so which enum values, TE runs with - and ``load_framework_extension`` - looked up once by ``transformer_engine/pytorch/__init__.py``
  - is answered by a loader that checks our module is the one in place instead of searching
  for a shared object. The swap is done by a one-shot import hook on
  ``transformer_engine.common``, so no TE file is edited and nothing else is intercepted.
- TE's Triton kernels (``ops.GroupedLinear``'s bias gradient runs one) run in Triton's
  interpreter on CPU: ``TRITON_INTERPRET=1`` is set before TE decorates its kernels.

Everything raises :class:`TeUnavailable` with one line saying what to install when TE, the
right TE version or one of its import-time dependencies is missing.

A TE source tree (``harness.te_tree.tree``; ``DW_TE_TREE``, set by ``--backend te-cpu@TREE``) is
followed instead of the wheel: the version is the tree's, any version is accepted, the
extension stand-in is built for the tree, the imported ``transformer_engine.pytorch`` must
come from the tree, and a tree that does not import (a syntax error, an extension attribute
te-cpu lacks at import time) ends in one line naming the file or the attribute.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.cell.faults import TeUnavailable
from harness.te_tree import tree as te_tree
from harness.backends.te_cpu import evidence, extension, interpreter, kernel_standins, launch_memo

#: the TE release whose extension surface ``extension`` reproduces (enums, referenced names)
SUPPORTED_VERSIONS: tuple[str, ...] = ("2.20.2",)
DISTRIBUTION = "transformer_engine"
INSTALL_HINT = "run `python -m harness install te`"


def installed_version() -> str | None:
    """The installed ``transformer-engine`` version, read from its metadata (no import)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def tree() -> te_tree.Tree | None:
    """The TE source tree this process follows (``DW_TE_TREE``), None for the installed TE.

    Raises:
        TeUnavailable: the variable names a folder that is not a TE tree.
    """
    value = os.environ.get(te_tree.ENV, "")
    if value not in _TREES:  # asked several times per import: inspect (git) once per path
        try:
            _TREES[value] = te_tree.from_env()
        except te_tree.TreeError as exc:
            raise TeUnavailable(str(exc)) from exc
    return _TREES[value]


_TREES: dict[str, te_tree.Tree | None] = {}


def check_version() -> str:
    """The TE version te-cpu runs: a tree's (any version: the point is to follow the tree),
    else the installed one if te-cpu supports it.

    Raises:
        TeUnavailable: TE is missing or another version is installed (no tree), or
            ``DW_TE_TREE`` names no TE tree.
    """
    source = tree()
    if source is not None:
        return source.version
    version = installed_version()
    if version is None:
        raise TeUnavailable(f"TransformerEngine is not installed: {INSTALL_HINT}")
    if version not in SUPPORTED_VERSIONS:
        raise TeUnavailable(f"te-cpu supports transformer-engine {', '.join(SUPPORTED_VERSIONS)}, "
                            f"found {version}: {INSTALL_HINT}")
    return version


def _load_cpu_extension(framework: str) -> None:
    """Stands in for ``transformer_engine.common.load_framework_extension``."""
    if framework != "torch":
        raise TeUnavailable(f"te-cpu provides only the torch extension, not {framework!r}")
    mod = sys.modules.get(extension.MODULE_NAME)
    if mod is None or getattr(mod, "__file__", None) != extension.__file__:
        raise TeUnavailable(f"{extension.MODULE_NAME} is not te-cpu's CPU module")


class _SwapExtensionLoader(importlib.abc.MetaPathFinder):
    """One-shot hook: after ``transformer_engine.common`` executes, point its
    ``load_framework_extension`` at :func:`_load_cpu_extension`."""

    TARGET = "transformer_engine.common"

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_swap(module: ModuleType) -> None:
            exec_module(module)
            module.load_framework_extension = _load_cpu_extension

        spec.loader.exec_module = exec_and_swap  # type: ignore[method-assign]
        return spec


def _set_env(name: str, value: str) -> str | None:
    old = os.environ.get(name)
    os.environ[name] = value
    return old


def import_te() -> ModuleType:
    """Import the real ``transformer_engine.pytorch`` on top of the CPU extension.

    Raises:
        TeUnavailable: TE or a dependency is missing, or TE was already imported without
            the CPU layer in this process.
    """
    check_version()
    source = tree()
    current = sys.modules.get(extension.MODULE_NAME)
    if "transformer_engine.pytorch" in sys.modules:
        if current is None or getattr(current, "__file__", None) != extension.__file__:
            raise TeUnavailable("transformer_engine.pytorch was already imported in this process "
                                "without the te-cpu layer")
        return _from_tree(sys.modules["transformer_engine.pytorch"], source)
    if current is not None and getattr(current, "__file__", None) != extension.__file__:
        raise TeUnavailable(f"a real {extension.MODULE_NAME} is already loaded; te-cpu replaces it")
    if source is not None:
        _put_first(source)
    cpu_extension = extension.build(source.package if source is not None else None)
    evidence.instrument(cpu_extension, extension.KERNELS)  # the cells' path evidence
    sys.modules[extension.MODULE_NAME] = cpu_extension
    os.environ.setdefault("TRITON_INTERPRET", "1")
    previous = _set_env("NVTE_PROJECT_BUILDING", "1")
    hook = _SwapExtensionLoader()
    sys.meta_path.insert(0, hook)
    try:
        te = importlib.import_module("transformer_engine.pytorch")
    except ModuleNotFoundError as exc:
        if source is not None and (exc.name or "").split(".")[0] == "transformer_engine":
            raise TeUnavailable(f"the TE tree {source.path} does not import: no module {exc.name!r} "
                                f"in it{_where(exc, source)}") from exc
        raise TeUnavailable(f"TransformerEngine's import needs the package {exc.name!r}: "
                            f"{INSTALL_HINT}") from exc
    except Exception as exc:
        failure = _import_failure(exc, source)
        if failure is exc:
            raise
        raise failure from exc
    finally:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        if previous is None:
            os.environ.pop("NVTE_PROJECT_BUILDING", None)
        else:
            os.environ["NVTE_PROJECT_BUILDING"] = previous
    if os.environ.get("TRITON_INTERPRET") == "1":
        interpreter.install()
        launch_memo.install()
        kernel_standins.install()  # outermost: a proven stand-in runs before the memo is asked
    return _from_tree(te, source)


def _put_first(source: te_tree.Tree) -> None:
    """The tree first on ``sys.path`` (``harness.vocabulary.backend_specs`` already did; a direct
    ``DW_TE_TREE=... import harness.backends.te_cpu.backend`` relies on this)."""
    loaded = sys.modules.get("transformer_engine")
    if loaded is not None and not source.contains(getattr(loaded, "__file__", None)):
        raise TeUnavailable(f"imported {getattr(loaded, '__file__', None)}, not the tree's "
                            f"({source.package}): transformer_engine was imported before te-cpu")
    if sys.path[:1] != [source.path]:
        sys.path.insert(0, source.path)
    importlib.invalidate_caches()


def _from_tree(te: ModuleType, source: te_tree.Tree | None) -> ModuleType:
    """``te`` itself, after checking that it is the tree's (when a tree is followed)."""
    if source is not None and not source.contains(getattr(te, "__file__", None)):
        raise TeUnavailable(f"imported {te.__file__}, not the tree's ({source.package}/pytorch/__init__.py)")
    return te


def _where(exc: BaseException, source: te_tree.Tree | None) -> str:
    """`` (raised at transformer_engine/pytorch/x.py:12)``: the innermost TE frame of ``exc``."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if "/transformer_engine/" in path:
            found = f"{path[path.rindex('/transformer_engine/') + 1:]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return f" (raised at {found})" if found else ""


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


_CANNOT_IMPORT = re.compile(r"cannot import name '([^']+)' from '" + re.escape(extension.MODULE_NAME) + "'")


def _import_failure(exc: Exception, source: te_tree.Tree | None) -> Exception:
    """One line for an import of TE that failed (a tree that does not import is bad input)."""
    who = f"the TE tree {source.path}" if source is not None else "TransformerEngine"
    for e in _chain(exc):
        if isinstance(e, extension.MissingExtensionAttribute):
            return TeUnavailable(f"{who} needs {e.qualname} at import time{_where(exc, source)}, which te-cpu's "
                                 "stand-in for TE's compiled extension lacks (harness/backends/te_cpu/extension.py)")
        m = _CANNOT_IMPORT.search(str(e)) if isinstance(e, ImportError) else None
        if m:
            return TeUnavailable(f"{who} needs {extension.MODULE_NAME}.{m.group(1)} at import time"
                                 f"{_where(exc, source)}, which te-cpu's stand-in for TE's compiled extension "
                                 "lacks (harness/backends/te_cpu/extension.py)")
    if source is None:
        return exc
    if isinstance(exc, SyntaxError):
        return TeUnavailable(f"{who} does not import: {exc.filename}:{exc.lineno}: SyntaxError: {exc.msg}")
    first = (str(exc).strip().splitlines() or [""])[0]
    return TeUnavailable(f"{who} does not import: {type(exc).__name__}: {first}{_where(exc, source)}")


def origin(te_pytorch: ModuleType) -> str:
    """Where the imported TE package lives (its ``transformer_engine`` folder)."""
    return str(Path(te_pytorch.__file__).resolve().parent.parent)
