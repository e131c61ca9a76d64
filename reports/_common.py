"""Helpers shared by the renderers: number formatting, text hygiene, the status vocabulary.

The reports read only the parsed ``results.json`` (``RunRecord.serialize()``); the status
vocabulary is ``harness.vocabulary.status``'s, re-exported here for the renderers.
"""

from __future__ import annotations

from collections import Counter

import math
import re
from typing import Any

# the one status vocabulary (harness.vocabulary.status is tiny and imports nothing heavy)
from harness.judging import gate
from harness.vocabulary import hook_modes, selection
from harness.judging import ledger as ledgers
from harness.vocabulary.status import (BAD_STATUSES, GOOD_STATUSES, PATH_NOT_TAKEN, STATUS_LABELS,  # noqa: E402,F401
                            STATUSES, counts_text)

# Characters XML 1.0 forbids (everything below 0x20 except tab/newline/CR, lone surrogates,
# U+FFFE/U+FFFF). The same filter keeps terminals and markdown renderers sane.
_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def clean_text(s: Any) -> str:
    """``str(s)`` minus characters that are illegal in XML 1.0 (and invisible anyway)."""
    return _ILLEGAL_XML.sub("\ufffd", "" if s is None else str(s))


def ratio_key(r: Any) -> float:
    """Sort key for a worst_ratio: None lowest, NaN highest (a NaN error is never fine)."""
    if r is None:
        return -1.0
    r = float(r)
    return math.inf if math.isnan(r) else r


def fmt_ratio(r: Any) -> str:
    """A ratio as a short label: ``0.31``, ``2.4``, ``3e-04``; NaN/inf spelled out."""
    if r is None:
        return ""
    r = float(r)
    if math.isnan(r):
        return "nan"
    if math.isinf(r):
        return "inf" if r > 0 else "-inf"
    if r == 0:
        return "0"
    if r < 0.01:
        m, e = f"{r:.0e}".split("e")
        return f"{m}e{int(e)}"
    if r < 1:
        return f"{r:.2g}"
    if r < 100:
        return f"{r:.3g}"
    if r < 1e4:
        return str(round(r))
    return f"{r:.1e}".replace("e+0", "e").replace("e+", "e")


def fmt_duration(s: Any) -> str:
    """Seconds as ``1h 02m 03s`` / ``4m 05s`` / ``6.2s``."""
    if s is None:
        return "–"
    s = float(s)
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def verdict(record: dict[str, Any]) -> str:
    """``PASS`` / ``FAIL`` / ``INCOMPLETE``: one word for titles and badges, by the gate's rule
    (``harness.judging.gate``: a stale or unfixed ledger entry fails the run as a failing cell does)."""
    return gate.word(record)


def counts_of(record: dict[str, Any]) -> dict[str, int]:
    """Counts per status, recomputed from the cells (the stored ``counts`` may be stale)."""
    out = {s: 0 for s in STATUSES}
    for c in record.get("cells", []):
        out[c.get("status", "error")] = out.get(c.get("status", "error"), 0) + 1
    return out


def worst_check(cell: dict[str, Any]) -> tuple[str, int] | None:
    """``(check name, rank)`` of the tensor check with the highest ratio in a cell."""
    best: tuple[float, str, int] | None = None
    for r in cell.get("ranks") or []:
        for c in r.get("comparisons") or []:
            if c.get("ratio") is None:
                continue
            k = ratio_key(c["ratio"])
            if best is None or k > best[0]:
                best = (k, c.get("name", "?"), r.get("rank", -1))
    return None if best is None else (best[1], best[2])


def failing_messages(cell: dict[str, Any], limit: int = 5) -> list[str]:
    """Up to ``limit`` one-per-problem lines: failed checks and rank exceptions."""
    out: list[str] = []
    for r in cell.get("ranks") or []:
        rank = r.get("rank", "?")
        err = r.get("error")
        raised = f"{err.get('type', 'Exception')}: {err.get('message', '')}".rstrip() if err else None
        if raised:
            out.append(f"[rank {rank}] {raised}")
        for c in r.get("comparisons") or []:
            if not c.get("ok", True):
                msg = c.get("message") or ""
                if c.get("kind") == "exception" and msg.strip() == raised:
                    continue  # the exception check restates the rank's error
                if not msg and "expected" in c:
                    msg = f"expected {c.get('expected')!r}, got {c.get('actual')!r}"
                out.append(f"[rank {rank}] {c.get('name', '?')}: {msg}".rstrip())
        if len(out) >= limit:
            break
    return out[:limit]


def backend_facts(record: dict[str, Any]) -> list[tuple[str, Any]]:
    """What the run record says about the backend beyond its name: the upstream code it ran
    (name, version, where it was imported from) and how its fp32 GEMMs compute."""
    info = (record.get("environment") or {}).get("backend_info") or {}
    upstream = " ".join(str(x) for x in (info.get("upstream"), info.get("version")) if x) or None
    fp32 = info.get("fp32_gemm") or (record.get("tolerance") or {}).get("fp32_gemm")
    u = {"tf32": "TF32, u = 2^-11", "ieee": "IEEE fp32, u = 2^-24"}.get(fp32, fp32)
    return [("upstream", upstream), ("imported from", info.get("upstream_origin") or info.get("origin")),
            ("fp32 GEMMs", u if info or fp32 else None)]


# ----------------------------------------------------------------------------- the ledger (CONTRACTS §7)


def ledger_entries(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of the ledger the run was judged under (``[]`` without a ledger)."""
    return list((record.get("ledger") or {}).get("entries") or [])


def stale_entries(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The ledger entries that reproduce in none of the cells they select (they fail the run)."""
    return [e for e in ledger_entries(record) if e.get("stale")]


def entry_state(e: dict[str, Any], judged: bool = True) -> str:
    """One phrase for what an entry did in this run; ``judged`` is False in a shard, where an
    entry that reproduced nowhere may still reproduce in another shard."""
    sel, rep, known = (len(e.get(k) or []) for k in ("selected", "reproduced", "known_cells"))
    if e.get("stale"):
        return f"STALE: reproduced in none of its {sel} cell(s)"
    if not sel:
        return "selects no cell of this run"
    if not rep and not judged:
        return f"reproduced in none of {sel} selected (stale is judged when the shards merge)"
    other = len(e.get("path_not_taken") or [])
    return (f"{known} known cell(s), reproduced in {rep} of {sel} selected"
            + (f", {other} took another TE path ({STATUS_LABELS[PATH_NOT_TAKEN]})" if other else ""))


def stale_line(e: dict[str, Any], record: dict[str, Any]) -> str:
    """What the gate says about a stale entry: a fix landed, delete the entry."""
    return ledgers.stale_message(e["id"], record.get("ledger") or {})


def known_refs(cell: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """``ID (upstream)`` for each ledger entry that explains a ``known`` cell."""
    upstream = {e.get("id"): e.get("upstream") for e in ledger_entries(record)}
    return [f"{i} ({upstream[i]})" if upstream.get(i) else str(i) for i in cell.get("known") or []]


def installers_line(record: dict[str, Any]) -> str | None:
    """Which of TE's and Megatron's hook installers the run ran (cells per mode), and what it
    left out for want of them (``harness.vocabulary.selection.left_out_line``); None when it
    neither ran nor left out any."""
    ran = Counter(c["axes"]["hooks"] for c in record.get("cells") or []
                  if c.get("axes", {}).get("hooks") in hook_modes.INSTALLERS)
    left = selection.left_out_line(record.get("selection") or {})
    if not ran and not left:
        return None
    parts = [f"hook installers run: {', '.join(f'{m} ({ran[m]} cells)' for m in hook_modes.INSTALLERS if ran[m]) or 'none'}"]
    if left:
        parts.append(left)
    return "; ".join(parts)


def rank_facts(cell: dict[str, Any]) -> list[str]:
    """What each rank recorded of what it ran under, one line per distinct fact: the recipe
    (``harness.cell.lowp.describe``: TE's class and the device it was shown) and the hooks
    (``harness.cell.hooks.Packs``: whose installer, its pack calls, those on the weight)."""
    out: list[str] = []
    for r in cell.get("ranks") or []:
        recipe, hooks = r.get("recipe"), r.get("hooks")
        if recipe:
            line = f"recipe: {recipe.get('recipe')} (TE's {recipe.get('te_class')}" + (
                f", device {recipe['device']})" if recipe.get("device") else ")")
            if line not in out:
                out.append(line)
        if hooks:
            out.append(f"hooks (rank {r.get('rank')}): {hooks.get('mode')} by {hooks.get('installer')}'s installer, "
                       f"{hooks.get('packs')} packs, {hooks.get('weight_packs')} of them on a DistributedWeight")
    return out
