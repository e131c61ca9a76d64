"""``--sample N[@SEED]``: a deterministic sample of a selection, kept by the run record.

What must hold: the sample is the same cells for the same selection, count and seed (on any
machine: it ranks by sha256), in selection order, and another seed draws others; a bad
``--sample`` is bad input (exit 2, one line); the run record's selection keeps it, so
``--resume`` and ``merge`` of sharded sampled sweeps expand exactly the sampled cells.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.vocabulary import matrix, selection
from harness.records import recordfile

#: this module tests the generator: its selections are made here (conftest.py)
pytestmark = pytest.mark.usefixtures("selections_made_here")

ROOT = Path(__file__).resolve().parents[1]
SELECTION = ["--preset", "full", "--modules", "linear", "--world-sizes", "1", "--dtypes", "bf16",
             "--weights", "plain,distributed", "--sample", "6@3"]


def test_a_sample_is_deterministic_ordered_and_seeded():
    full = matrix.select("full")
    a, b = matrix.sample(full, 50, 7), matrix.sample(full, 50, 7)
    assert a == b and len(a) == 50 and len(set(a)) == 50
    order = {c: i for i, c in enumerate(full)}
    assert [order[c] for c in a] == sorted(order[c] for c in a)
    assert set(matrix.sample(full, 50, 8)) != set(a)
    assert matrix.sample(full[:10], 50) == full[:10]
    assert matrix.parse_sample("2000") == (2000, 0) and matrix.parse_sample("60@37") == (60, 37)


@pytest.mark.parametrize("count,seed", [(1, 0), (50, 7), (806, 2), (807, 0)])
def test_a_sample_is_the_cells_of_smallest_digest(count, seed):
    """The definition, by brute force: the ``count`` cells whose sha256 of ``"SEED:ID"`` is
    smallest, in selection order."""
    ci = matrix.select("ci")
    smallest = set(sorted(ci, key=lambda c: hashlib.sha256(f"{seed}:{c.id}".encode()).digest())[:count])
    assert matrix.sample(ci, count, seed) == [c for c in ci if c in smallest]


@pytest.mark.parametrize("text", ["0", "x", "5@", "5@-1", "-3"])
def test_a_bad_sample_is_one_line_of_bad_input(text, capsys):
    assert cli.main(["list", "--sample", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--sample" in err[0], err


def test_list_shows_the_sample(capsys):
    assert cli.main(["list", *SELECTION]) == 0
    out = capsys.readouterr().out
    want = matrix.sample(matrix.select("full", {"module": ("linear",), "world_size": (1,), "dtype": ("bf16",),
                                                "weight": ("plain", "distributed")}), 6, 3)
    assert [ln.split()[0] for ln in out.splitlines() if ln.count("-") > 8] == [c.id for c in want]


def _harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_resume_and_merge_expand_the_recorded_sample(tmp_path):
    runs = [tmp_path / f"s{k}" for k in (1, 2)]
    for k, run in enumerate(runs, 1):
        proc = _harness("sweep", *SELECTION, "--shard", f"{k}/2", "--out", str(run), "--quiet")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert recordfile.read(run)["selection"]["sample"] == {"count": 6, "seed": 3}
    merged = _harness("merge", *map(str, runs), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stdout + merged.stderr
    listed = _harness("list", *SELECTION).stdout
    # the cells the reference cannot run (TE's and Megatron's installers) are left out of each
    # shard alike, and of the merge
    want = [ln.split()[0] for ln in listed.splitlines() if ln.count("-") > 8]
    want = [c for c in want if not selection.requires(matrix.Cell.from_id(c))]
    assert want and recordfile.read(tmp_path / "merged")["selection"]["left_out"]["cells"] >= 1
    assert [c["id"] for c in recordfile.read(tmp_path / "merged")["cells"]] == want
    before = [c["id"] for c in recordfile.read(runs[0])["cells"]]
    resumed = _harness("sweep", "--resume", str(runs[0]), "--quiet")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert [c["id"] for c in recordfile.read(runs[0])["cells"]] == before
