"""Is an exception a backend's deliberate rejection? (CONTRACTS §2: delayed wgrad with a
DistributedWeight must be rejected with a clear exception.)

A must-raise cell is met only by the backend saying no on purpose. Three things tell a
rejection from a backend that merely broke on the way:

- its type is not a programming error's (``PROGRAMMING_ERRORS``: a name, attribute, key or
  index that does not exist, an import that fails), whatever its text - a new check that is
  itself broken (``NameError: name 'check_delay_wgrad_distributed' is not defined``) would
  otherwise count as the rejection it was meant to make;
- the innermost frame lies in the backend's own source (``source_roots``: the upstream
  package it runs, e.g. TE's, or else the backend's own package), not in torch or a helper
  layer under it (te-cpu's CPU stand-ins are not TE);
- that frame's statement is a ``raise`` or an ``assert``: a ``TypeError`` or
  ``RuntimeError`` that surfaced from a call (a wrong argument count, a shape torch refused)
  stops at the calling line, not at a statement that says no.

Rank-side (the runner calls it), no torch.
"""

from __future__ import annotations

import ast
import functools
import sys
import traceback
from pathlib import Path
from types import ModuleType

#: exception types that are a programming error, never a deliberate rejection
PROGRAMMING_ERRORS = (NameError, AttributeError, ImportError, KeyError, IndexError)


#: the classes whose defining modules are a backend's own code (CONTRACTS §1)
API = ("Linear", "GroupedLinear", "LayerNormLinear", "ops.GroupedLinear")


def source_roots(backend: ModuleType | None) -> tuple[Path, ...]:
    """The folders holding a backend's own code: the folders of the modules defining its
    classes (a backend file that re-exports the reference's classes is the reference's code),
    and the upstream package it declares (``describe()["origin"]``, e.g. TE's
    ``transformer_engine`` folder under te-cpu) - or, declaring none, its own module's folder.
    A layer standing in under the backend (te-cpu's CPU kernels) is none of these."""
    if backend is None:
        return ()
    roots: list[Path] = []
    describe = getattr(backend, "describe", None)
    origin = (describe() or {}).get("origin") if callable(describe) else None
    if origin:
        path = Path(origin)
        roots.append((path.parent if path.suffix == ".py" else path).resolve())
    elif getattr(backend, "__file__", None):
        roots.append(Path(backend.__file__).resolve().parent)
    for name in API:
        obj: object = backend
        for part in name.split("."):
            obj = getattr(obj, part, None)
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        if getattr(module, "__file__", None):
            roots.append(Path(module.__file__).resolve().parent)
    return tuple(dict.fromkeys(roots))


def judge(exc: BaseException, roots: tuple[Path, ...]) -> str | None:
    """None when ``exc`` is a deliberate rejection by code under ``roots``, else why not (one line)."""
    name = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, PROGRAMMING_ERRORS):
        return f"{name} is a programming error, never the clear rejection CONTRACTS §2 asks for"
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return f"{name} carries no traceback: where it was raised cannot be told"
    last = frames[-1]
    where = f"{last.filename}:{last.lineno}"
    path = Path(last.filename).resolve()
    if roots and not any(path.is_relative_to(r) for r in roots):
        return (f"{name} was raised at {where}, outside the backend's own source "
                f"({', '.join(str(r) for r in roots)}): not the backend saying no")
    statement = _statement_at(str(path), last.lineno or 0)
    if statement not in ("raise", "assert"):
        return (f"{name} surfaced at {where} from a call ({statement or 'unreadable source'}), not from a raise "
                "or assert statement: not the backend saying no")
    return None


def _statement_at(file: str, line: int) -> str | None:
    """``"raise"``, ``"assert"`` or the statement kind (``"expression"``...) of the innermost
    statement spanning ``line`` of ``file``; None when the source cannot be read or parsed."""
    spans = _statement_spans(file)
    if spans is None:
        return None
    best: tuple[int, int, str] | None = None
    for span in spans:
        if span[0] <= line <= span[1] and (best is None or span[0] >= best[0]):
            best = span
    return best[2] if best else None


@functools.lru_cache(maxsize=64)
def _statement_spans(file: str) -> tuple[tuple[int, int, str], ...] | None:
    """(first line, last line, kind) of every statement of ``file``, in ``ast.walk``'s order:
    walked once per file (TE's module files hold thousands of nodes; a rank judges many
    expected errors raised from the same few files)."""
    try:
        tree = ast.parse(Path(file).read_text(), filename=file)
    except (OSError, SyntaxError, ValueError):
        return None
    kinds = {ast.Raise: "raise", ast.Assert: "assert"}
    return tuple((node.lineno, node.end_lineno or node.lineno, kinds.get(type(node), type(node).__name__.lower()))
                 for node in ast.walk(tree) if isinstance(node, ast.stmt))
