"""Bytecode compiled by ``python -m harness install``: the environment's packages and the
checkout's own modules, on every core.

Why the checkout: an editable install (``pip install -e``, the README's) leaves the
harness's sources uncompiled, and where ``PYTHONDONTWRITEBYTECODE`` is set - this project's
CI machines set it - Python never writes what it compiles: every process (each sweep, torchrun
agent, backend probe and test subprocess) compiled every module of the checkout it imported,
again. Two test files that start many such processes (``cases/test_cli.py``,
``cases/test_inputs.py``) took 45.1 and 48.5 CPU-s without it and 40.8 and 39.6 with it, on
the project's 2-core machine.

Why the environment: pip compiles what it installs one file after another. The README's
commands install with ``pip install --no-compile`` (and the components here do the same), and
this compiles the environment's files in a pool of one process per core instead; a file that
is already compiled costs one read of its header (the README's set-up timed both ways:
``benchmarks/bench_install.py``, docs/performance.md).

A compiled file is only ever a cache: Python compares it with its source's modification time
and compiles the source again where they differ, so an edit after ``install`` costs what it
did before, never a stale module. A file this Python cannot compile (torch ships a test helper
in Python 3.12's syntax) is left as source: nothing imports it here.
"""

from __future__ import annotations

import compileall
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

#: the checkout's folders whose modules its processes import: the package, the reports it
#: installs as ``harness.reports``, and the fixtures the suite's backends and ranks load
FOLDERS: tuple[str, ...] = ("harness", "reports", "fixtures")


@dataclass(frozen=True)
class Compiled:
    """What one compilation pass left as source: the checkout's folders with a file that does
    not compile (their modules are compiled as imported, as without this step), and how many
    of the environment's files do not."""

    checkout_failed: tuple[str, ...]
    environment_failed: int

    def summary(self) -> str:
        """The one line ``install`` prints."""
        notes = []
        if self.checkout_failed:
            notes.append("not written for " + ", ".join(self.checkout_failed) + " (compiled as imported)")
        if self.environment_failed:
            notes.append(f"{self.environment_failed} file(s) of the environment do not compile "
                         "under this Python (left as source)")
        return "ok" + (": " + "; ".join(notes) if notes else "")


def _compile(path: str) -> bool:
    """Compile one file unless its compiled file is current (False: it does not compile, or
    its folder is read-only)."""
    return bool(compileall.compile_file(path, quiet=2))


def _compile_many(paths: list[str]) -> list[bool]:
    """:func:`_compile` for each path; a file pip removed meanwhile is False."""
    out = []
    for path in paths:
        try:
            out.append(_compile(path))
        except OSError:
            out.append(False)
    return out


class CompileAhead:
    """The environment's files as they are now, compiled in the background while the
    components install: pip installs on one core, so the others compile what is already there
    (torch's files are most of the environment). :meth:`stop` drops what has not started; the
    final pass (:func:`compile_all`) then compiles the rest and what pip added or replaced
    (a file compiled before pip replaced it is stale by its modification time, so compiled
    again), and reports."""

    def __init__(self, environment: list[Path], workers: int) -> None:
        from concurrent.futures import ProcessPoolExecutor

        files = sorted({str(p) for folder in environment for p in folder.rglob("*.py")})
        self._pool = ProcessPoolExecutor(max_workers=workers)
        for i in range(0, len(files), 64):
            self._pool.submit(_compile_many, files[i:i + 64])

    def stop(self) -> None:
        """Drop the chunks not started and wait for those that are."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def environment_folders() -> list[Path]:
    """The running interpreter's package folders (the venv's ``site-packages``)."""
    paths = sysconfig.get_paths()
    return [Path(p) for p in dict.fromkeys((paths["purelib"], paths["platlib"])) if Path(p).is_dir()]


def compile_all(root: Path, environment: list[Path], workers: int | None = None) -> Compiled:
    """Compile the Python files of ``FOLDERS`` under ``root`` and of the ``environment``
    folders where their compiled files are missing or stale, ``workers`` processes at a time
    (default: one per core)."""
    groups = {name: sorted(map(str, (root / name).rglob("*.py"))) for name in FOLDERS if (root / name).is_dir()}
    env_files = sorted({str(p) for folder in environment for p in folder.rglob("*.py")})
    files = [f for group in groups.values() for f in group] + env_files
    workers = max(1, workers or os.cpu_count() or 1)
    if workers == 1 or len(files) < 64:
        ok = list(map(_compile, files))
    else:
        from concurrent.futures import ProcessPoolExecutor  # here: the CLI imports this module

        with ProcessPoolExecutor(max_workers=workers) as pool:
            ok = list(pool.map(_compile, files, chunksize=64))
    result = dict(zip(files, ok))
    return Compiled(checkout_failed=tuple(name for name, group in groups.items() if not all(result[f] for f in group)),
                    environment_failed=sum(not result[f] for f in env_files))
