"""The CI gate's whole-selection checks on other backends, as tests of the suite.

- The pre-fix backend through pytest (the README's pytest route, ``--backend
  harness.reference.prefix``): it fails exactly the cells the seed's regression predicts
  (``.ci/check_prefix.py``: hooked distributed cells of the classes whose backward asks the
  saved tensor) and passes every other.
- Megatron-Core's real ``GTPShardedParam`` as the weight of every ``ci`` cell it can take,
  on the reference backend: exit 0.

Why here and not after the suite in ``.ci/run``: they ran alone after it, while the suite
leaves a core idle whenever its fault tests wait out a grace period; as tests they fill
that time. Their records go to ``$DW_ARTIFACT_DIR`` when set (CI keeps it).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _artifacts(tmp_path: Path) -> Path:
    art = os.environ.get("DW_ARTIFACT_DIR")
    out = Path(art) if art else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    return out


def _env() -> dict[str, str]:
    """This process's environment without what would make a nested pytest another xdist
    worker of this run or write this run's JUnit file (``.ci/run`` sets ``PYTEST_ADDOPTS``)."""
    return {k: v for k, v in os.environ.items()
            if k != "PYTEST_ADDOPTS" and not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}


def _check_prefix():
    spec = importlib.util.spec_from_file_location("check_prefix", ROOT / ".ci" / "check_prefix.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prefix_backend_fails_exactly_the_predicted_cells(tmp_path: Path) -> None:
    art = _artifacts(tmp_path)
    junit = art / "junit-prefix.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "cases/test_cells.py", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "--backend", "harness.reference.prefix", f"--junitxml={junit}", f"--basetemp={tmp_path / 'pytest'}"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1200)
    (art / "prefix-pytest.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    assert _check_prefix().main(str(junit)) == 0, f"see {art / 'prefix-pytest.log'}"


def test_megatron_weight_passes_every_ci_cell_it_can_take(tmp_path: Path) -> None:
    art = _artifacts(tmp_path)
    out = art / "megatron"
    proc = subprocess.run([sys.executable, "-m", "harness", "sweep", "--preset", "ci", "--weights", "megatron",
                           "--quiet", "--force", "--out", str(out)],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1200)
    (art / "megatron.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
