"""What a finished run folder keeps of its launches: the logs and plans, gzipped.

Why: a run's record holds every verdict with every rank's checks and errors; the launches'
rank logs (a start and a done line per cell and rank, ~0.7 KB a cell) and plans (every
cell's id per launch) would otherwise outweigh it several times over for a large sweep.
Gzip keeps every line (``zcat logs/ws4-0/rank0.log.gz``) at about a tenth of the size. An
unfinished run keeps them plain: ``--resume`` appends to them, and a reader follows them.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

#: the folders a launch writes, and the files in them that are folded
FOLDED = (("logs", "*/*.log"), ("plans", "*.json"))


def fold_launch_files(run_dir: Path) -> list[Path]:
    """Gzip each launch log and plan in place (``X`` -> ``X.gz``); returns the new files."""
    out = []
    for folder, pattern in FOLDED:
        for path in sorted((run_dir / folder).glob(pattern)):
            out.append(gzip_in_place(path))
    return out


def gzip_in_place(path: Path) -> Path:
    """``path`` -> ``path.gz`` (written whole before ``path`` goes, so nothing is half-lost)."""
    target = path.with_name(path.name + ".gz")
    partial = target.with_name(target.name + ".partial")
    with open(path, "rb") as src, gzip.open(partial, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    partial.replace(target)
    path.unlink()
    return target


def read_text(path: Path) -> str:
    """A launch file's text, whether still plain or folded to ``path.gz``."""
    if path.exists():
        return path.read_text(errors="replace")
    with gzip.open(path.with_name(path.name + ".gz"), "rt", errors="replace") as f:
        return f.read()


def exists(path: Path) -> bool:
    """Whether a launch file is there, plain or folded."""
    return path.exists() or path.with_name(path.name + ".gz").exists()


#: what a run writes into its folder (the record, the result stream, the reports, the launches)
RUN_FILES = ("results.json.gz", "results.json", "cells.jsonl", "cells.jsonl.gz", "cells.retired",
             "report.html", "junit.xml", "summary.md", "selftest.json")
RUN_FOLDERS = ("ranks", "logs", "plans")
#: what makes a folder hold a run: a record or a result stream
RUN_MARKERS = ("results.json.gz", "results.json", "cells.jsonl", "cells.retired")


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` already holds a run's verdicts (a record or a result stream)."""
    return any((run_dir / name).exists() for name in RUN_MARKERS)


def clear(run_dir: Path) -> None:
    """Remove what an earlier run wrote into ``run_dir`` (``--force``); other files stay."""
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for name in RUN_FOLDERS:
        shutil.rmtree(run_dir / name, ignore_errors=True)
