"""The ``te-cpu`` backend: TransformerEngine 2.20.2's real modules on CPU, judged by the harness.

Needs ``python -m harness install te`` (the README's test command runs it). Without TE these
tests fail with that hint - they are never skipped. Importing ``harness.backends.te_cpu.backend`` patches
``torch``, so this process never does: the layer runs in worker ranks (two torchrun launches
here, world sizes 1 and 2) and in short subprocesses, and the last test checks that this
process's ``torch.cuda`` is still the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness.vocabulary import matrix
from harness.vocabulary.backend_specs import BackendError
from harness.orchestration.probe import probe_backend
from harness.install import te as te_component
from harness.launcher.launch import LaunchOptions, launch_cells
from harness.records.record import CellResult

from fixtures.te_script import load_kernels, run_python, run_te_script

ROOT = Path(__file__).resolve().parents[1]
SEED_BUG = "weight was removed while fuse_wgrad_accumulation=True"
#: this process's torch.cuda before any te-cpu run (compared by identity at the end)
_PRISTINE = {"is_available": torch.cuda.is_available, "current_device": torch.cuda.current_device,
             "get_device_properties": torch.cuda.get_device_properties, "empty": torch.empty,
             "to": torch.Tensor.to, "is_cuda": torch.Tensor.__dict__.get("is_cuda")}


@pytest.fixture(autouse=True, scope="module")
def _te_installed() -> None:
    why = te_component.missing()
    if why is not None:
        pytest.fail(f"te-cpu needs TransformerEngine: {why}: run `python -m harness install te`",
                    pytrace=False)


def _python(code: str, env: dict[str, str] | None = None, timeout: float = 300,
            fresh: bool = False) -> subprocess.CompletedProcess:
    """``code`` after its import of te-cpu (``fixtures.te_script.run_python``); ``fresh``: a new
    process, for a script that imports another te-cpu backend first."""
    return run_python(textwrap.dedent(code), {**os.environ, **(env or {})}, timeout, fresh)


@pytest.fixture(scope="module")
def te_cpu_info():
    """One probe of te-cpu for the module's tests (each probe imports TE in a new process)."""
    return probe_backend("te-cpu")


def test_probe_reports_te_version_origin_and_fp32_gemm(te_cpu_info) -> None:
    info = te_cpu_info
    assert (info.module, info.upstream, info.version, info.fp32_gemm, info.device) == (
        "harness.backends.te_cpu.backend", "transformer_engine", "2.20.2", "ieee", "cpu")
    assert Path(info.upstream_origin, "pytorch", "module", "linear.py").is_file()
    assert probe_backend("te-cpu-tf32").fp32_gemm == "tf32"


def test_unsupported_te_version_is_bad_input_with_the_install_hint(tmp_path: Path) -> None:
    """Another TE version first on the path: ``sweep`` exits 2 with one line saying what to
    install, before launching anything."""
    meta = tmp_path / "site" / "transformer_engine-9.9.9.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: transformer_engine\nVersion: 9.9.9\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-m", "harness", "sweep", "--backend", "te-cpu", "--world-sizes", "1",
                           "--modules", "linear", "--out", str(tmp_path / "run")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "9.9.9" in lines[0] and "python -m harness install te" in lines[0], lines
    assert not (tmp_path / "run" / "logs").exists()
    with pytest.raises(BackendError, match="found 9.9.9"):
        probe_backend("te-cpu", env=env)


def test_missing_kernel_and_extension_surface() -> None:
    """In a process with the layer: a TE module whose kernel the layer lacks fails with an
    error naming the extension function and TE's caller; the stand-in answers every name
    TE's sources take from the extension; its enums carry the header values TE reads."""
    proc = _python("""
        import json, sys, torch
        from pathlib import Path
        import harness.backends.te_cpu.backend as backend
        from harness.te_tree import scan as te_tree_scan
        from harness.backends.te_cpu import extension
        te = sys.modules["transformer_engine.pytorch"]
        out = {}
        try:
            te.ops.GELU()(torch.randn(4, 8))
        except extension.MissingCpuKernel as exc:
            out["error"] = str(exc)
        referenced = te_tree_scan.referenced_names(Path(backend.TE_ORIGIN))
        answered = {c.__name__ for c in extension.ENUMS} | set(extension.KERNELS) | set(extension.STUBBED)
        out["referenced"] = len(referenced)
        out["unanswered"] = sorted(referenced - answered - {"*"})
        tex = sys.modules["transformer_engine_torch"]
        out["dtypes"] = {m.name: int(m) for m in tex.DType}
        out["te_dtype_bf16"] = int(te.constants.DType.kBFloat16)
        try:
            getattr(tex, "flash_attention")
        except AttributeError:
            out["unknown_is_attribute_error"] = True
        print(json.dumps(out))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"].startswith("transformer_engine_torch.gelu: no CPU kernel"), out["error"]
    assert "called from transformer_engine/pytorch/ops/basic/activation.py" in out["error"]
    assert out["referenced"] > 150 and out["unanswered"] == []
    assert out["dtypes"] == {"kByte": 0, "kInt32": 2, "kFloat32": 4, "kFloat16": 5, "kBFloat16": 6,
                             "kFloat8E4M3": 7, "kFloat8E5M2": 8, "kFloat4E2M1": 10}
    assert out["te_dtype_bf16"] == 6 and out["unknown_is_attribute_error"]


def test_tf32_backend_rounds_fp32_gemms_and_is_judged_with_tf32_roundoff() -> None:
    """te-cpu-tf32: an fp32 cell's output differs from IEEE fp32 by TF32 rounding (visible),
    passes with the TF32 bound, and would fail the IEEE one."""
    proc = _python(fresh=True, code="""
        import json
        import harness.backends.te_cpu.tf32 as backend
        from harness.vocabulary import matrix
        from harness.cell import compare
        from harness.cell.runner import RankContext, run_cell
        cell = matrix.Cell.from_id("linear-plain-hooks_off-unfused-fp32-ws1-ddp-mb1-g1-nobias-igrad-nodelay")
        res = run_cell(backend, cell, RankContext())
        from harness.cell import oracle
        from harness.cell.inputs import make_inputs
        from harness.vocabulary.shape import Example
        out = [c for c in res.comparisons if c.name == "mb0.output"][0]
        # the same output judged as IEEE fp32: rebuild the module's output from the cell's inputs
        import torch
        inputs = make_inputs(cell.seed, Example(), cell.dtype, 1, 1, 1, False)
        ref = oracle.compute(inputs, 0).outputs[0]
        module = backend.Linear(inputs.weights[0].shape[1], inputs.weights[0].shape[0], bias=False,
                                params_dtype=torch.float32)
        with torch.no_grad():
            module.weight.copy_(inputs.weights[0])
            y = module(inputs.x[0][0])
        ieee = compare.compare_tensor("mb0.output", y, ref, "fp32")
        tf32 = compare.compare_tensor("mb0.output", y, ref, "tf32")
        print(json.dumps({"status": res.status, "fp32_gemm": backend.FP32_GEMM, "max_abs": out.max_abs,
                          "ratio": out.ratio, "same": tf32.max_abs == out.max_abs, "ieee_ratio": ieee.ratio}))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["fp32_gemm"] == "tf32" and out["status"] == "pass" and out["same"], out
    assert out["ieee_ratio"] > 1.0, f"TF32 rounding should exceed the IEEE fp32 bound: {out}"


def _cells(ws: int) -> dict[str, str]:
    """cell id -> what real TE 2.20.2 does with it (CONTRACTS §6)."""
    return {
        f"linear-plain-hooks_offload-unfused-bf16-ws{ws}-ddp-mb2-g1-bias-igrad-nodelay": "pass",
        f"grouped_linear-plain-hooks_identity-fused-bf16-ws{ws}-ddp-mb2-g4-bias-igrad-nodelay": "pass",
        f"ops_grouped_linear-plain-hooks_checkpoint-unfused-fp32-ws{ws}-autograd-mb2-g4-bias-igrad-nodelay": "pass",
        f"grouped_linear-distributed-hooks_off-fused-bf16-ws{ws}-ddp-mb2-g4-bias-igrad-nodelay": "pass",
        # the seed: under any saved-tensor hook TE's backward reads the plain unpacked tensor
        f"grouped_linear-distributed-hooks_offload-fused-bf16-ws{ws}-ddp-mb2-g4-bias-igrad-nodelay": SEED_BUG,
        f"linear-distributed-hooks_identity-fused-bf16-ws{ws}-ddp-mb2-g1-bias-igrad-nodelay":
            "GEMM requested the columnwise representation, but it is unavailable",
    }


@pytest.mark.parametrize("ws", [1, 2])
def test_real_te_modules_under_torchrun(ws: int, tmp_path: Path) -> None:
    """TE's Linear / GroupedLinear / ops.GroupedLinear on plain weights match the float64
    oracle; with GTP weights and a saved-tensor hook the seed's bug shows in TE's own code."""
    expected = _cells(ws)
    results: list[CellResult] = []
    opts = LaunchOptions(backend="te-cpu", run_dir=tmp_path, device="cpu", cell_timeout=240.0)
    launch_cells(ws, [matrix.Cell.from_id(c) for c in expected], opts, results.append)
    got = {r.id: r for r in results}
    assert set(got) == set(expected)
    for cid, want in expected.items():
        res = got[cid]
        if want == "pass":
            assert res.status == "pass", f"{cid}: {res.status}: {res.first_failure}"
            assert res.worst_ratio is not None and res.worst_ratio <= 1.0
        else:
            assert res.status == "error" and want in (res.first_failure or ""), f"{cid}: {res.first_failure}"
            tb = "".join((r.error or {}).get("traceback", "") for r in res.ranks)
            assert "site-packages/transformer_engine/pytorch/" in tb.replace("\\", "/"), tb[-2000:]
    _assert_untouched()


def _assert_untouched() -> None:
    for name in ("harness.backends.te_cpu.backend", "harness.backends.te_cpu.tf32", "transformer_engine", "transformer_engine_torch"):
        assert name not in sys.modules, name
    assert torch.cuda.is_available is _PRISTINE["is_available"]
    assert torch.cuda.current_device is _PRISTINE["current_device"]
    assert torch.cuda.get_device_properties is _PRISTINE["get_device_properties"]
    assert torch.empty is _PRISTINE["empty"] and torch.Tensor.to is _PRISTINE["to"]
    assert torch.Tensor.__dict__.get("is_cuda") is _PRISTINE["is_cuda"]
    assert torch.zeros(1).is_cuda is False


def test_parent_process_torch_is_untouched(te_cpu_info) -> None:
    """After probes, subprocesses and torchrun launches of te-cpu (the launch tests check
    it right after their launch too), this process never imported the layer or TE, and its
    torch.cuda surface is the real one."""
    _assert_untouched()


_MEMO_SCRIPT = '''
import os, torch
import harness.backends.te_cpu.backend  # noqa: F401 (TE on CPU, triton's interpreter with the launch memory)
from harness.backends.te_cpu import kernel_standins, launch_memo
os.environ[launch_memo.CACHE_ENV] = {cache!r}
os.environ[kernel_standins.INTERPRET_ENV] = "1"  # the kernel interpreted: what the memory keeps
from transformer_engine.pytorch.triton.grouped_dbias_dscales import compute_grouped_dbias

g = torch.Generator().manual_seed(7)
dy = torch.randn(12, 30, generator=g).to(torch.bfloat16)
offsets = torch.tensor([0, 3, 3, 10, 12], dtype=torch.int64)
counts = launch_memo.launches()
out = {{}}
out["first"] = compute_grouped_dbias(dy, offsets, 4)
out["after_first"] = (counts.run, counts.remembered)
out["again"] = compute_grouped_dbias(dy.clone(), offsets.clone(), 4)  # other storage, same bytes
out["after_again"] = (counts.run, counts.remembered)
changed = dy.clone()
changed[5, 7] += 1.0
out["changed"] = compute_grouped_dbias(changed, offsets, 4)
start = torch.full((4, 30), 0.5)
out["accumulated"] = compute_grouped_dbias(dy, offsets, 4, dbias=start.clone())
out["after_all"] = (counts.run, counts.remembered)
out["from_disk"] = counts.from_disk
out["dy"], out["changed_dy"] = dy, changed
torch.save(out, os.environ["DW_TE_SCRIPT_OUT"])
'''


def test_a_remembered_kernel_launch_equals_a_fresh_one(tmp_path_factory):
    """te-cpu's launch memory (``harness/backends/te_cpu/launch_memo.py``): TE's bias-gradient kernel
    given byte-identical inputs in other storage is written back, bit for bit the result of
    the first run; one changed input byte, or a different accumulator, runs it afresh - and
    every result is the float64 per-group sum (fp32 column sums of at most 7 bf16 rows). A
    second process with the same cache folder interprets none of them: it reads the first
    process's bytes."""
    cache = str(tmp_path_factory.mktemp("te_memo_cache"))
    out = run_te_script(tmp_path_factory, "te_memo", _MEMO_SCRIPT, timeout=300, cache=cache)
    assert out["after_first"] == (1, 0) and out["after_again"] == (1, 1) and out["after_all"] == (3, 1)
    assert out["from_disk"] == 0 and len(list(Path(cache).rglob("*.pt"))) == 3
    assert torch.equal(out["first"], out["again"])
    again = run_te_script(tmp_path_factory, "te_memo_again", _MEMO_SCRIPT, timeout=300, cache=cache)
    assert again["after_all"] == (0, 4) and again["from_disk"] == 3
    for name in ("first", "again", "changed", "accumulated"):
        assert torch.equal(again[name], out[name]), name
    bounds = [0, 3, 3, 10, 12]

    def sums(dy: torch.Tensor) -> torch.Tensor:
        return torch.stack([dy[a:b].double().sum(0) for a, b in zip(bounds, bounds[1:])])

    for name, dy, start in (("first", out["dy"], 0.0), ("changed", out["changed_dy"], 0.0),
                            ("accumulated", out["dy"], 0.5)):
        ref = sums(dy) + start
        magnitude = torch.stack([dy[a:b].double().abs().sum(0) for a, b in zip(bounds, bounds[1:])]) + start
        err = (out[name].double() - ref).abs()
        assert bool((err <= 9 * 2.0**-24 * magnitude).all()), (name, float(err.max()))
    assert not torch.equal(out["first"], out["changed"])


def test_the_launch_cache_key_holds_the_kernels_source_files(tmp_path):
    """Across processes a launch is keyed by the bytes of the kernel's source file and of the
    helpers it reaches: a tree whose kernel file differs (here only in a helper's constant,
    the kernel's own bytecode unchanged) is another key - also when the helper is reached
    through another ``@jit`` function of the kernel's own file (``.fn``: triton's JITFunction)."""
    import importlib.util

    launch_memo = load_kernels("launch_memo")
    chained = ("from jit import Jit\nimport helpers\n\n"
               "def _inner(x):\n    return x * helpers.SCALE\n\ninner = Jit(_inner)\n\n"
               "def _middle(x):\n    return inner.fn(x)\n\nmiddle = Jit(_middle)\n\n"
               "def kernel(x):\n    return middle.fn(x)\n")
    direct = "import helpers\n\ndef kernel(x):\n    return x * helpers.SCALE\n"

    def kernel_of(folder: str, source: str, scale: int):
        root = tmp_path / folder
        root.mkdir()
        (root / "helpers.py").write_text(f"SCALE = {scale}\n")
        (root / "jit.py").write_text("class Jit:\n    def __init__(self, fn):\n        self.fn = fn\n")
        (root / "kernels.py").write_text(source)
        sys.path.insert(0, str(root))
        try:
            for name in ("helpers", "jit", "kernels"):
                sys.modules.pop(name, None)
            spec = importlib.util.spec_from_file_location("kernels", root / "kernels.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module.kernel
        finally:
            sys.path.remove(str(root))
            for name in ("helpers", "jit"):
                sys.modules.pop(name, None)

    import conftest  # the suite's cache folder is set under the memo's own variable name
    assert conftest._LAUNCH_CACHE == launch_memo.CACHE_ENV
    identity = launch_memo._code_identity
    for i, source in enumerate((direct, chained)):
        one, same, other = (kernel_of(f"{i}{s}", source, scale) for s, scale in (("a", 2), ("b", 2), ("c", 3)))
        assert one.__code__.co_code == other.__code__.co_code
        assert identity(one) == identity(same) != identity(other), source
