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
import signal
import site
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
            notes.append(f"{self.environment_failed} file(s) of the environment not compiled: they "
                         "do not compile under this Python, or their folder is read-only (left as source)")
        return "ok" + (": " + "; ".join(notes) if notes else "")


def usable_cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _compile(path: str, force: bool = False) -> bool:
    """Compile one file unless its compiled file is current (``force``: whatever its compiled
    file says); False: it does not compile, it is gone, or its folder is read-only."""
    try:
        return bool(compileall.compile_file(path, quiet=2, force=force))
    except OSError:  # removed by pip meanwhile
        return False


def _compile_many(entries: list[tuple[str, bool]]) -> list[bool]:
    """:func:`_compile` of each (path, force): one pool task."""
    return [_compile(path, force) for path, force in entries]


def _chunks(entries: list[tuple[str, bool]]) -> list[list[tuple[str, bool]]]:
    """The pool's tasks: 64 files each (one file a task cost more in hand-offs than compiling)."""
    return [entries[i:i + 64] for i in range(0, len(entries), 64)]


def _quiet_worker() -> None:
    """A pool worker ends with its pool, not on the CLI's SIGTERM/SIGINT handlers."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _python_files(folders: list[Path]) -> list[str]:
    """The ``.py`` files under ``folders``, each once (a folder reached by two paths, e.g.
    ``lib64`` linked to ``lib``, counts once); an unreadable folder is skipped."""
    seen: dict[str, str] = {}
    for folder in folders:
        try:
            for path in folder.rglob("*.py"):
                seen.setdefault(os.path.realpath(path), str(path))
        except OSError:
            continue
    return sorted(seen.values())


class CompileAhead:
    """The environment's files as they are now, compiled in the background while the
    components install: pip installs on one core, so the others compile what is already there
    (torch's files are most of the environment). :meth:`stop` drops what has not started. A
    file pip writes meanwhile may be read half-written; the final pass (:func:`compile_all`,
    ``fresh_since=started``) compiles every file modified since this began again, whatever its
    compiled file says, then the rest that is missing or stale, and reports. A pool that cannot
    start (no ``/dev/shm``, say) leaves everything to the final pass."""

    def __init__(self, environment: list[Path], workers: int) -> None:
        self.started = time.time()
        self._pool: Any = None
        try:
            from concurrent.futures import ProcessPoolExecutor

            entries = [(path, False) for path in _python_files(environment)]
            self._pool = ProcessPoolExecutor(max_workers=workers, initializer=_quiet_worker)
            for chunk in _chunks(entries):
                self._pool.submit(_compile_many, chunk)
        except (OSError, ImportError, RuntimeError):
            self.stop()

    def stop(self) -> None:
        """Drop the chunks not started and wait for those that are."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def environment_folders() -> list[Path]:
    """The running interpreter's package folders (the venv's ``site-packages``; the user's
    site folder too where it is on ``sys.path``, where pip installs outside a venv)."""
    paths = sysconfig.get_paths()
    folders = [paths["purelib"], paths["platlib"]]
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and user in sys.path:
        folders.append(user)
    return [Path(p) for p in dict.fromkeys(folders) if Path(p).is_dir()]


def compile_all(root: Path, environment: list[Path], workers: int | None = None,
                fresh_since: float | None = None) -> Compiled:
    """Compile the Python files of ``FOLDERS`` under ``root`` and of the ``environment``
    folders where their compiled files are missing or stale - and, with ``fresh_since``, every
    file modified since then (a compiling pass ran beside pip: :class:`CompileAhead`) -
    ``workers`` processes at a time (default: one per usable core; one where a pool cannot
    start)."""
    groups = {name: _python_files([root / name]) for name in FOLDERS if (root / name).is_dir()}
    env_files = _python_files(environment)
    files = [f for group in groups.values() for f in group] + env_files
    entries = [(f, fresh_since is not None and _modified_since(f, fresh_since)) for f in files]
    workers = max(1, workers or usable_cores())
    ok: list[bool] | None = None
    if workers > 1 and len(files) >= 64:
        try:
            from concurrent.futures import ProcessPoolExecutor
            from concurrent.futures.process import BrokenProcessPool

            with ProcessPoolExecutor(max_workers=workers, initializer=_quiet_worker) as pool:
                ok = [done for chunk in pool.map(_compile_many, _chunks(entries)) for done in chunk]
        except (OSError, ImportError, RuntimeError, BrokenProcessPool):
            ok = None  # compiled here, one file after another
    if ok is None:
        ok = _compile_many(entries)
    result = dict(zip(files, ok))
    return Compiled(checkout_failed=tuple(name for name, group in groups.items() if not all(result[f] for f in group)),
                    environment_failed=sum(not result[f] for f in env_files))


def _modified_since(path: str, since: float) -> bool:
    """Modified at ``since`` or after (2 s early: file systems keep coarse times)."""
    try:
        return os.stat(path).st_mtime >= since - 2
    except OSError:
        return False
