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

from dataclasses import dataclass, field

import torch

from harness.rank.hooks import forward_executions
from harness.record import Check

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
    index = list(torch.unravel_index(torch.tensor(worst), a.shape)) if a.dim() else []
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
        factor = forward_executions(hooks) if kind == "materialize_forward" else 1
        want = [n * factor for n in twin.calls.get(kind, [0] * len(per_member))]
        ok = per_member == want
        out.append(Check(f"twin.{kind}_calls", KIND, ok,
                         None if ok else f"twin.{kind}_calls: hooked {per_member} per member, hooks off "
                                         f"{twin.calls.get(kind)} (x{factor} expected)",
                         expected=want, actual=per_member))
    return out
