"""Check the import layers of ``[tool.importlinter]`` (pyproject.toml) with import-linter.

import-linter reads a package from its folder, and ``harness.reports`` is installed from the
top-level ``reports/`` folder (setuptools package-dir), so the package is staged as it is
installed - ``harness/`` with ``reports/`` as ``harness/reports/`` - in a temporary folder
and checked there. Exit status: import-linter's (0 when every contract holds).

    python .ci/check_layers.py [--plant MODULE:IMPORT]   # --plant: add an import (to show a crossing fails)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stage(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "harness", dest / "harness", ignore=ignore)
    shutil.copytree(ROOT / "reports", dest / "harness" / "reports", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plant", action="append", default=[], metavar="MODULE:IMPORT",
                   help="append 'import IMPORT' to MODULE's file in the staged copy, e.g. harness.worker:harness.cli")
    args = p.parse_args(argv)
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if lint is None:
        print("check_layers: lint-imports not found (pip install -e '.[test]' installs import-linter)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dw-layers-") as tmp:
        staged = stage(Path(tmp))
        for plant in args.plant:
            module, _, target = plant.partition(":")
            path = staged.joinpath(*module.split("."))
            path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
            with open(path, "a") as f:
                f.write(f"\nimport {target}  # planted by check_layers --plant\n")
        env = {"PYTHONPATH": str(staged), "PATH": str(Path(sys.executable).parent)}
        return subprocess.run([lint, "--no-cache", "pyproject.toml"], cwd=staged, env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main())
