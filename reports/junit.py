"""JUnit XML for CI test-result widgets (GitHub, GitLab, Jenkins): one testcase per cell.

Mapping: ``fail`` -> ``<failure>``, ``error``/``timeout`` -> ``<error>``, ``skipped`` ->
``<skipped>``; ``pass`` and ``xfail`` pass (an xfail met its expectation: the backend raised
the clear error the contract asks for, noted in ``<system-out>``); ``known`` (every failure
explained by the known-defects ledger, CONTRACTS §7) is what pytest writes for an xfail,
``<skipped type="pytest.xfail" message="known defect: ENTRY (TE PR #N); ...">``, so CI widgets
count it as expected-to-fail, not as passing. ``path_not_taken`` (TE ran another path than
the cell names) is ``<skipped message="path not taken: REASON">``: it tested nothing of the
named path. The root is ``<testsuites>`` around a single
``<testsuite name="dw-harness">`` (pytest's layout); both carry the totals, so readers that
look at either find them.

Each ledger entry is a testcase too (classname ``dw_harness.ledger``, named by its id), so
every run lists the same entries and a widget shows one turning red: a stale entry (selects
cells, reproduces in none: the run fails) is a ``<failure>``; an entry that selects no cell of
the run, or is not judged (a shard), is ``<skipped>``; one that reproduces passes.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from harness.judging.review import path_reason

from .review_section import headline as review_headline
from .review_section import of as review_of
from .review_section import tree_line as review_tree_line
from ._common import (GOOD_STATUSES, PATH_NOT_TAKEN, STATUS_LABELS, clean_text, counts_of, entry_state, failing_messages, known_refs, ledger_entries, rank_facts,
                      stale_line)

MESSAGE_LIMIT = 1_000  # characters of the message attribute (CI widgets show it on one line)
BODY_LIMIT = 20_000  # characters of a failure body (tracebacks are clipped in the middle)


def _clip(s: str, limit: int) -> str:
    if len(s) <= limit:
        return s
    half = limit // 2
    return f"{s[:half]}\n... [{len(s) - limit} characters clipped] ...\n{s[-half:]}"


def _body(cell: dict[str, Any]) -> str:
    """The failure text: first failure, failing checks, rank tracebacks, and the repro line."""
    lines = [f"cell: {cell.get('id')}", f"status: {cell.get('status')} (expected {cell.get('expect', 'pass')})"]
    if cell.get("first_failure"):
        lines.append(f"first failure: {cell['first_failure']}")
    if cell.get("worst_ratio") is not None:
        lines.append(f"worst error/bound ratio: {cell['worst_ratio']}")
    problems = failing_messages(cell, limit=10)
    if problems:
        lines += ["", "problems:"] + [f"  {p}" for p in problems]
    seen: set[str] = set()
    for r in cell.get("ranks") or []:
        tb = (r.get("error") or {}).get("traceback")
        if tb and tb not in seen:
            seen.add(tb)
            lines += ["", f"traceback (rank {r.get('rank')}):", tb.rstrip()]
    facts = rank_facts(cell)
    if facts:
        lines += ["", *facts]
    if cell.get("example"):
        lines += ["", f"example: {cell['example']}"]
    lines += ["", f"repro: {cell.get('repro', '')}"]
    return clean_text(_clip("\n".join(lines), BODY_LIMIT))


def _one_line(s: Any) -> str:
    return clean_text(" ".join(str(s or "").split()))[:MESSAGE_LIMIT]


def _known_text(cell: dict[str, Any]) -> str:
    """A known cell's body: short (a real backend has thousands), the ledger says the rest."""
    lines = [f"cell: {cell.get('id')}", f"backend verdict: {cell.get('raw_status')} (known defect)"]
    if cell.get("first_failure"):
        lines.append(f"first failure: {cell['first_failure']}")
    lines.append(f"repro: {cell.get('repro', '')}")
    return clean_text(_clip("\n".join(lines), MESSAGE_LIMIT * 4))


def _entry_case(suite: ET.Element, e: dict[str, Any], record: dict[str, Any]) -> None:
    judged = (record.get("ledger") or {}).get("judged_stale", True)
    tc = ET.SubElement(suite, "testcase", {"classname": "dw_harness.ledger", "name": clean_text(e.get("id")),
                                           "time": "0.000"})
    state = entry_state(e, judged)
    if e.get("id") in ((record.get("ledger") or {}).get("unfixed") or []):
        line = f"ledger entry {e.get('id')} must be fixed by this change but is {e.get('verdict')}"
        el = ET.SubElement(tc, "failure", {"message": _one_line(line), "type": "required entry not fixed"})
        el.text = clean_text(_clip(f"{line}\n\nreproduces in:\n" + "\n".join(e.get("reproduced") or []), BODY_LIMIT))
    elif e.get("required") and e.get("verdict") == "fixed here":
        ET.SubElement(tc, "system-out").text = clean_text(f"{e.get('upstream')}: fixed here (required)")
    elif e.get("stale"):
        el = ET.SubElement(tc, "failure", {"message": _one_line(stale_line(e, record)), "type": "stale ledger entry"})
        el.text = clean_text(_clip(f"{stale_line(e, record)}\n\nselected cells:\n" + "\n".join(e.get("selected") or []),
                                   BODY_LIMIT))
    elif not e.get("selected") or not e.get("reproduced"):
        ET.SubElement(tc, "skipped", {"message": _one_line(state)})
    else:
        ET.SubElement(tc, "system-out").text = clean_text(f"{e.get('upstream')}: {state}")


def _review_properties(record: dict[str, Any]) -> list[tuple[str, Any]]:
    """``review`` (GREEN/RED: ...) and the TE tree under review, when the run is a review."""
    rev = review_of(record)
    if rev is None:
        return []
    return [("review", review_headline(rev)), ("te_tree", review_tree_line(rev))]


def render_junit(record: dict[str, Any]) -> str:
    """Render ``record`` (the parsed ``results.json``) as a JUnit XML document (a string)."""
    counts = counts_of(record)
    cells = record.get("cells") or []
    env = record.get("environment") or {}
    entries = ledger_entries(record)
    unfixed = set((record.get("ledger") or {}).get("unfixed") or [])
    stale = sum(bool(e.get("stale")) for e in entries) + len(unfixed)
    idle = sum(not e.get("stale") and e.get("id") not in unfixed and not (e.get("selected") and e.get("reproduced"))
               and not (e.get("required") and e.get("verdict") == "fixed here") for e in entries)
    totals = {
        "tests": str(len(cells) + len(entries)),
        "failures": str(counts.get("fail", 0) + stale),
        "errors": str(sum(n for s, n in counts.items() if s not in (*GOOD_STATUSES, "fail", "skipped"))),
        "skipped": str(counts.get("skipped", 0) + counts.get("known", 0) + counts.get(PATH_NOT_TAKEN, 0) + idle),
        "time": f"{float(record.get('duration_s') or sum(c.get('duration_s') or 0 for c in cells)):.3f}",
    }
    root = ET.Element("testsuites", {"name": "dw-harness", **totals})
    suite = ET.SubElement(root, "testsuite", {"name": "dw-harness", **totals,
                                              "timestamp": clean_text(record.get("started") or ""),
                                              "hostname": clean_text(env.get("hostname") or "")})
    props = ET.SubElement(suite, "properties")
    for k, v in (("backend", record.get("backend")), ("torch", env.get("torch")), ("device", env.get("device")),
                 ("pg_backend", env.get("pg_backend")), ("git_commit", env.get("git_commit")),
                 ("record_status", record.get("status")), ("command", record.get("command")),
                 *_review_properties(record)):
        if v is not None:
            ET.SubElement(props, "property", {"name": k, "value": clean_text(v)})
    reviewing = (record.get("ledger") or {}).get("required") is not None
    if reviewing:  # the verdict first: one testcase per entry, a required one not fixed fails
        for e in entries:
            _entry_case(suite, e, record)
    for c in cells:
        status = c.get("status", "error")
        module = str((c.get("axes") or {}).get("module", "cell"))
        tc = ET.SubElement(suite, "testcase", {
            "classname": clean_text(f"dw_harness.{module}"),
            "name": clean_text(c.get("id", "")),
            "time": f"{float(c.get('duration_s') or 0.0):.3f}",
        })
        if status == "fail":
            el = ET.SubElement(tc, "failure", {"message": _one_line(c.get("first_failure") or "cell failed"),
                                                "type": "mismatch"})
            el.text = _body(c)
        elif status not in (*GOOD_STATUSES, "skipped"):  # error, timeout, harness_error, ...
            errs = [r.get("error") for r in c.get("ranks") or [] if r.get("error")]
            etype = "timeout" if status == "timeout" else (errs[0].get("type", "error") if errs else status)
            el = ET.SubElement(tc, "error", {"message": _one_line(c.get("first_failure") or status),
                                              "type": clean_text(etype)})
            el.text = _body(c)
        elif status == "skipped":
            ET.SubElement(tc, "skipped", {"message": _one_line(c.get("first_failure") or "skipped")})
        elif status == PATH_NOT_TAKEN:  # the named path never ran: pytest's skip, with TE's reason
            ET.SubElement(tc, "skipped", {"message": _one_line(f"{STATUS_LABELS[status]}: {path_reason(c)}")})
        elif status == "known":  # pytest's xfail: the reason names the entries
            el = ET.SubElement(tc, "skipped", {"type": "pytest.xfail",
                                               "message": _one_line(f"{STATUS_LABELS['known']}: " + "; ".join(known_refs(c, record)))})
            el.text = _known_text(c)
        elif status == "xfail":
            out = ET.SubElement(tc, "system-out")
            errs = [r.get("error") for r in c.get("ranks") or [] if r.get("error")]
            what = f": {errs[0].get('type', '')}: {errs[0].get('message', '')}" if errs else ""
            out.text = clean_text(f"expected error met{what}")
    if not reviewing:
        for e in entries:
            _entry_case(suite, e, record)
    ET.indent(root, space=" ")
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
