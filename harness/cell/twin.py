"""Twin checks: a hooked cell against its hooks-off twin, bit for bit.

A saved-tensor hook (identity, offload, ``save_on_cpu``, non-reentrant checkpointing) only
moves the saved tensors, or recomputes the forward from the same inputs; on a correct
backend it changes no arithmetic. So the hooked cell and the same cell with hooks off, on
the same inputs and the same ``main_grad`` start values, must give bitwise-equal outputs,
input gradients and gradients of record, and the same protocol call counts - except that
checkpointing runs each forward twice, so forward materializations double. No tolerance:
the oracle's bound admits rounding differences, the twin admits none (TE PR #3545's test
checks the same). The only documented exception would be arithmetic that really differs
with hooks; on CPU none does (checkpointing recomputes the same GEMMs in the same order).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.cell.compare import unravel
from harness.cell.hooks import forward_executions
from harness.records.record import Check, RankResult

#: the check kind of every twin check: reports show twin failures as their own kind
KIND = "twin"


@dataclass
class Kept:
    """What one run of a cell leaves for its twin: the step's tensors and call counts."""

    outputs: list[torch.Tensor] = field(default_factory=list)
    dgrads: list[torch.Tensor | None] = field(default_factory=list)
    #: ``<param>.main_grad`` / ``<param>.grad`` -> the gradient of record after the step
    records: dict[str, torch.Tensor | None] = field(default_factory=dict)
    #: protocol call kind -> calls per group member (empty without a distributed weight)
    calls: dict[str, list[int]] = field(default_factory=dict)


def _detached(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone()


class Twins:
    """The hooks-off runs one rank of a lane has done, newest last, for the hooked cells that
    come after them. A cell's seed leaves its hook mode out (``Cell.seed``), so a hooked cell's
    twin *is* its hooks-off cell - the same inputs, start values and steps: ``ci``'s 574 hooked
    cells have 401 distinct twins, 221 of them ``ci`` cells themselves. A twin is kept after it
    ran (a hooked cell's twin run, or the hooks-off cell's own run) with its outcome, an error
    too, and served again instead of running again.

    Every rank of a lane runs the lane's cells in the same order and keeps every twin that
    ran, so the ranks hit and miss together: a hit runs no collective on any rank, a miss runs
    the twin's on every rank, as before. At most ``size`` twins are kept (the oldest go first,
    on every rank alike)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self.hits = 0
        self._kept: OrderedDict[tuple[int, str, str], tuple[RankResult, Kept]] = OrderedDict()

    @staticmethod
    def key(backend: Any, twin_id: str, example: Any) -> tuple[int, str, str]:
        """``backend`` (the loaded module object, one per spec for the rank's life), the twin's
        cell id and the cell's fitted example."""
        return id(backend), twin_id, json.dumps(example.serialize(), sort_keys=True)

    def get(self, key: tuple[int, str, str]) -> tuple[RankResult, Kept] | None:
        found = self._kept.get(key)
        if found is not None:
            self.hits += 1
            self._kept.move_to_end(key)
        return found

    def put(self, key: tuple[int, str, str], result: RankResult, kept: Kept) -> None:
        """Keep a twin's outcome as ``_add_twin_checks`` reads it - its status, and for an error
        the error and the checks it made - and detached copies of its tensors."""
        errored = result.status not in ("pass", "fail")
        outcome = RankResult(result.rank, result.status, list(result.comparisons) if errored else [],
                             dict(result.error) if result.error else None, by_peer=result.by_peer)
        copy = Kept([_detached(t) for t in kept.outputs], [_detached(t) for t in kept.dgrads],
                    {n: _detached(t) for n, t in kept.records.items()}, {k: list(v) for k, v in kept.calls.items()})
        self._kept[key] = (outcome, copy)
        self._kept.move_to_end(key)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)


def _bitwise(name: str, hooked: torch.Tensor | None, twin: torch.Tensor | None) -> Check:
    if hooked is None or twin is None:
        ok = hooked is None and twin is None
        return Check(name, KIND, ok, None if ok else f"{name}: one run has no tensor "
                     f"(hooked: {hooked is not None}, hooks off: {twin is not None})")
    a, b = hooked.detach().cpu(), twin.detach().cpu()
    if a.shape != b.shape or a.dtype != b.dtype:
        return Check(name, KIND, False, f"{name}: hooked {tuple(a.shape)} {a.dtype} vs hooks off "
                     f"{tuple(b.shape)} {b.dtype}")
    # NaN in the same places counts as equal: bits, not values, are compared
    same = (a == b) | (a.isnan() & b.isnan())
    if bool(same.all()):
        return Check(name, KIND, True, numel=a.numel(), mismatched=0, max_abs=0.0)
    diff = (a.to(torch.float64) - b.to(torch.float64)).abs().nan_to_num(float("inf"))
    worst = int(diff.argmax())
    index = list(unravel(worst, a.shape))
    mism = int((~same).sum())
    msg = (f"Hooked and hooks-off runs differ! Mismatched elements: {mism} / {a.numel()} "
           f"({100 * mism / max(a.numel(), 1):.1f}%) · greatest abs diff {float(diff.flatten()[worst]):.6g} "
           f"at {tuple(int(i) for i in index)} (bitwise equality required)\nThe failure occurred for item {name}")
    return Check(name, KIND, False, msg, numel=a.numel(), mismatched=mism,
                 max_abs=float(diff.flatten()[worst]), index=[int(i) for i in index])


def checks(hooks: str, hooked: Kept, twin: Kept) -> list[Check]:
    """The twin checks of a cell run with ``hooks`` against its hooks-off twin."""
    out = []
    for m, (a, b) in enumerate(zip(hooked.outputs, twin.outputs)):
        out.append(_bitwise(f"twin.mb{m}.output", a, b))
    for m, (a, b) in enumerate(zip(hooked.dgrads, twin.dgrads)):
        if a is not None or b is not None:
            out.append(_bitwise(f"twin.mb{m}.input_grad", a, b))
    for name in hooked.records:
        out.append(_bitwise(f"twin.{name}", hooked.records[name], twin.records.get(name)))
    for kind, per_member in hooked.calls.items():
        # a forward recomputed in backward gathers again (a layer's kinds are named per expert
        # group: "it0.layers.0.linear_fc1.materialize_forward")
        factor = forward_executions(hooks) if kind.rsplit(".", 1)[-1] == "materialize_forward" else 1
        want = [n * factor for n in twin.calls.get(kind, [0] * len(per_member))]
        ok = per_member == want
        out.append(Check(f"twin.{kind}_calls", KIND, ok,
                         None if ok else f"twin.{kind}_calls: hooked {per_member} per member, hooks off "
                                         f"{twin.calls.get(kind)} (x{factor} expected)",
                         expected=want, actual=per_member))
    return out
