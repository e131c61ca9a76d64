"""``python -m harness install megatron`` and the CPU/gloo shims Megatron's class needs.

Why: the component must give a fresh Python 3.11 machine Megatron-Core 0.19.2's sources from
PyPI alone (its wheel is cp312-only), and the shims that let the class run on CPU/gloo must
stay out of every process but the ranks that load it.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import torch

from harness.install import megatron as component

DIST_INFO = "megatron_core-0.19.2.dist-info"


def _fake_cp312_wheel(path: Path) -> Path:
    wheel = path / "megatron_core-0.19.2-cp312-cp312-manylinux_2_28_x86_64.whl"
    files = {
        "megatron/core/tensor_parallel/generalized_tensor_parallelism.py": b"X = 1\n",
        "megatron/core/datasets/helpers_cpp.cpython-312-x86_64-linux-gnu.so": b"\x7fELF",
        f"{DIST_INFO}/WHEEL": b"Wheel-Version: 1.0\nGenerator: setuptools\nRoot-Is-Purelib: false\n"
                              b"Tag: cp312-cp312-manylinux_2_28_x86_64\n\n",
        f"{DIST_INFO}/METADATA": b"Metadata-Version: 2.4\nName: megatron-core\nVersion: 0.19.2\n"
                                 b"Requires-Python: >=3.12\n",
        f"{DIST_INFO}/RECORD": b"",
    }
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


def test_repack_pure_drops_the_compiled_helper_and_retags(tmp_path):
    """The repackaged wheel has no compiled file, is tagged ``py3-none-any`` (pure), admits
    Python 3.10+, says it was repackaged, and its RECORD hashes every file it holds."""
    out = component.repack_pure(_fake_cp312_wheel(tmp_path), tmp_path)
    assert out.name == "megatron_core-0.19.2-py3-none-any.whl"
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        assert not any(n.endswith(".so") for n in names)
        assert "megatron/core/tensor_parallel/generalized_tensor_parallelism.py" in names
        wheel = z.read(f"{DIST_INFO}/WHEEL").decode()
        assert "Tag: py3-none-any" in wheel and "Root-Is-Purelib: true" in wheel
        assert "cp312" not in wheel.replace("from the cp312 wheel", "") and "\n\n" not in wheel
        assert "repackaged by dw-harness" in wheel
        assert "Requires-Python: >=3.10" in z.read(f"{DIST_INFO}/METADATA").decode()
        rows = list(csv.reader(io.StringIO(z.read(f"{DIST_INFO}/RECORD").decode())))
        assert {r[0] for r in rows} == names
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = z.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}" and int(size) == len(data)


def test_component_reports_what_is_missing(monkeypatch):
    """``missing()`` names the absent distribution, a wrong version or absent TE, reading
    metadata only."""
    from harness.vocabulary import weights

    assert component.missing() is None  # the suite runs with `python -m harness install megatron`
    monkeypatch.setattr(weights, "te_installed", lambda: False)
    assert "imports TransformerEngine, which is not installed" in component.missing()
    monkeypatch.setattr(weights, "_megatron_version", lambda: None)
    assert component.missing() == "megatron-core==0.19.2 is not installed"
    monkeypatch.setattr(weights, "_megatron_version", lambda: "0.18.0")
    assert "megatron-core 0.18.0 is installed, the harness needs 0.19.2" == component.missing()


def test_parent_process_is_never_patched():
    """Selecting, attaching plain weights and checking components leave ``torch`` alone:
    the CPU layers are applied only where Megatron's class is loaded (worker ranks).

    Checked in a fresh interpreter, as a parent process is: this test process may have loaded
    te-cpu in-process for another test, which does patch ``torch.cuda``."""
    code = textwrap.dedent("""
        import sys, torch
        from harness.vocabulary import matrix, weights
        from harness.cell import attach, megatron_gtp  # noqa: F401
        matrix.select("ci", {"weight": ["megatron"]})
        weights.unavailable({"megatron"})
        assert torch.cuda.Event.__module__ == "torch.cuda.streams", torch.cuda.Event.__module__
        cm = torch.distributed._coalescing_manager.__module__
        assert cm == "torch.distributed.distributed_c10d", cm
        assert "transformer_engine_torch" not in sys.modules
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]


SHIMS = textwrap.dedent(r'''
    import os, sys, torch, torch.distributed as dist
    dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
    from harness.cell import megatron_shims
    sites = megatron_shims.apply()
    assert megatron_shims.apply() == sites  # idempotent
    e = torch.cuda.Event(external=True); e.record(torch.cuda.current_stream()); e.wait()
    s = torch.cuda.Stream(); s.wait_event(e); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        pass
    p = torch.nn.Parameter(torch.arange(6.).reshape(2, 3))
    out = torch.empty(2, 3)
    dist.all_gather_into_tensor(out, p)  # gloo refuses a requires-grad input without the shim
    assert torch.equal(out, p.detach())
    with dist._coalescing_manager(group=None, device=p.device, async_ops=True) as cm:
        dist.all_gather_into_tensor(out, p.detach() * 2)
    cm.wait()
    assert torch.equal(out, p.detach() * 2)
    print("SITES", sorted(x.target for x in sites))
    # a gloo group left to the interpreter's exit can abort it ("terminate called without an
    # active exception") as its threads are torn down: end it as every rank does
    dist.destroy_process_group()
''')


def test_shims_answer_megatrons_sites_in_a_rank(tmp_path):
    """In a process of its own (as a rank), the shims make events, streams, gloo coalescing
    and a requires-grad all-gather work, and list what they answered."""
    script = tmp_path / "shims.py"
    script.write_text(SHIMS)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("SITES"))
    for target in ("cuda.Event", "cuda.Stream", "cuda.current_stream", "cuda.stream",
                   "distributed._coalescing_manager", "distributed.all_gather_into_tensor"):
        assert target in line


def test_selection_needing_megatron_is_refused_when_it_is_missing(monkeypatch, capsys):
    """``--weights megatron`` without megatron-core is bad input (exit 2) naming the install
    command; harness-only weights need nothing."""
    from harness import cli
    from harness.vocabulary import weights

    monkeypatch.setattr(weights, "_megatron_version", lambda: None)
    why = weights.unavailable({"megatron", "plain"})
    assert why and "python -m harness install megatron" in why
    assert weights.unavailable({"gtp_mcore", "distributed"}) is None
    assert cli.main(["list", "--weights", "megatron"]) == 2
    assert "python -m harness install megatron" in capsys.readouterr().err
