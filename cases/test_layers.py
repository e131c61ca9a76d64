"""The import layers of pyproject.toml hold, and crossing one fails the check (import-linter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _check(*plants: str) -> subprocess.CompletedProcess:
    args = [a for p in plants for a in ("--plant", p)]
    return subprocess.run([sys.executable, str(ROOT / ".ci" / "check_layers.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_every_layer_contract_is_kept():
    proc = _check()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "6 kept, 0 broken" in proc.stdout


@pytest.mark.parametrize("plant, broken", [
    ("harness.worker:harness.cli", "harness.worker is not allowed to import harness.cli"),
    ("harness.stream:harness.launcher.launch", "harness.stream is not allowed to import harness.launcher:"),
    ("harness.reports._common:torch", "harness.reports is not allowed to import torch"),
    ("harness.te_tree_scan:torch", "harness.te_tree_scan is not allowed to import torch"),
    # rooms by role: a parent-side module that reaches into what runs inside a rank
    ("harness.sweep:harness.rank.runner", "harness.sweep is not allowed to import harness.rank"),
    ("harness.launcher.launch:harness.rank.oracle", "harness.launcher is not allowed to import harness.rank"),
    ("harness.reports.html:harness.rank.compare", "harness.reports is not allowed to import harness.rank"),
    # the vocabulary and the records stay free of torch
    ("harness.matrix:torch", "harness.matrix is not allowed to import torch"),
    ("harness.plan:torch", "harness.plan is not allowed to import torch"),
])
def test_crossing_a_layer_fails_the_check(plant, broken):
    proc = _check(plant)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert broken in proc.stdout, proc.stdout[-4000:]
