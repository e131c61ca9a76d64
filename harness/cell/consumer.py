"""The consumer: who owns the gradient of record (CONTRACTS §4).

``ddp`` stands in for Megatron's DDP: fp32 ``main_grad`` buffers starting at a seeded
non-zero value (a parameter whose first microbatch's gradient replaces it under
``is_first_microbatch`` counts from zero: :meth:`Consumer.base`), a reducer that folds
``.grad`` into ``main_grad`` (from a post-accumulate hook, or from the module's wgrad hook
for parameters marked ``skip_backward_post_hook``), and an end-of-step average of
replicated parameters. ``autograd`` is plain PyTorch: the
gradient of record is ``.grad``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from harness.cell.inputs import main_grad_start

CONSUMERS = ("ddp", "autograd")


class Consumer:
    """Sets up one module's parameters for a step and finishes the step."""

    def __init__(self, mode: str, module: torch.nn.Module, sharded: set[str], seed: int,
                 rank: int, world_size: int, group: Any = None, replaced: set[str] = frozenset()) -> None:
        if mode not in CONSUMERS:
            raise ValueError(f"unknown consumer {mode!r} (choose from {', '.join(CONSUMERS)})")
        self.mode = mode
        self.module = module
        self.sharded = sharded
        self.world_size = world_size
        self.group = group
        self.params: dict[str, torch.nn.Parameter] = dict(module.named_parameters(recurse=False))
        self.start: dict[str, torch.Tensor] = {}
        #: parameters whose first microbatch's gradient replaces ``main_grad`` (``is_first_microbatch``)
        self.replaced = set(replaced)
        self.wgrad_hook_calls = 0
        #: per wgrad-hook call: was some delayed weight's gradient in place when it fired?
        self.hook_saw_gradients: list[bool] = []
        #: parameters whose gradient reached autograd during the main backward (any microbatch)
        self.delivered_in_main_backward: set[str] = set()
        #: delayed parameters whose ``main_grad`` the main backward changed (any microbatch)
        self.main_grad_changed_in_main_backward: set[str] = set()
        self._main_before: dict[str, torch.Tensor] = {}
        self.phase = "forward"
        self._snapshot: dict[str, tuple[Any, Any]] = {}
        self._grads_before: dict[str, Any] = {}
        self._observable = True
        self._handles: list[Any] = []
        self._main_grads: dict[str, tuple[torch.Tensor, int]] = {}
        if mode == "ddp":
            for name, p in self.params.items():
                start = main_grad_start(tuple(p.shape), seed, name, rank if name in sharded else None)
                self.start[name] = start.clone()
                p.main_grad = start.to(p.device)
                p.grad_added_to_main_grad = False
                # §2: "param.main_grad itself is never reassigned by the backend"
                self._main_grads[name] = (p.main_grad, p.main_grad.data_ptr())
        for name, p in self.params.items():
            self._handles.append(p.register_post_accumulate_grad_hook(self._observer(name)))
            if mode == "ddp" and not getattr(p, "skip_backward_post_hook", False):
                self._handles.append(p.register_post_accumulate_grad_hook(self._reduce))

    def register_hooks(self) -> None:
        """Hand the module its wgrad hook (backend code: the runner tags it as such)."""
        self.module.register_wgrad_accumulation_and_reduce_hooks(self._wgrad_hook)

    def _reduce(self, p: torch.Tensor) -> None:
        """Fold a real ``.grad`` into ``main_grad`` unless the backend already did."""
        if p.grad is not None:
            if not getattr(p, "grad_added_to_main_grad", False):
                p.main_grad.add_(p.grad)
            p.grad = None

    def _observer(self, name: str):
        # Autograd runs post-accumulate hooks even when a backward returned None for the
        # parameter, so "delivered" means .grad actually changed during the main backward.
        def observe(p: torch.Tensor) -> None:
            if self.phase == "backward" and p.grad is not None:
                before = self._grads_before.get(name)
                if before is None or not torch.equal(p.grad, before):
                    self.delivered_in_main_backward.add(name)
        return observe

    def before_backward(self) -> None:
        self.phase = "backward"
        self._grads_before = {n: None if p.grad is None else p.grad.detach().clone()
                              for n, p in self.params.items()}
        self._main_before = {n: p.main_grad.detach().clone() for n, p in self.params.items()
                             if getattr(p, "skip_backward_post_hook", False) and hasattr(p, "main_grad")}

    def _state(self, p: torch.Tensor) -> tuple[Any, Any]:
        grad = None if p.grad is None else p.grad.detach().clone()
        main = getattr(p, "main_grad", None)
        return grad, None if main is None else main.detach().clone()

    def before_backward_dw(self, observable: bool = True) -> None:
        """Snapshot the delayed parameters, so the hook can tell their gradients arrived.

        ``observable`` is False when the arriving gradients are zero by construction (this
        rank's microbatch has no rows): then nothing can show they arrived.
        """
        self.phase = "dw"
        self._observable = observable
        for name, before in self._main_before.items():
            if not torch.equal(self.params[name].main_grad, before):
                self.main_grad_changed_in_main_backward.add(name)
        self._snapshot = {n: self._state(p) for n, p in self.params.items()
                          if getattr(p, "skip_backward_post_hook", False)}

    def _gradients_in_place(self) -> bool:
        for name, (grad, main) in self._snapshot.items():
            now_grad, now_main = self._state(self.params[name])
            if (now_grad is not None and (grad is None or not torch.equal(now_grad, grad))) or (
                    now_main is not None and main is not None and not torch.equal(now_main, main)):
                return True
        return False

    def _wgrad_hook(self) -> None:
        self.wgrad_hook_calls += 1
        self.hook_saw_gradients.append(self._gradients_in_place() or not self._observable)
        if self.mode == "ddp":
            for p in self.params.values():
                if getattr(p, "skip_backward_post_hook", False):
                    self._reduce(p)

    def finish_step(self) -> None:
        """Average replicated (non-GTP) parameters' gradients of record across ranks.

        One all-reduce per dtype for all of them, as a DDP reduces its gradient buckets:
        a collective per parameter costs a scheduling round-trip of every rank each."""
        replicated = {n: p for n, p in self.params.items() if n not in self.sharded}
        if self.mode == "ddp":
            incs = {n: p.main_grad - self.base(n).to(p.main_grad.device) for n, p in replicated.items()}
            self._all_reduce(list(incs.values()))
            for n, p in replicated.items():
                p.main_grad.copy_(self.base(n).to(incs[n].device) + incs[n] / self.world_size)
        elif self.world_size > 1:
            grads = [p.grad for p in replicated.values() if p.grad is not None]
            self._all_reduce(grads)
            for g in grads:
                g.div_(self.world_size)

    def base(self, name: str) -> torch.Tensor:
        """What ``name``'s gradient of record adds the step's gradients to: its start value,
        or zero when the first microbatch's gradient replaced it."""
        start = self.start[name]
        return torch.zeros_like(start) if name in self.replaced else start

    def _all_reduce(self, tensors: list[torch.Tensor]) -> None:
        """Sum ``tensors`` across the ranks in place, one flat collective per dtype."""
        if self.world_size == 1:
            return
        by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault((t.dtype, t.device), []).append(t)
        for group in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in group])
            dist.all_reduce(flat, group=self.group)
            for t, part in zip(group, flat.split([t.numel() for t in group])):
                t.copy_(part.view_as(t))

    def main_grad_kept(self, name: str) -> bool:
        """Whether parameter ``name`` still has the ``main_grad`` object (and storage) the
        step started with: a backend that rebinds it leaves Megatron's DDP buffer behind."""
        kept, ptr = self._main_grads[name]
        now = getattr(self.params[name], "main_grad", None)
        return now is kept and now.data_ptr() == ptr

    def rebound_from(self, name: str) -> torch.Tensor | None:
        """The ``main_grad`` the step started with, when the backend rebound it (else None):
        the buffer Megatron's DDP still reads."""
        return None if self.mode != "ddp" or self.main_grad_kept(name) else self._main_grads[name][0]

    def record(self, name: str) -> torch.Tensor | None:
        """The gradient of record of parameter ``name``."""
        p = self.params[name]
        return p.main_grad if self.mode == "ddp" else p.grad

    def close(self) -> None:
        for h in self._handles:
            h.remove()
