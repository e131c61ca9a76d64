"""Path evidence: which of the CPU extension's kernels TE's code called.

A cell's label names a TE code path (``GroupedLinear``'s split-quantize GEMMs, the
normalization before ``LayerNormLinear``'s GEMM, ...); the kernels TE actually called prove
which one ran. Each kernel of :data:`harness.backends.te_cpu.extension.KERNELS` is wrapped once, when
the extension module is built, with a counter; the runner resets the counts before a cell
and reads them after it (``harness.backends.te_cpu.path_evidence``). What the harness itself calls to
read TE's state (``harness.cell.te_path`` asks TE's path predicate what it sees) runs under
:func:`paused`: it is not TE's doing, so it is not counted.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator

_CALLS: Counter[str] = Counter()
#: > 0 while the harness reads TE's state (:func:`paused`)
_PAUSED = [0]


def _counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def kernel(*args: Any, **kwargs: Any) -> Any:
        if not _PAUSED[0]:
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


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Calls made inside are not counted (the harness's own reads of TE's state)."""
    _PAUSED[0] += 1
    try:
        yield
    finally:
        _PAUSED[0] -= 1
