"""``sweep --shard K/N`` + ``merge`` give the unsharded sweep's cells and statuses; ``merge``
refuses shard sets that are not one sweep cut N ways (exit 2, nothing written).

One unsharded sweep and three shards of the same selection run as real CLI processes (the
shards side by side, as CI jobs would) against the pre-fix backend, so the statuses differ
from cell to cell (pass, fail, expected error). The refusals are judged on copies of the
shard folders whose records are edited to differ in one respect each.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.vocabulary import matrix
from harness.records import recordfile
from harness.vocabulary import shard
from harness.vocabulary.cost import cell_cost
from fixtures.ledgers import PREFIX_HOOKS_FAILS

ROOT = Path(__file__).resolve().parents[1]
SELECTION = ["--modules", "linear,grouped_linear", "--world-sizes", "1,2", "--dtypes", "bf16", "--recipes", "none", "--first-microbatch", "off",
             "--backend", "harness.backends.reference.prefix", "--quiet"]
N = 3


def _sweep(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", "sweep", *SELECTION, "--out", str(out), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("shards")
    whole = _sweep(root / "whole")
    whole_out, _ = whole.communicate(timeout=600)
    shards = [_sweep(root / f"s{k}", "--shard", f"{k}/{N}") for k in range(1, N + 1)]
    outs = [p.communicate(timeout=600)[0] for p in shards]
    assert [p.returncode for p in shards] == [1] * N, outs
    assert whole.returncode == 1, whole_out
    merged = subprocess.run([sys.executable, "-m", "harness", "merge", *(str(root / f"s{k}") for k in (3, 1, 2)),
                             "--out", str(root / "merged")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return {"root": root, "merged": merged}


def test_shards_merge_to_the_unsharded_sweep(runs):
    root = runs["root"]
    merged = runs["merged"]
    assert merged.returncode == 1, merged.stdout + merged.stderr  # the pre-fix backend fails cells
    whole = recordfile.read(root / "whole")
    joined = recordfile.read(root / "merged")
    assert joined["status"] == "complete" and whole["status"] == "complete"
    assert [(c["id"], c["status"]) for c in joined["cells"]] == [(c["id"], c["status"]) for c in whole["cells"]]
    assert {c["status"] for c in whole["cells"]} >= {"pass", "fail", "xfail"}
    parts = [[c["id"] for c in recordfile.read(root / f"s{k}")["cells"]] for k in range(1, N + 1)]
    assert all(parts) and sum(map(len, parts)) == len(whole["cells"])
    assert set().union(*parts) == {c["id"] for c in whole["cells"]}
    assert [s["shard"] for s in joined["environment"]["shards"]] == [1, 2, 3]
    assert len(joined["launches"]) >= N
    assert (root / "merged" / "report.html").exists() and (root / "merged" / "junit.xml").exists()
    # report and diff work from the compressed records
    assert cli.main(["report", str(root / "merged"), "--to", str(root / "rerendered")]) == 0
    assert cli.main(["diff", str(root / "whole"), str(root / "merged")]) == 0


def test_resume_of_a_finished_shard_runs_nothing(runs):
    run_dir = runs["root"] / "s2"
    before = recordfile.read(run_dir)
    # a finished run keeps its record, not its result stream (harness.orchestration.sweep.retire)
    assert not (run_dir / "cells.jsonl").exists() and not (run_dir / "ranks").exists()
    proc = subprocess.run([sys.executable, "-m", "harness", "sweep", "--resume", str(run_dir), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not (run_dir / "cells.jsonl").exists(), "the resume appended verdicts: it ran cells"
    after = recordfile.read(run_dir)
    assert after["cells"] == before["cells"] and len(after["launches"]) == len(before["launches"])
    assert recordfile.read(run_dir)["selection"]["shard"] == {"index": 2, "count": N}


def _edited_copy(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    record = recordfile.read(dst)
    edit(record)
    recordfile.write(record, dst)
    return dst


def _set(path: str, value):
    def edit(record: dict) -> None:
        *parents, key = path.split(".")
        target = record
        for p in parents:
            target = target[p]
        target[key] = value
    return edit


@pytest.mark.parametrize("case, edit, phrase", [
    ("other selection", _set("selection.filter", 'module == "linear"'), "selection.filter"),
    ("other backend", _set("backend", "harness.backends.reference"), "backend"),
    ("other harness version", _set("environment.harness_version", "0.0.1"), "harness_version"),
    ("other shard count", _set("selection.shard", {"index": 2, "count": 4}), "not one of 3"),
])
def test_merge_refuses_mismatched_shards(runs, tmp_path, capsys, case, edit, phrase):
    root = runs["root"]
    odd = _edited_copy(root / "s2", tmp_path / "odd", edit)
    code = cli.main(["merge", str(root / "s1"), str(odd), str(root / "s3"), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert phrase in err, err
    assert not (tmp_path / "m").exists()


def test_merge_names_missing_and_duplicate_shards(runs, tmp_path, capsys):
    root = runs["root"]
    assert cli.main(["merge", str(root / "s1"), str(root / "s3"), "--out", str(tmp_path / "m")]) == 2
    assert "missing shard(s) 2/3" in capsys.readouterr().err
    assert cli.main(["merge", str(root / "s1"), str(root / "s1"), str(root / "s2"), "--out", str(tmp_path / "m")]) == 2
    assert "shard 1/3 given twice" in capsys.readouterr().err
    assert cli.main(["merge", str(root / "whole"), "--out", str(tmp_path / "m")]) == 2
    assert "is not a shard" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_bad_shard_spec_is_bad_input(capsys):
    for spec in ("0/3", "4/3", "1of3", "2/0"):
        assert cli.main(["list", "--shard", spec]) == 2
        assert "--shard must be K/N" in capsys.readouterr().err


def test_shards_are_deterministic_disjoint_and_balanced():
    # full's first 3,000 cells (world size 1, linear), without making the other 355k first
    cells = matrix.select("full", {"world_size": [1], "module": ["linear"]})[:3000]
    owner = shard.assign(cells, 4)
    assert owner == shard.assign(list(cells), 4)
    parts = [shard.select(cells, shard.Shard(k, 4)) for k in range(1, 5)]
    assert sorted(c.id for p in parts for c in p) == sorted(c.id for c in cells)
    loads = [sum(cell_cost(c) for c in p) for p in parts]
    assert max(loads) - min(loads) <= max(cell_cost(c) for c in cells)


PREFIX_LEDGER = '''
[[entry]]
id = "prefix-hooks"
title = "the pre-fix backend loses the distributed weight under saved-tensor hooks"
upstream = "TE PR #3545 (open)"
row = "_Linear / _GroupedLinear backward decide distributed from the saved tensor"
kind = "defect"
cells = 'weight != "plain" and hooks != "off" and module not in ("ops_grouped_linear", "ops_grouped_linear_tensor") and not delay_wgrad'
''' + PREFIX_HOOKS_FAILS + '''
[[entry]]
id = "never-reproduces"
title = "selects cells of every shard, reproduces in none"
upstream = "unreported"
row = "none"
kind = "defect"
cells = 'module == "linear"'
fails = [{ check = "no.such.check", message = "never fails so" }]
'''


def test_merge_judges_the_ledger_over_every_shard(runs, tmp_path):
    """A shard cannot call an entry stale (it may reproduce in another shard); ``merge``
    judges the shards' ledger over the whole selection."""
    ledger_file = tmp_path / "ledger.toml"
    ledger_file.write_text(PREFIX_LEDGER)
    for k in range(1, N + 1):
        shutil.copytree(runs["root"] / f"s{k}", tmp_path / f"s{k}")
        proc = subprocess.run([sys.executable, "-m", "harness", "sweep", "--resume", str(tmp_path / f"s{k}"), "--quiet",
                               "--ledger", str(ledger_file)], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        shard_ledger = recordfile.read(tmp_path / f"s{k}")["ledger"]
        assert shard_ledger["stale"] == [] and shard_ledger["judged_stale"] is False
    merged = subprocess.run([sys.executable, "-m", "harness", "merge", *(str(tmp_path / f"s{k}") for k in range(1, N + 1)),
                             "--out", str(tmp_path / "merged")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert merged.returncode == 1, merged.stdout + merged.stderr
    joined = recordfile.read(tmp_path / "merged")
    assert joined["ledger"]["stale"] == ["never-reproduces"] and joined["ledger"]["judged_stale"] is True
    assert "never-reproduces (unreported) no longer reproduces" in merged.stderr
    assert {c["status"] for c in joined["cells"]} == {"pass", "xfail", "known"}
    # a shard judged under another ledger is not a shard of the same sweep
    other = tmp_path / "other.toml"
    other.write_text(PREFIX_LEDGER.split("[[entry]]\nid = \"never")[0])
    subprocess.run([sys.executable, "-m", "harness", "sweep", "--resume", str(tmp_path / "s1"), "--quiet",
                    "--ledger", str(other)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    refused = subprocess.run([sys.executable, "-m", "harness", "merge", *(str(tmp_path / f"s{k}") for k in range(1, N + 1)),
                              "--out", str(tmp_path / "merged2")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "ledger" in refused.stderr, refused.stderr
