"""The harness's GTP weight: a ``DistributedWeight`` implementer over ``torch.distributed``.

Megatron-Core's Generalized Tensor Parallelism shards a weight over a group and hands the
module a tensor subclass that knows how to all-gather itself and reduce-scatter its
gradient. This is an independent implementation of that contract (CONTRACTS §3): dim 0
(output features) is sharded with zero padding at the tail, group-level calls are served
by the leader, and every call is recorded so the harness can check the protocol (§2).

Each group uses one collective per call whatever its size (the members' shards travel
concatenated), because gloo has no coalescing manager.
"""

from __future__ import annotations

import gc
import math
import re
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.distributed as dist

__all__ = ["GTPWeight", "GTPGroup", "CallLog", "inject_gtp", "weight_names", "shard_rows"]

#: a distinctive, finite pattern that fresh grad buffers hold, so a backend that
#: accumulates into ``grad_buffer()`` instead of overwriting it is caught on the first step
_POISON_SCALE = 97.0


@dataclass
class CallLog:
    """Every protocol call a group received, in order."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, member: int, **info: Any) -> None:
        self.calls.append({"kind": kind, "member": member, **info})

    def count(self, kind: str, member: int | None = None) -> int:
        return sum(1 for c in self.calls if c["kind"] == kind and (member is None or c["member"] == member))

    def finalize_dtypes(self) -> list[str]:
        return [d for c in self.calls if c["kind"] == "finalize" for d in c["dtypes"]]


def shard_rows(rows: int, world_size: int, pad_multiple: int = 1) -> tuple[int, int]:
    """Return ``(padded_rows, rows_per_rank)`` for sharding ``rows`` over ``world_size``.

    Raises:
        ValueError: some rank would hold nothing but padding (the shapes cannot shard).
    """
    if world_size < 1 or pad_multiple < 1:
        raise ValueError(f"world_size={world_size} and pad_multiple={pad_multiple} must be >= 1")
    unit = world_size * pad_multiple
    padded = math.ceil(rows / unit) * unit
    per_rank = padded // world_size
    if (world_size - 1) * per_rank >= rows:
        raise ValueError(
            f"world size {world_size} cannot shard {rows} rows (pad_multiple={pad_multiple}): "
            f"rank {world_size - 1} would hold only padding"
        )
    return padded, per_rank


# torch >= 2.13 renames the tensor collectives (the old names warn); use whichever exists
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _unsupported(exc: BaseException) -> bool:
    """A collective the backend does not implement (vs. a real communication failure)."""
    text = str(exc).lower()
    return isinstance(exc, NotImplementedError) or "not supported" in text or "unsupported" in text


class GTPWeight(torch.nn.Parameter):
    """A parameter holding one rank's shard; ``.shape`` is the (padded) shard shape."""

    is_distributed_weight = True

    def __new__(cls, shard: torch.Tensor, requires_grad: bool = True) -> "GTPWeight":
        return torch.Tensor._make_subclass(cls, shard, requires_grad)

    def __init__(self, shard: torch.Tensor, requires_grad: bool = True) -> None:
        self.gtp_group: GTPGroup | None = None
        self.gtp_index = 0
        self._grad_buffer: torch.Tensor | None = None

    @property
    def logical_shape(self) -> tuple[int, ...]:
        return self.gtp_group.logical_shape

    @property
    def padded_shape(self) -> tuple[int, ...]:
        return (self.gtp_group.padded_rows, *self.gtp_group.logical_shape[1:])

    # ---- the DistributedWeight protocol -------------------------------------------------
    def materialize_group_for_forward(self) -> Any:
        self.gtp_group.log.add("materialize_forward", self.gtp_index)
        return self.gtp_group.gather(track=True)

    def materialize_group_for_backward(self) -> Any:
        self.gtp_group.log.add("materialize_backward", self.gtp_index)
        return self.gtp_group.gather()

    def finalize_group_grads(self, wgrads: Any) -> Any:
        return self.gtp_group.finalize(self.gtp_index, wgrads)

    def grad_buffer(self) -> torch.Tensor:
        main_grad = getattr(self, "main_grad", None)
        dtype = main_grad.dtype if main_grad is not None else self.dtype
        self.gtp_group.log.add("grad_buffer", self.gtp_index, dtype=str(dtype).replace("torch.", ""))
        buf = self._grad_buffer
        if buf is None or buf.dtype != dtype:
            shape = self.logical_shape
            poison = torch.arange(math.prod(shape), dtype=torch.float64).remainder_(7).sub_(3)
            buf = (poison * _POISON_SCALE).to(dtype=dtype, device=self.device).reshape(shape)
            self._grad_buffer = buf
        return buf


class GTPGroup:
    """What the members of one module's weight group share: process group, shapes, log."""

    def __init__(self, members: Sequence[GTPWeight], logical_shape: tuple[int, ...],
                 padded_rows: int, group: Any, world_size: int, rank: int) -> None:
        self.members = list(members)
        self.logical_shape = tuple(logical_shape)
        self.padded_rows = padded_rows
        self.rows_per_rank = padded_rows // world_size
        self.group = group
        self.world_size = world_size
        self.rank = rank
        self.log = CallLog()
        self._forward_gathers: list[weakref.ref] = []

    # ---- collectives (one per call for the whole group) ----------------------------------
    def _all_gather(self, flat: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return flat.clone().unsqueeze(0)
        out = torch.empty(self.world_size * flat.numel(), dtype=flat.dtype, device=flat.device)
        _ALL_GATHER(out, flat.contiguous(), group=self.group)
        return out.view(self.world_size, -1)

    def _reduce_scatter(self, chunks: torch.Tensor) -> torch.Tensor:
        """SUM-reduce ``chunks[r]`` from every rank onto rank r, in the chunks' dtype."""
        if self.world_size == 1:
            return chunks[0].clone()
        out = torch.empty(chunks.shape[1], dtype=chunks.dtype, device=chunks.device)
        try:
            _REDUCE_SCATTER(out, chunks.contiguous().view(-1), group=self.group)
        except (RuntimeError, NotImplementedError) as exc:
            if not _unsupported(exc):
                raise
            # Exact equivalent where a backend lacks reduce-scatter: gather, sum in rank order.
            everyone = self._all_gather(chunks.contiguous().view(-1)).view(self.world_size, self.world_size, -1)
            out = everyone[:, self.rank].sum(0, dtype=chunks.dtype)
        return out

    def gather(self, track: bool = False) -> list[torch.Tensor] | torch.Tensor:
        """All-gather every member, strip the padding, return detached logical tensors.

        ``track`` keeps weak references, so the harness can tell whether a backend held
        on to a forward's gathered weights (they are transient, CONTRACTS §2).
        """
        cols = self.logical_shape[1:]
        flat = torch.cat([m.detach().reshape(-1) for m in self.members])
        per_rank = self._all_gather(flat)
        shard_numel = self.rows_per_rank * math.prod(cols)
        out = []
        for i, m in enumerate(self.members):
            seg = per_rank[:, i * shard_numel:(i + 1) * shard_numel]
            full = seg.reshape(self.padded_rows, *cols)[: self.logical_shape[0]].clone()
            out.append(full.requires_grad_(m.requires_grad))
        if track:
            self._forward_gathers.extend(weakref.ref(t) for t in out)
        return out[0] if len(out) == 1 else out

    def live_forward_gathers(self) -> int:
        """How many tensors handed out by forward-materialize are still alive."""
        alive = sum(r() is not None for r in self._forward_gathers)
        if alive:
            gc.collect()  # only reference cycles could keep a released tensor; rule them out
            alive = sum(r() is not None for r in self._forward_gathers)
        return alive

    def finalize(self, caller: int, wgrads: Any) -> Any:
        """Pre-scale by 1/N, pad, reduce-scatter, then deliver into ``main_grad`` or return.

        Raises:
            ValueError: the wrong number of wgrads, or a wgrad not of the logical shape.
        """
        grads = list(wgrads) if isinstance(wgrads, (list, tuple)) else [wgrads]
        self.log.add("finalize", caller, dtypes=[str(g.dtype).replace("torch.", "") for g in grads],
                     shapes=[list(g.shape) for g in grads])
        if len(grads) != len(self.members):
            raise ValueError(f"finalize_group_grads got {len(grads)} wgrads for a group of {len(self.members)}")
        for i, g in enumerate(grads):
            if tuple(g.shape) != self.logical_shape:
                raise ValueError(
                    f"finalize_group_grads: wgrad {i} has shape {tuple(g.shape)}, expected the "
                    f"logical shape {self.logical_shape}"
                )
        dtype = grads[0].dtype
        n, s = self.world_size, self.rows_per_rank
        pad = self.padded_rows - self.logical_shape[0]
        padded = [
            torch.nn.functional.pad(g.to(dtype) * (1.0 / n), (0, 0, 0, pad)) if pad else g.to(dtype) * (1.0 / n)
            for g in grads
        ]
        # chunks[r] = concatenation of every member's rows for rank r
        chunks = torch.stack([torch.cat([p[r * s:(r + 1) * s].reshape(-1) for p in padded]) for r in range(n)])
        mine = self._reduce_scatter(chunks)
        shard_numel = mine.numel() // len(self.members)
        results = []
        for i, m in enumerate(self.members):
            shard = mine[i * shard_numel:(i + 1) * shard_numel].view(m.shape)
            main_grad = getattr(m, "main_grad", None)
            if main_grad is None:
                results.append(shard)
                continue
            if tuple(main_grad.shape) != tuple(m.shape):
                raise ValueError(f"weight{i}.main_grad has shape {tuple(main_grad.shape)}, expected the shard shape {tuple(m.shape)}")
            main_grad.add_(shard)
            m.grad_added_to_main_grad = True
            results.append(torch.zeros(m.shape, dtype=m.dtype, device=m.device))
        return results[0] if len(results) == 1 else results


_WEIGHT_NAME = re.compile(r"^weight(\d*)$")


def weight_names(module: torch.nn.Module) -> list[str]:
    """The module's weight parameters in group order: ``weight`` or ``weight0..weightN-1``."""
    found = [n for n, _ in module.named_parameters(recurse=False) if _WEIGHT_NAME.match(n)]
    return sorted(found, key=lambda n: int(_WEIGHT_NAME.match(n).group(1) or 0))


def inject_gtp(module: torch.nn.Module, group: Any = None, pad_multiple: int = 1) -> GTPGroup:
    """Replace a module's weight parameters by GTP weights, as Megatron does at construction.

    Every rank must hold the same full weights when this is called; rank r keeps rows
    ``[r*s, (r+1)*s)`` of the zero-padded weight.

    Args:
        module: any backend's ``Linear``/``GroupedLinear``/``ops.GroupedLinear`` instance.
        group: the GTP process group (default: the world); None without a process group
            means world size 1 in-process.
        pad_multiple: pad rows to a multiple of ``world_size * pad_multiple``.

    Returns:
        The group, whose ``log`` records every protocol call.

    Raises:
        ValueError: the module has no weights, or the world size cannot shard them.
    """
    names = weight_names(module)
    if not names:
        raise ValueError(f"{type(module).__name__} has no weight parameters to shard")
    initialized = dist.is_available() and dist.is_initialized()
    world_size = dist.get_world_size(group) if initialized else 1
    rank = dist.get_rank(group) if initialized else 0
    full = [getattr(module, n) for n in names]
    logical = tuple(full[0].shape)
    padded_rows, s = shard_rows(logical[0], world_size, pad_multiple)
    members = []
    for w in full:
        data = torch.nn.functional.pad(w.detach(), (0, 0, 0, padded_rows - logical[0]))
        members.append(GTPWeight(data[rank * s:(rank + 1) * s].clone(), requires_grad=w.requires_grad))
    gtp = GTPGroup(members, logical, padded_rows, group if initialized else None, world_size, rank)
    for i, (name, m) in enumerate(zip(names, members)):
        m.gtp_group, m.gtp_index = gtp, i
        setattr(module, name, m)
    return gtp
