"""Importing the installed ``transformer_engine.pytorch`` with the CPU layer in place.

TE's PyTorch package needs two compiled pieces (CONTRACTS §6): ``libtransformer_engine.so``,
loaded with ctypes by ``transformer_engine/common/__init__.py``, and the
``transformer_engine_torch`` extension, loaded by ``common.load_framework_extension``.

- The core library: TE skips its load (and the PyPI packaging sanity check) when
  ``NVTE_PROJECT_BUILDING`` is set - TE's own switch, set here for the import only.
- The extension: :mod:`harness.te_cpu.extension` is registered as ``transformer_engine_torch``
  and ``load_framework_extension`` - looked up once by ``transformer_engine/pytorch/__init__.py``
  - is answered by a loader that checks our module is the one in place instead of searching
  for a shared object. The swap is done by a one-shot import hook on
  ``transformer_engine.common``, so no TE file is edited and nothing else is intercepted.
- TE's Triton kernels (``ops.GroupedLinear``'s bias gradient runs one) run in Triton's
  interpreter on CPU: ``TRITON_INTERPRET=1`` is set before TE decorates its kernels.

Everything raises :class:`TeUnavailable` with one line saying what to install when TE, the
right TE version or one of its import-time dependencies is missing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.te_cpu import evidence, extension

#: the TE release whose extension surface ``extension`` reproduces (enums, referenced names)
SUPPORTED_VERSIONS: tuple[str, ...] = ("2.20.2",)
DISTRIBUTION = "transformer_engine"
INSTALL_HINT = "run `python -m harness install te`"


class TeUnavailable(ImportError):
    """TE (or the version te-cpu supports, or an import-time dependency) is not installed."""


def installed_version() -> str | None:
    """The installed ``transformer-engine`` version, read from its metadata (no import)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_version() -> str:
    """The installed TE version if te-cpu supports it.

    Raises:
        TeUnavailable: TE is missing or another version is installed.
    """
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
    current = sys.modules.get(extension.MODULE_NAME)
    if "transformer_engine.pytorch" in sys.modules:
        if current is None or getattr(current, "__file__", None) != extension.__file__:
            raise TeUnavailable("transformer_engine.pytorch was already imported in this process "
                                "without the te-cpu layer")
        return sys.modules["transformer_engine.pytorch"]
    if current is not None and getattr(current, "__file__", None) != extension.__file__:
        raise TeUnavailable(f"a real {extension.MODULE_NAME} is already loaded; te-cpu replaces it")
    cpu_extension = extension.build()
    evidence.instrument(cpu_extension, extension.KERNELS)  # the cells' path evidence
    sys.modules[extension.MODULE_NAME] = cpu_extension
    os.environ.setdefault("TRITON_INTERPRET", "1")
    previous = _set_env("NVTE_PROJECT_BUILDING", "1")
    hook = _SwapExtensionLoader()
    sys.meta_path.insert(0, hook)
    try:
        return importlib.import_module("transformer_engine.pytorch")
    except ModuleNotFoundError as exc:
        raise TeUnavailable(f"TransformerEngine's import needs the package {exc.name!r}: "
                            f"{INSTALL_HINT}") from exc
    finally:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        if previous is None:
            os.environ.pop("NVTE_PROJECT_BUILDING", None)
        else:
            os.environ["NVTE_PROJECT_BUILDING"] = previous


def origin(te_pytorch: ModuleType) -> str:
    """Where the imported TE package lives (its ``transformer_engine`` folder)."""
    return str(Path(te_pytorch.__file__).resolve().parent.parent)
