"""Check the worlds and layers of ``[tool.importlinter]`` (pyproject.toml) with import-linter.

Run on the installed packages (``harness`` and ``harness_reports``, which pip installs from the
top-level ``reports/`` folder): ``lint-imports`` reads each from where it is installed. Exit
status: import-linter's (0 when every contract holds).

    python .ci/check_layers.py [--plant MODULE:IMPORT]

``--plant`` adds ``import IMPORT`` to MODULE in a copy of both packages (the tree itself is never
touched) and checks the copy: how the suite shows that a crossing fails the check.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: each installed package and the folder it is installed from
PACKAGES = {"harness": "harness", "harness_reports": "reports"}


def _plant(dest: Path, plants: list[str]) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package, folder in PACKAGES.items():
        shutil.copytree(ROOT / folder, dest / package, ignore=ignore)
    for plant in plants:
        module, _, target = plant.partition(":")
        path = dest.joinpath(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        with open(path, "a") as f:
            f.write(f"\nimport {target}  # planted by check_layers --plant\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plant", action="append", default=[], metavar="MODULE:IMPORT",
                   help="append 'import IMPORT' to MODULE in a copy, e.g. harness.rank.worker:harness.cli")
    args = p.parse_args(argv)
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if lint is None:
        print("check_layers: lint-imports not found (pip install -e '.[test]' installs import-linter)",
              file=sys.stderr)
        return 2
    command = [lint, "--no-cache", str(ROOT / "pyproject.toml")]
    if not args.plant:
        return subprocess.run(command, cwd=ROOT).returncode
    with tempfile.TemporaryDirectory(prefix="dw-layers-") as tmp:
        _plant(Path(tmp), args.plant)
        # the copy comes first on the path: import-linter reads the packages from there
        env = {**os.environ, "PYTHONPATH": tmp}
        return subprocess.run(command, cwd=tmp, env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main())
