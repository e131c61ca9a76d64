"""The float64 oracle: what every rank's tensors should be, computed without sharding.

CONTRACTS §5: from the dtype-rounded inputs, in float64, over all W ranks and K
microbatches. Each value comes with its *magnitude* - the same computation on absolute
values (``|A| @ |B|``) - which the tolerance policy scales, so bounds grow with the
reduction length and with cancellation instead of being fixed ``atol``/``rtol`` pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.inputs import CellInputs

F64 = torch.float64


@dataclass
class Reference:
    """One expected tensor: its value, its magnitude, and how it was produced."""

    value: torch.Tensor
    magnitude: torch.Tensor
    reduction: int            # length of the GEMM reduction behind one element
    roundings: int            # sequential roundings in the value's dtype, the last one included


@dataclass
class RankOracle:
    outputs: list[Reference]          # per microbatch
    dgrads: list[Reference]           # per microbatch
    wgrad_sums: list[Reference]       # per weight: mean over ranks of the sum over microbatches
    bgrad_sums: list[Reference]       # per bias, likewise


def _group_rows(splits: list[int]) -> list[slice]:
    out, start = [], 0
    for s in splits:
        out.append(slice(start, start + s))
        start += s
    return out


def compute(inputs: CellInputs, rank: int, tags: tuple[float, float] = (1.0, 1.0)) -> RankOracle:
    """The oracle as seen from ``rank`` (outputs and dgrads are per rank; grads global).

    ``tags``: the factors of the weight's forward and backward copies (a tagged weight,
    ``harness.weights.Behaviour``): outputs use the forward copy, input gradients the
    backward copy; weight gradients do not involve the weight."""
    W = [w.to(F64) for w in inputs.weights]
    Wf = [w * tags[0] for w in W]
    Wb = [w * tags[1] for w in W]
    B = [b.to(F64) for b in inputs.biases]
    world = len(inputs.x)
    mbs = len(inputs.x[0])
    n = len(W)
    out_f, in_f = W[0].shape

    outputs, dgrads = [], []
    for m in range(mbs):
        x, dy = inputs.x[rank][m].to(F64), inputs.dy[rank][m].to(F64)
        y, ya = torch.zeros(x.shape[0], out_f, dtype=F64), torch.zeros(x.shape[0], out_f, dtype=F64)
        dx, dxa = torch.zeros_like(x), torch.zeros_like(x)
        for i, rows in enumerate(_group_rows(inputs.splits[rank][m])):
            y[rows] = x[rows] @ Wf[i].t() + (B[i] if B else 0.0)
            ya[rows] = x[rows].abs() @ Wf[i].abs().t() + (B[i].abs() if B else 0.0)
            dx[rows] = dy[rows] @ Wb[i]
            dxa[rows] = dy[rows].abs() @ Wb[i].abs()
        outputs.append(Reference(y, ya, reduction=in_f, roundings=2 if B else 1))
        dgrads.append(Reference(dx, dxa, reduction=out_f, roundings=1))

    wsum = [torch.zeros(out_f, in_f, dtype=F64) for _ in range(n)]
    wabs = [torch.zeros(out_f, in_f, dtype=F64) for _ in range(n)]
    bsum = [torch.zeros(out_f, dtype=F64) for _ in range(len(B))]
    babs = [torch.zeros(out_f, dtype=F64) for _ in range(len(B))]
    for r in range(world):
        for m in range(mbs):
            x, dy = inputs.x[r][m].to(F64), inputs.dy[r][m].to(F64)
            for i, rows in enumerate(_group_rows(inputs.splits[r][m])):
                wsum[i] += dy[rows].t() @ x[rows]
                wabs[i] += dy[rows].abs().t() @ x[rows].abs()
                if B:
                    bsum[i] += dy[rows].sum(0)
                    babs[i] += dy[rows].abs().sum(0)
    rows_total = inputs.x[0][0].shape[0]
    roundings = increment_roundings(mbs, world)
    wgrads = [Reference(s / world, a / world, rows_total * mbs, roundings) for s, a in zip(wsum, wabs)]
    bgrads = [Reference(s / world, a / world, rows_total * mbs, roundings) for s, a in zip(bsum, babs)]
    return RankOracle(outputs, dgrads, wgrads, bgrads)


def increment_roundings(microbatches: int, world: int) -> int:
    """Sequential roundings behind a weight or bias gradient's increment (``harness.compare``).

    One per microbatch's GEMM (or bias reduction) and one per accumulation of the next
    microbatch, ``W - 1`` adds of the cross-rank reduction and the ``1/W`` scale: each
    rounds a partial value no larger than the magnitude. (The start value's add is
    ``record_of``'s.)
    """
    return 2 * microbatches - 1 + (world - 1) + (1 if world > 1 else 0)


def record_of(ref: Reference, start: torch.Tensor | None, shard: tuple[int, int, int] | None) -> Reference:
    """The gradient of record: ``start + increment``, cut to this rank's shard if sharded.

    Args:
        ref: the global increment (mean over ranks of the sum over microbatches).
        start: the ``main_grad`` start value in the record's shape (None: autograd ``.grad``).
        shard: ``(padded_rows, row0, rows)`` for a GTP weight; padding rows keep ``start``.
    """
    value, magnitude = ref.value, ref.magnitude
    if shard is not None:
        padded, row0, nrows = shard
        pad = padded - value.shape[0]
        value = torch.nn.functional.pad(value, (0, 0, 0, pad))[row0:row0 + nrows]
        magnitude = torch.nn.functional.pad(magnitude, (0, 0, 0, pad))[row0:row0 + nrows]
    roundings = ref.roundings
    if start is not None:
        s = start.to(F64)
        value, magnitude, roundings = value + s, magnitude + s.abs(), roundings + 1
    return Reference(value, magnitude, ref.reduction, roundings)
