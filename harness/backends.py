"""Loading a backend: an import path, ``path/to/file.py``, or ``module:attribute``.

A backend is anything exposing ``Linear``, ``GroupedLinear`` and ``ops.GroupedLinear``
(CONTRACTS §1) - the reference, the pre-fix reference, a mutant, or real
``transformer_engine.pytorch`` on a CUDA machine.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

REQUIRED = ("Linear", "GroupedLinear", "ops.GroupedLinear")


class BackendError(ValueError):
    """The backend cannot be used (bad spec, import failure, missing names)."""


def _import_target(spec: str) -> Any:
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            raise BackendError(f"backend file {spec!r} does not exist")
        name = f"_dw_backend_{abs(hash(str(path.resolve())))}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
        return module
    modname, _, attr = spec.partition(":")
    module = importlib.import_module(modname)
    if not attr:
        return module
    getter = getattr(module, "get", None)
    if callable(getter):
        return getter(attr)
    return getattr(module, attr)


def load_backend(spec: str) -> Any:
    """Import and validate a backend.

    Raises:
        BackendError: with a one-line reason (including the import error) on failure.
    """
    try:
        backend = _import_target(spec)
    except BackendError:
        raise
    except Exception as exc:  # any import-time failure is bad input, reported in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise BackendError(f"cannot import backend {spec!r}: {type(exc).__name__}: {first}") from exc
    missing = []
    for name in REQUIRED:
        obj = backend
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is None:
            missing.append(name)
    if missing:
        raise BackendError(f"backend {spec!r} lacks {', '.join(missing)} (CONTRACTS §1)")
    return backend
