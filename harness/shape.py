"""A cell's shapes, without torch: the CLI checks a selection against them before any rank
starts, and a command that launches ranks need not pay torch's import in its own process."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Example:
    """The shapes a cell runs with; hypothesis draws others with ``--examples``.

    ``out_features`` defaults to 30 so that GTP shards need tail padding at world sizes 4
    and 8 and none at 1 and 2; ``rows`` are per rank and microbatch.
    """

    in_features: int = 24
    out_features: int = 30
    rows: int = 12
    salt: int = 0

    def serialize(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Example":
        return cls(**{k: int(v) for k, v in d.items() if k in cls.__dataclass_fields__})
