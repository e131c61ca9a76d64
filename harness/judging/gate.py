"""The gate: one rule, read from a run record, for the exit code of every command that judges
cells (``sweep``, ``merge``, ``repro``, ``selftest``'s clean cells, ``harness.rank.external``) and
for the one word the reports put on a run (no torch).

- 3 (a harness bug) when any cell is a harness error: nothing else can be said of the run;
- 1 when any cell missed its expectation (``harness.vocabulary.status``: not ``good``), a ledger entry
  is stale (a fix landed: delete it, CONTRACTS §7), or a change under review does not fix
  an entry it must fix;
- else 0.

The word is ``INCOMPLETE`` for a record without a verdict on every cell, else ``PASS`` or
``FAIL`` by the same rule: a report can never say PASS where the command exited non-zero.
"""

from __future__ import annotations

from typing import Any, Iterable

from harness.vocabulary import errors as exitcodes
from harness.vocabulary.status import GOOD_STATUSES, HARNESS_ERROR


def statuses_exit_code(statuses: Iterable[str], failing_entries: bool = False) -> int:
    """The exit code of cells with these ``statuses``; ``failing_entries``: a ledger entry
    fails the run (stale, or required and not fixed here)."""
    seen = set(statuses)
    if HARNESS_ERROR in seen:
        return exitcodes.HARNESS_BUG
    return exitcodes.OK if seen <= set(GOOD_STATUSES) and not failing_entries else exitcodes.MISMATCH


def stale(record: dict[str, Any]) -> list[str]:
    """Ledger entries that reproduce in none of the cells they select."""
    return list((record.get("ledger") or {}).get("stale") or [])


def unfixed(record: dict[str, Any]) -> list[str]:
    """Under review (``sweep --fixes``): the required entries this change does not fix here."""
    return list((record.get("ledger") or {}).get("unfixed") or [])


def exit_code(record: dict[str, Any]) -> int:
    """The run's exit code (module docstring), from its serialized record."""
    return statuses_exit_code((c.get("status", "error") for c in record.get("cells") or []),
                              bool(stale(record) or unfixed(record)))


def word(record: dict[str, Any]) -> str:
    """``PASS`` / ``FAIL`` / ``INCOMPLETE``: one word for titles and badges."""
    if record.get("status") == "incomplete":
        return "INCOMPLETE"
    return "PASS" if exit_code(record) == exitcodes.OK else "FAIL"


def incomplete(record: dict[str, Any]) -> str | None:
    """Why this record cannot give a verdict on its whole selection (None: it can): a shard
    judges part of it, an interrupted or unfinished run lacks verdicts. A review is GREEN only
    on a complete record of the whole selection (a merged one counts)."""
    part = (record.get("selection") or {}).get("shard")
    if part:
        return (f"shard {part.get('index')}/{part.get('count')} holds part of the selection: "
                f"merge all {part.get('count')} shards' run folders (python -m harness merge) for the verdict")
    cells = record.get("cells") or []
    missing = sum(c.get("status") == "skipped" for c in cells)
    if record.get("status") == "incomplete" or missing:
        return (f"the run is incomplete: {missing} of {len(cells)} cell(s) have no verdict"
                " (sweep --resume RUN_DIR finishes it)")
    return None


def messages(record: dict[str, Any]) -> list[str]:
    """The gate's lines for the terminal's error stream: each stale entry, each required entry
    the change does not fix, and a harness bug when there is one."""
    from harness.judging import ledger as ledgers

    outcome = record.get("ledger") or {}
    verdicts = {e["id"]: e.get("verdict") for e in outcome.get("entries") or []}
    out = [ledgers.stale_message(i, outcome) for i in stale(record)]
    out += [f"ledger entry {i} must be fixed by this change but is {verdicts.get(i)}" for i in unfixed(record)]
    bugs = sum(c.get("status") == HARNESS_ERROR for c in record.get("cells") or [])
    if bugs:
        out.append(f"{bugs} cell(s) hit a harness bug (status {HARNESS_ERROR}: not a verdict on the backend); "
                   "please report it with the traceback in the report or the rank logs")
    return out
