"""Facts about the run itself for the run record: when, where, with what (no torch at import)."""

from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any


def now() -> str:
    """The current time as the run record writes it (ISO-8601 UTC, seconds)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def git_commit() -> str | None:
    """The harness checkout's commit, when it runs from one."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def harness_version() -> str:
    """The installed dw-harness version (shards to merge must share it)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("dw-harness")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def environment(device: str, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """torch, python, platform, host, device and process-group backend of this run
    (``facts``: the ranks' torch as the backend probe saw it, ``harness.rank.loading.torch_facts``;
    None: not probed - a record built without a probe says so rather than import torch here)."""
    facts = facts or {"version": None, "cuda": None, "cuda_available": False, "gpus": 0, "gpu_name": None}
    cuda = device in ("auto", "cuda") and facts["cuda_available"]
    return {
        "torch": facts["version"],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "device": f"cuda ({facts['gpu_name']})" if cuda else "cpu",
        "pg_backend": "nccl" if cuda else "gloo",
        "git_commit": git_commit(),
        "harness_version": harness_version(),
        "cpus": os.cpu_count(),
    }
