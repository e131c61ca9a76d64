"""The user-facing documentation stays consistent: README.md, docs/*.md and the CLI's --help.

- every relative markdown link resolves to a file (or folder) of the repository, and its
  ``#anchor`` to a heading of the target (GitHub's slug rule);
- every ``§N`` / ``§N.M`` reference - in the docs, in every subcommand's ``--help`` and in the
  string literals of ``harness/`` and ``reports/`` (docstrings included, comments not) - names
  a numbered heading of docs/contracts.md ("CONTRACTS §N" means section N of that page);
- no tracker references (``issue 12``, ``issues 10/11``) and no paths outside the repository
  (``../shared``) in the docs or the ``--help`` texts;
- no history in the docs: no figure right after "before", "was" or "were", and no measured
  figure (a time, a size, a count of cells or tests) right before "before" - a past figure
  goes to CHANGELOG.md with its date, a timing to ``benchmarks/`` (docs/performance.md
  renders it).

Every failure lists each offender as ``file:line: text``. The only process started is
``python -m harness --help``; the subcommands' help is rendered by the same parser in-process.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / "docs" / "contracts.md"
CODE_ROOTS = ("harness", "reports")

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_SECTION = re.compile(r"§\s*(\d+(?:\.\d+)*)")
_TRACKER = re.compile(r"\bissues?\s+\d+", re.IGNORECASE)
_OUTSIDE = "../shared"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose_lines(text: str, *, keep_code: bool = False) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks; inline code spans blanked unless
    ``keep_code`` (a heading's anchor is made from its code spans' text too)."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line if keep_code else _INLINE_CODE.sub("", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text (link targets and code marks dropped), lowercased,
    every character but letters, digits, ``_``, ``-`` and spaces dropped, spaces to ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    """Every heading anchor of a markdown file, with GitHub's ``-1``, ``-2`` for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8"), keep_code=True):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return frozenset(out)


def contract_sections() -> set[str]:
    """The section numbers of docs/contracts.md's headings: ``## 5. The oracle`` -> ``5``."""
    numbers = set()
    for _, line in prose_lines(CONTRACTS.read_text(encoding="utf-8"), keep_code=True):
        m = _HEADING.match(line)
        if m:
            n = re.match(r"(\d+(?:\.\d+)*)\.?\s", m.group(2))
            if n:
                numbers.add(n.group(1))
    return numbers


def _top_help() -> str:
    env = {**os.environ, "COLUMNS": "1000"}  # no wrapping: a reference stays on one line
    proc = subprocess.run([sys.executable, "-m", "harness", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"python -m harness --help: exit {proc.returncode}\n{proc.stderr}"
    return proc.stdout


def _listed_commands(text: str) -> list[str]:
    """The subcommand names a help text lists (argparse indents them by four spaces under
    "positional arguments:")."""
    if "positional arguments:" not in text:
        return []
    block = text.split("positional arguments:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^ {4}([a-z][\w-]*)(?:\s{2,}\S|$)", block, flags=re.MULTILINE)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: p for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name, p in action.choices.items()}


@pytest.fixture(scope="module")
def help_texts() -> dict[str, str]:
    """``{"harness sweep --help": text, ...}``: the top level (from ``python -m harness
    --help`` itself), every subcommand it lists and every verb of a subcommand that has verbs
    (``ledger list``) - rendered by the CLI's own parser in this process, which prints exactly
    what ``python -m harness COMMAND --help`` prints, in one import of the CLI instead of a
    process per command."""
    from harness.cli import build_parser

    top = _top_help()
    listed = _listed_commands(top)
    assert "sweep" in listed, f"could not read the subcommands from python -m harness --help:\n{top}"
    texts = {"harness --help": top}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "1000")
        commands = _subparsers(build_parser())
        assert sorted(commands) == sorted(listed), (
            f"python -m harness --help lists {sorted(listed)}, the parser has {sorted(commands)}")
        for name, parser in commands.items():
            texts[f"harness {name} --help"] = parser.format_help()
            for verb, sub in _subparsers(parser).items():
                texts[f"harness {name} {verb} --help"] = sub.format_help()
    return texts


def _fail(what: str, offenders: list[str]) -> None:
    if offenders:
        pytest.fail(f"{len(offenders)} {what}:\n" + "\n".join(offenders), pytrace=False)


def test_relative_links_resolve() -> None:
    offenders = []
    for path in doc_files():
        for n, line in prose_lines(path.read_text(encoding="utf-8")):
            for m in _LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, mailto:, ...
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (path.parent / file_part).resolve() if file_part else path
                where = f"{rel(path)}:{n}: ({target})"
                if ROOT not in dest.parents and dest != ROOT:
                    offenders.append(f"{where} points outside the repository")
                elif not dest.exists():
                    offenders.append(f"{where} no such file: {file_part}")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    offenders.append(f"{where} no heading with anchor #{anchor} in {rel(dest)}")
    _fail("broken relative link(s)", offenders)


def _section_refs(text: str, where: str, valid: set[str], first_line: int = 1) -> list[str]:
    out = []
    for m in _SECTION.finditer(text):
        if m.group(1) not in valid:
            line = first_line + text.count("\n", 0, m.start())
            snippet = text[max(0, m.start() - 30):m.end() + 10].replace("\n", " ")
            out.append(f"{where}:{line}: §{m.group(1)} ({snippet.strip()!r})")
    return out


def _string_literals(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module (docstrings and f-string parts too; not comments)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_contract_sections_exist(help_texts: dict[str, str]) -> None:
    valid = contract_sections()
    assert valid, f"no numbered headings (## N. Title) found in {rel(CONTRACTS)}"
    offenders = []
    for path in doc_files():
        offenders += _section_refs(path.read_text(encoding="utf-8"), rel(path), valid)
    for name, text in help_texts.items():
        offenders += _section_refs(text, name, valid)
    for root in CODE_ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            for line, value in _string_literals(path):
                offenders += _section_refs(value, rel(path), valid, first_line=line)
    _fail(f"§ reference(s) to no heading of {rel(CONTRACTS)} (sections: {', '.join(sorted(valid))})",
          offenders)


def _tracker_refs(text: str, where: str) -> list[str]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in _TRACKER.finditer(line):
            out.append(f"{where}:{n}: tracker reference {m.group(0)!r}: {line.strip()}")
        if _OUTSIDE in line:
            out.append(f"{where}:{n}: path outside the repository: {line.strip()}")
    return out


def test_no_tracker_references_or_outside_paths(help_texts: dict[str, str]) -> None:
    offenders = []
    for path in doc_files():
        offenders += _tracker_refs(path.read_text(encoding="utf-8"), rel(path))
    for name, text in help_texts.items():
        offenders += _tracker_refs(text, name)
    _fail("tracker reference(s) or outside path(s) in user-facing text", offenders)


#: "before/was/were" and then, within the clause, a number: "9 min 58 s before X joined" reads
#: history, so does "it was 10 min"
_PAST_AFTER = re.compile(r"\b(?:before|was|were)\b[^.;()\[\]|]{0,50}?\b\d[\d,.]*\b", re.IGNORECASE)
_PAST_BEFORE = re.compile(r"\b\d[\d,.]*\s*(?:%|x|s|ms|min|MB|GB|cells?|tests?|entries|hunks|rows|pass|known|"
                          r"CPU-s(?:econds)?)\s+(?:[\w`-]+\s+){0,2}?(?:before|was|were)\b", re.IGNORECASE)


def test_no_past_figures() -> None:
    offenders = []
    for path in doc_files():
        for n, line in prose_lines(path.read_text(encoding="utf-8")):
            line = re.sub(r"<!--.*?-->", "", line)  # a figure marker's name is not prose
            for pattern in (_PAST_AFTER, _PAST_BEFORE):
                offenders += [f"{rel(path)}:{n}: {m.group(0)!r}" for m in pattern.finditer(line)]
    _fail("past figure(s) in the docs (history goes to CHANGELOG.md, timings to benchmarks/)", offenders)


def test_the_past_figure_rule_sees_history() -> None:
    seen = [text for text in ("10 min 33 s for the suite (9 min 58 s before the stand-in joined)",
                              "the `full` preset was 21,600 cells", "before `nvfp4` joined: 756 cells")
            if _PAST_AFTER.search(text) or _PAST_BEFORE.search(text)]
    assert len(seen) == 3, seen
    assert not any(p.search("exit 2 before any launch") for p in (_PAST_AFTER, _PAST_BEFORE))


def test_slug_rule() -> None:
    assert slug("What real TE 2.20.2 does, cell by cell: the `ci` sweep") == \
        "what-real-te-2202-does-cell-by-cell-the-ci-sweep"
    assert slug("Exact checks: twins, tagged copies, `main_grad` identity") == \
        "exact-checks-twins-tagged-copies-main_grad-identity"
    assert slug("The loopback launcher's overhead") == "the-loopback-launchers-overhead"
    assert slug("2. The DistributedWeight protocol, as a backend consumes it") == \
        "2-the-distributedweight-protocol-as-a-backend-consumes-it"
