"""How a backend talks to a DistributedWeight (CONTRACTS §2), from the backend's side.

Group-level calls go through the leader (``weights[0]``) only, and the implementer takes a
bare tensor for a group of one and a list otherwise; these helpers hide that asymmetry so
the modules always deal in lists.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def is_distributed_weight(weight: Any) -> bool:
    """True for an implementer of the protocol (the marker), False for plain tensors."""
    return bool(getattr(weight, "is_distributed_weight", False))


def check_distributed_group(weights: Sequence[Any]) -> bool:
    """Validate a module's weight group; True when it is distributed.

    Raises:
        TypeError: an object carries the marker but is not a ``torch.Tensor``, or the group
            mixes distributed and plain weights (the leader could not speak for it).
    """
    flags = [is_distributed_weight(w) for w in weights]
    for i, (w, f) in enumerate(zip(weights, flags)):
        if f and not isinstance(w, torch.Tensor):
            raise TypeError(
                f"weight {i} of the group has is_distributed_weight=True but is a {type(w).__name__}, "
                "not a torch.Tensor subclass"
            )
    if any(flags) and not all(flags):
        raise TypeError(f"weight group mixes distributed and plain weights: {flags}")
    return bool(flags and flags[0])


def as_list(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def group_arg(tensors: Sequence[torch.Tensor]) -> Any:
    """The implementer's calling convention: bare tensor for one, list for several."""
    return tensors[0] if len(tensors) == 1 else list(tensors)


def materialize_forward(weights: Sequence[Any]) -> list[torch.Tensor]:
    return as_list(weights[0].materialize_group_for_forward())


def materialize_backward(weights: Sequence[Any]) -> list[torch.Tensor]:
    return as_list(weights[0].materialize_group_for_backward())


def finalize(weights: Sequence[Any], wgrads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    # by keyword, the protocol's own parameter name (TE's distributed_weight.py): an
    # implementer must accept it so (CONTRACTS §2: protocol methods take keyword arguments)
    return as_list(weights[0].finalize_group_grads(wgrads=group_arg(wgrads)))
