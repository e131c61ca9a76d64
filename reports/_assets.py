"""The report's stylesheet and program: package data files under ``assets/``, read once.

Status colours are not in the stylesheet: they are generated from the one status vocabulary
(``harness.vocabulary.status``), so a new status needs no edit here.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from harness.vocabulary.status import TABLE


@lru_cache(maxsize=None)
def asset(name: str) -> str:
    """The text of ``assets/<name>`` (installed as package data with ``harness_reports``)."""
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def status_css() -> str:
    """``--<status>`` colours, ``.s-<status>`` / ``.t-<status>`` classes, grid slot marks."""
    rules = [":root{" + "".join(f"--{s.name}:{s.color};" for s in TABLE) + "}"]
    for s in TABLE:
        rules.append(f".s-{s.name}{{background:var(--{s.name})}}.t-{s.name}{{color:var(--{s.name})}}")
        if s.bad:
            rules.append(f"table.grid td.worst-{s.name}{{box-shadow:inset 3px 0 0 var(--{s.name})}}")
    return "".join(rules)


def css() -> str:
    return asset("report.css") + status_css()


def js() -> str:
    return asset("report.js")
