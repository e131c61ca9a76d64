"""The seed's production combination reproduces its failure: ``sweep --preset seed``.

Megatron-Core's own expert layer, ``TEGroupedMLP`` (TE's real ``GroupedLinear`` through backend
``harness.backends.te_cpu.backend``), its experts sharded by Megatron's own constructor
(``GTPShardedParam``), bf16, 4 experts, fused wgrad, two layers and two microbatches, under
Megatron's own fine-grained activation offloading fails in backward with TE 2.20.2's ``weight
was removed while fuse_wgrad_accumulation=True`` (CONTRACTS §6); the same cell without hooks
passes. Labelling it as a known defect is the ledger's job (CONTRACTS §7): this test only
proves the combination runs and reproduces. Needs ``python -m harness install megatron``.

Why: the seed was seen with exactly these real classes; a harness that cannot reproduce it
with them cannot claim to catch it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.install import megatron as component
from harness.records import recordfile

ROOT = Path(__file__).resolve().parents[1]
SEED_MESSAGE = "weight was removed while fuse_wgrad_accumulation=True"


def test_seed_preset_reproduces_on_te_and_megatron(tmp_path: Path):
    why = component.missing()
    assert why is None, f"Megatron's class is not installed ({why}): run `python -m harness install megatron`"
    out = tmp_path / "seed"
    proc = subprocess.run([sys.executable, "-m", "harness", "sweep", "--preset", "seed", "--world-sizes", "2",
                           "--backend", "harness.backends.te_cpu.backend", "--out", str(out), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    context = f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    cells = {c["axes"]["hooks"]: c for c in recordfile.read(out)["cells"]}
    assert set(cells) == {"mcore_offload", "off"}, context
    for c in cells.values():
        assert (c["axes"]["module"], c["axes"]["weight"], c["axes"]["dtype"], c["axes"]["fused"],
                c["axes"]["num_gemms"], c["axes"]["layers"]) == ("mcore_grouped_mlp", "megatron", "bf16", True, 4, 2)
    hooked = cells["mcore_offload"]
    assert hooked["status"] != "pass" and SEED_MESSAGE in (hooked["first_failure"] or ""), context
    # Megatron's manager installed its hooks and they saw the weight
    assert all(r["hooks"]["installer"] == "megatron" and r["hooks"]["weight_packs"] > 0 for r in hooked["ranks"]), \
        [r.get("hooks") for r in hooked["ranks"]]
    assert cells["off"]["status"] == "pass", f"the control without hooks failed: {cells['off']['first_failure']}"
