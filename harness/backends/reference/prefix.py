"""The reference backend with TransformerEngine's pre-fix behaviour (the regression).

Backward decides "distributed?" from the *unpacked saved tensor*. Under any saved-tensor
hook autograd returns a plain tensor, so backward takes the plain branch: it looks the
weight up through weak references taken in forward - for ``GroupedLinear`` those point at
the transient all-gathered weights, already freed, hence TE's
``weight was removed while fuse_wgrad_accumulation=True`` - and runs the GEMMs on the shard.
``LayerNormLinear`` has the same defect as ``Linear`` (its backward asks the unpacked saved
weight too). The op-fuser ``GroupedLinear`` reads its weights from its attributes and is
unaffected.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch

from harness.backends.reference import _modules, ops, recipe
from harness.backends.reference._core import GemmCall, ReferenceImpl
from harness.backends.reference._fp8 import autocast

__all__ = ["Linear", "GroupedLinear", "LayerNormLinear", "ops", "autocast", "recipe"]


class PrefixImpl(ReferenceImpl):
    """Pre-fix: weights from ``ctx.saved_tensors``; ``main_grad`` owners via weakrefs."""

    def __init__(self, refs_to_gemm_weights: bool) -> None:
        # TE's Linear kept a weakref to the parameter; GroupedLinear to the GEMM's weights.
        self.refs_to_gemm_weights = refs_to_gemm_weights

    def save(self, ctx: Any, call: GemmCall, inp: torch.Tensor, weights: Sequence[Any],
             gemm_weights: Sequence[torch.Tensor]) -> None:
        ctx.save_for_backward(inp, *weights)
        owners = gemm_weights if self.refs_to_gemm_weights else weights
        ctx.origin_weight_refs = [weakref.ref(w) for w in owners]

    def backward_weights(self, ctx: Any, call: GemmCall, saved: Sequence[torch.Tensor]) -> list[Any]:
        return list(saved[1: 1 + call.n])

    def origin_weights(self, ctx: Any, call: GemmCall, weights: Sequence[Any],
                       distributed: bool) -> list[Any]:
        if distributed:
            return list(weights)
        owners = [ref() for ref in ctx.origin_weight_refs]
        if call.fused:
            assert all(w is not None for w in owners), (
                "weight was removed while fuse_wgrad_accumulation=True"
            )
        return owners


class Linear(_modules.Linear):
    _impl = PrefixImpl(refs_to_gemm_weights=False)


class GroupedLinear(_modules.GroupedLinear):
    _impl = PrefixImpl(refs_to_gemm_weights=True)


class LayerNormLinear(_modules.LayerNormLinear):
    """TE's ``_LayerNormLinear`` decides "distributed?" from the unpacked saved weight too."""

    _impl = PrefixImpl(refs_to_gemm_weights=False)
