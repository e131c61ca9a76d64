"""The backend probe, as the parent runs it: import and describe a backend in a short
subprocess with the ranks' environment (``python -m harness.rank.loading --probe SPEC``), so
that the parent never imports torch or the backend (``te-cpu`` patches ``torch`` when
imported); the warm agent (``harness.launcher.warm``) answers the same question faster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Mapping

from harness.vocabulary.backend_specs import BackendError, BackendInfo


def probe_backend(spec: str, env: Mapping[str, str] | None = None, timeout: float = 300.0) -> BackendInfo:
    """Import and validate ``spec`` in a subprocess with the ranks' environment.

    Args:
        spec: as ``--backend`` takes it.
        env: the environment the ranks will get (default: this process's).
        timeout: seconds the import may take.

    Returns:
        What the backend says about itself; the parent's ``torch`` is never touched.

    Raises:
        BackendError: the backend cannot be imported or lacks a name (one line, e.g. what
            to install).
    """
    cmd = [sys.executable, "-m", "harness.rank.loading", "--probe", spec]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ if env is None else env), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise BackendError(f"importing backend {spec!r} took longer than {timeout:g}s") from exc
    if proc.returncode == 0:
        try:
            return BackendInfo.from_dict(json.loads(proc.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError, TypeError) as exc:
            raise BackendError(f"probing backend {spec!r} printed no backend description") from exc
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    why = lines[-1] if lines else f"the probe exited with code {proc.returncode}"
    raise BackendError(why.removeprefix("harness.rank.loading: error: "))
