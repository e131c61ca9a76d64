"""Path evidence: which of the CPU extension's kernels TE's code called.

A cell's label names a TE code path (``GroupedLinear``'s split-quantize GEMMs, the
normalization before ``LayerNormLinear``'s GEMM, ...); the kernels TE actually called prove
which one ran. Each kernel of :data:`harness.te_cpu.extension.KERNELS` is wrapped once, when
the extension module is built, with a counter; the runner resets the counts before a cell
and reads them after it (``harness.te_cpu.path_evidence``).
"""

from __future__ import annotations

import functools
from collections import Counter
from types import ModuleType
from typing import Any, Callable, Iterable

_CALLS: Counter[str] = Counter()


def _counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def kernel(*args: Any, **kwargs: Any) -> Any:
        _CALLS[name] += 1
        return fn(*args, **kwargs)

    return kernel


def instrument(module: ModuleType, names: Iterable[str]) -> None:
    """Wrap ``module``'s functions ``names`` so that every call is counted."""
    for name in names:
        setattr(module, name, _counted(name, getattr(module, name)))


def reset() -> None:
    _CALLS.clear()


def calls() -> dict[str, int]:
    """Kernel name -> calls since the last :func:`reset`."""
    return dict(_CALLS)
