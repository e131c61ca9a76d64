"""Planted faults: each class of docs/fault-classes.md as a named, minimal deviation of the reference.

A mutant is a backend (``Linear``, ``GroupedLinear``, ``ops.GroupedLinear``) whose modules
use a subclass of ``ReferenceImpl`` (or ``OpsImpl``) that overrides one decision - two where
the fault spans two call sites - so the clean reference carries no flag or branch for any
of them. Select one as ``harness.backends.reference.mutants:<name>``, e.g.
``harness.backends.reference.mutants:shared-grad-buffer`` (the backend loader calls :func:`get`).

Which faults there are, where each can show and what a kill about it looks like is the
torch-free catalog :mod:`harness.vocabulary.fault_classes` (docs/fault-classes.md); this module plants
each in the reference (:data:`IMPLEMENTATIONS`).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

from harness.vocabulary.fault_classes import CATALOG, REFERENCE, GEMM_MODULES, MODULE_CLASSES, NORM, FaultClass, evidence_found  # noqa: F401
from harness.backends.reference import _dw, _fp8, _modules, _norm, ops, prefix, recipe
from harness.backends.reference._core import GemmCall, ReferenceImpl
from harness.backends.reference.ops import OpsImpl

__all__ = ["MUTANTS", "Mutant", "backend_from_fault", "evidence_found", "get", "names"]

# ---- the faults: one mixin per class of docs/fault-classes.md ---------------------------------------
# Each mixin is placed before ReferenceImpl / OpsImpl in the MRO, so ``super()`` is the
# correct behaviour and the override reads as "the fix, minus one thing".

class _WgradComputeDtype:
    """Distributed wgrads formed (and handed to finalize) in the compute dtype."""

    def wgrad_dtype(self, weight: Any, compute_dtype: torch.dtype, fused: bool,
                    distributed: bool) -> torch.dtype:
        # Fault: main_grad's dtype is used only when fusing; the distributed case is forgotten.
        main_grad = getattr(weight, "main_grad", None)
        if main_grad is not None and fused:
            return main_grad.dtype
        return compute_dtype

    def grad_buffers(self, weights: Sequence[Any]) -> list[torch.Tensor]:
        # Fault: the wgrad GEMM's output buffer takes the weight's (compute) dtype, so the
        # GEMM runs and finalize reduces in bf16/fp16 instead of main_grad's fp32.
        return [w.grad_buffer().to(w.dtype) for w in weights]


class _SharedGradBuffer:
    """One ``grad_buffer()`` serves the whole group."""

    def grad_buffers(self, weights: Sequence[Any]) -> list[torch.Tensor]:
        buf = weights[0].grad_buffer()  # Fault: hoisted out of the per-member loop.
        return [buf for _ in weights]


class _FullShapeDummy:
    """The dummy gradient returned to autograd is shaped like the gathered weight."""

    def distributed_wgrads(self, call: GemmCall, weights: Sequence[Any],
                           grad_outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor],
                           compute_dtype: torch.dtype) -> list[torch.Tensor]:
        grads = super().distributed_wgrads(call, weights, grad_outs, inps, compute_dtype)
        if not call.fused:
            return grads
        # Fault: the dummy is made like the wgrad (full logical shape), not like the shard.
        return [torch.zeros(go.shape[-1], x.shape[-1], dtype=w.dtype, device=w.device)
                for w, go, x in zip(weights, grad_outs, inps)]


class _UnfusedFinalizeDropped:
    """Unfused: finalize runs, but autograd gets the local, unreduced full wgrad."""

    def deliver_finalized(self, finalized: list[torch.Tensor],
                          local: list[torch.Tensor]) -> list[torch.Tensor]:
        return local  # Fault: finalize's return value is ignored.


class _OpsDoubleAdd:
    """The op accumulates a distributed wgrad into ``main_grad`` *and* finalize adds it."""

    def distributed_wgrads(self, call: GemmCall, weights: Sequence[Any],
                           grad_outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor],
                           compute_dtype: torch.dtype) -> list[torch.Tensor]:
        if call.fused:
            # Fault: the op's accumulate_into_main_grad step runs for every weight, before
            # the distributed path hands the same wgrad to finalize.
            self.plain_wgrads(call, weights, grad_outs, inps, compute_dtype)
        return super().distributed_wgrads(call, weights, grad_outs, inps, compute_dtype)


class _DgradForwardCopy:
    """Backward reuses the forward's gathered weights instead of materializing again."""

    def save(self, ctx: Any, call: GemmCall, inp: torch.Tensor, weights: Sequence[Any],
             gemm_weights: Sequence[torch.Tensor]) -> None:
        super().save(ctx, call, inp, weights, gemm_weights)
        ctx.gemm_weights = tuple(gemm_weights)  # Fault: keeps the transient gathered tensors.

    def backward_gemm_weights(self, ctx: Any, call: GemmCall, weights: Sequence[Any],
                              distributed: bool) -> list[torch.Tensor]:
        if distributed:
            return list(ctx.gemm_weights)  # Fault: no backward-materialize.
        return super().backward_gemm_weights(ctx, call, weights, distributed)


class _PerMemberMaterialize:
    """Every member is asked to materialize (each call gathers the whole group)."""

    def forward_weights(self, call: GemmCall, weights: Sequence[Any]) -> list[torch.Tensor]:
        if call.distributed:
            return [_dw.as_list(w.materialize_group_for_forward())[i] for i, w in enumerate(weights)]
        return super().forward_weights(call, weights)

    def backward_gemm_weights(self, ctx: Any, call: GemmCall, weights: Sequence[Any],
                              distributed: bool) -> list[torch.Tensor]:
        if distributed:
            return [_dw.as_list(w.materialize_group_for_backward())[i] for i, w in enumerate(weights)]
        return super().backward_gemm_weights(ctx, call, weights, distributed)


class _DwFusedHookSkipped:
    """``backward_dw()`` fires the wgrad hooks only on its unfused branch."""

    def fire_wgrad_hooks(self, module: Any, call: GemmCall) -> None:
        if not call.fused:  # Fault: the accumulate-into-main_grad branch returns early.
            super().fire_wgrad_hooks(module, call)


class _DelayWithDwAccepted:
    """Delayed wgrad with a distributed weight is not rejected up front."""

    def check_supported(self, module: torch.nn.Module, weights: Sequence[Any]) -> bool:
        return _dw.check_distributed_group(weights)  # Fault: the delay guard is missing.


# ---- faults only a Megatron-like implementer exposes (CONTRACTS §2 "what an implementer
# may do"): with the harness weight's kind defaults each of these passes every check.

class _WgradsReusedAfterFinalize:
    """Unfused: when finalize returns nothing, the backend hands autograd the wgrads it gave
    finalize - which an asynchronous finalize has consumed (scaled in place, reduced later)."""

    def deliver_finalized(self, finalized: list[torch.Tensor],
                          local: list[torch.Tensor]) -> list[torch.Tensor]:
        # Fault: "no return value, so the wgrads are still ours to deliver".
        return [mine if got is None else got for got, mine in zip(finalized, local)]


class _MainGradReadAfterFinalize:
    """Reads ``main_grad`` right after finalize to check the reduction landed and, finding it
    unchanged, accumulates its local wgrad itself (an asynchronous finalize delivers later)."""

    def distributed_wgrads(self, call: GemmCall, weights: Sequence[Any],
                           grad_outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor],
                           compute_dtype: torch.dtype) -> list[torch.Tensor]:
        before = [getattr(w, "main_grad", None) for w in weights]
        before = [None if b is None else b.clone() for b in before]
        grads = super().distributed_wgrads(call, weights, grad_outs, inps, compute_dtype)
        for w, old, go, x in zip(weights, before, grad_outs, inps):
            if old is not None and torch.equal(w.main_grad, old):  # Fault: read right after finalize
                local = self.wgrad(go, x, w.main_grad.dtype)
                rows = min(local.shape[0], w.main_grad.shape[0])
                w.main_grad[:rows].add_(local[:rows])
        return grads


class _MaterializedCopyKept:
    """Caches the first backward's materialized weights on the module and computes later
    microbatches' dgrad with them (still calling materialize, so the call counts are right)."""

    def backward_gemm_weights(self, ctx: Any, call: GemmCall, weights: Sequence[Any],
                              distributed: bool) -> list[torch.Tensor]:
        fresh = super().backward_gemm_weights(ctx, call, weights, distributed)
        if not distributed:
            return fresh
        kept = call.module.__dict__.get("_kept_backward_weights")
        if kept is None:
            call.module.__dict__["_kept_backward_weights"] = kept = fresh
        return list(kept)  # Fault: a copy kept across later materializations


class _RequiresGradFromCopies:
    """Decides "do the weights need a gradient?" from the gathered copies' ``requires_grad``
    (TE's GroupedLinear before PR #3517): copies without it silently get no wgrad."""

    def forward_weights(self, call: GemmCall, weights: Sequence[Any]) -> list[torch.Tensor]:
        copies = super().forward_weights(call, weights)
        call.copies_require_grad = all(c.requires_grad for c in copies)  # Fault
        return copies

    def distributed_wgrads(self, call: GemmCall, weights: Sequence[Any],
                           grad_outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor],
                           compute_dtype: torch.dtype) -> list[torch.Tensor]:
        if not getattr(call, "copies_require_grad", True):
            return [None for _ in weights]  # no wgrad GEMM, no finalize
        return super().distributed_wgrads(call, weights, grad_outs, inps, compute_dtype)


class _FusedPlainFold:
    """Fused, plain weights fold their wgrad into ``main_grad`` through ``fold`` - the one
    decision the faults below get wrong."""

    def fold(self, weight: Any, wgrad: torch.Tensor) -> None:
        raise NotImplementedError

    def plain_wgrads(self, call: GemmCall, origins: Sequence[Any],
                     grad_outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor],
                     compute_dtype: torch.dtype) -> list[torch.Tensor]:
        if not call.fused:
            return super().plain_wgrads(call, origins, grad_outs, inps, compute_dtype)
        for w, go, x in zip(origins, grad_outs, inps):
            self.fold(w, self.wgrad(go, x, w.main_grad.dtype))
            w.grad_added_to_main_grad = True
        return [self.dummy_grad(w) for w in origins]


class _MainGradRebound(_FusedPlainFold):
    """Fused, plain weights: accumulates the wgrad out of place and rebinds ``main_grad`` to
    the sum - every value right, but Megatron's DDP bucket that ``main_grad`` viewed never
    sees the gradient (CONTRACTS §2: ``main_grad`` is never reassigned)."""

    def fold(self, weight: Any, wgrad: torch.Tensor) -> None:
        weight.main_grad = weight.main_grad + wgrad  # Fault: rebinds


# ---- subtle numeric faults: real-world precision bugs, caught only by values ----

class _WgradRoundedThroughBf16(_FusedPlainFold):
    """The weight gradient passes through bf16 once before an fp32 ``main_grad`` takes it
    (a cast left in a fused epilogue): every element loses 16 mantissa bits."""

    def write_buffer(self, buf: torch.Tensor, wgrad: torch.Tensor, index: int) -> None:
        super().write_buffer(buf, wgrad.to(torch.bfloat16).to(wgrad.dtype), index)  # Fault

    def fold(self, weight: Any, wgrad: torch.Tensor) -> None:
        weight.main_grad.add_(wgrad.to(torch.bfloat16).to(wgrad.dtype))  # Fault


class _MainGradAccumulatedInBf16(_FusedPlainFold):
    """Fused, plain weights: ``main_grad`` accumulated in bf16 (the sum rounded to bf16,
    then stored back into the fp32 buffer)."""

    def fold(self, weight: Any, wgrad: torch.Tensor) -> None:
        bf = torch.bfloat16
        weight.main_grad.copy_((weight.main_grad.to(bf) + wgrad.to(bf)).to(wgrad.dtype))  # Fault


class _DgradWithBf16Weight:
    """fp32 cells: the input gradient is computed with the weight rounded to bf16 (a
    low-precision copy kept for the backward GEMM)."""

    def backward_gemm_weights(self, ctx: Any, call: GemmCall, weights: Sequence[Any],
                              distributed: bool) -> list[torch.Tensor]:
        fresh = super().backward_gemm_weights(ctx, call, weights, distributed)
        return [w.to(torch.bfloat16).to(w.dtype) if w.dtype == torch.float32 else w for w in fresh]  # Fault


class _Tf32WhileDeclaringIeee:
    """fp32 forward GEMMs run with TF32 operands (10 mantissa bits) while the backend
    declares IEEE fp32 (no ``FP32_GEMM = "tf32"``), so the harness holds it to u = 2^-24."""

    def forward_weights(self, call: GemmCall, weights: Sequence[Any]) -> list[torch.Tensor]:
        from harness.cell.quantized import round_to_tf32

        copies = super().forward_weights(call, weights)
        return [round_to_tf32(c) if c.dtype == torch.float32 else c for c in copies]  # Fault


class _GroupedTensorPathNoDw:
    """``GroupedLinear``'s grouped-tensor path as TE 2.20.2 wrote it: forward keeps the
    gathered copies for backward, and backward runs on them as if the weights were plain -
    no backward-materialize, no ``grad_buffer()``, no finalize."""

    def save(self, ctx: Any, call: GemmCall, inp: torch.Tensor, weights: Sequence[Any],
             gemm_weights: Sequence[torch.Tensor]) -> None:
        super().save(ctx, call, inp, weights, gemm_weights)
        if getattr(call.module, "use_grouped_tensor", False):
            ctx.weight_objects = tuple(gemm_weights)  # Fault: the gathered copies, kept

    def origin_weights(self, ctx: Any, call: GemmCall, weights: Sequence[Any],
                       distributed: bool) -> list[Any]:
        if getattr(call.module, "use_grouped_tensor", False):
            return list(ctx.weight_objects)  # Fault: main_grad looked up on the copies
        return super().origin_weights(ctx, call, weights, distributed)


# ---- faults of LayerNormLinear's normalization: its parameters are plain, its gradients ----
# ---- ordinary - and a backend can still lose or misroute them ----------------------------

class _NormDgammaDropped:
    """The normalization's backward never returns ``dgamma``: ``layer_norm_weight`` keeps
    its gradient of record from before the step."""

    def norm_backward(self, dh: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor,
                      beta: torch.Tensor | None, call: Any) -> _norm.NormGrads:
        grads = super().norm_backward(dh, x, gamma, beta, call)
        return _norm.NormGrads(grads.dx, None, grads.dbeta)  # Fault


class _NormDbetaOnGamma:
    """LayerNorm: the bias gradient is delivered to ``layer_norm_weight`` and the scale's to
    ``layer_norm_bias`` (two same-shaped outputs in the wrong order)."""

    def norm_backward(self, dh: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor,
                      beta: torch.Tensor | None, call: Any) -> _norm.NormGrads:
        grads = super().norm_backward(dh, x, gamma, beta, call)
        if grads.dbeta is None:
            return grads
        return _norm.NormGrads(grads.dx, grads.dbeta, grads.dgamma)  # Fault


class _NormZeroCenteredIgnoredInBackward:
    """Zero-centered gamma: forward scales by ``1 + gamma``, backward by ``gamma``."""

    def norm_backward(self, dh: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor,
                      beta: torch.Tensor | None, call: Any) -> _norm.NormGrads:
        # Fault: the +1 forgotten (dgamma does not involve the scale; the input gradient does)
        call = _norm.NormCall(call.impl, call.kind, False, call.eps)
        return super().norm_backward(dh, x, gamma, beta, call)


# ---- building backends ------------------------------------------------------------------

def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def _subclass(bases: tuple[type, ...], name: str, qualprefix: str, attrs: dict[str, Any]) -> type:
    cls = type(name, bases, {"__module__": __name__, **attrs})
    cls.__qualname__ = f"{qualprefix}.{name}"
    return cls


def _backend(name: str, description: str, linear: type, grouped: type, ops_grouped: type,
             layernorm: type) -> types.ModuleType:
    backend = types.ModuleType(f"{__name__}:{name}", description)
    backend.__file__ = __file__  # its code is the reference's (harness.cell.rejection.source_roots)
    backend.__all__ = ["Linear", "GroupedLinear", "LayerNormLinear", "ops", "autocast", "recipe"]
    backend.autocast = _fp8.autocast
    backend.recipe = recipe
    backend.Linear = linear
    backend.GroupedLinear = grouped
    backend.LayerNormLinear = layernorm
    backend.ops = types.ModuleType(f"{__name__}:{name}.ops", description)
    backend.ops.GroupedLinear = ops_grouped
    return backend


def backend_from_fault(name: str, description: str, fault: type,
                       modules: Sequence[str] = GEMM_MODULES) -> types.ModuleType:
    """A backend whose modules in ``modules`` use ``fault`` over the reference's impl."""
    q = _camel(name)
    linear, grouped, ops_grouped = _modules.Linear, _modules.GroupedLinear, ops.GroupedLinear
    layernorm = _modules.LayerNormLinear
    if set(modules) & set(MODULE_CLASSES):
        impl = _subclass((fault, ReferenceImpl), f"{q}Impl", q, {})()
        if "linear" in modules:
            linear = _subclass((_modules.Linear,), "Linear", q, {"_impl": impl})
        if {"grouped_linear", "grouped_linear_tensor"} & set(modules):
            grouped = _subclass((_modules.GroupedLinear,), "GroupedLinear", q, {"_impl": impl})
        if set(modules) & set(NORM):
            layernorm = _subclass((_modules.LayerNormLinear,), "LayerNormLinear", q, {"_impl": impl})
    if {"ops_grouped_linear", "ops_grouped_linear_tensor"} & set(modules):
        ops_impl = _subclass((fault, OpsImpl), f"{q}OpsImpl", q, {})()
        ops_grouped = _subclass((ops.GroupedLinear,), "GroupedLinear", f"{q}.ops", {"_impl": ops_impl})
    return _backend(name, description, linear, grouped, ops_grouped, layernorm)


@dataclass(frozen=True)
class Mutant:
    """One planted fault: its class of docs/fault-classes.md (``harness.vocabulary.fault_classes``) and
    the backend that plants it.

    Attributes:
        fault: the catalog entry (name, description, modules, ``min_world_size``, evidence).
        backend: a backend module (``Linear``, ``GroupedLinear``, ``ops.GroupedLinear``).
    """

    fault: FaultClass
    backend: types.ModuleType

    def __getattr__(self, name: str) -> Any:  # name, description, modules, min_world_size, evidence
        return getattr(self.fault, name)


# ---- low precision: faults of the FP8 path (cells under a recipe; harness.backends.reference._fp8) ----

class _Fp8PerShardAmax:
    """A distributed weight's forward scale (current) or recorded amax (delayed) taken from
    this rank's shard, not from the whole gathered weight."""

    def fp8_weight_forward(self, call: GemmCall, i: int, weight: Any, gemm_weight: torch.Tensor) -> Any:
        if not call.distributed:
            return super().fp8_weight_forward(call, i, weight, gemm_weight)
        return call.fp8.forward_w(i, gemm_weight, amax_of=weight.detach())  # Fault: the shard's amax


class _Fp8StaleWeightWorkspace:
    """The FP8 weight quantized by the first microbatch is kept on the module and multiplied
    again by every later forward (a weight workspace never refreshed)."""

    def fp8_weight_forward(self, call: GemmCall, i: int, weight: Any, gemm_weight: torch.Tensor) -> Any:
        cache = call.module.__dict__.setdefault("_stale_fp8_weights", {})
        if i in cache:  # Fault: reused, whatever the scale or the weight is now
            return cache[i]
        cache[i] = super().fp8_weight_forward(call, i, weight, gemm_weight)
        return cache[i]


class _Fp8E4m3Gradient:
    """The output gradient quantized to E4M3 (the forward format) instead of E5M2."""

    def fp8_grad(self, call: GemmCall, i: int, grad_out: torch.Tensor) -> Any:
        return call.fp8.grad(i, grad_out, fmt="e4m3")  # Fault: HYBRID's gradients are E5M2


class _Fp8DgradWeightUnquantized:
    """A distributed weight's dgrad multiplies the re-gathered high-precision weight next to
    the FP8 gradient: the backward re-quantization is missing."""

    def fp8_weight_backward(self, call: GemmCall, i: int, weight: Any, gemm_weight: torch.Tensor) -> Any:
        if not call.distributed:
            return super().fp8_weight_backward(call, i, weight, gemm_weight)
        return _fp8.Quantized(gemm_weight.detach().float(), 1.0, gemm_weight.dtype, call.fp8.state.kind)  # Fault


class _Fp8DgradWeightRequantized:
    """Delayed scaling: a distributed weight's re-gathered weight is quantized with the
    scale as updated after the forward (and its amax recorded), not the forward's scale."""

    def fp8_weight_backward(self, call: GemmCall, i: int, weight: Any, gemm_weight: torch.Tensor) -> Any:
        if not call.distributed or call.fp8.state.kind != "delayed":
            return super().fp8_weight_backward(call, i, weight, gemm_weight)
        slot = call.fp8.state.w[i]
        return _fp8.quantize(gemm_weight, slot.next_scale(gemm_weight), slot.fmt, slot.kind)  # Fault


def _mxfp8_rounded_down(w: torch.Tensor) -> torch.Tensor:
    """``w`` (``[out, in]``) in MXFP8 blocks of 32 along ``in`` with each E8M0 scale-inverse
    the power of two *at most* ``amax / 448`` (the recipe rounds it up): the block's largest
    elements exceed E4M3's range and saturate."""
    blocks = w.detach().float().reshape(w.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True).clamp_min(2.0**-126)
    inv = torch.ldexp(torch.ones_like(amax), torch.floor(torch.log2(amax / 448.0)).to(torch.int32))
    vals = (blocks / inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * inv
    return vals.reshape(w.shape)


class _Mxfp8ScaleRoundedDown:
    """MXFP8: the weight's block scales rounded down, not up (its largest elements saturate)."""

    def fp8_weight_forward(self, call: GemmCall, i: int, weight: Any, gemm_weight: torch.Tensor) -> Any:
        if call.fp8.state.kind != "mxfp8":
            return super().fp8_weight_forward(call, i, weight, gemm_weight)
        return _fp8.Quantized(_mxfp8_rounded_down(gemm_weight), 1.0, gemm_weight.dtype, "mxfp8")  # Fault


class _Nvfp4ShardTensorScale:
    """NVFP4: a distributed weight's tensor scale (``S_enc`` and the GEMM's factor) from the
    amax of this rank's shard, not of the whole gathered weight: where the shard holds smaller
    values than the weight, the other shards' largest elements saturate."""

    def fp8_weight_forward(self, call: GemmCall, i: int, weight: Any, gemm_weight: torch.Tensor) -> Any:
        q = super().fp8_weight_forward(call, i, weight, gemm_weight)
        if not call.distributed or call.fp8.state.kind != "nvfp4":
            return q
        shard = weight.detach().abs()
        return replace(q, tensor_amax=float(shard.max()) if shard.numel() else 0.0)  # Fault: the shard's amax


# ---- the blocks of the block recipes: faults only an operand of two or more blocks shows -------

class _BlockFaultOperand(_fp8.BlockQuantized):
    """A block recipe's operand quantized with a planted :data:`_fp8.AmaxMap` (``amax_map``
    gives it, from the operand and the K axis its blocks lie along)."""

    def amax_map(self, axis: int) -> _fp8.AmaxMap | None:
        raise NotImplementedError

    def along(self, k_axis: int) -> torch.Tensor:
        axis = k_axis ^ int(self.transposed)
        vals = _fp8.block_quantized(self.src, self.rule, axis, self.fmt, self.dtype, self.tensor_amax,
                                    self.amax_map(axis))
        return vals.t() if self.transposed else vals


class _NeighbourAmaxOperand(_BlockFaultOperand):
    """Each block (tile) takes the amax of the next block along K (the last the first's)."""

    def amax_map(self, axis: int) -> _fp8.AmaxMap:
        return lambda amax, dim: torch.roll(amax, -1, dim)  # Fault: the neighbour's amax


class _RaggedEdgeOperand(_BlockFaultOperand):
    """The short last block (tile) along K - the ragged edge - scaled with the full block
    before it: its boundary taken one block early, as ``n // 128`` full blocks would put it."""

    def amax_map(self, axis: int) -> _fp8.AmaxMap:
        length = self.src.shape[1] if self.rule == "2d" else self.src.shape[axis]

        def previous_for_ragged(amax: torch.Tensor, dim: int) -> torch.Tensor:
            count = amax.shape[dim]
            if length % 128 == 0 or count < 2:
                return amax
            index = torch.arange(count)
            index[-1] = count - 2  # Fault: the ragged block reads the block before it
            return amax.index_select(dim, index)
        return previous_for_ragged


class _BlockOperandFault:
    """Every block-recipe operand of every GEMM (forward, dgrad, wgrad) quantized by
    ``operand``, the faulty block quantizer; other operands as the reference quantizes them."""

    operand: type[_BlockFaultOperand]
    rules: tuple[str, ...] = ("mxfp8", "1d", "2d", "nvfp4", "nvfp4-2d")

    def _faulty(self, op: Any) -> Any:
        if type(op) is _fp8.BlockQuantized and op.rule in self.rules:
            return self.operand(**vars(op))
        return op

    def fprop(self, x: Any, weight: Any) -> torch.Tensor:
        return super().fprop(self._faulty(x), self._faulty(weight))

    def dgrad(self, grad_out: Any, weight: Any) -> torch.Tensor:
        return super().dgrad(self._faulty(grad_out), self._faulty(weight))

    def wgrad(self, grad_out: Any, inp: Any, dtype: torch.dtype) -> torch.Tensor:
        return super().wgrad(self._faulty(grad_out), self._faulty(inp), dtype)


class _BlockAmaxFromNeighbour(_BlockOperandFault):
    """MXFP8, FP8 block scaling and NVFP4: each block or tile scaled from its K-neighbour's amax."""

    operand = _NeighbourAmaxOperand


class _BlockRaggedEdgeOffByOne(_BlockOperandFault):
    """FP8 block scaling: the ragged edge's block or tile scaled with the full one before it."""

    operand = _RaggedEdgeOperand
    rules = ("1d", "2d")


class _FirstMicrobatchIgnored:
    """``is_first_microbatch=True`` ignored: a fused plain weight accumulates its first wgrad."""

    def plain_wgrads(self, call: GemmCall, origins: Sequence[Any], grad_outs: Sequence[torch.Tensor],
                     inps: Sequence[torch.Tensor], compute_dtype: torch.dtype) -> list[torch.Tensor]:
        return super().plain_wgrads(replace(call, first_microbatch=None),  # Fault
                                    origins, grad_outs, inps, compute_dtype)


class _FirstMicrobatchOverwritesDistributed:
    """``is_first_microbatch=True`` applied to a distributed weight (TE exempts it: its finalize
    accumulates): ``main_grad`` is cleared before the first finalize."""

    def distributed_wgrads(self, call: GemmCall, weights: Sequence[Any], grad_outs: Sequence[torch.Tensor],
                           inps: Sequence[torch.Tensor], compute_dtype: torch.dtype) -> list[torch.Tensor]:
        if call.first_microbatch:
            for w in weights:
                if getattr(w, "main_grad", None) is not None:
                    w.main_grad.zero_()  # Fault: the flag's overwrite, on a weight finalize accumulates into
        return super().distributed_wgrads(call, weights, grad_outs, inps, compute_dtype)


#: the fault class -> the mixin planting it (``hooks-strip-subclass`` is the pre-fix backend itself)
IMPLEMENTATIONS: dict[str, type] = {
    "wgrad-compute-dtype": _WgradComputeDtype,
    "shared-grad-buffer": _SharedGradBuffer,
    "full-shape-dummy": _FullShapeDummy,
    "unfused-finalize-dropped": _UnfusedFinalizeDropped,
    "ops-double-add": _OpsDoubleAdd,
    "dgrad-forward-copy": _DgradForwardCopy,
    "per-member-materialize": _PerMemberMaterialize,
    "dw-fused-hook-skipped": _DwFusedHookSkipped,
    "delay-with-dw-accepted": _DelayWithDwAccepted,
    "wgrads-reused-after-finalize": _WgradsReusedAfterFinalize,
    "main-grad-read-after-finalize": _MainGradReadAfterFinalize,
    "materialized-copy-kept": _MaterializedCopyKept,
    "requires-grad-from-copies": _RequiresGradFromCopies,
    "main-grad-rebound": _MainGradRebound,
    "wgrad-rounded-through-bf16": _WgradRoundedThroughBf16,
    "main-grad-accumulated-in-bf16": _MainGradAccumulatedInBf16,
    "dgrad-with-bf16-weight": _DgradWithBf16Weight,
    "tf32-declared-ieee": _Tf32WhileDeclaringIeee,
    "grouped-tensor-path-no-dw": _GroupedTensorPathNoDw,
    "norm-dgamma-dropped": _NormDgammaDropped,
    "norm-dbeta-on-gamma": _NormDbetaOnGamma,
    "norm-zero-centered-ignored-in-backward": _NormZeroCenteredIgnoredInBackward,
    "fp8-per-shard-amax": _Fp8PerShardAmax,
    "fp8-stale-weight-workspace": _Fp8StaleWeightWorkspace,
    "fp8-e4m3-gradient": _Fp8E4m3Gradient,
    "fp8-dgrad-weight-unquantized": _Fp8DgradWeightUnquantized,
    "fp8-dgrad-weight-requantized": _Fp8DgradWeightRequantized,
    "mxfp8-scale-rounded-down": _Mxfp8ScaleRoundedDown,
    "nvfp4-shard-tensor-scale": _Nvfp4ShardTensorScale,
    "block-amax-from-neighbour": _BlockAmaxFromNeighbour,
    "block-tile-boundary-off-by-one": _BlockRaggedEdgeOffByOne,
    "first-microbatch-ignored": _FirstMicrobatchIgnored,
    "first-microbatch-overwrites-distributed": _FirstMicrobatchOverwritesDistributed,
}


def _hooks_strip_subclass(fault: FaultClass) -> types.ModuleType:
    # The pre-fix backend is exactly this fault; the op reads its weights from its own
    # attributes, so its class is the reference's (the control group).
    return _backend(fault.name, fault.description, prefix.Linear, prefix.GroupedLinear, ops.GroupedLinear,
                    prefix.LayerNormLinear)


def _build() -> dict[str, Mutant]:
    out = {}
    for fault in REFERENCE.values():
        backend = (_hooks_strip_subclass(fault) if fault.name == "hooks-strip-subclass" else
                   backend_from_fault(fault.name, fault.description, IMPLEMENTATIONS[fault.name], fault.modules))
        out[fault.name] = Mutant(fault, backend)
    return out


MUTANTS: dict[str, Mutant] = _build()


def names() -> list[str]:
    """The mutant names, in docs/fault-classes.md order."""
    return list(MUTANTS)


def get(name: str) -> types.ModuleType:
    """The backend of mutant ``name`` (what ``harness.backends.reference.mutants:<name>`` loads).

    Raises:
        ValueError: an unknown name; the message lists the known ones.
    """
    try:
        return MUTANTS[name].backend
    except KeyError:
        raise ValueError(f"Unknown mutant {name!r} (mutants: {', '.join(MUTANTS)})") from None


def __getattr__(attr: str) -> types.ModuleType:
    """``getattr(mutants, "shared-grad-buffer")`` for loaders that do not call :func:`get`."""
    if attr in MUTANTS:
        return MUTANTS[attr].backend
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
