"""What ``pip install .`` installs: the ``harness`` namespace only, with the reports' assets.

Builds the wheel (no dependencies, no venv: seconds) and reads its file list; the
installed layout is what the wheel holds. Also checks that the pyproject's explicit package
list names every package folder under ``harness/`` (a new subpackage must be added there).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_package_list_names_every_package_folder():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "harness").rglob("__init__.py")
               if "__pycache__" not in p.parts}
    assert set(config["packages"]) == on_disk | {"harness.reports"}
    assert config["package-dir"]["harness.reports"] == "reports"


def test_wheel_installs_only_the_harness_namespace(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("dw_harness-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"harness"}, top
    for needed in ("harness/reports/__init__.py", "harness/reports/assets/report.css",
                   "harness/reports/assets/report.js", "harness/worker.py", "harness/stream.py"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("fixtures/", "cases/", "reports/", "benchmarks/"))]
