"""The harness's GTP weight: a ``DistributedWeight`` implementer over ``torch.distributed``.

Megatron-Core's Generalized Tensor Parallelism shards a weight over a group and hands the
module a tensor subclass that knows how to all-gather itself and reduce-scatter its
gradient. This is an independent implementation of that contract (CONTRACTS §3): dim 0
(output features) is sharded with zero padding at the tail, group-level calls are served
by the leader, and every call is recorded so the harness can check the protocol (§2).

A :class:`~harness.vocabulary.weights.Behaviour` selects which of §2's implementer freedoms it
exercises - Megatron's class takes every one of them, so a backend that only works with a
kinder implementer is caught: padding to ``16·N``, in-place ``1/N`` scaling of the caller's
wgrads, asynchronous finalize delivered along a prefetch chain, materializations borrowed
from buffers that go stale, NaN where Megatron leaves memory uninitialised, and copies
without ``requires_grad``. The kind defaults give fresh copies and synchronous finalize.

The all-gather of a group is one collective whatever its size (the members' shards travel
concatenated: gloo has no coalescing manager); the reduce-scatter is too, unless the
behaviour asks for one per member as Megatron issues them (same summation order).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import re
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.distributed as dist

from harness.cell.faults import WeightStateLost
from harness.cell.faults import HarnessBug
from harness.vocabulary.weights import Behaviour, shard_rows

__all__ = ["GTPWeight", "GTPGroup", "WeightStateLost", "CallLog", "Behaviour", "inject_gtp", "weight_names",
           "shard_rows", "reset_chain"]

#: a distinctive, finite pattern that fresh grad buffers hold, so a backend that
#: accumulates into ``grad_buffer()`` instead of overwriting it is caught on the first step
_POISON_SCALE = 97.0
_NAN = float("nan")


def live_referents(refs: Sequence[weakref.ref], floor: int = 0) -> int:
    """How many of ``refs`` still point to a live object, reference cycles ruled out - or, when
    that many cannot exceed ``floor`` (the largest count the caller already holds), a number
    no larger than ``floor``.

    Only a cycle could keep a released tensor alive, so a count above ``floor`` is taken again
    after a full collection. A collection scans every object the rank holds, and a count above
    0 is common where a backend keeps its gathered weight (each failing cell of TE's known
    defects that keep it meets one every microbatch). The caller keeps the largest count of a
    step, so a count at or below the one it has cannot change it, collected or not: the later
    microbatches of such a cell collect nothing."""
    alive = sum(r() is not None for r in refs)
    if alive > floor:
        gc.collect()
        alive = sum(r() is not None for r in refs)
    return alive


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


class _PrefetchChain:
    """Megatron's prefetch chain: chained groups link up in first-forward order.

    Process-global, as Megatron's ``GTPShardedParam._chain_state`` is; :func:`reset_chain`
    starts a new model (a group of the previous one must never become a new one's link).
    """

    def __init__(self) -> None:
        self.last: GTPGroup | None = None

    def join(self, group: "GTPGroup") -> None:
        if group.joined:
            return
        group.joined = True
        group.prev = self.last
        if self.last is not None:
            self.last.next = group
        self.last = group


_CHAIN = _PrefetchChain()


def reset_chain() -> None:
    """Forget the prefetch chain (Megatron's ``reset_gtp_state()``): call between models."""
    _CHAIN.last = None


# torch >= 2.13 renames the tensor collectives (the old names warn); use whichever exists
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _unsupported(exc: BaseException) -> bool:
    """A collective the backend does not implement (vs. a real communication failure)."""
    text = str(exc).lower()
    return isinstance(exc, NotImplementedError) or "not supported" in text or "unsupported" in text


#: every weight that joined a group: a protocol call on one of these without its group is the
#: harness's bug, on any other object of a weight's class a copy the backend was handed
#: (by id: a tensor's ``==`` is elementwise, so no set of tensors can be asked for membership)
_JOINED: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


class GTPWeight(torch.nn.Parameter):
    """A parameter holding one rank's shard; ``.shape`` is the (padded) shard shape."""

    is_distributed_weight = True

    def __new__(cls, shard: torch.Tensor, requires_grad: bool = True) -> "GTPWeight":
        return torch.Tensor._make_subclass(cls, shard, requires_grad)

    def __init__(self, shard: torch.Tensor, requires_grad: bool = True) -> None:
        self.gtp_group: GTPGroup | None = None
        self.gtp_index = 0
        self._grad_buffer: torch.Tensor | None = None

    def join(self, group: "GTPGroup", index: int) -> None:
        """Become member ``index`` of ``group`` (the state every protocol method reads)."""
        self.gtp_group, self.gtp_index = group, index
        _JOINED[id(self)] = self

    def _group(self) -> "GTPGroup":
        group = getattr(self, "gtp_group", None)
        if group is not None:
            return group
        if _JOINED.get(id(self)) is self:  # the weight itself lost its state: the harness's own doing
            raise HarnessBug(f"{type(self).__name__} lost its group after joining it")
        raise WeightStateLost(f"{type(self).__name__} without its group: a DistributedWeight method was "
                              f"called on a copy of the weight (rebuilt from a saved tensor?), not on "
                              f"the weight itself")

    @property
    def logical_shape(self) -> tuple[int, ...]:
        return self._group().logical_shape

    @property
    def padded_shape(self) -> tuple[int, ...]:
        group = self._group()
        return (group.padded_rows, *group.logical_shape[1:])

    # ---- the DistributedWeight protocol (keyword arguments such as nvtx_label= accepted) --
    def materialize_group_for_forward(self, **kwargs: Any) -> Any:
        group = self._group()
        group.log.add("materialize_forward", self.gtp_index)
        return group.materialize(forward=True)

    def materialize_group_for_backward(self, **kwargs: Any) -> Any:
        group = self._group()
        group.log.add("materialize_backward", self.gtp_index)
        return group.materialize(forward=False)

    def finalize_group_grads(self, wgrads: Any, **kwargs: Any) -> Any:
        return self._group().finalize(self.gtp_index, wgrads)

    def get_data_tensors(self) -> tuple[torch.Tensor, ...]:
        """TE's offload marking (``cpu_offload_v1.mark_activation_offload``) calls this on any
        tensor that is not exactly a ``Tensor`` or ``Parameter``: a shard is its own data, as
        Megatron's ``GTPShardedParam`` answers."""
        return (self,)

    def grad_buffer(self) -> torch.Tensor:
        main_grad = getattr(self, "main_grad", None)
        dtype = main_grad.dtype if main_grad is not None else self.dtype
        group = self._group()
        group.log.add("grad_buffer", self.gtp_index, dtype=str(dtype).replace("torch.", ""))
        buf = self._grad_buffer
        if buf is None or buf.dtype != dtype:
            shape = self.logical_shape
            poison = torch.arange(math.prod(shape), dtype=torch.float64).remainder_(7).sub_(3)
            buf = (poison * _POISON_SCALE).to(dtype=dtype, device=self.device).reshape(shape)
            self._grad_buffer = buf
        if group.behaviour.nan_fill:
            buf.fill_(_NAN)  # uninitialised memory, as Megatron's pool hands out
        return buf


class GTPGroup:
    """What the members of one module's weight group share: process group, shapes, log,
    behaviour, and their place in the prefetch chain."""

    def __init__(self, members: Sequence[GTPWeight], logical_shape: tuple[int, ...],
                 padded_rows: int, group: Any, world_size: int, rank: int,
                 behaviour: Behaviour = Behaviour()) -> None:
        self.members = list(members)
        self.logical_shape = tuple(logical_shape)
        self.padded_rows = padded_rows
        self.rows_per_rank = padded_rows // world_size
        self.group = group
        self.world_size = world_size
        self.rank = rank
        self.behaviour = behaviour
        self.log = CallLog()
        self._forward_gathers: list[weakref.ref] = []
        # prefetch chain (asynchronous finalize only)
        self.joined = False
        self.prev: GTPGroup | None = None
        self.next: GTPGroup | None = None
        #: wgrads of finalizes not yet reduced: the caller's own tensors (scaled and padded at
        #: delivery) or, when scaled in place, what the reduction will read (see finalize)
        self._pending: list[list[torch.Tensor]] = []
        # shared buffers: what the last materialize lent, made stale (NaN) by the next one
        self._lent: list[torch.Tensor] = []

    # ---- collectives -------------------------------------------------------------------
    def _all_gather(self, flat: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return flat.clone().unsqueeze(0)
        out = torch.empty(self.world_size * flat.numel(), dtype=flat.dtype, device=flat.device)
        ALL_GATHER(out, flat.contiguous(), group=self.group)
        return out.view(self.world_size, -1)

    def _reduce_scatter(self, inp: torch.Tensor) -> torch.Tensor:
        """SUM-reduce rank r's block of ``inp`` (split along dim 0 into N blocks) from every
        rank onto rank r, in ``inp``'s dtype."""
        n = self.world_size
        if n == 1:
            return inp.clone()
        inp = inp.contiguous()
        out = torch.empty((inp.shape[0] // n, *inp.shape[1:]), dtype=inp.dtype, device=inp.device)
        try:
            REDUCE_SCATTER(out, inp, group=self.group)
        except (RuntimeError, NotImplementedError) as exc:
            if not _unsupported(exc):
                raise
            # Exact equivalent where a backend lacks reduce-scatter: gather, sum in rank order.
            everyone = self._all_gather(inp.view(-1)).view(n, n, *out.shape)
            out = everyone[:, self.rank].sum(0, dtype=inp.dtype)
        return out

    def _gather_padded(self) -> list[torch.Tensor]:
        """Every member's full padded weight, gathered in one collective."""
        cols = self.logical_shape[1:]
        flat = torch.cat([m.detach().reshape(-1) for m in self.members])
        per_rank = self._all_gather(flat)
        shard_numel = self.rows_per_rank * math.prod(cols)
        return [per_rank[:, i * shard_numel:(i + 1) * shard_numel].reshape(self.padded_rows, *cols)
                for i in range(len(self.members))]

    # ---- materialize -------------------------------------------------------------------
    def materialize(self, forward: bool) -> list[torch.Tensor] | torch.Tensor:
        """All-gather every member, strip the padding, return detached logical tensors.

        Forward calls of a chained (asynchronous) group join the prefetch chain. Forward
        copies are tracked by weak reference, so the harness can tell whether a backend
        held on to them (they are transient, CONTRACTS §2).
        """
        self.join_chain(forward)
        rows = self.logical_shape[0]
        gathered = [g[:rows] for g in self._gather_padded()]
        tag = self.behaviour.tag_forward if forward else self.behaviour.tag_backward
        if tag != 1.0:  # exact: a power of two
            gathered = [g * tag for g in gathered]
        copies = self._borrow(gathered) if self.behaviour.shared_buffers else [g.clone() for g in gathered]
        out = [c.requires_grad_(m.requires_grad and self.behaviour.copies_require_grad)
               for c, m in zip(copies, self.members)]
        if forward:
            self.track_forward(out)
        return out[0] if len(out) == 1 else out

    def join_chain(self, forward: bool) -> None:
        """A forward call of a chained (asynchronous) group joins the prefetch chain."""
        if forward and self.behaviour.async_finalize:
            _CHAIN.join(self)

    def track_forward(self, copies: list[Any]) -> None:
        """Remember forward copies by weak reference (:meth:`live_forward_gathers`)."""
        self._forward_gathers.extend(weakref.ref(t) for t in copies)

    def _borrow(self, gathered: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copies valid until the next materialize: the buffers lent by the previous call are
        filled with NaN now, and never lent again, so a copy kept across this call reads
        NaN for the rest of its life (however many calls a microbatch makes)."""
        for stale in self._lent:
            stale.fill_(_NAN)
        self._lent = [g.clone() for g in gathered]
        return [buf.detach() for buf in self._lent]  # the caller's objects, our storage

    def live_forward_gathers(self, floor: int = 0) -> int:
        """How many tensors handed out by forward-materialize are still alive
        (:func:`live_referents`: exact above ``floor``)."""
        return live_referents(self._forward_gathers, floor)

    # ---- finalize ----------------------------------------------------------------------
    def finalize(self, caller: int, wgrads: Any) -> Any:
        """Pre-scale by 1/N, pad, reduce-scatter, then deliver into ``main_grad`` or return.

        Asynchronous, a group with a previous chain member returns ``None`` and reduces
        later, when that member finalizes: like Megatron's reduce-scatter it then reads the
        padded copy made now or, without padding, the caller's own tensors.

        Raises:
            ValueError: the wrong number of wgrads, a wgrad not of the logical shape, a
                ``main_grad`` not of the shard shape, or an asynchronous finalize without one.
        """
        batched = isinstance(wgrads, (list, tuple))
        grads = list(wgrads) if batched else [wgrads]
        self.log.add("finalize", caller, dtypes=[str(g.dtype).replace("torch.", "") for g in grads],
                     shapes=[list(g.shape) for g in grads])
        self._check_wgrads(grads)
        inplace = self.behaviour.inplace_scale
        if inplace and self.world_size > 1:
            torch._foreach_mul_(grads, 1.0 / self.world_size)  # Megatron's mean pre-scale
        if self.behaviour.async_finalize and self.prev is not None:
            self._pending.append(self._reduce_input(grads) if inplace else grads)
            result: Any = tuple(None for _ in grads) if batched else None
        else:
            result = self._deliver(self._reduce_input(grads))
            result = result if batched or len(result) > 1 else result[0]
        if self.behaviour.async_finalize and self.next is not None:
            self.next.deliver_pending()
        return result

    def _check_wgrads(self, grads: list[torch.Tensor]) -> None:
        if len(grads) != len(self.members):
            raise ValueError(f"finalize_group_grads got {len(grads)} wgrads for a group of {len(self.members)}")
        for i, g in enumerate(grads):
            if tuple(g.shape) != self.logical_shape:
                raise ValueError(
                    f"finalize_group_grads: wgrad {i} has shape {tuple(g.shape)}, expected the "
                    f"logical shape {self.logical_shape}"
                )
        for i, m in enumerate(self.members):
            main_grad = getattr(m, "main_grad", None)
            if main_grad is None and self.behaviour.async_finalize:
                raise ValueError(f"weight{i} has no main_grad: an asynchronous finalize delivers "
                                 f"into main_grad (Megatron's GTP runs under its DDP)")
            if main_grad is not None and tuple(main_grad.shape) != tuple(m.shape):
                raise ValueError(f"weight{i}.main_grad has shape {tuple(main_grad.shape)}, "
                                 f"expected the shard shape {tuple(m.shape)}")

    def _reduce_input(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """What the reduce-scatter reads: the wgrads in the first one's dtype, scaled by 1/N
        (unless already scaled in place), tail-padded to the padded rows."""
        dtype = grads[0].dtype
        if self.behaviour.inplace_scale:
            scaled = [g.to(dtype) for g in grads]
        else:
            scaled = [g.to(dtype) * (1.0 / self.world_size) for g in grads]
        pad = self.padded_rows - self.logical_shape[0]
        return [torch.nn.functional.pad(g, (0, 0, 0, pad)) if pad else g for g in scaled]

    def _deliver(self, padded: list[torch.Tensor]) -> list[torch.Tensor]:
        """Reduce-scatter, add each shard into ``main_grad`` (set the flag) and return the
        placeholders - or, without ``main_grad``, the reduced shards themselves."""
        n, s = self.world_size, self.rows_per_rank
        if self.behaviour.per_member_reduce:
            mine = [self._reduce_scatter(p) for p in padded]
        else:
            # chunks[r] = concatenation of every member's rows for rank r
            chunks = torch.stack([torch.cat([p[r * s:(r + 1) * s].reshape(-1) for p in padded])
                                  for r in range(n)])
            flat = self._reduce_scatter(chunks.view(-1))
            step = flat.numel() // len(self.members)
            mine = [flat[i * step:(i + 1) * step] for i in range(len(self.members))]
        results = []
        for m, shard in zip(self.members, mine):
            shard = shard.view(m.shape)
            main_grad = getattr(m, "main_grad", None)
            if main_grad is None:
                results.append(shard)
                continue
            main_grad.add_(shard)
            m.grad_added_to_main_grad = True
            results.append(self._placeholder(m))
        return results

    def _placeholder(self, m: GTPWeight) -> torch.Tensor:
        """What a synchronous finalize returns for a member with ``main_grad``."""
        if self.behaviour.nan_fill:  # Megatron: an uninitialised tensor of main_grad's shape
            return torch.full(m.main_grad.shape, _NAN, dtype=m.dtype, device=m.device)
        return torch.zeros(m.shape, dtype=m.dtype, device=m.device)

    def deliver_pending(self) -> None:
        """Reduce and deliver the finalizes that waited for the previous chain member."""
        pending, self._pending = self._pending, []
        for grads in pending:
            self._deliver(grads if self.behaviour.inplace_scale else self._reduce_input(grads))


_WEIGHT_NAME = re.compile(r"^weight(\d*)$")


def weight_names(module: torch.nn.Module) -> list[str]:
    """The module's weight parameters in group order: ``weight`` or ``weight0..weightN-1``."""
    found = [n for n, _ in module.named_parameters(recurse=False) if _WEIGHT_NAME.match(n)]
    return sorted(found, key=lambda n: int(_WEIGHT_NAME.match(n).group(1) or 0))


def sharding(module: torch.nn.Module, group: Any) -> tuple[list[str], Any, int, int]:
    """``(weight names, process group, world size, rank)`` for sharding ``module``'s weights over
    ``group`` (the world when None); without a process group: ``(names, None, 1, 0)``.

    Raises:
        ValueError: the module has no weights.
    """
    names = weight_names(module)
    if not names:
        raise ValueError(f"{type(module).__name__} has no weight parameters to shard")
    if not (dist.is_available() and dist.is_initialized()):
        return names, None, 1, 0
    return names, group, dist.get_world_size(group), dist.get_rank(group)


def inject_gtp(module: torch.nn.Module, group: Any = None, pad_multiple: int | None = None,
               behaviour: Behaviour | None = None) -> GTPGroup:
    """Replace a module's weight parameters by GTP weights, as Megatron does at construction.

    Every rank must hold the same full weights when this is called; rank r keeps rows
    ``[r*s, (r+1)*s)`` of the zero-padded weight. Each GTP weight takes its parameter's slot
    in the registration order, or - ``behaviour.megatron_attach`` - is re-registered behind
    the module's other parameters, as Megatron's attach does.

    Args:
        module: any backend's ``Linear``/``GroupedLinear``/``ops.GroupedLinear`` instance.
        group: the GTP process group (default: the world); None without a process group
            means world size 1 in-process.
        pad_multiple: pad rows to a multiple of ``world_size * pad_multiple`` (overrides
            the behaviour's).
        behaviour: which implementer freedoms to exercise (default: the kind defaults).

    Returns:
        The group, whose ``log`` records every protocol call.

    Raises:
        ValueError: the module has no weights, or the world size cannot shard them.
    """
    behaviour = behaviour or Behaviour()
    if pad_multiple is not None:
        behaviour = dataclasses.replace(behaviour, pad_multiple=pad_multiple)
    names, group, world_size, rank = sharding(module, group)
    full = [getattr(module, n) for n in names]
    logical = tuple(full[0].shape)
    padded_rows, s = shard_rows(logical[0], world_size, behaviour.pad_multiple)
    members = []
    for w in full:
        data = torch.nn.functional.pad(w.detach(), (0, 0, 0, padded_rows - logical[0]))
        members.append(GTPWeight(data[rank * s:(rank + 1) * s].clone(), requires_grad=w.requires_grad))
    gtp = GTPGroup(members, logical, padded_rows, group, world_size, rank, behaviour)
    for i, (name, m) in enumerate(zip(names, members)):
        m.join(gtp, i)
        if behaviour.megatron_attach:
            attach_like_megatron(module, name, m, full[i], i, grouped=names != ["weight"])
        else:
            setattr(module, name, m)  # the same slot of the registration order
    if behaviour.megatron_attach and names != ["weight"]:
        members[0].weight_list = members  # Megatron: a grouped (routed-expert) leader's list
    return gtp


#: the tensor-parallel attributes Megatron's ``copy_tensor_model_parallel_attributes`` carries
#: from the replaced parameter (TE's ``set_tensor_model_parallel_attributes`` sets them)
TP_ATTRIBUTES = ("tensor_model_parallel", "partition_dim", "partition_stride")


def attach_like_megatron(module: torch.nn.Module, name: str, member: GTPWeight, replaced: torch.Tensor,
                          index: int, grouped: bool, move: bool = True) -> None:
    """Put ``member`` in place of ``replaced`` as Megatron's ``attach_gtp_to_presharded_module``
    does (``_gtp_wrap_bf16_shard``, ``_gtp_attach_attrs``): re-registered, so it moves behind
    the module's other parameters; the tensor-parallel attributes copied; the routed-expert
    tags of a grouped module. The attributes TE 2.20.2 reads of them: the registration order
    (the op-fuser's parameter list), ``is_routed_expert`` and the leader's ``weight_list``
    (the fused grouped MLP). ``move=False``: the member already holds ``replaced``'s slot
    and keeps it, as Megatron's in-place reclass of a native quantized shard does."""
    for attr in TP_ATTRIBUTES:
        if hasattr(replaced, attr):
            setattr(member, attr, getattr(replaced, attr))
    member.is_routed_expert = grouped
    member.expert_idx = index if grouped else None
    member.weight_list = None  # the leader's is set once the group is complete
    member._debug_name = name  # Megatron's tag_gtp_params_with_names (module-relative here)
    if move:
        delattr(module, name)
        module._parameters[name] = member
