"""What a TE source tree asks of TE's compiled extension, read from the tree's files.

te-cpu's stand-in for ``transformer_engine_torch`` (:mod:`harness.backends.te_cpu.extension`) follows
the tree it runs (``--te-tree``, :mod:`harness.te_tree.tree`): this module reads the tree and says

- which names its Python sources take from the extension (:func:`referenced_names`: the
  Python AST of ``pytorch/``, ``debug/``, ``common/``), each of which the stand-in answers;
- which enums the extension exposes, with which members and values (:func:`tree_enums`:
  the pybind11 bindings say the members, the C headers their values).

Why here, beside :mod:`harness.te_tree.tree`, and not in ``harness/backends/te_cpu/``: it reads a TE tree
and nothing else - no torch, no TE import, no patched process - so it is a pure function of
the tree's files, like :mod:`harness.te_tree.tree`'s validation, which the parent process runs;
``harness.backends.te_cpu.backend`` is the rank-side layer that applies a CPU device to a process and imports
TE, and only its ``extension.build`` calls this module. What te-cpu already knows (its
built-in enums) comes in as an argument, so nothing here depends on the stand-in.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from harness.vocabulary import atomic

#: the name TE imports its compiled extension by (``import transformer_engine_torch as tex``)
MODULE_NAME = "transformer_engine_torch"
#: where a tree keeps the headers whose enums the extension exposes (relative to ``transformer_engine/``)
HEADER_GLOBS: tuple[str, ...] = ("common/include/transformer_engine/*.h", "pytorch/csrc/*.h")
#: where a tree keeps its pybind11 bindings (``py::enum_<...>(m, "Name").value(...)``)
BINDING_GLOBS: tuple[str, ...] = ("common/util/pybind_helper.h", "pytorch/csrc/*.cpp", "pytorch/csrc/*/*.cpp",
                                  "pytorch/csrc/*.h", "pytorch/csrc/*/*.h")
_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_ENUM = re.compile(r"\benum\s+(?:class\s+|struct\s+)?([A-Za-z_]\w*)?\s*(?::\s*[\w:\s]+?)?"
                   r"\{([^{}]*)\}\s*([A-Za-z_]\w*)?", re.S)
_TYPEDEF = re.compile(r"\btypedef\s+$")
_DIRECTIVE = re.compile(r"\s*#\s*(?:include|if|ifdef|ifndef|else|elif|endif|pragma|undef|error|warning|line)\b")
_MEMBER = re.compile(r"^([A-Za-z_]\w*)\s*(?:=\s*(.+))?$", re.S)
_BINDING = re.compile(r"\benum_\s*<\s*([\w:\s]+?)\s*>\s*\(\s*\w+\s*,\s*\"(\w+)\"(.*?);", re.S)
_BOUND_VALUE = re.compile(r"\.value\(\s*\"(\w+)\"\s*,\s*([\w:\s]+?)\s*\)", re.S)


# ---- the Python sources: the names taken from the extension ------------------------------------
def referenced_names(te_root: Path, memo: Path | None = None) -> set[str]:
    """Every name TE's PyTorch sources under ``te_root`` take from the extension.

    Finds ``<alias>.<name>`` for every ``import transformer_engine_torch as <alias>`` and
    every ``from transformer_engine_torch import <name>`` (parsed, not grepped, so
    ``torch.ops.tex.<op>`` is not mistaken for an extension name).

    ``memo``: a folder where the answer is kept, keyed by the sources that import the extension
    (path and text) and this module's own source: every rank of a ``--te-tree`` launch asks,
    and parsing them is most of a rank's start-up (0.7 CPU-s); a tree whose sources changed
    is another key. None: parsed every time.
    """
    sources = []
    for sub in ("pytorch", "debug", "common"):
        for path in sorted((te_root / sub).rglob("*.py")):
            text = path.read_text(errors="replace")
            if MODULE_NAME in text:  # else no import of the extension: no name taken from it
                sources.append((path, text))
    kept = _memo_file(memo, te_root, sources) if memo is not None else None
    if kept is not None:
        try:
            return set(json.loads(kept.read_text()))
        except (OSError, ValueError):
            pass
    names: set[str] = set()
    for path, text in sources:
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError:  # a file that does not parse fails TE's import, if TE imports it
            continue
        aliases, attributes = set(), []
        for node in ast.walk(tree):  # one walk: the aliases, and every ``<name>.<attr>``
            if isinstance(node, ast.Attribute):
                if isinstance(node.value, ast.Name):
                    attributes.append((node.value.id, node.attr))
            elif isinstance(node, ast.Import):
                aliases.update(a.asname or a.name for a in node.names if a.name == MODULE_NAME)
            elif isinstance(node, ast.ImportFrom) and node.module == MODULE_NAME:
                names.update(a.name for a in node.names)
        names.update(attr for alias, attr in attributes if alias in aliases)
    if kept is not None:
        atomic.write_text(kept, json.dumps(sorted(names)))
    return names


def _memo_file(memo: Path, te_root: Path, sources: list[tuple[Path, str]]) -> Path:
    h = hashlib.blake2b(Path(__file__).read_bytes(), digest_size=20)
    for path, text in sources:
        h.update(str(path.relative_to(te_root)).encode() + b"\0" + text.encode(errors="replace") + b"\0")
    return Path(memo) / f"te-tree-names-{h.hexdigest()}.json"


# ---- the C sources: the enums' members and values ---------------------------------------------
def _strip(text: str) -> str:
    """C source without comments, line continuations and preprocessor directives (a
    ``#define``'s body is kept: TE declares common bindings in a macro)."""
    text = _COMMENTS.sub(" ", text.replace("\\\n", " "))
    return "\n".join(ln for ln in text.splitlines() if not _DIRECTIVE.match(ln))


def _const(expr: str, known: dict[str, int]) -> int | None:
    """The value of an enumerator's initializer: integer literals (``-1``, ``0x10``, ``1u``),
    earlier enumerators, and ``+ - * << >> | & ~`` over them; None otherwise."""
    expr = re.sub(r"(?<=[0-9a-fA-F])[uUlL]+\b", "", expr.strip()).replace("::", ".")
    expr = re.sub(r"\bstatic_cast\s*<[^>]*>", "", expr)
    try:
        node = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.LShift: int.__lshift__,
           ast.RShift: int.__rshift__, ast.BitOr: int.__or__, ast.BitAnd: int.__and__}

    def value(n: ast.AST) -> int:
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name) and n.id in known:
            return known[n.id]
        if isinstance(n, ast.Attribute) and n.attr in known:  # Enum::kMember
            return known[n.attr]
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd, ast.Invert)):
            v = value(n.operand)
            return -v if isinstance(n.op, ast.USub) else ~v if isinstance(n.op, ast.Invert) else v
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            return ops[type(n.op)](value(n.left), value(n.right))
        raise ValueError(ast.dump(n))

    try:
        return value(node)
    except (ValueError, TypeError, OverflowError):
        return None


def parse_enums(text: str) -> dict[str, dict[str, int]]:
    """Every ``enum [class] Name { A = 0, B, ... }`` (and ``typedef enum { ... } Name;``) of a
    C/C++ header: name -> members -> values (C's rule: an enumerator without initializer is
    the previous one plus one; one whose initializer cannot be evaluated is left out)."""
    text = _strip(text)
    out: dict[str, dict[str, int]] = {}
    for m in _ENUM.finditer(text):
        typedef = bool(_TYPEDEF.search(text[max(0, m.start() - 16):m.start()]))
        name = m.group(3) if typedef and m.group(3) else m.group(1)
        if not name:
            continue
        members: dict[str, int] = {}
        nxt: int | None = 0
        for item in m.group(2).split(","):
            mm = _MEMBER.match(" ".join(item.split()))
            if not mm:
                continue
            member, expr = mm.group(1), mm.group(2)
            val = _const(expr, members) if expr else nxt
            nxt = None if val is None else val + 1
            if val is not None:
                members[member] = val
        if members:
            out.setdefault(name, members)
    return out


def parse_bindings(text: str) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Every ``py::enum_<CType>(m, "Name").value("member", CType::kMember)...;`` of a pybind11
    source: Python name -> (C type's last name, [(Python member, C enumerator)])."""
    out: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for m in _BINDING.finditer(_strip(text)):
        values = [(v.group(1), "".join(v.group(2).split()).split("::")[-1]) for v in _BOUND_VALUE.finditer(m.group(3))]
        if values:
            out.setdefault(m.group(2), ("".join(m.group(1).split()).split("::")[-1], values))
    return out


def _read_all(te_root: Path, patterns: Sequence[str], parse: Callable[[str], dict[str, Any]],
              needle: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pattern in patterns:
        for path in sorted(te_root.glob(pattern)):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if needle in text:
                for name, found in parse(text).items():
                    out.setdefault(name, found)
    return out


def header_enums(te_root: Path) -> dict[str, dict[str, int]]:
    """The enums of a tree's headers (``HEADER_GLOBS`` under its ``transformer_engine/``
    folder ``te_root``), first definition wins; empty when the tree has no headers."""
    return _read_all(te_root, HEADER_GLOBS, parse_enums, "enum")


def tree_enums(te_root: Path, known: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """The extension's enums for a tree: Python name -> members -> values.

    Where the tree has the pybind11 binding of an enum (``BINDING_GLOBS``), its members are
    the bound ones - TE checks that its Python ``DType`` mirrors ``tex.DType`` exactly, and
    the binding exposes fewer members than the C header declares - with the values of the
    header's enumerators (te-cpu's built-in value where the header lacks one). Without a
    binding, the header's enum of the same name gives the values of te-cpu's members (its
    extra enumerators are not assumed bound). Enums te-cpu knows and the tree does not
    mention keep their built-in members.

    Args:
        te_root: the tree's ``transformer_engine/`` folder.
        known: the enums te-cpu has built in (name -> member -> value): the members of an
            enum the tree does not bind, and a value the tree's headers lack.
    """
    headers = header_enums(te_root)
    unscoped = {m: v for members in headers.values() for m, v in members.items()}
    out: dict[str, dict[str, int]] = {}
    for name, (ctype, values) in _read_all(te_root, BINDING_GLOBS, parse_bindings, "enum_").items():
        scoped, ours = headers.get(ctype, {}), known.get(name, {})
        members: dict[str, int] = {}
        for member, enumerator in values:
            val = scoped.get(enumerator, unscoped.get(enumerator, ours.get(member)))
            if val is not None:
                members[member] = val
        if members:
            out[name] = members
    for name, ours in known.items():
        if name not in out:
            header = headers.get(name, {})
            out[name] = {m: header.get(m, v) for m, v in ours.items()}
    return out


__all__ = ["MODULE_NAME", "HEADER_GLOBS", "BINDING_GLOBS", "referenced_names", "parse_enums", "parse_bindings",
           "header_enums", "tree_enums"]
