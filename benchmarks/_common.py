"""Shared by the benchmark scripts: the machine's description and the results file."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def machine() -> dict[str, Any]:
    import torch

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg(),
    }


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
