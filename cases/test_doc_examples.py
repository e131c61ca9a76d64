"""Every shell and Python example in README.md and docs/*.md is run by the suite, or says why
not; every figure the pages quote agrees with the command that produces it.

An example's fenced block is preceded by one marker line (docs/decisions.md says why):

- ``<!-- example: run -->``: this test runs each command line of the block from a scratch
  folder (``python`` is the suite's interpreter), expecting exit 0 or the ``# exit N`` the line
  ends with; an ``<!-- output -->`` ``text`` block right after it holds lines the block's
  output must contain;
- ``<!-- example: run by cases/test_x.py -->``: that test runs it (it names the page);
- ``<!-- example: not run: REASON -->``: it needs what the suite does not have (a GPU, a
  second node) or it is the suite itself; the reason says which.

The figures (``<!--fig:NAME-->VALUE<!--/fig-->``, ``fixtures.figures``) of every source but the
sweeps are checked here; a sweep's on the run the suite already makes of it
(``cases/test_sweep_figures.py``, ``figures.check_run``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from fixtures import figures

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!-- example: (run|run by (\S+)|not run: (.+?)) -->$")
_SHELL = {"bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    lang: str
    marker: str | None
    body: str
    output: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def examples(pages: list[Path] = PAGES) -> list[Example]:
    """The shell and Python blocks of ``pages``, each with the marker above it (None: none)
    and the ``<!-- output -->`` block after it."""
    out = []
    for page in pages:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i])
            if not m or not m.group(1):
                i += 1
                continue
            lang, start = m.group(1), i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            body = "\n".join(lines[i + 1:j])
            k = start - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            marker = lines[k].strip() if k >= 0 and lines[k].strip().startswith("<!-- example:") else None
            output = None
            n = j + 1
            while n < len(lines) and not lines[n].strip():
                n += 1
            if n + 1 < len(lines) and lines[n].strip() == "<!-- output -->" and lines[n + 1].startswith("```"):
                e = n + 2
                while e < len(lines) and lines[e].strip() != "```":
                    e += 1
                output = "\n".join(lines[n + 2:e])
            if lang in _SHELL or lang == "python":
                out.append(Example(page, start + 1, lang, marker, body, output))
            i = j + 1
    return out


EXAMPLES = examples()


def test_every_example_says_whether_the_suite_runs_it():
    unmarked = [e.where for e in EXAMPLES if e.marker is None or not _MARKER.match(e.marker)]
    assert not unmarked, f"examples without an '<!-- example: ... -->' marker line above them: {unmarked}"
    for e in EXAMPLES:
        m = _MARKER.match(e.marker or "")
        if m and m.group(2):
            runner = ROOT / m.group(2)
            assert runner.is_file(), f"{e.where}: {m.group(2)} does not exist"
            assert str(e.page.relative_to(ROOT)) in runner.read_text(), \
                f"{e.where}: {m.group(2)} never names {e.page.relative_to(ROOT)}"


_COMMAND = re.compile(r"^\s*(?:\$ )?(?:python3? |torchrun |pip |[A-Z_]+=\S* (?:python|torchrun)|xdg-open )")


def test_no_shell_example_hides_from_the_markers():
    """A command shown as an indented code block, or in a fence without a language, would
    escape the markers: every command block is a fenced ``bash`` (or ``python``) block."""
    hidden = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        fenced = False
        for n, line in enumerate(lines):
            if line.strip().startswith("```"):
                if not fenced and line.strip() == "```" and n + 1 < len(lines) and _COMMAND.match(lines[n + 1]):
                    hidden.append(f"{page.relative_to(ROOT)}:{n + 1}: a command in a fence without a language")
                fenced = not fenced
                continue
            if (not fenced and line.startswith("    ") and _COMMAND.match(line)
                    and (n == 0 or not lines[n - 1].strip())):
                hidden.append(f"{page.relative_to(ROOT)}:{n + 1}: an indented command block")
    assert not hidden, hidden


def _commands(body: str) -> list[tuple[str, int]]:
    """The block's command lines (continuations joined, comments dropped) and the exit each
    expects (``# exit N`` at its end; 0 otherwise)."""
    joined = body.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        expect = 0
        m = re.search(r"#\s*exit (\d+)", line)
        if m:
            expect = int(m.group(1))
        out.append((line.split(" #")[0].strip(), expect))
    return out


RUN = [e for e in EXAMPLES if e.marker == "<!-- example: run -->"]


@pytest.mark.parametrize("example", RUN, ids=[e.where for e in RUN])
def test_the_examples_marked_run_run(example: Example, tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    printed = []
    for command, expect in _commands(example.body):
        argv = shlex.split(command)
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == expect, f"{example.where}: `{command}` exited {proc.returncode}, " \
                                          f"the page says {expect}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        printed.append(proc.stdout + proc.stderr)
    if example.output is not None:
        text = "\n".join(printed)
        missing = [ln for ln in example.output.splitlines() if ln.strip() and ln.strip() not in text]
        assert not missing, f"{example.where}: the shown output is not what the commands print: {missing}"


def test_every_figure_agrees_with_its_source():
    stale = figures.check_static()
    assert not stale, "\n".join(stale)


def test_every_figure_names_a_known_source():
    unknown = []
    for fig in figures.scan(figures.documents()):
        kind = fig.name.split(":")[0]
        if kind == "sweep":
            if fig.name.split(":")[1] not in figures.RUNS:
                unknown.append(f"{fig.where}: {fig.name}")
        elif kind not in figures.SOURCES:
            unknown.append(f"{fig.where}: {fig.name}")
    assert not unknown, unknown


def test_a_drifted_figure_is_named_with_its_file_and_line(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("intro\n\nthe ci preset has <!--fig:cells:ci-->12<!--/fig--> cells\n")
    assert figures.check_static([page]) == [
        f"{page}:3: figure cells:ci says '12', its source gives {figures.value_of('cells:ci')!r}"]
    page.write_text(page.read_text().replace(">12<", f">{figures.value_of('cells:ci')}<"))
    assert figures.check_static([page]) == []
