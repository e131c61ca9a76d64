"""An upstream-ready bug report for one ledger entry, from a run record alone.

What a TE maintainer needs to act on a finding: the versions it was seen with, the smallest
cell that shows it and the command that reproduces it, what was observed against what the
contract expects (the failing checks and exceptions the entry explains, per rank), the
CONTRACTS sentence it breaks, the source that causes it, and every other cell it affects.
"""

from __future__ import annotations

import re
from typing import Any

from harness.vocabulary.errors import NoEvidence
from harness.vocabulary import matrix
from harness.judging.ledger import Entry, failing_items
from harness.records.record import CellResult


def _for_upstream(text: str) -> str:
    """"CONTRACTS §2" means a section of this repository's docs/contracts.md; upstream readers
    get it spelled out."""
    return text.replace("CONTRACTS §", "dw-harness's contract (docs/contracts.md) §")


def _size(cell: dict[str, Any]) -> tuple:
    """Smaller first: fewer ranks, groups and microbatches; hooks off; then the id."""
    a = cell["axes"]
    return (a["world_size"], a["num_gemms"], a["microbatches"], a["hooks"] != "off", a["bias"], cell["id"])


def _observed(rule: Entry, cell: dict[str, Any]) -> list[str]:
    """One line per rank and failure the entry's signature matches: what the check saw
    against what it expected, or what was raised."""
    result = CellResult.from_dict(cell)
    axes = matrix.Cell.from_dict(cell["axes"])
    checks = {(r.rank, c.name): c for r in result.ranks for c in r.comparisons}
    lines = []
    for item in failing_items(result):
        if rule.symptom(item, axes) is None:
            continue
        c = checks.get((item.rank, item.name))
        if item.kind == "exception" and item.type:
            lines.append(f"- rank {item.rank} raised `{item.type}: {item.text}`")
        elif c is not None and c.kind == "tensor":
            first = item.text.splitlines()[0] if item.text else ""
            lines.append(f"- rank {item.rank}, `{item.name}`: {first} (error/bound ratio {item.ratio or 0:.3g})")
        elif c is not None:
            lines.append(f"- rank {item.rank}, `{item.name}`: expected `{c.expected!r}`, got `{c.actual!r}`"
                         + (f" ({item.text})" if c.expected is None and item.text else ""))
    return lines


def _frames(cell: dict[str, Any], package: str) -> str | None:
    """The traceback of the first rank that raised, cut to the upstream package's frames."""
    for r in cell["ranks"]:
        tb = (r.get("error") or {}).get("traceback")
        if tb:
            keep = [l for l in tb.splitlines() if package in l or not l.startswith("  ")]
            return "\n".join(keep[-16:])
    return None


def render(record: dict[str, Any], entry_id: str) -> str:
    """The markdown report of ``entry_id`` (a ledger entry of ``record``).

    Raises:
        KeyError: the record's ledger has no such entry (or the record no ledger).
        NoEvidence: the entry reproduces in none of the run's cells.
    """
    ledger = record.get("ledger") or {}
    entry = next((e for e in ledger.get("entries", []) if e["id"] == entry_id), None)
    if entry is None:
        known = ", ".join(e["id"] for e in ledger.get("entries", [])) or "none: the run used no ledger"
        raise KeyError(f"the run's ledger has no entry {entry_id!r} (entries: {known})")
    by_id = {c["id"]: c for c in record["cells"]}
    cells = sorted((by_id[i] for i in entry.get("reproduced", []) if i in by_id), key=_size)
    if not cells:
        raise NoEvidence(f"entry {entry_id} reproduces in none of this run's cells: nothing to report "
                         "(run a sweep that selects its cells first)")
    smallest = cells[0]
    env = record.get("environment", {})
    info = env.get("backend_info") or {}
    package = info.get("upstream") or ledger.get("package") or "transformer_engine"
    upstream = f"{package} {info.get('version')}" if info.get("version") else package
    repro = smallest["repro"]
    sweep = ["python", "-m", "harness", "sweep", "--backend", record["backend"], "--preset",
             record.get("selection", {}).get("preset", "ci"), "--filter", entry["cells"]]
    out = [
        f"# {entry['title']}",
        "",
        f"Found by dw-harness (ledger entry `{entry['id']}`, upstream: {entry['upstream']}); "
        f"kind: {entry['kind']}.",
        "",
        "## Environment",
        "",
        f"- {upstream}" + (f" (imported from `{info['upstream_origin']}`)" if info.get("upstream_origin") else ""),
        f"- torch {env.get('torch', '?')}, Python {env.get('python', '?')}, {env.get('platform', '?')}",
        f"- device {env.get('device', '?')}, process group {env.get('pg_backend', '?')}; harness backend "
        f"`{record['backend']}`, fp32 GEMMs {info.get('fp32_gemm') or (record.get('tolerance') or {}).get('fp32_gemm', 'ieee')}",
        "",
        "## Smallest failing case",
        "",
        f"Cell `{smallest['id']}`: "
        + ", ".join(f"{k}={v}" for k, v in smallest["axes"].items()) + ".",
        "",
        "```bash",
        repro,
        "```",
        "",
        "## Observed",
        "",
        *(_observed(Entry.from_record(entry), smallest) or ["- (see the cell's checks in the report)"]),
        "",
        "## Expected",
        "",
        _for_upstream(entry.get("contract") or f"CONTRACTS §6: {entry['row']}"),
        "",
        "## Where",
        "",
        entry.get("where") or "(not located)",
    ]
    frames = _frames(smallest, package)
    if frames:
        out += ["", "Traceback (upstream frames):", "", "```", frames, "```"]
    out += [
        "",
        f"## Every affected cell in this run ({len(cells)} of the {len(entry.get('selected', []))} it selects)",
        "",
        "```bash",
        " ".join(_quote(p) for p in sweep),
        "```",
        "",
        *[f"- `{c['id']}` ({c['status']})" for c in cells[:40]],
    ]
    if len(cells) > 40:
        out.append(f"- ... and {len(cells) - 40} more")
    return "\n".join(out) + "\n"


def _quote(part: str) -> str:
    return part if re.fullmatch(r"[\w./:=,-]+", part) else "'" + part.replace("'", "'\\''") + "'"
