"""The launch plan: what every rank of one launch runs, as the launcher hands it over.

The parent side writes it (``harness.launcher.launch``, one JSON file per launch under ``plans/``;
``harness.rank.external``, built by every rank from the same options) and the ranks read it
(``harness.rank.worker``, and torchrun's agent to preload the plan's backends). Typed here so
that both sides name its fields the same way; the JSON file keeps the keys it always had,
so a plan written before (without lanes, or without a task's own ``examples``) still loads.
Pure Python (no torch): the CLI process writes plans.

The rest of the protocol between the parent and torchrun's processes lives here too: the
command line of the harness's torchrun agent (``harness.rank.agent``: torchrun whose every
listening socket is on loopback; an entry point of its own, since its process becomes the
ranks' parent - the launcher needs only its command line and never imports it), whether the
agent forks the ranks, and the marker a warm agent prints its probe's outcome behind.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the module torchrun's agent runs (``python -m harness.rank.agent [torchrun options] -m harness.rank.worker ...``)
AGENT_MODULE = "harness.rank.agent"
#: the line of a warm agent's stdout that carries its probe's outcome (JSON after it)
WARM_MARKER = "dw-harness-warm-probe "


def agent_command(*torchrun_args: str) -> list[str]:
    """The command line that runs torchrun with ``torchrun_args`` on loopback only.

    ``torchrun_args`` are torchrun's options and the training script (``-m harness.rank.worker
    ...``), without any rendezvous option: the agent owns those.
    """
    return [sys.executable, "-m", AGENT_MODULE, *torchrun_args]


def harness_root() -> str:
    """The folder holding this checkout's ``harness`` package: an agent server
    (``harness.rank.agent_server``) serves only callers of its own checkout."""
    return str(Path(__file__).resolve().parents[2])


def ranks_forked() -> bool:
    """Whether torchrun's agent forks the harness's ranks (``harness.rank.agent``): on Linux,
    unless ``DW_RANK_START=spawn`` (macOS's system libraries are not fork-safe)."""
    return sys.platform.startswith("linux") and os.environ.get("DW_RANK_START", "fork") == "fork"



@dataclass
class Lane:
    """A sub-group of a launch and the indices (into the launch's task list) it runs, in order."""

    ranks: tuple[int, ...]
    tasks: list[int] = field(default_factory=list)

    def serialize(self) -> dict:
        return {"ranks": list(self.ranks), "tasks": list(self.tasks)}

    @classmethod
    def from_dict(cls, d: dict) -> "Lane":
        return cls(tuple(d["ranks"]), list(d["tasks"]))


@dataclass(frozen=True)
class PlanTask:
    """One cell against one backend, by cell id (the ranks rebuild the cell from it)."""

    backend: str
    cell: str
    #: hypothesis-drawn extra examples for this task (None: the plan's ``examples``)
    examples: int | None = None

    def serialize(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.backend, "cell": self.cell}
        if self.examples is not None:
            d["examples"] = self.examples
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlanTask:
        examples = d.get("examples")
        return cls(d["backend"], d["cell"], None if examples is None else int(examples))


@dataclass
class LaunchPlan:
    """One launch: its run folder and name, its tasks in order, the lanes that run them, and
    how the ranks set themselves up."""

    run_dir: Path
    launch: str
    tasks: list[PlanTask]
    #: sub-groups and the task indices each runs (``harness.vocabulary.packing``); None: one lane of
    #: every rank running every task (a plan written before lanes existed)
    lanes: list[Lane] | None = None
    #: each rank exits as soon as its lanes are done (the launcher's launches); otherwise it
    #: waits for every verdict of the launch and tears the process group down
    exit_when_done: bool = False
    device: str = "auto"
    threads_per_rank: int = 1
    #: one fixed shape for every task (``Example.serialize()``); None: each cell's own
    example: dict[str, Any] | None = None
    #: hypothesis-drawn extra examples of a task that does not say
    examples: int = 0
    collective_timeout: float = 120.0
    #: the selection that built the plan (``harness.rank.external``: its rank 0 writes the record)
    selection: dict[str, Any] | None = None

    def examples_of(self, task: PlanTask) -> int:
        """The extra examples ``task`` runs."""
        return self.examples if task.examples is None else task.examples

    def lanes_for(self, world: int) -> list[Lane]:
        """The plan's lanes; without any, one lane of the ``world`` ranks running every task."""
        if self.lanes is None:
            return [Lane(tuple(range(world)), list(range(len(self.tasks))))]
        return self.lanes

    def serialize(self) -> dict[str, Any]:
        d: dict[str, Any] = {"run_dir": str(self.run_dir), "launch": self.launch,
                             "tasks": [t.serialize() for t in self.tasks]}
        if self.lanes is not None:
            d["lanes"] = [lane.serialize() for lane in self.lanes]
        d.update(exit_when_done=self.exit_when_done, device=self.device, threads_per_rank=self.threads_per_rank,
                 example=self.example, examples=self.examples, collective_timeout=self.collective_timeout)
        if self.selection is not None:
            d["selection"] = self.selection
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LaunchPlan:
        return cls(Path(d["run_dir"]), d["launch"], [PlanTask.from_dict(t) for t in d["tasks"]],
                   [Lane.from_dict(x) for x in d["lanes"]] if "lanes" in d else None,
                   bool(d.get("exit_when_done", False)), d.get("device", "auto"),
                   int(d.get("threads_per_rank", 1)), d.get("example"), int(d.get("examples", 0)),
                   float(d.get("collective_timeout", 120)), d.get("selection"))

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.serialize(), indent=1))

    @classmethod
    def read(cls, path: Path) -> LaunchPlan:
        return cls.from_dict(json.loads(Path(path).read_text()))
