"""The filter language over cells (no torch): ``--filter`` and ``--cells``, a ledger entry's
``cells`` and a symptom's ``when`` are expressions in it.

A safe subset of Python expressions: axis names (bool axes are real bools: ``fused``, ``not
bias``), ``id`` (the cell id), constants, comparisons (``==``, ``!=``, ``<``, ``in``, ...),
``and``/``or``/``not`` and tuples, lists or sets of constants. Everything else is refused when
the expression is compiled, and so is a value an axis does not have (``module == "linaer"``
would otherwise select nothing, silently). ``harness.vocabulary.matrix.compile_filter`` binds it to the
matrix's axes.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from harness.vocabulary.errors import FilterError

__all__ = ["FilterError", "compile_expr", "exact_ids", "names_in"]

_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not,
          ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In,
          ast.NotIn, ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List, ast.Set)


def names_in(expr: str) -> set[str]:
    """The names an expression uses (axes and ``id``)."""
    return {n.id for n in ast.walk(ast.parse(expr.strip(), mode="eval")) if isinstance(n, ast.Name)}


def exact_ids(expr: str) -> frozenset[str] | None:
    """The cell ids outside which ``expr`` is false, where its form says so: ``id == "X"``,
    ``id in (...)``, an ``or`` of those, or an ``and`` with one of them (``--cells`` with whole
    ids makes these); None for any other form. Selecting from ``full`` then builds those
    cells instead of the whole product (``harness.vocabulary.matrix.select``)."""
    try:
        return _ids_of(ast.parse(expr.strip(), mode="eval").body)
    except SyntaxError:
        return None


def _ids_of(node: ast.expr) -> frozenset[str] | None:
    if isinstance(node, ast.BoolOp):
        parts = [_ids_of(v) for v in node.values]
        if isinstance(node.op, ast.Or):
            return None if any(p is None for p in parts) else frozenset().union(*parts)
        known = [p for p in parts if p is not None]
        return frozenset.intersection(*known) if known else None
    if (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.left, ast.Name)
            and node.left.id == "id"):
        op, rhs = node.ops[0], node.comparators[0]
        if isinstance(op, ast.Eq) and isinstance(rhs, ast.Constant) and isinstance(rhs.value, str):
            return frozenset((rhs.value,))
        if isinstance(op, ast.In) and isinstance(rhs, (ast.Tuple, ast.List, ast.Set)) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in rhs.elts):
            return frozenset(e.value for e in rhs.elts)
    return None


def compile_expr(expr: str, axes: Sequence[str],
                 check_value: Callable[[str, Any], None]) -> Callable[[Mapping[str, Any]], bool]:
    """Check ``expr`` against the subset once; a predicate on a cell's axes (plus ``id``).

    ``check_value(axis, value)`` raises a ``ValueError`` for a value ``axis`` cannot have.

    Raises:
        FilterError: one line saying what is wrong.
    """
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise FilterError(f"Malformed filter {expr!r}: {e.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise FilterError(f"Unsupported syntax {type(node).__name__} in filter {expr!r} "
                              f"(allowed: axis names, constants, comparisons, and/or/not)")
        if isinstance(node, ast.Name) and node.id not in axes and node.id != "id":
            raise FilterError(f"Unknown name {node.id!r} in filter "
                              f"(axes: {', '.join(axes)}; and id, the cell id)")
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and not all(
                isinstance(e, ast.Constant) for e in node.elts):
            raise FilterError(f"Malformed filter {expr!r}: a tuple/list/set may hold only constants")
    for node in ast.walk(tree):  # second pass: every name is now known to be an axis
        if isinstance(node, ast.Compare):
            _check_compare(node, expr, check_value)
    code = compile(tree, "<filter>", "eval")

    def pred(values: Mapping[str, Any]) -> bool:
        try:
            return bool(eval(code, {"__builtins__": {}}, dict(values)))  # noqa: S307
        except TypeError as e:  # e.g. module < 3
            raise FilterError(f"Cannot evaluate filter {expr!r} on {values.get('id')}: {e}") from None
    return pred


def _check_compare(node: ast.Compare, expr: str, check_value: Callable[[str, Any], None]) -> None:
    """Catch typos that would silently select nothing: `module == "linaer"`, `fused == "on"`."""
    operands = [node.left, *node.comparators]
    for op, lhs, rhs in zip(node.ops, operands, operands[1:]):
        for name, other in ((lhs, rhs), (rhs, lhs)):
            if not isinstance(name, ast.Name) or name.id == "id":
                continue
            if isinstance(op, (ast.Eq, ast.NotEq)) and isinstance(other, ast.Constant):
                consts = [other.value]
            elif isinstance(op, (ast.In, ast.NotIn)) and name is lhs and isinstance(
                    other, (ast.Tuple, ast.List, ast.Set)):
                consts = [e.value for e in other.elts if isinstance(e, ast.Constant)]
            else:
                continue
            for c in consts:
                try:
                    check_value(name.id, c)
                except ValueError as e:
                    raise FilterError(f"Bad filter {expr!r}: {e}") from None
