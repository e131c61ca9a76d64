"""Planted faults in TE's and Megatron's own code on CPU: the self-test's mutants that only the
cells needing TE can show - TE's and Megatron's hook installers, Megatron's expert layer.

Each mutant is te-cpu (``harness.backends.te_cpu.backend``) on the project's patched TE tree - a
backend that passes every such cell - with one fault planted while its cells run (``cell_scope``:
the runner enters it around each cell, so the clean backend and the other mutants sharing the
rank's process never see it). The spec is ``harness.backends.te_cpu.mutants:NAME@TREE``; the
catalog entry of each (``harness.vocabulary.fault_classes``, ``backend="te-cpu"``) says where it
can show and what a kill about it looks like.

- ``offload-installs-no-hooks``: TE's ``get_cpu_offload_context`` hands back a context that
  installs nothing (the installer a user trusts, silently off): the cell runs unhooked, so
  nothing about hooks is tested - the ``hook_packs`` check must see it.
- ``fc2-fix-missing``: the hook-safe fix applied to an expert layer's fc1 and not to its fc2:
  under a saved-tensor hook, fc2's ``GroupedLinear`` forgets its distributed weights on the
  autograd context (the patched TE keeps them in ``ctx.distributed_weights``) - what the pre-fix
  TE did for every module. Only a layer's cell has an fc2.
- ``mxfp8-scale-swizzle-order``: te-cpu's MXFP8 quantizer (``quant/mxfp8.py``) writes the
  GEMM-ready scales (``optimize_for_gemm``, which TE's Linear asks of its input and gradient)
  with the two 4-wide indices of each 128x4 tile exchanged; the GEMM reads TE's layout
  (``quant/swizzle.py``). A fault in the stand-in's kernel, not in TE's Python: the cells it
  shows in are the block-spanning ones (more than 32 rows, or more than one block along K, in
  a scale tile), where every element decodes under another block's scale.
- ``probs-grad-lost-under-hooks``: under a saved-tensor hook, the routing probabilities'
  gradient is taken from a copy the graph does not link back to them, so none reaches them
  (the layer's output and the weights' gradients are unchanged). Only a layer's cell has them.
"""

from __future__ import annotations

import contextlib
import importlib
import types
from typing import Any, Callable, Iterator

import torch

from harness.backends.te_cpu import backend as _te

NAMES = ("offload-installs-no-hooks", "fc2-fix-missing", "probs-grad-lost-under-hooks", "mxfp8-scale-swizzle-order")


def _hooked() -> bool:
    """Whether a saved-tensor hook pair is installed now (torch's default hooks stack)."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def _no_hooks(*args: Any, **kwargs: Any) -> tuple[Any, Callable[[torch.Tensor], torch.Tensor]]:
    """``get_cpu_offload_context`` that installs nothing (its context and its sync are no-ops)."""
    return contextlib.nullcontext(), lambda t: t


@contextlib.contextmanager
def _patched(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    """``owner.name`` replaced while inside (an inherited attribute: shadowed, then unshadowed)."""
    own = name in owner.__dict__
    original = owner.__dict__.get(name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def _fc2_fix_missing() -> Iterator[None]:
    """fc2's ``_GroupedLinear`` context drops the distributed weights while hooks are on."""
    te_grouped = importlib.import_module("transformer_engine.pytorch.module.grouped_linear")
    experts = importlib.import_module("megatron.core.extensions.transformer_engine")
    function = te_grouped._GroupedLinear
    row = experts.TERowParallelGroupedLinear
    in_fc2 = [False]
    forward, row_forward = function.forward, row.forward

    def fc2_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        in_fc2[0] = True
        try:
            return row_forward(self, *args, **kwargs)
        finally:
            in_fc2[0] = False

    def grouped_forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        out = forward(ctx, *args, **kwargs)
        if in_fc2[0] and _hooked():  # Fault: fc2 keeps no distributed weight under a hook
            ctx.distributed_weights = None
        return out

    with _patched(row, "forward", fc2_forward), _patched(function, "forward", staticmethod(grouped_forward)):
        yield


class _LostUnderHooks(torch.autograd.Function):
    """The identity whose gradient goes nowhere (the "hooked copy" the probabilities' gradient
    was taken from)."""

    @staticmethod
    def forward(ctx: Any, probs: torch.Tensor) -> torch.Tensor:
        return probs.view_as(probs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(grad)  # Fault: the routing probabilities get no gradient


@contextlib.contextmanager
def _probs_grad_lost() -> Iterator[None]:
    experts = importlib.import_module("megatron.core.transformer.moe.experts")
    mlp = experts.TEGroupedMLP
    forward = mlp.forward

    def lost_forward(self: Any, hidden: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor,
                     *args: Any, **kwargs: Any) -> Any:
        if _hooked():
            probs = _LostUnderHooks.apply(probs)
        return forward(self, hidden, tokens, probs, *args, **kwargs)

    with _patched(mlp, "forward", lost_forward):
        yield


def _swizzle_order_exchanged(scales: torch.Tensor) -> torch.Tensor:
    """TE's swizzle (``quant/swizzle.py``) with the tile's two 4-wide indices exchanged: the
    scale of row ``r`` and K-block ``c`` of a 128x4 tile at ``(r % 32) * 16 + c * 4 + r // 32``."""
    r, c = scales.shape
    t = scales.reshape(r // 128, 4, 32, c // 4, 4).permute(0, 3, 2, 4, 1)  # Fault: (c, r // 32), not (r // 32, c)
    return t.contiguous().reshape(r, c)


@contextlib.contextmanager
def _mxfp8_swizzle_order() -> Iterator[None]:
    """te-cpu's MXFP8 quantizer writes its swizzled scales in the exchanged order (the GEMM's
    reads, ``unswizzle``, stay TE's)."""
    from harness.backends.te_cpu.quant import mxfp8, swizzle

    def columnwise(scales: torch.Tensor) -> torch.Tensor:
        return _swizzle_order_exchanged(scales.t().contiguous()).reshape(scales.shape)

    faulty = types.SimpleNamespace(swizzle=_swizzle_order_exchanged, swizzle_columnwise=columnwise,
                                   unswizzle=swizzle.unswizzle, unswizzle_columnwise=swizzle.unswizzle_columnwise)
    with _patched(mxfp8, "_swz", faulty):
        yield


_SCOPES: dict[str, Callable[[], Any]] = {
    "mxfp8-scale-swizzle-order": _mxfp8_swizzle_order,
    "fc2-fix-missing": _fc2_fix_missing,
    "probs-grad-lost-under-hooks": _probs_grad_lost,
}


def get(name: str) -> types.ModuleType:
    """The mutant ``name`` as a backend module: te-cpu's, with its fault.

    Raises:
        ValueError: an unknown mutant.
    """
    if name not in NAMES:
        raise ValueError(f"unknown te-cpu mutant {name!r} (choose from {', '.join(NAMES)})")
    backend = types.ModuleType(f"harness.backends.te_cpu.mutants:{name}")
    for attr in _te.__all__:
        setattr(backend, attr, getattr(_te, attr))
    backend.__all__ = list(_te.__all__)
    backend.__file__ = __file__
    if name == "offload-installs-no-hooks":
        backend.get_cpu_offload_context = _no_hooks
        backend.__all__.append("get_cpu_offload_context")
    if name in _SCOPES:
        backend.cell_scope = _SCOPES[name]
    return backend
