"""Delayed weight-gradient support shared by every reference module.

TE modules with ``delay_wgrad_compute=True`` skip the wgrad GEMMs in backward and queue
them; the caller (Megatron) runs them later with ``backward_dw()`` and expects the
registered wgrad accumulation-and-reduce hooks to fire once the gradients are in place.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

import torch

WgradHook = Callable[[], None]


class WgradStore:
    """FIFO of queued wgrad computations, one entry per delayed backward."""

    def __init__(self) -> None:
        self._queue: deque[Callable[[], None]] = deque()

    def put(self, compute: Callable[[], None]) -> None:
        self._queue.append(compute)

    def pop(self) -> Callable[[], None] | None:
        return self._queue.popleft() if self._queue else None

    def __len__(self) -> int:
        return len(self._queue)


class DelayedWgradMixin:
    """``need_backward_dw`` / ``backward_dw`` / hook registration for an ``nn.Module``.

    The parameters whose gradient is delayed are marked ``skip_backward_post_hook`` so that
    a DDP-style consumer reduces them from the wgrad hook instead of a post-accumulate hook.
    The mark is (re)applied whenever such a parameter is registered, so it survives a weight
    being replaced after construction (what GTP injection does).
    """

    delay_wgrad_compute: bool

    def _init_wgrad(self, delay_wgrad_compute: bool) -> None:
        object.__setattr__(self, "delay_wgrad_compute", bool(delay_wgrad_compute))
        object.__setattr__(self, "_wgrad_store", WgradStore())
        object.__setattr__(self, "_wgrad_hooks", [])

    def _delayed_param_names(self) -> Iterable[str]:
        """Names of parameters whose gradient ``backward_dw`` delivers; modules override."""
        return ()

    def register_parameter(self, name: str, param: torch.nn.Parameter | None) -> None:
        super().register_parameter(name, param)  # type: ignore[misc]
        if param is not None and getattr(self, "delay_wgrad_compute", False):
            if name in set(self._delayed_param_names()):
                param.skip_backward_post_hook = True

    def _mark_delayed_params(self) -> None:
        if self.delay_wgrad_compute:
            for name in self._delayed_param_names():
                p = getattr(self, name, None)
                if p is not None:
                    p.skip_backward_post_hook = True

    def need_backward_dw(self) -> bool:
        return self.delay_wgrad_compute

    def register_wgrad_accumulation_and_reduce_hooks(self, hook: WgradHook) -> None:
        self._wgrad_hooks.append(hook)

    def backward_dw(self) -> None:
        """Run the oldest queued wgrad computation (which fires the hooks once it is done)."""
        if not self.delay_wgrad_compute:
            return
        compute = self._wgrad_store.pop()
        if compute is not None:
            compute()

    def _fire_wgrad_hooks(self) -> None:
        for hook in self._wgrad_hooks:
            hook()
