"""Triton's CPU interpreter without a walk of ``triton.language`` on every helper call.

Why: triton's interpreter swaps ``triton.language``'s builtins for interpreted ones on every
kernel launch and again on every call of a ``@jit`` helper from inside a kernel (``tl.sum``
calls one per reduction), and each swap lists every member of each module with
``inspect.getmembers`` to find the builtins. TE's bias-gradient kernel (``ops.GroupedLinear``)
does that about 25 times a launch: in a ``te-cpu`` sweep the interpreter took two thirds of
the time, and these walks a quarter of the interpreter's.

How: before any kernel runs, the names of the builtins of each module the interpreter swaps
are listed once. ``_patch_builtin`` then visits only those names and keeps triton's own test
(``is_builtin`` on the member as it is now) and triton's own swap (``_patch_attr``), so it
swaps exactly what the full walk swaps: a member swapped already is a plain function, not a
builtin, and is skipped by both. Any other module takes triton's own walk. Nothing of TE's
kernel or of the interpreter's arithmetic changes; the ``te-cpu`` tests that compare TE's
bias gradients with float64 cover it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

_INSTALLED = "_dw_builtin_names"


def install() -> bool:
    """Swap in the listed-once walk; False (and nothing changed) on a triton without it."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_builtin", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    is_builtin = getattr(tl.core, "is_builtin", None)
    if original is None or patch_attr is None or is_builtin is None:
        return False
    if hasattr(original, _INSTALLED):
        return True
    modules = (tl, tl.core, tl.core.tensor, tl.math,
               getattr(tl.core, "tensor_descriptor_base", None))
    names: dict[int, tuple[Any, list[str]]] = {
        id(m): (m, [n for n, member in inspect.getmembers(m) if is_builtin(member)])
        for m in modules if m is not None}

    def patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
        listed = names.get(id(pkg))
        if listed is None or listed[0] is not pkg:
            original(pkg, builder, scope)
            return
        for name in listed[1]:
            member = getattr(pkg, name, None)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    setattr(patch_builtin, _INSTALLED, names)
    interpreter._patch_builtin = patch_builtin
    return True


def wrap_launch(marker: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace the interpreter's kernel launch (``InterpretedFunction.run``) by ``wrap(run)``
    once per process, marked ``marker``; False (nothing changed) on a triton without it.

    Wrappers stack (te-cpu's launch memory, then its kernel stand-ins outermost), and each
    keeps the markers of those it wraps, so installing one again is a no-op whatever is
    wrapped around it since."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    run = getattr(InterpretedFunction, "run", None)
    if run is None:
        return False
    if getattr(run, marker, False):
        return True
    wrapped = functools.update_wrapper(wrap(run), run)  # keeps the markers of ``run``
    setattr(wrapped, marker, True)
    InterpretedFunction.run = wrapped
    return True
