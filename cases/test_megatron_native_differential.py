"""The harness's native stand-in (weight ``gtp_mcore_fp8``) equals Megatron-Core's native-FP8
GTP path (weight ``megatron_fp8``), call by call.

Launches ``fixtures/megatron_native_differential.py`` under torchrun + gloo on te-cpu at world
sizes 2 and 4: under current scaling, delayed scaling and MXFP8, for groups of 1 (``Linear``)
and 3 (``GroupedLinear``), with Megatron's ``async_reduction`` off and on, both implementers
get shards quantized from the same values by TE's ``quantized_model_init`` and the same
protocol calls, and must hand out bitwise-identical gathers (quantized data, scales,
transposes and dequantized values), wgrads after finalize and ``main_grad`` contents, with
identical structure and flags - except in the later forwards under a per-tensor recipe, where
Megatron reads a prefetch buffer TE never wrote (its ledger entry): there the stand-in's gathers
must equal its first and Megatron's hold NaN. Two negative controls (the stand-in without in-place scaling,
or synchronous) must differ.

Why: ``gtp_mcore_fp8`` lets every native cell be judged without Megatron installed, and tells
Megatron's own defects (``megatron-native-fp8-padding-unsupported``) from the path's; this
proves it is that path where Megatron runs. Needs ``python -m harness install`` (TE and
Megatron-Core; the README's test command runs it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.process_group import run_torchrun
from harness.install import megatron as component

SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "megatron_native_differential.py"
TIMEOUT_S = 300.0


@pytest.mark.parametrize("world_size", [2, 4])
def test_gtp_mcore_fp8_is_bitwise_megatrons_native_path(world_size, tmp_path):
    why = component.missing()
    assert why is None, f"Megatron's class is not installed ({why}): run `python -m harness install megatron`"
    result = run_torchrun(SCRIPT, world_size, timeout_s=TIMEOUT_S, args=(str(tmp_path),), forked=True)
    context = f"rc={result.returncode}\nstderr:\n{result.stderr[-4000:]}"
    by_rank = {r["rank"]: r for r in (json.loads(f.read_text()) for f in sorted(tmp_path.glob("rank*.json")))}
    assert sorted(by_rank) == list(range(world_size)), context
    for rank, rec in sorted(by_rank.items()):
        assert rec["error"] is None, f"rank {rank} raised:\n{rec['error']}"
        assert [c["config"] for c in rec["configs"]] == [
            f"{r}-g{g}-{m}" for r in ("current", "delayed", "mxfp8") for g in (1, 3) for m in ("sync", "async")]
        for cfg in rec["configs"]:
            assert cfg["comparisons"] >= 40, cfg
            assert not cfg["mismatches"], f"rank {rank} {cfg['config']}: {cfg['mismatches'][:5]}"
            # Megatron's prefetch defect shows in every per-tensor configuration, and only there
            assert cfg["prefetch_defect"] is (None if cfg["config"].startswith("mxfp8") else True), cfg
        assert all(n > 0 for n in rec["controls"].values()), f"a control did not differ: {rec['controls']}"
    assert result.returncode == 0, context
