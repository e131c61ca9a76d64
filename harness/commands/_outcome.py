"""How a command that judged cells ends (``sweep``, ``merge``): the reports written from the
record, the end-of-run text, and the gate's exit code with its lines on the error stream.

Each reads the record as stored (``harness.records.recordfile.read_streamed``): its cells come
from the file one at a time, so how a run ends costs no more memory for a large run than for a
small one."""

from __future__ import annotations

import sys
from pathlib import Path

from typing import Any

from harness.judging import gate


def write_reports(record: dict[str, Any], run_dir: Path) -> dict[str, Path]:
    """Render every report from the run record alone (``read_streamed``'s); a report failure
    never loses results."""
    from harness_reports import write_all

    try:
        return write_all(record, run_dir)
    except Exception as exc:  # report rendering must not hide the verdict
        print(f"dw-harness: warning: report rendering failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return {}


def conclude(data: dict[str, Any], record_line: str, paths: dict[str, Path]) -> int:
    """Print the run's summary (``data``: the record, ``read_streamed``'s), where its record and
    reports are, the gate's lines; return the exit code (``harness.judging.gate``)."""
    from harness_reports import terminal

    print()
    print(terminal.summary(data))
    print(f"\n{record_line}")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    for line in gate.messages(data):
        print(f"dw-harness: {line}", file=sys.stderr)
    return gate.exit_code(data)
