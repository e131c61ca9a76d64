"""Shared by the benchmark scripts: the machine's description and the results file."""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def commit() -> str | None:
    """The repository's HEAD (``+dirty`` when tracked files differ), or None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    """The machine, the date and the commit a measurement was made on (docs/performance.md
    renders them from here)."""
    import torch

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg(),
    }


def children_cpu() -> float:
    """CPU seconds (user and system) of every child process this one has waited for."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def results_path() -> Path:
    return HERE / f"results-{datetime.date.today().isoformat()}.json"


def save(key: str, data: dict[str, Any]) -> Path:
    """Merge ``data`` under ``key`` into today's results file (each script owns one key)."""
    path = results_path()
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc[key] = data
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) and abs(v) < 100 else (f"{v:.0f}" if isinstance(v, float) else str(v))

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
