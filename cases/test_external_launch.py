"""The worker under a user's own torchrun (how multi-node users run it): same verdicts,
folded from the same result stream, and the same exit codes as ``sweep``; it packs the
cells of smaller world sizes onto sub-groups and takes ``--shard``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.records.stream import ResultStream
from harness.vocabulary import modules
from harness.vocabulary.plan import agent_command
from harness.records import recordfile

ROOT = Path(__file__).resolve().parents[1]


def test_worker_runs_under_external_torchrun(tmp_path):
    # plain torchrun with its c10d rendezvous on purpose, as multi-node users run it (so this
    # launch listens on every interface, unlike the harness's own; docs/security.md)
    out = tmp_path / "ext"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", "2", "-m", "harness.rank.external", "--preset", "smoke",
           "--backend", "harness.backends.reference.prefix", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, start_new_session=True)
    # the pre-fix backend fails cells: rank 0 exits 1, as sweep would, and torchrun with it
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = recordfile.read(out)
    assert record["status"] == "complete"
    statuses = {c["id"]: c["status"] for c in record["cells"]}
    # every TE module, hooks off and identity; Megatron's expert layer is left out (it needs TE)
    assert len(statuses) == 2 * (len(modules.NAMES) - len(modules.LAYERS)) and all("-ws2-" in i for i in statuses)
    assert record["selection"]["left_out"]["cells"] == 2 * len(modules.LAYERS)
    # the pre-fix regression shows exactly on the hooked cells of linear/grouped_linear
    for cell_id, status in statuses.items():
        hooked = "hooks_identity" in cell_id and not cell_id.startswith("ops_")
        assert (status not in ("pass", "xfail")) == hooked, (cell_id, status)
    assert (out / "report.html").exists() and (out / "logs" / "external-ws2" / "rank1.log").exists()
    assert {i: r.status for i, r in ResultStream(out).latest().items()} == statuses


def test_external_selection_without_cells_at_this_world_size_is_bad_input(tmp_path):
    cmd = agent_command("--nproc-per-node", "1", "-m", "harness.rank.external", "--preset", "smoke",
                           "--out", str(tmp_path / "x"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, start_new_session=True)
    assert proc.returncode != 0
    assert "no cell at world size 1" in proc.stdout + proc.stderr


def test_external_packs_smaller_world_sizes_and_takes_a_shard(tmp_path):
    # 2 ranks run the shard's ws2 cells on both and its ws1 cells on two sub-groups of one
    out = tmp_path / "packed"
    cmd = agent_command("--nproc-per-node", "2", "-m", "harness.rank.external", "--modules", "linear",
                           "--world-sizes", "1,2", "--dtypes", "bf16", "--hooks", "off,identity",
                           "--shard", "1/2", "--out", str(out))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = recordfile.read(out)
    assert record["status"] == "complete" and record["selection"]["shard"] == {"index": 1, "count": 2}
    assert {c["axes"]["world_size"] for c in record["cells"]} == {1, 2}
    assert all(c["status"] in ("pass", "xfail") for c in record["cells"])
    logs = (out / "logs" / "external-ws2" / "rank1.log").read_text()
    assert "lane [1]" in logs and "lane [0, 1]" in logs, logs[-2000:]


def _ledger(tmp_path):
    from fixtures.ledgers import PREFIX_HOOKS_FAILS

    path = tmp_path / "prefix.toml"
    path.write_text('[[entry]]\nid = "prefix-hooks"\ntitle = "pre-fix hooks"\nupstream = "unreported"\n'
                    'row = "planted"\nkind = "defect"\n'
                    'cells = \'weight != "plain" and hooks != "off" and module != "ops_grouped_linear" '
                    'and module != "ops_grouped_linear_tensor"\'\n' + PREFIX_HOOKS_FAILS
                    + 'where = "harness/backends/reference/prefix.py"\ncontract = "CONTRACTS §2"\n')
    return path


def test_external_s_record_is_sweep_s(tmp_path):
    """The same cells under the same ledger: the same statuses, known entries, ledger outcome
    and exit code from ``harness.rank.external`` as from ``sweep`` (one record builder, one gate)."""
    ledger = _ledger(tmp_path)
    ext, swept = tmp_path / "ext", tmp_path / "sweep"
    cmd = agent_command("--nproc-per-node", "2", "-m", "harness.rank.external", "--preset", "smoke",
                           "--backend", "harness.backends.reference.prefix", "--ledger", str(ledger), "--out", str(ext))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, "-m", "harness", "sweep", "--preset", "smoke", "--backend",
                           "harness.backends.reference.prefix", "--ledger", str(ledger), "--out", str(swept), "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    a, b = recordfile.read(ext), recordfile.read(swept)
    same = lambda r: {c["id"]: (c["status"], c.get("known"), c.get("raw_status")) for c in r["cells"]}  # noqa: E731
    assert same(a) == same(b) and "known" in {s for s, _, _ in same(a).values()}
    outcome = lambda r: [(e["id"], e["verdict"], e["stale"], e["reproduced"]) for e in r["ledger"]["entries"]]  # noqa: E731
    assert outcome(a) == outcome(b)
    assert a["tolerance"] == b["tolerance"] and a["environment"]["backend_info"]["spec"] == "harness.backends.reference.prefix"


def test_a_harness_bug_under_external_exits_3(tmp_path):
    out = tmp_path / "bug"
    cmd = agent_command("--nproc-per-node", "1", "-m", "harness.rank.external", "--preset", "full",
                           "--modules", "linear", "--world-sizes", "1", "--dtypes", "bf16", "--hooks", "off",
                           "--weights", "plain", "--fused", "off", "--consumers", "autograd", "--microbatches", "1",
                           "--bias", "on", "--input-grad", "on", "--delay-wgrad", "off",
                           "--backend", str(ROOT / "fixtures" / "harness_bug.py"), "--out", str(out))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert "exitcode: 3" in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {c["status"] for c in recordfile.read(out)["cells"]} == {"harness_error"}
