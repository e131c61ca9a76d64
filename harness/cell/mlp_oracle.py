"""The float64 oracle of Megatron's expert layer (``TEGroupedMLP``), without sharding.

For each iteration, microbatch and rank: a chunk of MoE layers, each ``O = (act(X W1^T + b1)
* p) W2^T + b2 * p`` per expert over its rows (Megatron-Core 0.19.2, ``moe/experts.py``:
``linear_fc1``, ``bias_act_func`` on its default eager branch, ``linear_fc2``, ``_apply_bias``),
the layer's output the next layer's input; backward from the cell's output gradient to the
input gradient, each layer's routing-probability gradient, and every weight's and bias's
gradient, summed over microbatches and averaged over ranks (Megatron's expert GTP reduces the
mean over its group; its DDP averages replicated experts the same way).

The bound of each compared value is derived as a module's is (``harness.cell.compare``): the
final rounding ``u(out) * |value|``, the last GEMM's fp32 accumulation and earlier roundings
on its magnitude; and, because a layer is a chain, every earlier stage's error carried
through the later stages on absolute values (first order: ``|J| e``, the same rule
``compare``'s ``slack`` carries an operand known within bounds by). Each stage rounds as the
backend computes it (te-cpu's GEMMs: fp32 accumulation, one rounding; torch's eager
activation, product and sum ops in the cell's dtype: each evaluated in fp32 and rounded once):

- ``Y = rnd(X W1^T + b1)``; SwiGLU: ``S = rnd(silu(g))``, ``A = rnd(S * u)`` for ``[g | u] = Y``;
  GELU: ``A = rnd(gelu(Y))``; ``Z = rnd(A * p)``; ``O = rnd(Z W2^T)``, then with a bias
  ``rnd(O + rnd(b2 * p))``;
- backward: ``dZ = rnd(dO W2)``, ``dA = rnd(dZ * p)``, ``dp = rnd(sum rnd(dZ * A))`` (+ the
  bias's ``rnd(sum rnd(dO * b2))``), the activation's derivative (``dY``), ``dX = rnd(dY W1)``;
  weight gradients ``dO^T Z`` and ``dY^T X`` in fp32.

An activation's own error: its derivative times the error of its input, plus its second
derivative's bound over the input's interval times the error squared, plus its evaluation (a
few fp32 units) and rounding; so with the derivative's error in backward. Nothing here is
tuned to pass: the self-test's perturbations measure how much of this bound a planted error
needs (docs/accuracy.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from harness.cell.inputs import DTYPES, generator, group_rows, randn
from harness.cell.oracle import Reference, increment_roundings
from harness.vocabulary.tolerance import UNDERFLOW, UNIT_ROUNDOFF

F64 = torch.float64
U32 = UNIT_ROUNDOFF["fp32"]
#: an activation evaluated in fp32 before its rounding: a few units of fp32 (libm's erf, exp)
EVAL_U = 4 * U32
#: bounds of the activations' higher derivatives over the reals (``|gelu''| <= 2 phi(0)``,
#: ``|gelu'''| <= 1.6``; ``|silu''| <= 0.5``, ``|silu'''| <= 0.35``), each rounded up
SECOND = {"gelu": 0.8, "silu": 0.5}
THIRD = {"gelu": 1.6, "silu": 0.35}


@dataclass
class Approx:
    """A value as the backend computes it: the exact float64 value of its formula over exact
    inputs, and a bound on how far the computed one can be (every rounding and every inherited
    error, first order)."""

    value: torch.Tensor
    err: torch.Tensor

    @classmethod
    def exact(cls, t: torch.Tensor) -> "Approx":
        v = t.to(F64)
        return cls(v, torch.zeros_like(v))


@dataclass
class LayerInputs:
    """Every tensor of one layer cell, seeded from the cell (never from its weight kind or hooks)."""

    dtype: torch.dtype
    activation: str
    experts: int
    #: ``[iteration][layer][expert]``: fc1's and fc2's full logical weights and biases
    w1: list[list[list[torch.Tensor]]]
    w2: list[list[list[torch.Tensor]]]
    b1: list[list[list[torch.Tensor]]]
    b2: list[list[list[torch.Tensor]]]
    #: ``[iteration][rank][microbatch]``: the chunk's input and its output gradient
    x: list[list[list[torch.Tensor]]]
    dy: list[list[list[torch.Tensor]]]
    #: ``[iteration][rank][microbatch][layer]``: routing probabilities and tokens per expert
    probs: list[list[list[list[torch.Tensor]]]]
    splits: list[list[list[list[list[int]]]]]

    @property
    def iterations(self) -> int:
        return len(self.x)

    @property
    def layers(self) -> int:
        return len(self.w1[0])


def fc1_rows(activation: str, ffn: int) -> int:
    """fc1's output features: the gated linear unit's two halves for SwiGLU."""
    return 2 * ffn if activation == "swiglu" else ffn


def make_inputs(seed: int, hidden: int, ffn: int, rows: int, dtype_name: str, activation: str,
                experts: int, layers: int, iterations: int, world_size: int, microbatches: int,
                bias: bool, draw_splits) -> LayerInputs:
    """The layer cell's seeded tensors, rounded to the cell's dtype; ``draw_splits(rows, groups,
    seed, rank, key)`` draws tokens per expert (``harness.cell.inputs.draw_splits``)."""
    dtype = DTYPES[dtype_name]
    f1 = fc1_rows(activation, ffn)
    its, lys, exs = range(iterations), range(layers), range(experts)
    w1 = [[[randn((f1, hidden), dtype, seed, "w1", i, l, e, scale=0.5) for e in exs] for l in lys] for i in its]
    w2 = [[[randn((hidden, ffn), dtype, seed, "w2", i, l, e, scale=0.5) for e in exs] for l in lys] for i in its]
    b1 = [[[randn((f1,), dtype, seed, "b1", i, l, e, scale=0.5) for e in exs] for l in lys] for i in its] if bias \
        else [[[] for _ in lys] for _ in its]
    b2 = [[[randn((hidden,), dtype, seed, "b2", i, l, e, scale=0.5) for e in exs] for l in lys] for i in its] if bias \
        else [[[] for _ in lys] for _ in its]
    ranks, mbs = range(world_size), range(microbatches)
    x = [[[randn((rows, hidden), dtype, seed, "x", i, r, m) for m in mbs] for r in ranks] for i in its]
    dy = [[[randn((rows, hidden), dtype, seed, "dy", i, r, m) for m in mbs] for r in ranks] for i in its]
    probs = [[[[torch.rand((rows,), generator=generator(seed, "p", i, r, m, l), dtype=torch.float32).to(dtype)
                for l in lys] for m in mbs] for r in ranks] for i in its]
    splits = [[[[draw_splits(rows, experts, seed, r, (i, m, l)) for l in lys] for m in mbs] for r in ranks]
              for i in its]
    return LayerInputs(dtype, activation, experts, w1, w2, b1, b2, x, dy, probs, splits)


# --- the arithmetic, value and error ------------------------------------------------------

def _rnd(a: Approx, u: float, eta: float, evaluated: float = 0.0) -> Approx:
    """``a`` evaluated (``evaluated``: its own fp32 evaluation's relative error) and rounded once."""
    mag = a.value.abs()
    return Approx(a.value, a.err + (u + evaluated) * (mag + a.err) + eta)


def _mul(a: Approx, b: Approx) -> Approx:
    return Approx(a.value * b.value, a.value.abs() * b.err + a.err * b.value.abs() + a.err * b.err)


def _gemm_pre(a: Approx, b: Approx, op_u: float) -> Approx:
    """``a @ b`` before its rounding: the inherited errors through the GEMM on absolute values,
    fp32 accumulation (``sqrt(K) u32`` of the magnitude, as ``compare``'s bound) and an operand
    rounding (``op_u``: TF32 GEMMs)."""
    k = a.value.shape[-1]
    mag = a.value.abs() @ b.value.abs()
    inherited = a.err @ b.value.abs() + a.value.abs() @ b.err + a.err @ b.err
    return Approx(a.value @ b.value, inherited + (U32 * math.sqrt(max(k, 1)) + op_u) * mag)


def _phi(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _act(name: str, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``f(y), f'(y), f''(y)`` of ``gelu`` (erf form) or ``silu``, in float64."""
    if name == "gelu":
        cdf = 0.5 * (1 + torch.erf(y / math.sqrt(2)))
        return y * cdf, cdf + y * _phi(y), _phi(y) * (2 - y * y)
    s = torch.sigmoid(y)
    return y * s, s * (1 + y * (1 - s)), s * (1 - s) * (2 + y * (1 - 2 * s))


def _apply(name: str, y: Approx, u: float, eta: float) -> Approx:
    """``f(y)`` evaluated in fp32 and rounded: ``|f'| e + f''max e^2 / 2`` inherited. The fp32
    evaluation errs by a few units of ``|f(y)|`` and of ``|y|`` too: ``gelu = y (1 + erf) / 2``
    cancels in ``1 + erf`` where ``y < 0``, ``silu = y sigmoid(y)`` carries ``sigmoid``'s
    error times ``|y|``."""
    f, d1, _ = _act(name, y.value)
    inherited = d1.abs() * y.err + 0.5 * SECOND[name] * y.err * y.err + EVAL_U * y.value.abs()
    return _rnd(Approx(f, inherited), u, eta, EVAL_U)


def _apply_backward(name: str, y: Approx, g: Approx, u: float, eta: float) -> Approx:
    """``f'(y) * g`` evaluated in fp32 and rounded (torch's ``*_backward`` kernels); as in the
    forward, the evaluation errs by a few units of ``|f'(y)|`` and of ``|y|`` (``1 - sigmoid``,
    ``1 + erf`` cancel), times ``|g|``."""
    _, d1, d2 = _act(name, y.value)
    d1_err = (d2.abs() + THIRD[name] * y.err) * y.err + EVAL_U * (1 + y.value.abs())
    inherited = d1.abs() * g.err + d1_err * (g.value.abs() + g.err)
    return _rnd(Approx(d1 * g.value, inherited), u, eta, EVAL_U)


@dataclass
class _Saved:
    x: Approx
    y: Approx
    s: Approx | None
    a: Approx
    z: Approx
    p: Approx


@dataclass
class RankLayerOracle:
    """What one rank's tensors of one layer cell should be, per iteration and microbatch."""

    outputs: list[list[Reference]] = field(default_factory=list)      # [it][mb]
    dgrads: list[list[Reference]] = field(default_factory=list)       # [it][mb]
    dprobs: list[list[list[Reference]]] = field(default_factory=list)  # [it][mb][layer]
    #: ``[it]`` -> parameter name -> the mean over ranks of the sum over microbatches
    grads: list[dict[str, Reference]] = field(default_factory=list)


def _ref(a: Approx, pre: Approx, reduction: int, roundings: int = 1) -> Reference:
    """A compared value: ``pre`` is it before its final rounding (its error the slack the bound
    carries beside the final rounding and the accumulation)."""
    return Reference(a.value, torch.zeros_like(a.value), reduction, roundings, slack=pre.err)


class LayerOracle:
    """The oracle of one layer cell (``compute``: as seen from one rank)."""

    def __init__(self, inputs: LayerInputs, out_dtype: str, gemm_operand_u: float = 0.0) -> None:
        """``out_dtype``: the cell's dtype (its activations'); ``gemm_operand_u``: what a GEMM's
        operand rounding costs per unit of its magnitude (TF32 GEMMs of an fp32 cell:
        ``2 u(tf32)``, as ``compare``'s bound charges it)."""
        self.inputs = inputs
        self.u = UNIT_ROUNDOFF[out_dtype]
        self.eta = UNDERFLOW[out_dtype]
        self.op_u = gemm_operand_u

    def _forward_layer(self, it: int, layer: int, x: Approx, p: torch.Tensor, splits: list[int],
                       ) -> tuple[Approx, Approx, list[_Saved]]:
        """One MoE layer's forward over the rows of each expert: (output, output before its last
        rounding, what backward needs)."""
        ins, u, eta = self.inputs, self.u, self.eta
        rows = x.value.shape[0]
        hidden = ins.w2[it][layer][0].shape[0]
        out_v = torch.zeros(rows, hidden, dtype=F64)
        out_e = torch.zeros_like(out_v)
        pre_e = torch.zeros_like(out_v)
        saved = []
        for e, sl in enumerate(group_rows(splits)):
            xe = Approx(x.value[sl], x.err[sl])
            pe = Approx.exact(p[sl].unsqueeze(-1))
            w1 = Approx.exact(ins.w1[it][layer][e].t())
            y = self._gemm(xe, w1) if not ins.b1[it][layer] else \
                self._gemm_bias(xe, w1, ins.b1[it][layer][e])
            s = None
            if ins.activation == "swiglu":
                half = y.value.shape[-1] // 2
                g, lin = Approx(y.value[:, :half], y.err[:, :half]), Approx(y.value[:, half:], y.err[:, half:])
                s = _apply("silu", g, u, eta)
                a = _rnd(_mul(s, lin), u, eta)
            else:
                a = _apply("gelu", y, u, eta)
            z = _rnd(_mul(a, pe), u, eta)
            w2 = Approx.exact(ins.w2[it][layer][e].t())
            o_pre = _gemm_pre(z, w2, self.op_u)
            o = _rnd(o_pre, u, eta)
            if ins.b2[it][layer]:
                bp = _rnd(_mul(Approx.exact(ins.b2[it][layer][e].unsqueeze(0)), pe), u, eta)
                o_pre = Approx(o.value + bp.value, o.err + bp.err)
                o = _rnd(o_pre, u, eta)
            out_v[sl], out_e[sl], pre_e[sl] = o.value, o.err, o_pre.err
            saved.append(_Saved(xe, y, s, a, z, pe))
        return Approx(out_v, out_e), Approx(out_v, pre_e), saved

    def _gemm(self, a: Approx, b: Approx) -> Approx:
        return _rnd(_gemm_pre(a, b, self.op_u), self.u, self.eta)

    def _gemm_bias(self, x: Approx, w: Approx, bias: torch.Tensor) -> Approx:
        """fc1 with its bias in the GEMM's epilogue: added in fp32, one rounding."""
        pre = _gemm_pre(x, w, self.op_u)
        b = bias.to(F64)
        return _rnd(Approx(pre.value + b, pre.err + U32 * (pre.value + b).abs()), self.u, self.eta)

    def _backward_layer(self, it: int, layer: int, dout: Approx, saved: list[_Saved], splits: list[int],
                        grads: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]],
                        ) -> tuple[Approx, Approx, Approx, Approx]:
        """One layer's backward: (input gradient, it before its last rounding, the probabilities'
        gradient, it before its last rounding); its weights' and biases' gradient terms are
        added to ``grads`` (name -> value, magnitude, inherited error, reduction)."""
        ins, u, eta = self.inputs, self.u, self.eta
        rows, hidden = dout.value.shape
        dx_v = torch.zeros(rows, hidden, dtype=F64)
        dx_e, dx_pre = torch.zeros_like(dx_v), torch.zeros_like(dx_v)
        dp_v, dp_e, dp_pre = (torch.zeros(rows, dtype=F64) for _ in range(3))
        prefix = f"layers.{layer}."
        for e, sl in enumerate(group_rows(splits)):
            sv = saved[e]
            do = Approx(dout.value[sl], dout.err[sl])
            w2 = Approx.exact(ins.w2[it][layer][e])
            dz = self._gemm(do, w2)
            _add_grad(grads, f"{prefix}linear_fc2.weight{e}", do, sv.z, self.op_u)
            da = _rnd(_mul(dz, sv.p), u, eta)
            prod = _rnd(_mul(dz, sv.a), u, eta)
            dp_pre_e = Approx(prod.value.sum(-1), prod.err.sum(-1) + U32 * math.sqrt(prod.value.shape[-1])
                              * prod.value.abs().sum(-1))
            dp = _rnd(dp_pre_e, u, eta)
            if ins.b2[it][layer]:
                b2 = Approx.exact(ins.b2[it][layer][e].unsqueeze(0))
                bprod = _rnd(_mul(do, b2), u, eta)
                dpb = _rnd(Approx(bprod.value.sum(-1), bprod.err.sum(-1) + U32 * math.sqrt(hidden)
                                  * bprod.value.abs().sum(-1)), u, eta)
                dp_pre_e = Approx(dp.value + dpb.value, dp.err + dpb.err)
                dp = _rnd(dp_pre_e, u, eta)
                _add_bias_grad(grads, f"{prefix}linear_fc2.bias{e}", _rnd(_mul(do, sv.p), u, eta))
            if ins.activation == "swiglu":
                half = sv.y.value.shape[-1] // 2
                g = Approx(sv.y.value[:, :half], sv.y.err[:, :half])
                lin = Approx(sv.y.value[:, half:], sv.y.err[:, half:])
                du = _rnd(_mul(da, sv.s), u, eta)
                ds = _rnd(_mul(da, lin), u, eta)
                dg = _apply_backward("silu", g, ds, u, eta)
                dy = Approx(torch.cat([dg.value, du.value], -1), torch.cat([dg.err, du.err], -1))
            else:
                dy = _apply_backward("gelu", sv.y, da, u, eta)
            w1 = Approx.exact(ins.w1[it][layer][e])
            dx_pre_e = _gemm_pre(dy, w1, self.op_u)
            dx = _rnd(dx_pre_e, u, eta)
            _add_grad(grads, f"{prefix}linear_fc1.weight{e}", dy, sv.x, self.op_u)
            if ins.b1[it][layer]:
                _add_bias_grad(grads, f"{prefix}linear_fc1.bias{e}", dy)
            dx_v[sl], dx_e[sl], dx_pre[sl] = dx.value, dx.err, dx_pre_e.err
            dp_v[sl], dp_e[sl], dp_pre[sl] = dp.value, dp.err, dp_pre_e.err
        return (Approx(dx_v, dx_e), Approx(dx_v, dx_pre), Approx(dp_v, dp_e), Approx(dp_v, dp_pre))

    def compute(self, rank: int, world: int) -> RankLayerOracle:
        """The oracle as seen from ``rank``: its own outputs, input and probability gradients;
        the parameters' gradients over every rank."""
        ins = self.inputs
        out = RankLayerOracle()
        mbs = len(ins.x[0][0])
        for it in range(ins.iterations):
            grads: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = {}
            outs_it, dgr_it, dpr_it = [], [], []
            for r in range(world):
                for m in range(mbs):
                    h = Approx.exact(ins.x[it][r][m])
                    h_pre = h
                    saved = []
                    for layer in range(ins.layers):
                        p = ins.probs[it][r][m][layer].to(F64)
                        h, h_pre, sv = self._forward_layer(it, layer, h, p, ins.splits[it][r][m][layer])
                        saved.append(sv)
                    g, g_pre = Approx.exact(ins.dy[it][r][m]), None
                    dps: list[Reference] = [None] * ins.layers  # type: ignore[list-item]
                    for layer in reversed(range(ins.layers)):
                        g, g_pre, dp, dp_pre = self._backward_layer(it, layer, g, saved[layer],
                                                                    ins.splits[it][r][m][layer], grads)
                        dps[layer] = _ref(dp, dp_pre, ins.w2[it][layer][0].shape[1])
                    if r == rank:
                        outs_it.append(_ref(h, h_pre, ins.w2[it][ins.layers - 1][0].shape[1]))
                        dgr_it.append(_ref(g, g_pre, ins.w1[it][0][0].shape[0]))
                        dpr_it.append(dps)
            out.outputs.append(outs_it)
            out.dgrads.append(dgr_it)
            out.dprobs.append(dpr_it)
            roundings = increment_roundings(mbs, world) + 1  # + the increment read back from main_grad
            out.grads.append({name: Reference(v / world, mag / world, n, roundings, slack=err / world)
                              for name, (v, mag, err, n) in grads.items()})
        return out


def _accumulate(grads: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]], name: str,
                value: torch.Tensor, mag: torch.Tensor, err: torch.Tensor, n: int) -> None:
    if name in grads:
        v0, m0, e0, n0 = grads[name]
        grads[name] = (v0 + value, m0 + mag, e0 + err, n0 + n)
    else:
        grads[name] = (value, mag, err, n)


def _add_grad(grads: dict, name: str, dout: Approx, inp: Approx, op_u: float) -> None:
    """``dout^T inp`` (fp32 wgrad GEMM): its exact value, magnitude and inherited error."""
    value = dout.value.t() @ inp.value
    mag = dout.value.abs().t() @ inp.value.abs()
    err = (dout.err.t() @ inp.value.abs() + dout.value.abs().t() @ inp.err + dout.err.t() @ inp.err
           + op_u * mag)
    _accumulate(grads, name, value, mag, err, dout.value.shape[0])


def _add_bias_grad(grads: dict, name: str, dout: Approx) -> None:
    """A bias's gradient: ``dout`` summed over the expert's rows (rounded to the cell's dtype as
    ``.grad``: charged with the accumulation's roundings)."""
    _accumulate(grads, name, dout.value.sum(0), dout.value.abs().sum(0), dout.err.sum(0), dout.value.shape[0])
