"""What ``sweep`` and ``merge`` print when a run ends: counts per module and status, the
ledger's entries, the review's verdict and the cells that missed their expectation (a pure
function of the record, like every report)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from harness.judging.review import FIXED, path_reason
from harness.vocabulary.status import GOOD_STATUSES, PATH_NOT_TAKEN, STATUSES, label

from . import review_section as review
from ._common import counts_of, failing_messages, installers_line

#: how many failing cells the terminal lists (the report has them all)
LISTED = 20


def summary(record: dict[str, Any]) -> str:
    """The end-of-run text: the status table, the ledger, the review, the failing cells."""
    per: dict[str, Counter] = {}
    for c in record.get("cells") or []:
        per.setdefault(c["axes"]["module"], Counter())[c["status"]] += 1
    w = max([len("module")] + [len(m) for m in per])
    cols = [max(len(label(s)), 5) for s in STATUSES]
    lines = [f"{'module':{w}} " + " ".join(f"{label(s):>{c}}" for s, c in zip(STATUSES, cols))]
    for mod, cnt in [*per.items(), ("total", counts_of(record))]:
        lines.append(f"{mod:{w}} " + " ".join(f"{cnt.get(s, 0):>{c}}" for s, c in zip(STATUSES, cols)))
    installers = installers_line(record)
    if installers:
        lines += ["", installers]
    outcome = record.get("ledger")
    if outcome:
        lines += ["", f"ledger {outcome['path']}:"]
        entries = outcome.get("entries") or []
        idw = max((len(e["id"]) for e in entries), default=0)
        judged = outcome.get("judged_stale", True)
        for e in entries:
            mark = "*" if e.get("required") else " "
            lines.append(f" {mark}{e['id']:{idw}} {e['upstream']:20} {e.get('verdict', ''):14} {_state(e, judged)}")
    rev = review.of(record)
    if rev is not None:
        lines += [""] + review_lines(rev, record)
    else:
        lines += [""] * bool(review.code_lines(record)) + review.code_lines(record)
    lines += not_taken_lines(record)
    bad, listed = 0, []  # the first LISTED failing cells' lines, and how many there are
    for c in record.get("cells") or []:
        if c["status"] not in GOOD_STATUSES:
            bad += 1
            if bad <= LISTED:
                first = c.get("first_failure") or (failing_messages(c, 1) or [""])[0]
                listed.append(f"  {label(c['status']).upper():7} {c['id']}\n          {first}\n          repro: {c.get('repro')}")
    if bad:
        lines += ["", f"{bad} cell(s) did not meet their expectation:", *listed]
        if bad > LISTED:
            lines.append(f"  ... and {bad - LISTED} more (see the report)")
    return "\n".join(lines)


def _state(e: dict[str, Any], judged: bool) -> str:
    """``3 known, reproduced in 3/4 selected cell(s)`` (a shard: stale is judged at the merge)."""
    sel, rep, known = (len(e.get(k) or []) for k in ("selected", "reproduced", "known_cells"))
    if e.get("stale"):
        return "STALE: no longer reproduces"
    if not sel:
        return "selects no cell of this run"
    other = len(e.get("path_not_taken") or [])
    return (f"{known} known, reproduced in {rep}/{sel} selected cell(s)"
            + (" (stale is judged when the shards merge)" if not rep and not judged else "")
            + (f", {other} {label(PATH_NOT_TAKEN)}" if other else ""))


def not_taken_lines(record: dict[str, Any], shown: int = 5) -> list[str]:
    """The cells where TE ran another path than they name, by the reason TE gave."""
    groups: dict[str, list[str]] = {}
    for c in record.get("cells") or []:
        if c["status"] == PATH_NOT_TAKEN:
            groups.setdefault(path_reason(c), []).append(c["id"])
    if not groups:
        return []
    n = sum(len(ids) for ids in groups.values())
    out = ["", f"{n} cell(s) did not run the TE path they name ({label(PATH_NOT_TAKEN)}: no verdict on that path):"]
    for reason, ids in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:shown]:
        out.append(f"  {len(ids)} cell(s), e.g. {ids[0]}:\n          {reason}")
    if len(groups) > shown:
        out.append(f"  ... and {len(groups) - shown} more reasons (see the report)")
    return out


def review_lines(rev: Any, record: dict[str, Any]) -> list[str]:
    """The review's verdict: the code judged, GREEN / RED / INCOMPLETE with every reason, the
    entries fixed here without being required."""
    out = review.code_lines(record)
    if rev.required:
        out.append(f"review {review.headline(rev)}")
        out += [f"  {line}" for line in rev.reasons()[:LISTED]]
    elif rev.regressions:
        out.append(f"{len(rev.regressions)} cell(s) fail without a ledger entry (regressions)")
    bonus = [e.id for e in rev.entries if e.verdict == FIXED and not e.required]
    if bonus:
        out.append(f"also fixed here (not required): {', '.join(bonus)}")
    return out
