"""Saved-tensor hook modes: how a cell's forward is wrapped.

Every mode except ``off`` makes autograd hand backward a plain tensor in place of a saved
parameter subclass - the condition under which TE's pre-fix backward lost the distributed
path. ``checkpoint`` also recomputes the forward during backward, which is why a backend
materializes twice per step there.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch.utils.checkpoint import checkpoint

from harness.vocabulary.matrix import HOOK_MODES


class _Offloaded:
    """A packed activation: a copy moved off the compute device, and where it came from."""

    __slots__ = ("tensor", "device")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.device = tensor.device
        # On CPU the "host copy" is still a real copy, so aliasing bugs cannot hide.
        self.tensor = tensor.detach().to("cpu", copy=True)


def _offload_pack(t: torch.Tensor) -> Any:
    """Megatron-style fine-grained offloading: parameters pass through, activations move."""
    if isinstance(t, torch.nn.Parameter):
        return t
    return _Offloaded(t)


def _offload_unpack(packed: Any) -> torch.Tensor:
    if isinstance(packed, _Offloaded):
        return packed.tensor.to(packed.device)
    return packed


@contextlib.contextmanager
def saved_tensor_context(mode: str) -> Iterator[None]:
    """The hooks installed around the forward call for ``mode`` (checkpoint: none here).

    Raises:
        ValueError: an unknown mode.
    """
    if mode in ("off", "checkpoint"):
        yield
    elif mode == "identity":
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            yield
    elif mode == "offload":
        with torch.autograd.graph.saved_tensors_hooks(_offload_pack, _offload_unpack):
            yield
    elif mode == "save_on_cpu":
        with torch.autograd.graph.save_on_cpu(pin_memory=False):
            yield
    else:
        raise ValueError(f"unknown hook mode {mode!r} (choose from {', '.join(HOOK_MODES)})")


def run_forward(mode: str, fn: Callable[[torch.Tensor], torch.Tensor], inp: torch.Tensor) -> torch.Tensor:
    """Call ``fn(inp)`` under ``mode``; checkpoint wraps it non-reentrantly."""
    with saved_tensor_context(mode):
        if mode == "checkpoint":
            return checkpoint(fn, inp, use_reentrant=False)
        return fn(inp)


def forward_executions(mode: str) -> int:
    """How many times the module's forward runs per microbatch under ``mode``."""
    return 2 if mode == "checkpoint" else 1
