"""A warm agent: the backend probe and the first launch's torchrun agent in one process.

Every sweep used to start two Python processes before its first cell: the backend probe
(``harness.orchestration.probe.probe_backend``: import torch and the backend, describe it, exit) and
torchrun's agent (import torch and what the ranks preload, fork the ranks). Each paid for
importing torch (about 2 s of CPU), and for ``te-cpu`` TE's heavy dependencies too (about
3 s more). A warm agent pays once: ``python -m harness.rank.agent --warm SPEC`` preloads what
the agent would (``harness.vocabulary.backend_specs.RANK_PRELOAD``), describes the backend from a forked
child (the backend's own import and whatever it runs stay out of the agent, as they did out
of the old agent), prints the description, and waits. The first launch whose backends need
the same preload hands it its torchrun arguments, environment and log (:func:`take`); a
warm agent nobody takes ends when this process does (its stdin closes).

Only where ranks are forked (Linux; ``DW_RANK_START=spawn`` turns both off); elsewhere the
probe is the plain subprocess and every launch starts its own agent.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import selectors
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, Mapping

from harness.vocabulary.backend_specs import BackendError, BackendInfo, preload_of
from harness.launcher import served
from harness.vocabulary.plan import WARM_MARKER, ranks_forked


def supported() -> bool:
    """Whether launches fork their ranks here (the warm agent's probe forks too), and the
    agent can take a launch's command line (``setproctitle``: ``ps``, and whoever looks for
    a run's processes by its folder, see what they would see of a fresh agent)."""
    return ranks_forked() and importlib.util.find_spec("setproctitle") is not None


def preload_key(specs: Iterable[str]) -> tuple[str, ...]:
    """What an agent preloads for ranks of ``specs``: two launches with the same key can use
    the same agent."""
    return tuple(sorted({p[0] for s in specs if (p := preload_of(s)) is not None}))


def agent_env(threads_per_rank: int = 1, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a launch's torchrun agent (its ranks inherit it); a warm agent starts
    with the defaults and takes its launch's at the hand-over."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads_per_rank), "PYTHONUNBUFFERED": "1", **(extra or {})}


@dataclass
class _Warm:
    proc: subprocess.Popen
    key: tuple[str, ...]
    stderr: IO[bytes]


_ready: list[_Warm] = []


def probe(spec: str, timeout: float = 300.0) -> BackendInfo:
    """Describe ``spec`` like ``harness.orchestration.probe.probe_backend``, from a warm agent kept for
    the first launch that can use it.

    Raises:
        BackendError: the backend cannot be imported or described (one line), or the probe
            took longer than ``timeout`` seconds.
    """
    stderr = tempfile.TemporaryFile()
    proc = served.start_agent(["--warm", spec], stdin=served.PIPE, stdout=served.PIPE, stderr=stderr,
                              env=agent_env())
    warm = _Warm(proc, preload_key([spec]), stderr)
    try:
        outcome = _read_outcome(proc, timeout)
    except BackendError:
        _end(warm)
        raise
    if outcome is None:
        _end(warm)
        stderr.seek(0)
        lines = [ln for ln in stderr.read().decode(errors="replace").splitlines() if ln.strip()]
        raise BackendError(lines[-1] if lines else f"the probe exited with code {proc.returncode}")
    if "error" in outcome:
        _end(warm)
        raise BackendError(outcome["error"])
    _ready.append(warm)
    return BackendInfo.from_dict(outcome["info"])


def _read_outcome(proc: subprocess.Popen, timeout: float) -> dict | None:
    """The probe's outcome from the warm agent's stdout; None if it exited without one."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise BackendError(f"importing backend {proc.args[-1]!r} took longer than {timeout:g}s")
            line = proc.stdout.readline().decode(errors="replace")
            if not line:
                proc.wait()
                return None
            if line.startswith(WARM_MARKER):
                return json.loads(line[len(WARM_MARKER):])


def take(specs: Iterable[str], argv: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen | None:
    """Hand a warm agent whose preload fits ``specs`` torchrun's ``argv`` (as
    ``harness.rank.agent.main`` takes them), the launch's environment and its log; the agent,
    now torchrun's, or None (no such agent: start one as usual)."""
    key = preload_key(specs)
    for warm in list(_ready):
        _ready.remove(warm)
        if warm.key != key or warm.proc.poll() is not None:
            _end(warm)
            continue
        assert warm.proc.stdin is not None and warm.proc.stdout is not None
        try:
            warm.proc.stdin.write((json.dumps({"argv": argv, "env": dict(env), "log": str(log)}) + "\n").encode())
            warm.proc.stdin.close()
        except OSError:
            _end(warm)
            continue
        warm.proc.stdout.close()
        warm.stderr.close()
        warm.proc.stdin = warm.proc.stdout = None
        return warm.proc
    return None


def _end(warm: _Warm) -> None:
    """End a warm agent nobody took: its stdin closes, it exits."""
    for pipe in (warm.proc.stdin, warm.proc.stdout):
        try:
            if pipe is not None:
                pipe.close()
        except OSError:
            pass
    try:
        warm.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        warm.proc.kill()
        warm.proc.wait()
    warm.stderr.close()


@atexit.register
def _end_all() -> None:
    while _ready:
        _end(_ready.pop())
