"""Megatron-Core's one-layer-chunk defect of its fine-grained offloading, as docs/megatron.md
shows it: the page's reproduction (plain PyTorch and Megatron, no TE) raises ``Chunk mismatch``
in its second iteration, and runs clean with two layers per chunk - the ledger entry
``megatron-offload-one-layer-chunk-mismatch`` is Megatron's, not an artefact of the harness's
cells."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.install import megatron as megatron_component

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "megatron.md"
_BLOCK = re.compile(r"<!-- example: run by cases/test_megatron_offload.py -->\n```python\n(.*?)```", re.S)
#: TE blocked (the reproduction needs none), then the CPU's answers for torch.cuda's streams and
#: events, which Megatron's manager creates; then the page's text, unchanged
_PRELUDE = ("import sys; sys.modules['transformer_engine'] = None\n"
            "from harness.cell import megatron_shims; megatron_shims.apply()\n")


def _run(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    why = megatron_component.missing()
    if why is not None:
        pytest.fail(f"Megatron-Core's offloading needs megatron-core: {why}: run `python -m harness install megatron`",
                    pytrace=False)
    script = tmp_path / "chunk_mismatch.py"
    script.write_text(text)
    code = _PRELUDE + f"exec(compile(open({str(script)!r}).read(), {str(script)!r}, 'exec'))"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _block() -> str:
    found = _BLOCK.findall(PAGE.read_text())
    assert len(found) == 1, "docs/megatron.md must hold the chunk-mismatch reproduction once"
    return found[0]


def test_one_layer_per_chunk_fails_the_second_iteration(tmp_path):
    proc = _run(tmp_path, _block())
    assert proc.returncode != 0
    done = [line for line in proc.stdout.splitlines() if line.startswith("iteration")]  # beside Megatron's table
    assert done == ["iteration 0 microbatch 0: ok", "iteration 0 microbatch 1: ok"], proc.stdout
    assert re.search(r"AssertionError: Chunk mismatch <megatron\.core\.pipeline_parallel\.fine_grained_activation_offload"
                     r"\.ChunkOffloadHandler object", proc.stderr), proc.stderr[-3000:]
    assert "harness" not in _block() and "transformer_engine" not in _block()


def test_two_layers_per_chunk_run_clean(tmp_path):
    text = _block().replace("layers = [Expert()]", "layers = [Expert(), Expert()]")
    proc = _run(tmp_path, text)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line for line in proc.stdout.splitlines() if line.startswith("iteration")][-1] == "iteration 1 microbatch 1: ok"
