"""TE's Linear under ``Float8CurrentScaling`` through ``--backend te-cpu``, judged by the
quantization-aware oracle (``harness.cell.quantized``), in one sweep of a handful of cells
(two launches) shared by the module.

What must hold: a distributed weight without hooks passes against the oracle of the quantized
operands (output, input gradient, main_grad) - and would not against the unquantized one; the
record says which recipe and device ran; under a saved-tensor hook TE 2.20.2 loses the
DistributedWeight under the recipe too, in the forms the shipped ledger's
``hooks-strip-distributed-weight`` states for recipe cells (silently at world size 1, a GEMM
shape error at 2); the ``none`` cells' ids never change.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fixtures.runs import run_once
from fixtures.te_runs import harness
from harness.records import recordfile
from harness.cell import compare, inputs, oracle
from harness.vocabulary.shape import Example, fitted

CELLS = {
    "linear-distributed-hooks_off-fused-bf16-ws2-ddp-mb2-g1-bias-igrad-nodelay-rcurrent": ("pass", None),
    "linear-plain-hooks_save_on_cpu-unfused-fp16-ws1-autograd-mb2-g1-bias-igrad-nodelay-rcurrent": ("pass", None),
    "linear-distributed-hooks_save_on_cpu-fused-bf16-ws1-ddp-mb2-g1-bias-igrad-nodelay-rcurrent":
        ("known", "hooks-strip-distributed-weight"),
    "linear-distributed-hooks_identity-fused-bf16-ws2-ddp-mb2-g1-bias-igrad-nodelay-rcurrent":
        ("known", "hooks-strip-distributed-weight"),
    "linear-plain-hooks_off-fused-bf16-ws2-ddp-mb2-g1-bias-igrad-nodelay-rdelayed": ("pass", None),
    # TE re-quantizes a DistributedWeight's re-gathered weight with the updated scale
    "linear-distributed-hooks_off-fused-bf16-ws2-ddp-mb2-g1-bias-igrad-nodelay-rdelayed":
        ("known", "delayed-scaling-distributed-dgrad-requantized"),
    # is_first_microbatch: the first microbatch's FP8 weight is multiplied again by the second
    "linear-plain-hooks_off-fused-bf16-ws2-ddp-mb2-g1-bias-igrad-nodelay-rdelayed-fmb": ("pass", None),
    "linear-distributed-hooks_off-fused-bf16-ws2-ddp-mb2-g1-bias-igrad-nodelay-rdelayed-fmb":
        ("known", "delayed-scaling-distributed-dgrad-requantized"),
    # the re-quantize records the backward copy's amax: a tagged copy moves the weight's next scale
    "linear-gtp_tagged-hooks_off-fused-fp32-ws1-ddp-mb2-g1-bias-igrad-nodelay-rdelayed":
        ("known", "delayed-scaling-distributed-dgrad-requantized"),
    # under FP8 a delayed bias gradient is computed in the main backward
    "linear-plain-hooks_off-fused-bf16-ws4-ddp-mb2-g1-bias-igrad-delay-rcurrent":
        ("known", "fp8-delayed-bias-grad-in-main-backward"),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict, int, str]:
    out: dict[str, object] = {}

    def sweep(root: Path) -> None:
        proc = harness("sweep", "--backend", "te-cpu", "--preset", "full", "--recipes", "current,delayed", "--modules", "linear",
                       "--weights", "plain,distributed,gtp_tagged",
                       "--cells", ",".join(CELLS), "--out", str(root / "run"),
                       "--quiet")
        (root / "rc").write_text(str(proc.returncode))
        (root / "out").write_text(proc.stdout + proc.stderr)

    root = run_once(tmp_path_factory, "recipes-te", sweep)
    out = recordfile.read(root / "run")
    return out, int((root / "rc").read_text()), (root / "out").read_text()


def test_recipe_cells_pass_or_are_known(run):
    record, rc, out = run
    assert rc == 0, out[-3000:]  # every failure labelled by the shipped ledger
    got = {c["id"]: (c["status"], c.get("known") or []) for c in record["cells"]}
    for cid, (status, entry) in CELLS.items():
        assert got[cid][0] == status, (cid, got[cid])
        if entry:
            assert entry in got[cid][1], (cid, got[cid])


def test_the_record_names_the_recipe_and_device(run):
    record, _, _ = run
    classes = {"current": "Float8CurrentScaling", "delayed": "DelayedScaling"}
    for c in record["cells"]:
        recipe = c["id"].removesuffix("-fmb").rsplit("-r", 1)[1]
        for r in c["ranks"]:
            assert r["recipe"] == {"recipe": recipe, "te_class": classes[recipe], "device": "sm_90"}


def test_delayed_scaling_requantizes_a_distributed_weight_for_dgrad(run):
    """Delayed scaling: only the input gradients fail, each within the bound of the oracle whose
    dgrad weight is the re-gathered weight quantized with the scale updated after the forward
    (``dgrad_weight_requantized``); output and main_grad hold the plain-weight oracle."""
    record, _, _ = run
    cells = [c for c in record["cells"] if c["id"].startswith("linear-distributed-hooks_off") and "rdelayed" in c["id"]]
    assert len(cells) == 2  # without and with is_first_microbatch
    for cell in cells:
        for r in cell["ranks"]:
            failed = [k for k in r["comparisons"] if not k["ok"]]
            assert failed and all(k["name"].endswith("input_grad") for k in failed), [k["name"] for k in failed]
            assert all(k["models"]["dgrad_weight_requantized"] <= 1 for k in failed)


def test_the_requantize_records_the_backward_copys_amax(run):
    """A tagged weight's backward copy differs from its forward copy: TE's re-quantize records
    its amax, so after a second forward the weight's scale is the model's, not the oracle's
    (``fp8_scales`` fails with exactly the ``dgrad_weight_requantized`` scales)."""
    record, _, _ = run
    cell = next(c for c in record["cells"] if c["id"].startswith("linear-gtp_tagged-hooks_off"))
    for r in cell["ranks"]:
        scales = next(k for k in r["comparisons"] if k["name"] == "fp8_scales")
        assert not scales["ok"] and scales["models"] == {"dgrad_weight_requantized": 0.0}, scales


def test_the_hooked_failure_at_world_size_one_is_silent(run):
    """The step ran to its end: no error, no re-gather and no finalize - the FP8 form of the defect."""
    record, _, _ = run
    cell = next(c for c in record["cells"] if "hooks_save_on_cpu-fused-bf16-ws1-ddp" in c["id"] and "distributed" in c["id"])
    failed = {k["name"] for r in cell["ranks"] for k in r["comparisons"] if not k["ok"]}
    assert cell["ranks"][0]["error"] is None
    assert {"leader.materialize_backward_calls", "leader.finalize_calls", "weight.main_grad"} <= failed


def test_the_unquantized_oracle_would_reject_what_passes():
    """Sensitivity: the quantization is not lost in the tolerance. The forward output of the
    quantized operands is outside the bound of the unquantized oracle in about a third of its elements."""
    example = fitted(Example(), "linear", True, "current")
    cell_inputs = inputs.make_inputs(7, example, "bf16", 1, 1, 1, True, unit=16)
    q = oracle.compute(cell_inputs, 0, recipe="current").outputs[0]
    plain = oracle.compute(cell_inputs, 0).outputs[0]
    outside = (q.value - plain.value).abs() > compare.bound(plain, "bf16")
    assert outside.float().mean() > 0.2  # a third at this seed
    assert example.in_features % 16 == 0 and example.out_features % 16 == 0 and example.rows % 16 == 0
    assert torch.equal(oracle.compute(cell_inputs, 0).outputs[0].value, plain.value)
