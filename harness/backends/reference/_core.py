"""The grouped GEMM autograd function behind every reference module, and its policy.

``Linear`` is a group of one, ``GroupedLinear`` and ``ops.GroupedLinear`` groups of N: one
function computes ``y_i = x_i @ W_i^T + b_i`` over the row splits and its backward, so the
three modules cannot drift apart. Every decision that a real backend could get wrong is a
method of ``ReferenceImpl`` (where backward finds the weights, which dtype wgrads use, which
buffer they go to, what autograd receives, when hooks fire). The pre-fix backend and the
planted mutants (``harness.backends.reference.prefix`` / ``.mutants``) subclass it and override one
method each, so the clean reference carries no mutant code in its flow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from harness.backends.reference import _dw, _fp8, _norm

#: a GEMM operand: a tensor, or under a recipe its FP8 codes and scale (``_fp8.Quantized``,
#: whose ``@`` is the quantized GEMM, its result the scaled fp32 accumulator)
Operand = Any


def wgrad_gemm(grad_out: Operand, inp: Operand, dtype: torch.dtype) -> torch.Tensor:
    """``dW = dY^T X`` with the product formed in ``dtype`` (exact for bf16/fp16 -> fp32);
    quantized operands: the FP8 GEMM's fp32 result, rounded to ``dtype``."""
    if isinstance(grad_out, _fp8.QUANTIZED):
        return (grad_out.t() @ inp).to(dtype)
    return grad_out.t().to(dtype) @ inp.to(dtype)


@dataclass
class GemmCall:
    """Everything one forward hands to its backward that is not a tensor."""

    module: torch.nn.Module
    impl: "ReferenceImpl"
    m_splits: list[int]
    fused: bool
    delay: bool
    delay_bias: bool
    distributed: bool
    n: int
    has_bias: bool
    #: the recipe's state and the forward's scales, under ``autocast`` (``_fp8``); else None
    fp8: "_fp8.CallScaling | None" = None
    #: ``is_first_microbatch`` as the forward got it: ``True`` lets a fused plain weight's
    #: wgrad overwrite ``main_grad`` (the step's first gradient), as TE does
    first_microbatch: bool | None = None


class ReferenceImpl:
    """The hook-safe behaviour (the TE fix): weight objects live on ``ctx``."""

    # ---- the arithmetic: each GEMM / reduction once, so a fault can change its result ----
    def fprop(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x @ weight.t()

    def dgrad(self, grad_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return grad_out @ weight

    def wgrad(self, grad_out: torch.Tensor, inp: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return wgrad_gemm(grad_out, inp, dtype)

    def bgrad(self, grad_out: torch.Tensor) -> torch.Tensor:
        return grad_out.sum(0)

    # ---- low precision: what each GEMM operand is quantized from, and how (``_fp8``) ----
    def fp8_weight_forward(self, call: "GemmCall", i: int, weight: Any,
                           gemm_weight: torch.Tensor) -> Operand:
        """The forward's weight operand: the whole (gathered) weight, quantized - or, when
        the forward passes ``is_first_microbatch=False``, the workspace the last ``True``
        quantized (TE's FP8 weight caching; the weights do not change within a step)."""
        return _fp8.cached_weight(call.fp8, call.module, i, gemm_weight, call.first_microbatch)

    def fp8_grad(self, call: "GemmCall", i: int, grad_out: torch.Tensor) -> Operand:
        """The output gradient operand, in the recipe's gradient format."""
        return call.fp8.grad(i, grad_out)

    def fp8_weight_backward(self, call: "GemmCall", i: int, weight: Any,
                            gemm_weight: torch.Tensor) -> Operand:
        """The dgrad's weight operand: the weight backward holds, quantized as the forward's."""
        return call.fp8.saved_w(i, gemm_weight)

    def norm_forward(self, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None,
                     call: "_norm.NormCall") -> torch.Tensor:
        return _norm.forward(x, gamma, beta, call)

    def norm_backward(self, dh: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor,
                      beta: torch.Tensor | None, call: "_norm.NormCall") -> "_norm.NormGrads":
        return _norm.backward(dh, x, gamma, beta, call)

    # ---- forward -------------------------------------------------------------------
    def check_supported(self, module: torch.nn.Module, weights: Sequence[Any]) -> bool:
        """Validate the weight group before any collective; True when distributed.

        Raises:
            TypeError: a non-tensor carries the distributed marker.
            NotImplementedError: delayed wgrad with a distributed weight (unsupported by
                contract: finalize would reduce a buffer nobody filled yet).
        """
        distributed = _dw.check_distributed_group(weights)
        if distributed and getattr(module, "delay_wgrad_compute", False):
            raise NotImplementedError(
                f"{type(module).__name__}: delay_wgrad_compute=True is not supported with a "
                "DistributedWeight (is_distributed_weight=True): the delayed wgrad would be "
                "finalized before it is computed"
            )
        return distributed

    def forward_weights(self, call: GemmCall, weights: Sequence[Any]) -> list[torch.Tensor]:
        if call.distributed:
            return _dw.materialize_forward(weights)
        return list(weights)

    def save(self, ctx: Any, call: GemmCall, inp: torch.Tensor, weights: Sequence[Any],
             gemm_weights: Sequence[torch.Tensor]) -> None:
        """Save for backward; keep the weight *objects* on ctx so hooks cannot strip them."""
        ctx.save_for_backward(inp, *weights)
        ctx.weight_objects = tuple(weights)

    # ---- backward ------------------------------------------------------------------
    def backward_weights(self, ctx: Any, call: GemmCall, saved: Sequence[torch.Tensor]) -> list[Any]:
        """The objects backward decides "distributed?" from (the fix: never the unpacked).

        ``saved`` is ``ctx.saved_tensors``, unpacked exactly once (checkpointing forbids more).
        """
        return list(ctx.weight_objects)

    def backward_gemm_weights(self, ctx: Any, call: GemmCall, weights: Sequence[Any],
                              distributed: bool) -> list[torch.Tensor]:
        if distributed:
            return _dw.materialize_backward(weights)
        return list(weights)

    def origin_weights(self, ctx: Any, call: GemmCall, weights: Sequence[Any],
                       distributed: bool) -> list[Any]:
        """The parameter objects that own ``main_grad`` (fused accumulation)."""
        return list(weights)

    def wgrad_dtype(self, weight: Any, compute_dtype: torch.dtype, fused: bool,
                    distributed: bool) -> torch.dtype:
        main_grad = getattr(weight, "main_grad", None)
        if main_grad is not None and (fused or distributed):
            return main_grad.dtype
        return compute_dtype

    def grad_buffers(self, weights: Sequence[Any]) -> list[torch.Tensor]:
        return [w.grad_buffer() for w in weights]

    def write_buffer(self, buf: torch.Tensor, wgrad: torch.Tensor, index: int) -> None:
        if tuple(buf.shape) != tuple(wgrad.shape):
            raise ValueError(
                f"grad_buffer() of weight{index} has shape {tuple(buf.shape)}; expected the "
                f"full logical shape {tuple(wgrad.shape)}"
            )
        buf.copy_(wgrad)

    def dummy_grad(self, weight: Any) -> torch.Tensor:
        return torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device)

    def distributed_wgrads(self, call: GemmCall, weights: Sequence[Any],
                           grad_outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor],
                           compute_dtype: torch.dtype) -> list[torch.Tensor]:
        """Wgrads of a distributed group; returns what autograd receives per weight."""
        if call.fused:
            bufs = self.grad_buffers(weights)
            for i, (buf, go, x) in enumerate(zip(bufs, grad_outs, inps)):
                self.write_buffer(buf, self.wgrad(go, x, buf.dtype), i)
            _dw.finalize(weights, bufs)
            return [self.dummy_grad(w) for w in weights]
        wgrads = [
            self.wgrad(go, x, self.wgrad_dtype(w, compute_dtype, False, True))
            for w, go, x in zip(weights, grad_outs, inps)
        ]
        return self.deliver_finalized(_dw.finalize(weights, wgrads), wgrads)

    def deliver_finalized(self, finalized: list[torch.Tensor],
                          local: list[torch.Tensor]) -> list[torch.Tensor]:
        """Unfused: finalize's return value is the gradient autograd receives."""
        return finalized

    def plain_wgrads(self, call: GemmCall, origins: Sequence[Any],
                     grad_outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor],
                     compute_dtype: torch.dtype) -> list[torch.Tensor]:
        if call.fused:
            for w, go, x in zip(origins, grad_outs, inps):
                main_grad = w.main_grad
                wgrad = self.wgrad(go, x, main_grad.dtype)
                if call.first_microbatch:  # TE: accumulate = fused and not is_first_microbatch
                    main_grad.copy_(wgrad)
                else:
                    main_grad.add_(wgrad)
                w.grad_added_to_main_grad = True
            return [self.dummy_grad(w) for w in origins]
        return [self.wgrad(go, x, compute_dtype) for go, x in zip(grad_outs, inps)]

    def weight_grads(self, call: GemmCall, weights: Sequence[Any], origins: Sequence[Any],
                     distributed: bool, grad_outs: Sequence[torch.Tensor],
                     inps: Sequence[torch.Tensor], compute_dtype: torch.dtype) -> list[torch.Tensor]:
        if distributed:
            return self.distributed_wgrads(call, weights, grad_outs, inps, compute_dtype)
        return self.plain_wgrads(call, origins, grad_outs, inps, compute_dtype)

    # ---- delayed wgrad -----------------------------------------------------------------
    def fire_wgrad_hooks(self, module: Any, call: GemmCall) -> None:
        """Both branches (accumulate-into-main_grad and regular) fire the hooks."""
        module._fire_wgrad_hooks()


def _accumulate_grad(param: torch.Tensor, grad: torch.Tensor) -> None:
    grad = grad.to(param.dtype)
    param.grad = grad if param.grad is None else param.grad + grad


class GroupGemm(torch.autograd.Function):
    """``y = cat_i(x_i @ W_i^T + b_i)`` over row splits, with the distributed-weight path."""

    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, call: GemmCall, *params: torch.Tensor) -> torch.Tensor:
        impl = call.impl
        weights = params[: call.n]
        biases = params[call.n:] if call.has_bias else ()
        gemm_weights = impl.forward_weights(call, weights)
        xs = torch.split(inp, call.m_splits)
        fp8 = call.fp8
        if fp8 is None:
            outs = [impl.fprop(x, w) for x, w in zip(xs, gemm_weights)]
            if call.has_bias:
                outs = [o + b for o, b in zip(outs, biases)]
        else:
            outs = [impl.fprop(fp8.forward_x(i, x), impl.fp8_weight_forward(call, i, weights[i], w))
                    for i, (x, w) in enumerate(zip(xs, gemm_weights))]
            if call.has_bias:  # in fp32; an fp32 layer's bias as bf16 (FP8 GEMMs take no fp32 bias)
                bias_dtype = torch.bfloat16 if inp.dtype == torch.float32 else inp.dtype
                outs = [o + b.to(bias_dtype).float() for o, b in zip(outs, biases)]
            outs = [o.to(inp.dtype) for o in outs]
        out = torch.cat(outs) if len(outs) > 1 else outs[0]
        impl.save(ctx, call, inp, weights, gemm_weights)
        ctx.call = call
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        call: GemmCall = ctx.call
        impl = call.impl
        saved = ctx.saved_tensors
        inp = saved[0]
        weights = impl.backward_weights(ctx, call, saved)
        distributed = _dw.is_distributed_weight(weights[0])
        gemm_weights = impl.backward_gemm_weights(ctx, call, weights, distributed)
        grad_out = grad_out.contiguous()
        gos = torch.split(grad_out, call.m_splits)
        xs = torch.split(inp, call.m_splits)
        fp8 = call.fp8
        # the GEMMs' operands: under a recipe, quantized (backward with the forward's scales)
        g_ops: Sequence[Operand] = gos
        x_ops: Sequence[Operand] = xs
        w_ops: Sequence[Operand] = gemm_weights
        if fp8 is not None:
            g_ops = [impl.fp8_grad(call, i, go) for i, go in enumerate(gos)]
            x_ops = [fp8.saved_x(i, x) for i, x in enumerate(xs)]
            w_ops = [impl.fp8_weight_backward(call, i, weights[i], w) for i, w in enumerate(gemm_weights)]

        dgrad = None
        if ctx.needs_input_grad[0]:
            parts = [impl.dgrad(go, w).to(grad_out.dtype) for go, w in zip(g_ops, w_ops)]
            dgrad = torch.cat(parts) if len(parts) > 1 else parts[0]

        n = call.n
        need_w = any(ctx.needs_input_grad[2: 2 + n])
        need_b = call.has_bias and any(ctx.needs_input_grad[2 + n:])
        w_grads: list[torch.Tensor | None] = [None] * n
        b_grads: list[torch.Tensor | None] = [None] * (n if call.has_bias else 0)
        compute_dtype = grad_out.dtype

        delayed_bias = need_b and call.delay and call.delay_bias
        if need_b and not delayed_bias:
            b_grads = [impl.bgrad(go) for go in gos]
        if need_w and call.delay:
            origins = impl.origin_weights(ctx, call, weights, distributed)
            call.module._wgrad_store.put(
                _delayed_wgrad(call, weights, origins, distributed, g_ops, x_ops, compute_dtype,
                               gos if delayed_bias else None)
            )
        elif need_w:
            origins = impl.origin_weights(ctx, call, weights, distributed)
            w_grads = list(impl.weight_grads(call, weights, origins, distributed, g_ops, x_ops,
                                             compute_dtype))
        if fp8 is not None:
            fp8.backward_done()
        return (dgrad, None, *w_grads, *b_grads)


def _detached(ops: Sequence[Operand]) -> list[Operand]:
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in ops]


def _delayed_wgrad(call: GemmCall, weights: Sequence[Any], origins: Sequence[Any],
                   distributed: bool, gos: Sequence[Operand], xs: Sequence[Operand],
                   compute_dtype: torch.dtype, bias_gos: Sequence[torch.Tensor] | None):
    """The queued half of a delayed backward: compute, deliver, then fire hooks
    (``bias_gos``: the unquantized output gradients when the bias gradients are delayed too)."""
    gos, xs = _detached(gos), _detached(xs)
    bias_gos = _detached(bias_gos) if bias_gos is not None else None

    def compute() -> None:
        grads = call.impl.weight_grads(call, weights, origins, distributed, gos, xs, compute_dtype)
        if not call.fused:
            for p, g in zip(origins, grads):
                _accumulate_grad(p, g)
        if bias_gos is not None:
            for i, go in enumerate(bias_gos):
                _accumulate_grad(getattr(call.module, f"bias{i}"), call.impl.bgrad(go))
        call.impl.fire_wgrad_hooks(call.module, call)

    return compute
