"""Reviewing a fix in TE's own code, end to end as a reviewer runs it: ``patch-te`` makes a TE
2.20.2 tree with our hook-safe DistributedWeight fix, ``sweep --te-tree ... --fixes ...``
judges it per ledger entry, and the verdict is green only for a fix that fixes what it must
and breaks nothing.

Three trees, each a git checkout made from the installed wheel:

* **fixed**: the shipped patch. Over the ``ci`` preset the seed's hook entry and the
  ``LayerNormLinear`` hook entry are *fixed here*, the entries the patch does not address are
  *still failing*, and no cell that passes on the unpatched wheel fails (exit 0).
* **broken**: the same patch without ``_GroupedLinear.backward``'s preference for the weights
  kept on ``ctx`` (one hunk reverted): red, naming the hook entry as still failing.
* **planted**: the unpatched wheel with two regressions planted inside ``known`` cells: Linear's
  wgrad multiplied by ``1 + 2**-6`` before finalize - less than the bf16 rounding the
  wgrad-dtype entry predicts moves it by a few times, yet every cell of that entry is a
  regression, because the entry states the rounding as a model, not a band - and a different
  exception in a must-raise cell of the delayed-wgrad entry: red, each cell named as a
  regression, with the entry's form nearest to it.
* **broken check**: the shipped patch whose new delayed-wgrad rejection calls a helper that
  does not exist: the ``NameError`` names both "delay" and "distributed", but a programming
  error is never the rejection the contract asks for: red, the entry not fixed here.

The fixed tree is also reviewed where TE cannot take its grouped-tensor path (te-cpu answering
cuBLASLt 12.9.1, ``DW_TE_CPU_CUBLASLT``, as on most CUDA 12 machines): the fix of
``grouped-tensor-path-no-distributed-weight-handling`` never runs there, so every grouped-tensor
cell is "path not taken" with TE's reason and the review requiring that entry is red - judged
once with te-cpu's kernel evidence and once from TE's recorded choice alone
(``DW_TE_CPU_EVIDENCE=off``), the route a GPU run takes.

A tree that does not import is ``cases/test_te_tree.py``'s; the unpatched wheel's ``ci`` sweep
(exit 0 under the ledger) is ``cases/test_ledger_te.py``'s, shared here through ``te_runs``.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures import reproduction
from fixtures.te_runs import SHIPPED, harness, te_runs  # noqa: F401 (a fixture)
from harness.install import te as te_component

ROOT = Path(__file__).resolve().parents[1]
PATCH = ROOT / "harness" / "te_tree" / "patches" / "transformer_engine-2.20.2-dw-fix.patch"
LINEAR = "transformer_engine/pytorch/module/linear.py"
GROUPED = "transformer_engine/pytorch/module/grouped_linear.py"
HOOK_ENTRIES = ["hooks-strip-distributed-weight", "hooks-strip-distributed-weight-layernorm"]
#: what the patch leaves alone (a Python fix cannot reach them, or they are not DW handling)
UNADDRESSED = ["backward-dw-assigns-grad", "grouped-tensor-delayed-bias-marked-but-not-delayed",
               # where an FP8 delayed bias gradient is computed, and which dtype an fp32 layer's
               # bias enters an FP8 GEMM in - not distributed-weight handling
               "fp8-delayed-bias-grad-in-main-backward", "ops-grouped-fp8-gemm-fp32-bias",
               # TE's v1 CPU offloading and Megatron's offloading manager: the installers'
               # own defects, not the layers' handling of a distributed weight
               "cpu-offload-v1-clears-cached-fp8-weight", "megatron-offload-one-layer-chunk-mismatch",
               # distributed-weight handling the shipped patch does not change (yet; its header says
               # so): the grouped-tensor op's dgrad operand (hunk 19 fixes the split path's only),
               # and the FP8 alignment check on the shard - both select ci cells, so the day the
               # patch fixes either, this test fails until the entry moves out of this list
               "ops-grouped-tensor-distributed-dgrad-weight-unquantized", "fp8-alignment-checked-on-distributed-shard"]
#: the hunk of the patch that makes _GroupedLinear.backward (split-quantize path) prefer ctx's weights
GROUPED_PREFERENCE = "decide from the parameter objects kept on ctx"
GROUPED_HOOKED = ["--preset", "ci", "--modules", "grouped_linear", "--weights", "distributed",
                  "--hooks", "identity,offload,save_on_cpu,checkpoint", "--delay-wgrad", "off",
                  "--input-grad", "on", "--world-sizes", "1,2"]
#: the entry whose cells the planted wgrad regresses, and a must-raise cell of
#: delayed-wgrad-distributed-not-rejected (known on the unpatched wheel: te_runs' ci sweep)
WGRAD_ENTRY = "unfused-wgrad-activation-dtype-linear"
RAISE_CELL = "linear-distributed-hooks_off-fused-fp32-ws1-ddp-mb1-g1-nobias-noigrad-delay"
#: Megatron-Core's weight re-registers the weights behind the biases: the ops.GroupedLinear cells
#: of ci with bias (at world size 2) are where TE 2.20.2 hands a bias a weight's gradient
ORDER_ENTRY = "ops-grads-in-registration-order-assumed"
MEGATRON_OPS = ["--preset", "ci", "--weights", "megatron", "--filter",
                'module in ("ops_grouped_linear", "ops_grouped_linear_tensor") and bias and not delay_wgrad '
                'and world_size == 2']
PLANTS = [  # (anchor line in the unpatched linear.py, what goes before it)
    ("                # Distributed weight (e.g. GTP): reduce-scatter the freshly computed wgrad\n",
     "                wgrad = wgrad * (1 + 2**-6)  # planted regression: a wgrad off by 1.6%\n"),
    ("            wgrad_store = self.wgrad_store if self.wgrad_store.delay_wgrad_compute() else None\n",
     "            if self.wgrad_store.delay_wgrad_compute():  # planted regression: another exception\n"
     "                raise ValueError(\"planted: not the rejection the ledger knows\")\n"),
]


#: the shipped patch's rejection in linear.py, and the broken helper call planted before it
REJECTION = "        raise NotImplementedError(\n            \"delay_wgrad_compute=True is not supported with a DistributedWeight \"\n"
BROKEN_CHECK = "        check_delay_wgrad_distributed(args)  # planted: the new check calls a helper that does not exist\n"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def _hunk(patch: str, path: str, marker: str) -> str:
    """The file header of ``path`` in ``patch`` plus its one hunk containing ``marker``."""
    section = next(s for s in re.split(r"(?m)^(?=diff --git )", patch) if s.startswith(f"diff --git a/{path} "))
    header, *hunks = re.split(r"(?m)^(?=@@ )", section)
    (hunk,) = [h for h in hunks if marker in h]
    return header + hunk


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    why = te_component.missing()
    if why is not None:
        pytest.fail(f"reviewing TE needs TransformerEngine: {why}: run `python -m harness install te`", pytrace=False)
    base = tmp_path_factory.mktemp("review-te")
    fixed = base / "fixed"
    proc = harness("patch-te", str(fixed))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"applied 49/49 hunk(s) of {PATCH}" in proc.stdout, proc.stdout

    # each tree is a copy of the patched one (its repository and patch-te's byte-compiled
    # modules: only the files a tree changes compile again in its ranks), changed and committed
    broken = base / "broken"
    shutil.copytree(fixed, broken)
    reverse = base / "grouped-preference.patch"
    reverse.write_text(_hunk(PATCH.read_text(), GROUPED, GROUPED_PREFERENCE))
    _git(broken, "apply", "-R", str(reverse))
    _git(broken, "commit", "-qam", "the fix without GroupedLinear's backward preference")

    planted = base / "planted"
    shutil.copytree(fixed, planted)
    _git(planted, "checkout", "-q", "HEAD~1")  # the wheel as installed, unpatched
    text = (planted / LINEAR).read_text()
    for anchor, plant in PLANTS:
        assert text.count(anchor) == 1, anchor
        text = text.replace(anchor, plant + anchor)
    (planted / LINEAR).write_text(text)
    _git(planted, "commit", "-qam", "two planted regressions")

    broken_check = base / "broken-check"
    shutil.copytree(fixed, broken_check)
    text = (broken_check / LINEAR).read_text()
    assert text.count(REJECTION) == 1
    (broken_check / LINEAR).write_text(text.replace(REJECTION, BROKEN_CHECK + REJECTION))
    _git(broken_check, "commit", "-qam", "the rejection's helper does not exist")
    return {"fixed": fixed.resolve(), "broken": broken.resolve(), "planted": planted.resolve(),
            "broken_check": broken_check.resolve(), "base": base}


def _sweep(tree: Path | None, out: Path, *args: str,
           env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    backend = ["--backend", "te-cpu"] + (["--te-tree", str(tree)] if tree else [])
    proc = harness("sweep", *backend, *args, "--out", str(out), "--quiet", env=env)
    with gzip.open(out / "results.json.gz", "rt") as fh:
        return proc, json.load(fh)


def _verdicts(out: str) -> dict[str, str]:
    """Entry id -> verdict from the terminal's ledger table."""
    found = {}
    for line in out.splitlines():
        m = re.match(r"^\s*\*?([a-z0-9-]+)\s+.*?\s(fixed here|still failing|not exercised)\s", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def _statuses(record: dict) -> dict[str, str]:
    return {c["id"]: c["status"] for c in record["cells"]}


def test_patched_tree_fixes_the_hook_entries_and_breaks_nothing(trees, request, tmp_path):
    # te_runs (the unpatched wheel's sweeps) is asked for after this sweep: under xdist the
    # two run side by side on the two workers instead of one after the other
    proc, record = _sweep(trees["fixed"], tmp_path / "run", "--preset", "ci", "--fixes", ",".join(HOOK_ENTRIES))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "review GREEN: 2 of 2 required entries fixed here, 0 regression(s)" in out, out[-4000:]
    verdicts = _verdicts(proc.stdout)
    assert set(verdicts) == {e.id for e in SHIPPED.entries}
    assert {e: verdicts[e] for e in HOOK_ENTRIES} == dict.fromkeys(HOOK_ENTRIES, "fixed here")
    assert {e: verdicts[e] for e in UNADDRESSED} == dict.fromkeys(UNADDRESSED, "still failing")
    assert "still failing" not in {v for e, v in verdicts.items() if e not in UNADDRESSED}, verdicts
    # every cell of the hook entries passes here; none that passes on the unpatched wheel fails
    base_run, base_rc, _ = request.getfixturevalue("te_runs")["ci"]
    assert base_rc == 0
    with gzip.open(base_run / "results.json.gz", "rt") as fh:
        base = _statuses(json.load(fh))
    now = _statuses(record)
    assert set(now) == set(base)
    worse = {c: (base[c], now[c]) for c in base if base[c] in ("pass", "xfail") and now[c] != base[c]}
    assert worse == {}
    hooked = {c for c, s in base.items() if s == "known" and "distributed-hooks_" in c and "hooks_off" not in c
              and c.startswith(("linear-", "grouped_linear-", "layernorm_linear-", "rmsnorm_linear-"))}
    assert hooked and {c: now[c] for c in hooked if now[c] not in ("pass", "xfail")} == {}
    # the verdict is at the top of each report, and names the tree
    summary = (tmp_path / "run" / "summary.md").read_text()
    head = summary[:summary.index("| entry |")]
    assert "Review: GREEN: 2 of 2 required entries fixed here, 0 regression(s)" in head
    assert f"TE tree under review: `{trees['fixed']} at " in head
    assert "|\n\n| pass | expected error met |" in summary  # the two tables stay apart
    html = (tmp_path / "run" / "report.html").read_text()
    assert 'id="review"' in html and html.index('id="review"') < html.index('id="matrix"')
    junit = (tmp_path / "run" / "junit.xml").read_text()
    assert 'name="review" value="GREEN' in junit and f'name="te_tree" value="{trees["fixed"]}' in junit


def test_a_broken_fix_is_red_and_names_the_entry(trees, tmp_path):
    proc, record = _sweep(trees["broken"], tmp_path / "run", *GROUPED_HOOKED,
                          "--fixes", "hooks-strip-distributed-weight")
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert _verdicts(proc.stdout)["hooks-strip-distributed-weight"] == "still failing"
    assert "review RED: 0 of 1 required entries fixed here, 0 regression(s)" in proc.stdout
    assert ("dw-harness: ledger entry hooks-strip-distributed-weight must be fixed by this change but is still "
            "failing") in proc.stderr
    assert record["cells"] and {c["status"] for c in record["cells"]} == {"known"}
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert "Review: RED: 0 of 1 required entries fixed here" in summary[:summary.index("| entry |")]


def test_regressions_planted_in_known_cells_are_red_and_named(trees, te_runs, tmp_path):
    base_run, _, _ = te_runs["ci"]
    with gzip.open(base_run / "results.json.gz", "rt") as fh:
        unpatched = {c["id"]: (c["status"], c.get("known")) for c in json.load(fh)["cells"]}
    wgrad_cells = sorted(c for c, (status, known) in unpatched.items() if known == [WGRAD_ENTRY])
    assert len(wgrad_cells) >= 4 and all(unpatched[c][0] == "known" for c in wgrad_cells)
    assert unpatched[RAISE_CELL] == ("known", ["delayed-wgrad-distributed-not-rejected"])

    proc, record = _sweep(trees["planted"], tmp_path / "run", "--preset", "ci", "--cells",
                          ",".join([*wgrad_cells, RAISE_CELL]))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert _statuses(record) == dict.fromkeys([*wgrad_cells, RAISE_CELL], "fail")
    n = len(wgrad_cells) + 1
    assert f"{n} cell(s) fail without a ledger entry (regressions)" in proc.stdout
    assert "raised ValueError: planted: not the rejection the ledger knows" in proc.stdout
    # each regressed wgrad cell names what no entry explains: main_grad beyond the modelled rounding
    for c in record["cells"]:
        if c["id"] in wgrad_cells:
            assert c["first_failure"].startswith("unexplained by the ledger: rank "), c["first_failure"]
            assert f'nearest: {WGRAD_ENTRY} {{ check = "weight.main_grad", model = "wgrad_in_activation_dtype"' \
                in c["first_failure"], c["first_failure"]
            ratios = [ch["models"]["wgrad_in_activation_dtype"] for r in c["ranks"] for ch in r["comparisons"]
                      if ch["name"] == "weight.main_grad"]
            assert min(ratios) > 10, (c["id"], ratios)
    summary = (tmp_path / "run" / "summary.md").read_text()
    head = summary[:summary.index("| entry |")]
    assert f"Review: RED: 0 of 0 required entries fixed here, {n} regression(s)" in head
    regressions = summary[summary.index(f"**Regressions** ({n})"):]
    assert all(f"`{c}`" in regressions for c in [*wgrad_cells, RAISE_CELL])


def test_a_broken_rejection_check_is_not_the_expected_error(trees, tmp_path):
    proc, record = _sweep(trees["broken_check"], tmp_path / "run", "--preset", "ci", "--cells", RAISE_CELL,
                          "--fixes", "delayed-wgrad-distributed-not-rejected")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert _statuses(record) == {RAISE_CELL: "fail"}
    assert _verdicts(proc.stdout)["delayed-wgrad-distributed-not-rejected"] != "fixed here"
    assert "review RED: 0 of 1 required entries fixed here, 1 regression(s)" in proc.stdout, out[-4000:]
    assert "NameError: name 'check_delay_wgrad_distributed' is not defined is a programming error" in proc.stdout


GROUPED_ENTRY = "grouped-tensor-path-no-distributed-weight-handling"
#: three ci cells on the grouped-tensor paths: two the entry selects, one of the op fuser's
TENSOR_CELLS = ["grouped_linear_tensor-distributed-hooks_off-fused-bf16-ws2-ddp-mb2-g4-bias-igrad-nodelay",
                "grouped_linear_tensor-distributed-hooks_identity-unfused-bf16-ws2-ddp-mb2-g4-bias-igrad-nodelay",
                "ops_grouped_linear_tensor-distributed-hooks_off-fused-bf16-ws2-ddp-mb2-g4-bias-igrad-nodelay"]
#: what TE 2.20.2 says on such a machine, per layer (its path predicate, the inputs it saw)
TE_SAYS = ("TE chose the split-quantize path: cuBLASLt 12.9.1 < 13.3 required for the grouped GEMM (TE's "
           "is_{}_grouped_tensor_path_supported saw torch.bfloat16, sm_90, cuBLASLt 12.9.1: False)")


def test_a_fix_whose_path_te_cannot_take_is_not_exercised_and_red(trees, tmp_path):
    runs = {}
    for evidence in ("on", "off"):
        out = tmp_path / f"evidence-{evidence}"
        proc, record = _sweep(trees["fixed"], out, "--preset", "ci", "--cells", ",".join(TENSOR_CELLS),
                              "--fixes", GROUPED_ENTRY,
                              env={"DW_TE_CPU_CUBLASLT": "12.9.1", "DW_TE_CPU_EVIDENCE": evidence})
        text = proc.stdout + proc.stderr
        assert proc.returncode == 1, text[-4000:]
        cells = {c["id"]: c for c in record["cells"]}
        assert set(cells) == set(TENSOR_CELLS) and {c["status"] for c in cells.values()} == {"path_not_taken"}
        for cid, c in cells.items():
            says = TE_SAYS.format("op_fuser" if cid.startswith("ops_") else "module")
            assert c["first_failure"] == f"[rank 0] {says}"
            for rank in c["ranks"]:  # TE's recorded choice on every rank; kernels only where counted
                assert rank["choice"]["path"] == "split_quantize" and rank["choice"]["reason"] == says
                if evidence == "on":
                    assert rank["path"].get("te_general_grouped_gemm") and not any(
                        k.startswith("te_general_grouped_gemm_for") for k in rank["path"]), rank["path"]
                else:
                    assert "path" not in rank
        assert _verdicts(proc.stdout)[GROUPED_ENTRY] == "not exercised"
        assert "review RED: 0 of 1 required entries fixed here, 0 regression(s)" in proc.stdout
        why = (f"ledger entry {GROUPED_ENTRY} must be fixed by this change but is not exercised (its 2 of 2 cell(s) "
               f"took another TE path than they name: {TE_SAYS.format('module')})")
        assert why in proc.stdout
        assert "3 cell(s) did not run the TE path they name" in proc.stdout
        summary = (out / "summary.md").read_text()
        assert "### Path not taken (3)" in summary and "2 cell(s) took another TE path" in summary
        assert 'id="not-taken"' in (out / "report.html").read_text()
        junit = (out / "junit.xml").read_text()
        assert junit.count('<skipped message="path not taken: TE chose the split-quantize path') == 3
        runs[evidence] = {cid: (c["status"], c["first_failure"]) for cid, c in cells.items()}
    assert runs["off"] == runs["on"]  # the ctx flags alone judge as the kernels and flags together



def test_patched_tree_with_megatrons_weight_fixes_the_parameter_order(trees, tmp_path):
    """Megatron-Core's real weight on the patched tree: the op-fuser's gradients follow the
    parameters, so the ops cells with bias pass and the review requiring the entry is GREEN;
    the plain-TE reproduction of docs/megatron.md runs to the end."""
    proc, record = _sweep(trees["fixed"], tmp_path / "run", *MEGATRON_OPS, "--fixes", ORDER_ENTRY)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "review GREEN: 1 of 1 required entries fixed here, 0 regression(s)" in out, out[-4000:]
    assert _verdicts(proc.stdout)[ORDER_ENTRY] == "fixed here"
    # every cell passes but those known by entries the patch leaves (UNADDRESSED): an fp32 one
    # under a recipe (the bias entry), and - since the grouped-tensor values run under recipes -
    # the grouped-tensor op's recipe cells, whose dgrad of the unquantized re-gathered weights is
    # refused before any gradient reaches autograd (so the parameter order cannot show there)
    statuses = _statuses(record)
    assert len(record["cells"]) >= 10 and set(statuses.values()) <= {"pass", "known"}
    dgrad_first = {c["id"] for c in record["cells"] if c["axes"]["module"] == "ops_grouped_linear_tensor"
                   and c["axes"].get("recipe", "none") != "none"}
    for cell in record["cells"]:
        if cell["id"] in dgrad_first:
            assert statuses[cell["id"]] == "known", cell["id"]
            assert cell["known"] == ["ops-grouped-tensor-distributed-dgrad-weight-unquantized"], cell["id"]
        elif statuses[cell["id"]] == "known":
            assert cell["known"] == ["ops-grouped-fp8-gemm-fp32-bias"], cell["id"]
    # the order entry is fixed where it can show: the ops cells without a recipe pass
    assert any(statuses[c["id"]] == "pass" for c in record["cells"] if c["axes"].get("recipe", "none") == "none"
               and c["axes"]["module"] == "ops_grouped_linear_tensor")
    repro = reproduction.run(tmp_path, tree=trees["fixed"])
    assert repro.returncode == 0, repro.stderr[-3000:]
    assert repro.stdout.splitlines() == reproduction.ORDERS

