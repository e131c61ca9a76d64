"""The checkout's own bytecode, compiled by ``python -m harness install``.

Why: an editable install (``pip install -e``, the README's) leaves the harness's sources
uncompiled, and where ``PYTHONDONTWRITEBYTECODE`` is set - this project's CI machines set it -
Python never writes what it compiles: every process (each sweep, torchrun agent, backend probe
and test subprocess) compiled every module of the checkout it imported, again. A regular
install has pip compile them once; this does the same for the checkout. Two test files that
start many such processes (``cases/test_cli.py``, ``cases/test_inputs.py``) took 45.1 and
48.5 CPU-s without it and 40.8 and 39.6 with it, on the project's 2-core machine.

A compiled file is only ever a cache: Python compares it with its source's modification time
and compiles the source again where they differ, so an edit after ``install`` costs what it
did before, never a stale module.
"""

from __future__ import annotations

import compileall
from pathlib import Path

#: the checkout's folders whose modules its processes import: the package, the reports it
#: installs as ``harness.reports``, and the fixtures the suite's backends and ranks load
FOLDERS: tuple[str, ...] = ("harness", "reports", "fixtures")


def compile_checkout(root: Path) -> list[str]:
    """Compile the Python files of ``FOLDERS`` under ``root`` where their compiled files are
    missing or stale; returns the folders that could not be (read-only, not there: harmless,
    their modules are compiled as they are imported, as before)."""
    failed = []
    for name in FOLDERS:
        folder = root / name
        if folder.is_dir() and not compileall.compile_dir(folder, quiet=2):
            failed.append(name)
    return failed
