"""The warm agent (``harness.launcher.warm``): the backend probe and the first launch's torchrun agent in
one process. What must hold: it describes a backend exactly as the plain probe does, and
fails with the plain probe's one line; the launch it takes looks like a fresh agent's (its
command line names the plan: ``cases/test_loopback.py`` finds the ranks by it); one nobody
takes ends with the process that started it, whatever ended that process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.launcher import warm
from harness.vocabulary import backend_specs
from harness.vocabulary.backend_specs import BackendError
from harness.orchestration.probe import probe_backend

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not warm.supported(), reason="warm agents need forked ranks (Linux)")


def _processes_naming(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(f"{entry.name}: {cmdline}")
    return found


def test_warm_probe_describes_the_backend_as_the_plain_probe_does():
    try:
        assert warm.probe("reference") == probe_backend("reference")
    finally:
        warm._end_all()


@pytest.mark.parametrize("spec", ["no_such_pkg.backend", "te_cpu", "fixtures/no_such_file.py"])
def test_warm_probe_fails_with_the_plain_probes_line(spec):
    """...and a package no folder holds gets that line before any probe
    (``backend_specs.unfound``, what ``sweep`` says at once)."""
    with pytest.raises(BackendError) as plain:
        probe_backend(spec)
    with pytest.raises(BackendError) as warm_error:
        warm.probe(spec)
    assert str(warm_error.value) == str(plain.value)
    assert not _processes_naming(f"--warm {spec}")
    assert backend_specs.unfound(spec) == (None if spec.endswith(".py") else str(plain.value))


def _sweep_with_unique_backend(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    backend = tmp_path / "unique_warm_backend.py"
    shutil.copy(ROOT / "fixtures" / "faults.py", backend)
    cmd = [sys.executable, "-m", "harness", "sweep", "--backend", str(backend), *args,
           "--out", str(tmp_path / "run"), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, backend


def test_an_agent_nobody_takes_ends_with_the_sweep(tmp_path):
    """Bad input found after the probe (a module the backend lacks): exit 2, and the warm
    agent the probe left is gone with the sweep."""
    proc, backend = _sweep_with_unique_backend(tmp_path, "--modules", "no_such_module")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert not _processes_naming(str(backend))


def test_an_agent_nobody_takes_ends_when_its_parent_is_killed(tmp_path):
    """SIGKILL (no atexit) right after the probe, while the agent waits for a launch: it reads
    the end of its stdin and exits."""
    backend = tmp_path / "unique_warm_backend.py"
    shutil.copy(ROOT / "fixtures" / "faults.py", backend)
    parent = textwrap.dedent(f"""
        import os, signal
        from harness.launcher import warm
        warm.probe({str(backend)!r})
        print("probed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", parent], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL and "probed" in proc.stdout, proc.stderr
    deadline = time.monotonic() + 60
    while (left := _processes_naming(str(backend))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left


_PRELOAD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from harness.rank import worker
    from harness.vocabulary import matrix
    from harness.vocabulary.plan import LaunchPlan, PlanTask
    folder, out = Path(sys.argv[1]), []
    for spec, device, *weight in [tuple(a.split("=")) for a in sys.argv[2:]]:
        cell = matrix.select("ci", {"weight": tuple(weight)})[0] if weight else matrix.select("smoke")[0]
        plan = folder / f"{len(out)}.json"
        LaunchPlan(folder, "p", [PlanTask(spec, cell.id)], [], device=device).write(plan)
        out.append([worker.preload(["--plan", str(plan)]), "transformer_engine.pytorch" in sys.modules])
    print(json.dumps(out))
""")


def _preloaded(tmp_path: Path, *plans: str) -> list[list[bool]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", _PRELOAD, str(tmp_path), *plans], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return __import__("json").loads(proc.stdout.strip().splitlines()[-1])


def test_the_agent_imports_te_cpu_for_its_ranks_only_on_a_cpu_plan(tmp_path):
    """``worker.preload`` in torchrun's agent: te-cpu's own import (the same in every rank) is
    done once before the ranks are forked, on a plan for the CPU only - te-cpu answers
    ``torch.cuda`` as a GPU would, so a rank of an ``auto`` plan chooses its device first and
    imports te-cpu itself; an import that fails here says so (False), and the agent then starts
    its ranks as new processes, which fail as they would have."""
    not_a_tree = tmp_path / "not-a-tree"
    not_a_tree.mkdir()
    # a backend whose import may depend on the rank is never imported here; nor is te-cpu's
    # layer for a cell of Megatron's weight where a backend runs a tree this process did not
    # load (a planted fault's): its ranks import TE from the tree
    assert _preloaded(tmp_path, "reference=cpu", f"te-cpu@{not_a_tree}=cpu", "te-cpu=auto",
                      f"harness.backends.te_cpu.mutants:fc2-fix-missing@{not_a_tree}=cpu=megatron",
                      "te-cpu=cpu") == [[True, False], [False, False], [True, False], [True, False], [True, True]]


_PRELOAD_MODES = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from harness.rank import worker
    from harness.vocabulary import matrix
    from harness.vocabulary.plan import LaunchPlan, PlanTask
    folder, hooks = Path(sys.argv[1]), sys.argv[2]
    cell = next(c for c in matrix.select("ci") if c.hooks == hooks)
    plan = folder / "plan.json"
    LaunchPlan(folder, "p", [PlanTask("fixtures.faults", cell.id), PlanTask("fixtures.faults", "not-a-cell")], [],
               device="cpu").write(plan)
    assert "torch._dynamo" not in sys.modules
    ok = worker.preload(["--plan", str(plan)])
    print(json.dumps([ok, "torch._dynamo" in sys.modules]))
""")


@pytest.mark.parametrize("hooks,imported", [("checkpoint", True), ("save_on_cpu", False)])
def test_the_agent_imports_what_a_hook_mode_imports_whatever_the_backend(tmp_path, hooks, imported):
    """A plan with a ``checkpoint`` cell has the agent import ``torch._dynamo`` once before it
    forks the ranks (``torch.utils.checkpoint`` imports it at its first call, in every rank),
    for any backend - a backend of the user's (here the suite's fault backend) as well as the
    reference; a plan without one does not pay it, and an id that names no cell is left to
    the ranks."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", _PRELOAD_MODES, str(tmp_path), hooks], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, imported]


_PRELOAD_MEGATRON = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from harness.cell import hooks, megatron_shims
    from harness.rank import worker
    from harness.vocabulary import matrix, modules
    from harness.vocabulary.plan import LaunchPlan, PlanTask
    folder = Path(sys.argv[1])
    cells = {name: matrix.select("ci", axes)[0] for name, axes in (
        ("plain", {"hooks": ("save_on_cpu",), "weight": ("plain",)}), ("offload", {"hooks": ("mcore_offload",)}),
        ("weight", {"weight": ("megatron",)}), ("layer", {"module": modules.LAYERS}))}
    names = {name: worker._megatron_imports([cell]) for name, cell in cells.items()}
    plan = folder / "plan.json"
    LaunchPlan(folder, "p", [PlanTask("te-cpu", cells["plain"].id)], [], device="cpu").write(plan)
    plain = [worker.preload(["--plan", str(plan)]), "megatron.core" in sys.modules]
    LaunchPlan(folder, "p", [PlanTask("te-cpu", cells["offload"].id)], [], device="cpu").write(plan)
    offload = [worker.preload(["--plan", str(plan)]), hooks.MEGATRON_OFFLOAD in sys.modules]
    print(json.dumps({"names": names, "plain": plain, "offload": offload,
                      "shims": [s.target for s in megatron_shims.applied()]}))
""")


def test_the_agent_imports_megatrons_modules_for_the_cells_that_run_them(tmp_path):
    """On a CPU plan whose TE is loaded, the agent imports the Megatron-Core modules its cells
    import at their first use, once for every rank: none for a plan without such a cell, the
    fine-grained offloading module for an ``mcore_offload`` cell, the GTP module for a cell of
    Megatron's weight, those and the expert layer's for a layer cell. It imports only: the
    stand-ins Megatron's code needs (``megatron_shims``) are still applied by the cell code
    that runs it."""
    from fixtures.te_script import run_python
    from harness.cell import hooks, mlp
    from harness.cell.megatron_gtp import FIRST_USE_IMPORTS as GTP

    code = _PRELOAD_MEGATRON.replace("sys.argv[1]", repr(str(tmp_path)))
    proc = run_python(code, {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["names"] == {"plain": [], "offload": [hooks.MEGATRON_OFFLOAD], "weight": list(GTP),
                            "layer": [*GTP, *mlp.MEGATRON_IMPORTS]}
    assert got["plain"] == [True, False] and got["offload"] == [True, True] and got["shims"] == []
