"""Putting a cell's weight into its module: the runner's one call, :func:`attach_weight`.

The ``weight`` axis value (:mod:`harness.vocabulary.weights`) picks the implementer - the harness GTP
weight in one of its behaviours, or Megatron-Core's real ``GTPShardedParam`` - and every
distributed weight comes back as a :class:`ShardedGroup`, the view of it the runner's
checks read (call log, shard layout, live forward copies).

Megatron delivers an asynchronous finalize along its prefetch chain: a weight's reduced
gradient lands in ``main_grad`` only when the *previous* weight of the chain finalizes,
later in the same backward. A model has such a previous weight - the layer before; a cell
has one module. So for a chained weight a :class:`ChainHead`, a harness-owned weight of
the same implementer, plays the layer before: it materializes before the module's forward
and materializes and finalizes once the whole backward is done, which is when the module's
pending gradient reaches ``main_grad``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol

import torch
import torch.distributed as dist

from harness.vocabulary import weights
from harness.cell import gtp

__all__ = ["ShardedGroup", "ChainHead", "attach_weight"]


class ShardedGroup(Protocol):
    """What the runner reads of a module's distributed weight group."""

    log: gtp.CallLog
    members: list[torch.Tensor]
    padded_rows: int
    rows_per_rank: int

    def live_forward_gathers(self, floor: int = 0) -> int: ...


Maker = Callable[[torch.nn.Module], ShardedGroup]


def _in_backward() -> bool:
    """True while autograd's engine runs a backward (e.g. a checkpoint's recomputation)."""
    return torch._C._current_graph_task_id() != -1


class ChainHead:
    """The weight before the module in the prefetch chain (a stand-in for the previous layer).

    Its shape differs from the module's (one more column), so Megatron's buffer cache,
    keyed by shape, never lends the two the same buffer.
    """

    def __init__(self, module: torch.nn.Module, like: torch.Tensor, make: Maker) -> None:
        rows, cols = like.shape[0], like.shape[1] + 1
        holder = torch.nn.Module()
        values = torch.arange(rows * cols, dtype=torch.float32).remainder_(5).sub_(2).div_(4)
        holder.weight = torch.nn.Parameter(values.reshape(rows, cols).to(like.dtype).to(like.device))
        self.group = make(holder)
        self.leader = self.group.members[0]
        self.logical = (rows, cols)
        for m in self.group.members:
            m.main_grad = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
            m.grad_added_to_main_grad = False
        self.handles = [module.register_forward_pre_hook(self._forward),
                        module.register_forward_hook(self._arm)]

    def _forward(self, module: torch.nn.Module, args: Any) -> None:
        if not _in_backward():  # a checkpoint's recomputation is not a new layer forward
            self.leader.materialize_group_for_forward()

    def _arm(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if not _in_backward() and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(self._queue)

    def _queue(self, grad: torch.Tensor) -> None:
        # runs when the backward starts; the callback runs when all of it is done
        torch.autograd.Variable._execution_engine.queue_callback(self._backward)

    def _backward(self) -> None:
        self.leader.materialize_group_for_backward()
        wgrads = [torch.zeros(self.logical, dtype=torch.float32, device=self.leader.device)
                  for _ in self.group.members]
        self.leader.finalize_group_grads(wgrads[0] if len(wgrads) == 1 else wgrads)


def _maker(kind: weights.WeightKind, group: Any, values: list[torch.Tensor] | None,
           recipe: str = "none") -> Maker:
    """How a module gets the weight of ``kind``; ``values``: native shards quantized from them
    (under ``recipe``, whose format sets a native shard's row alignment)."""
    if kind.implementer == "megatron":
        from harness.cell import megatron_gtp

        if group is None and not dist.is_initialized():
            raise ValueError("Megatron's GTP weight needs a process group (torch.distributed "
                             "is not initialized)")
        pg = group if group is not None else dist.group.WORLD
        if values is not None:
            return lambda m: megatron_gtp.inject_native(m, pg, values)
        return lambda m: megatron_gtp.inject(m, pg)
    if values is not None:
        from harness.cell import gtp_native

        # a native MXFP8 shard is whole 32-row blocks (Megatron's alignment under MXFP8)
        aligned = dataclasses.replace(kind.behaviour, pad_multiple=weights.pad_multiple(kind.name, recipe))
        return lambda m: gtp_native.inject_native(m, group, values, aligned)
    return lambda m: gtp.inject_gtp(m, group=group, behaviour=kind.behaviour)


def attach_weight(module: torch.nn.Module, weight: str, group: Any = None, recipe: str = "none",
                  values: list[torch.Tensor] | None = None) -> ShardedGroup | None:
    """Give ``module`` the cell's weights; None for ``plain``.

    Every rank must hold the same full weights when this is called. Starts a new model for
    the process-global prefetch chains (Megatron's ``reset_gtp_state()``).

    Args:
        module: any backend's module, loaded with the full weights.
        weight: the cell's ``weight`` axis value.
        group: the GTP process group (None: the world).
        recipe: the cell's recipe (Megatron's row alignment follows it).
        values: the full weights in high precision: a native weight quantizes each shard
            from them (a module built under ``quantized_model_init`` holds them quantized
            whole, which is not what a shard's own quantization gives).

    Raises:
        ValueError: the world size cannot shard the weights, or the module has none.
    """
    kind = weights.KINDS[weight]
    if not kind.distributed:
        return None
    gtp.reset_chain()
    if kind.implementer == "megatron":
        from harness.cell import megatron_gtp

        megatron_gtp.reset_state(weights.pad_multiple(kind.name, recipe))
    if kind.native and values is None:
        raise ValueError("a native weight quantizes each shard from the full weights' values: pass values")
    names = gtp.weight_names(module)
    if kind.chained and names:  # the previous layer's weight: high precision (a BF16 GTP weight)
        ChainHead(module, getattr(module, names[0]), _maker(kind, group, None))
    return _maker(kind, group, values if kind.native else None, recipe)(module)
