"""The worlds and layers of pyproject.toml hold, crossing one fails the check (import-linter),
and docs/architecture.md names every module under its world and says the layer order as
pyproject.toml does."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
LAYERS = {c["id"]: c["layers"] for c in CONTRACTS if c["type"] == "layers"}


def _check(*plants: str) -> subprocess.CompletedProcess:
    args = [a for p in plants for a in ("--plant", p)]
    return subprocess.run([sys.executable, str(ROOT / ".ci" / "check_layers.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_every_contract_is_kept():
    proc = _check()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(CONTRACTS)} kept, 0 broken" in proc.stdout


@pytest.mark.parametrize("plant, broken", [
    # a rank never reaches up into the parent
    ("harness.rank.worker:harness.cli", "harness.rank is not allowed to import harness.cli"),
    ("harness.records.stream:harness.launcher.launch", "harness.records is not allowed to import harness.launcher"),
    # the parent, the readers and the vocabulary never import torch nor anything of a rank
    ("harness_reports._common:torch", "is not allowed to import torch"),
    ("harness.te_tree.scan:torch", "harness.te_tree is not allowed to import torch"),
    ("harness.orchestration.sweep:harness.cell.runner", "is not allowed to import harness.cell"),
    ("harness.launcher.launch:harness.cell.oracle", "harness.launcher.launch -> harness.cell.oracle"),
    ("harness_reports.html:harness.cell.compare", "harness_reports is not allowed to import harness.cell"),
    ("harness.vocabulary.matrix:torch", "harness.vocabulary.matrix -> torch"),
    # one cell's code never imports a backend (the rank's top applies te-cpu for Megatron)
    ("harness.cell.oracle:harness.backends.te_cpu.backend", "harness.cell is not allowed to import harness.backends"),
    # the backends stay apart
    ("harness.backends.reference.mutants:harness.backends.te_cpu.gemm",
     "harness.backends.reference is not allowed to import harness.backends.te_cpu"),
    # no circle, one hidden behind importlib included (it was: quant.tensors -> extension)
    ("harness.backends.te_cpu.quant.tensors:harness.backends.te_cpu.extension",
     "No cycles are allowed in harness.backends.te_cpu"),
])
def test_crossing_a_layer_fails_the_check(plant, broken):
    proc = _check(plant)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert broken in proc.stdout, proc.stdout[-4000:]


def _package_of(path: Path) -> str:
    """The dotted package a module file belongs to, as import-linter's layers name it."""
    rel = path.relative_to(ROOT)
    parts = ["harness_reports", *rel.parts[1:]] if rel.parts[0] == "reports" else list(rel.parts)
    return ".".join(parts[:-1]) if path.name != "__init__.py" or len(parts) > 2 else parts[0]


def _worlds() -> dict[str, list[str]]:
    """Each world and its layers, from pyproject.toml's two layer contracts: the layers only
    the parent has, those only a rank has, and those both share - the vocabulary (the last)
    and the records with their readers (the rest)."""
    parent, rank = LAYERS["parent"], LAYERS["rank"]
    shared = [layer for layer in parent if layer in rank]
    return {"The parent": [layer for layer in parent if layer not in shared],
            "A rank": [layer for layer in rank if layer not in shared],
            "The records and their readers": shared[:-1],
            "The vocabulary": shared[-1:]}


def _world_of(package: str, worlds: dict[str, list[str]]) -> str | None:
    for world, layers in worlds.items():
        for layer in layers:
            for name in re.split(r"\s*[|:]\s*", layer):
                if package == name or package.startswith(name + "."):
                    return world
    return None


def _named_in_doc() -> dict[str, str]:
    """Every module path the doc names in backticks, and the world section it is named in."""
    named: dict[str, str] = {}
    world = None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"^## (.+)$", line)
        if heading:
            world = heading.group(1).strip()
        for path in re.findall(r"`((?:harness|reports)/[\w/]+\.py)`", line):
            named.setdefault(path, world)
    return named


def test_every_module_is_named_in_its_world():
    """A module missing from docs/architecture.md, or named under another world than the one
    its package's layer puts it in, fails here (the doc's world sections are the ``##``
    headings, each listing its modules as paths)."""
    worlds = _worlds()
    named = _named_in_doc()
    missing, misplaced, unplaced = [], [], []
    for path in sorted([*(ROOT / "harness").rglob("*.py"), *(ROOT / "reports").rglob("*.py")]):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("harness/__init__.py", "harness/__main__.py", "harness/cli.py"):
            world = "The parent"
        else:
            world = _world_of(_package_of(path), worlds)
        if world is None:
            unplaced.append(rel)
        elif rel not in named:
            missing.append(rel)
        elif named[rel] != world:
            misplaced.append(f"{rel} (named under {named[rel]!r}, its layer is in {world!r})")
    assert not unplaced, f"modules in no layer of pyproject.toml: {unplaced}"
    assert not missing, f"docs/architecture.md does not name: {missing}"
    assert not misplaced, f"docs/architecture.md names these under the wrong world: {misplaced}"


def test_the_doc_says_the_layer_order_of_pyproject():
    """The doc's ``layers`` block states each contract's order exactly as pyproject.toml has it."""
    block = re.search(r"```text\n(parent: .*?)\n```", DOC.read_text(), re.S)
    assert block, "docs/architecture.md has no ```text block starting 'parent: '"
    stated = {}
    for line in block.group(1).splitlines():
        name, _, order = line.partition(":")
        stated[name.strip()] = [layer.strip() for layer in order.split(">")]
    assert stated == LAYERS


def test_top_of_the_package_holds_only_its_entry():
    assert sorted(p.name for p in (ROOT / "harness").glob("*.py")) == ["__init__.py", "__main__.py", "cli.py"]
