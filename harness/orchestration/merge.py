"""Joining the run folders of ``sweep --shard K/N`` into one run record.

The shards must be one selection cut N ways: the same selection (preset, axis overrides,
filter, examples, and the digest of its cell ids), backend, the code it judged (upstream
version; a TE tree's commit, dirty state and its digest: ``harness.records.provenance``), tolerance,
ledger (whose stale entries only the merged record can tell) and harness version
(package version and commit), each shard exactly once. Anything else is refused before a
record is written (exit 2), naming the shard that differs and how, or the shards missing.
The joined record keeps every cell's verdict and every launch; its environment lists the
shards (host, duration, status), and it is ``complete`` only when every shard was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.judging import ledger as ledgers
from harness.judging import assemble
from harness.vocabulary import matrix, selection
from harness.records import provenance, runinfo
from harness.vocabulary.errors import UsageError
from harness.records.record import RunRecord, load

#: selection keys every shard must share (``shard`` itself differs by design)
_SAME_SELECTION = ("preset", "overrides", "filter", "sample", "examples", "cells_total", "cells_digest")


def _load(run_dir: Path) -> RunRecord:
    try:
        return load(run_dir)
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"cannot merge {str(run_dir)!r}: no readable run record ({exc})") from exc


def _ledger(record: RunRecord) -> ledgers.Ledger | None:
    return ledgers.Ledger.from_dict(record.ledger) if record.ledger else None


def _identity(record: RunRecord) -> dict[str, Any]:
    """What must be equal across the shards of one sweep."""
    env = record.environment
    ledger = _ledger(record)
    code = provenance.identity(record.serialize())
    return {"backend": record.backend, "tolerance": record.tolerance,
            # the code judged: shards of another commit, dirty state or TE version are another sweep
            "judged code": provenance.describe(code) if code.get("upstream") or code.get("tree") else None,
            # not its path: the shipped file sits wherever each shard's harness is installed
            "ledger": {k: v for k, v in ledger.serialize().items() if k != "path"} if ledger else None,
            "harness_version": env.get("harness_version"), "git_commit": env.get("git_commit"),
            **{f"selection.{k}": record.selection.get(k) for k in _SAME_SELECTION}}


def check(runs: list[tuple[Path, RunRecord]]) -> int:
    """The shard count N of ``runs`` after checking they are shards 1..N of one sweep.

    Raises:
        UsageError: not a shard, shards of different sweeps, a duplicate or a missing shard.
    """
    if not runs:
        raise UsageError("merge needs the run folders of a sharded sweep")
    for path, rec in runs:
        if not rec.selection.get("shard"):
            raise UsageError(f"{path} is not a shard (its sweep had no --shard K/N)")
    first_path, first = runs[0]
    want = _identity(first)
    for path, rec in runs[1:]:
        got = _identity(rec)
        diff = [f"{k}: {got[k]!r} vs {want[k]!r}" for k in want if got[k] != want[k]]
        if diff:
            raise UsageError(f"{path} is not a shard of the same sweep as {first_path}: " + "; ".join(diff))
    count = first.selection["shard"]["count"]
    seen: dict[int, Path] = {}
    for path, rec in runs:
        part = rec.selection["shard"]
        if part["count"] != count:
            raise UsageError(f"{path} is shard {part['index']}/{part['count']}, not one of {count}")
        if part["index"] in seen:
            raise UsageError(f"shard {part['index']}/{count} given twice: {seen[part['index']]} and {path}")
        seen[part["index"]] = path
    missing = [f"{k}/{count}" for k in range(1, count + 1) if k not in seen]
    if missing:
        raise UsageError(f"incomplete shard set: missing shard(s) {', '.join(missing)} "
                         f"(have {', '.join(f'{k}/{count}' for k in sorted(seen))})")
    return count


def merge(run_dirs: list[Path], argv: list[str]) -> RunRecord:
    """One run record of the whole selection from its shards' run folders (not written).

    Raises:
        UsageError: the folders are not exactly the shards of one sweep (``check``), or the
            selection no longer expands to the cells the shards ran.
    """
    runs = [(Path(d), _load(Path(d))) for d in run_dirs]
    check(runs)
    runs.sort(key=lambda r: r[1].selection["shard"]["index"])
    first = runs[0][1]
    sel = first.selection
    cells = selection.recorded(sel)
    if matrix.ids_digest(cells) != sel.get("cells_digest"):
        raise UsageError("the shards' selection expands to other cells with this harness than when they ran")
    by_id = {c.id: c for _, rec in runs for c in rec.cells}
    unknown = sorted(set(by_id) - {c.id for c in cells})
    if unknown:
        raise UsageError(f"a shard has cells outside its selection: {unknown[:3]}")
    merged = [by_id[c.id] if c.id in by_id else assemble.unrun(c, "not run: no shard has a verdict for this cell")
              for c in cells]
    complete = all(rec.status == "complete" for _, rec in runs) and len(by_id) == len(cells)
    failures = [f"shard {rec.selection['shard']['index']}: {rec.failure}" for _, rec in runs if rec.failure]
    record = RunRecord(
        status="complete" if complete else "incomplete",
        started=min(rec.started for _, rec in runs), finished=runinfo.now(),
        # the shards ran side by side: the merged run took as long as its slowest shard
        duration_s=max(rec.duration_s for _, rec in runs),
        command=" ".join(["python", "-m", "harness", *argv]), argv=list(argv), backend=first.backend,
        environment={**first.environment, "shards": [
            {"shard": rec.selection["shard"]["index"], "run_dir": str(path), "hostname": rec.environment.get("hostname"),
             "status": rec.status, "duration_s": rec.duration_s, "cells": len(rec.cells)} for path, rec in runs]},
        selection={k: v for k, v in sel.items() if k not in ("shard",)} | {"merged_shards": len(runs)},
        tolerance=first.tolerance, world_sizes=sorted({ws for _, rec in runs for ws in rec.world_sizes}),
        launches=[l for _, rec in runs for l in rec.launches], failure="; ".join(failures) or None)
    # the shards' ledger, judged over the whole selection: only now can an entry be stale
    return assemble.judge(record, merged, _ledger(first))
