"""te-cpu's LayerNorm / RMSNorm kernels, and TE 2.20.2's own ``LayerNormLinear`` on them.

Two levels, both against float64 math:

- kernels (``harness.backends.te_cpu.norm``): loaded *by path*, because importing the package
  ``harness.backends.te_cpu.backend`` applies the CPU layer to ``torch`` and imports TE - this process never
  does that (``cases/test_te_cpu.py``); ``norm.py`` itself imports only torch;
- TE's ``LayerNormLinear`` (and the extension's binding conventions): in one subprocess that
  imports ``harness.backends.te_cpu.backend`` as the existing te-cpu tests do, saves its tensors, and leaves
  the float64 judgement to this process.

The bound. TE's norm kernels, and the CPU ones, compute in fp32 and round once to the output
dtype. First-order error analysis of an fp32 computation: a reduction of n terms errs by at
most ``n * u`` times the sum of its terms' absolute values (``gamma_n``, u = 2^-24), every
other operation by ``u`` times its value, and an error propagates linearly into later values.
So the fp32 value ``v`` before the final rounding satisfies ``|v - ref| <= err`` with::

    err = (sum of the reduction lengths on the value's path + 32) * u * magnitude

``magnitude`` is the float64 computation on absolute values (it bounds every intermediate
the value is computed from), and 32 covers the few elementwise roundings along the path.
Rounding to the output dtype is monotone, so the value returned must lie in
``[round(ref - err), round(ref + err)]``: exactly "one final rounding to the output dtype plus
fp32 accumulation error", with no separate ``u(out) * |ref|`` or subnormal term to guess.
The interval is tight enough that a forward computed in bf16, or TE's cuDNN variant that
forms ``gamma + 1`` in the weight dtype, is rejected (``test_bound_rejects_*``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from fixtures.te_script import load_kernels, run_te_script

U32 = 2.0**-24  # unit roundoff of the fp32 compute type
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NORMS = ("LayerNorm", "RMSNorm")
EPS = 1e-5
#: elementwise roundings on any value's path (see the module docstring)
ELEMENTWISE = 32


norm = load_kernels("norm")


# ---- float64 references ---------------------------------------------------------------------
@dataclass(frozen=True)
class Stats64:
    """Per-row statistics of ``x`` in float64 and the magnitude of ``xhat`` (module docstring)."""

    mu: torch.Tensor | None
    rs: torch.Tensor
    mag_xhat: torch.Tensor  #: bounds |xhat| and every intermediate it is computed from


def _stats64(kind: str, x: torch.Tensor) -> Stats64:
    """``x``: (rows, hidden) float64."""
    if kind == "LayerNorm":
        mu = x.mean(1)
        rs = torch.rsqrt(x.var(1, unbiased=False) + EPS)
        return Stats64(mu, rs, rs[:, None] * (x.abs().mean(1, keepdim=True) + (x - mu[:, None]).abs()))
    rs = torch.rsqrt(x.square().mean(1) + EPS)
    return Stats64(None, rs, rs[:, None] * x.abs())


def _forward64(kind: str, x: torch.Tensor, scale: torch.Tensor, beta: torch.Tensor | None) -> torch.Tensor:
    """The norm in float64: ``F.layer_norm``, or RMSNorm written out."""
    if kind == "LayerNorm":
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), scale, beta, EPS)
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * scale


def _mag_dx(kind: str, stats: Stats64, mag_dy: torch.Tensor) -> torch.Tensor:
    """Magnitude of ``dx = rs * (dy - mean(dy * xhat) * xhat [- mean(dy)])`` given ``|dy|``'s."""
    m = stats.rs[:, None] * (mag_dy + stats.mag_xhat * (mag_dy * stats.mag_xhat).mean(1, keepdim=True))
    if kind == "LayerNorm":
        m = m + stats.rs[:, None] * mag_dy.mean(1, keepdim=True)
    return m


def _assert_within(name: str, actual: torch.Tensor, ref: torch.Tensor, err: torch.Tensor | float) -> None:
    """``actual`` lies in ``[round(ref - err), round(ref + err)]`` (module docstring)."""
    lo, hi = (ref - err).to(actual.dtype).double(), (ref + err).to(actual.dtype).double()
    a = actual.double()
    bad = (a < lo) | (a > hi)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        e = err.flatten()[i] if isinstance(err, torch.Tensor) else err
        raise AssertionError(f"{name}: {int(bad.sum())}/{bad.numel()} outside the bound; e.g. flat index {i}: "
                             f"{float(a.flatten()[i])!r} vs float64 {float(ref.flatten()[i])!r} "
                             f"(fp32 error bound {float(e):.3g}, {actual.dtype})")


# ---- kernel level ---------------------------------------------------------------------------
SHAPE = (3, 5, 48)  # leading dims flattened to 15 rows of 48 features, as TE's extension does
ROWS, HIDDEN = 15, 48
#: reductions on each path (module docstring): the forward's mean and variance over the hidden
#: size; the backward's two row means of dx plus the saved statistics' (2 * HIDDEN), and the
#: column sums of dgamma / dbeta over the rows
K_FWD = 2 * HIDDEN + ELEMENTWISE
K_BWD = 4 * HIDDEN + ROWS + ELEMENTWISE


def _operands(kind: str, dtype: torch.dtype, zero_centered: bool, seed: int) -> dict[str, Any]:
    """A nonzero-mean input and a gamma (around 0 when zero-centered, else around 1), beta,
    and an output gradient, all in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(SHAPE, generator=g) * 2 + 0.5).to(dtype)
    gamma = (torch.randn(HIDDEN, generator=g) * 0.3 + (0.0 if zero_centered else 1.0)).to(dtype)
    beta = (torch.randn(HIDDEN, generator=g) * 0.2).to(dtype) if kind == "LayerNorm" else None
    dz = torch.randn(SHAPE, generator=g).to(dtype)
    return {"x": x, "gamma": gamma, "beta": beta, "dz": dz}


def _scale64(gamma: torch.Tensor, zero_centered: bool) -> torch.Tensor:
    return gamma.double() + (1.0 if zero_centered else 0.0)


def _fwd(kind: str, ops: dict[str, Any], zero_centered: bool, **kw: Any) -> Any:
    if kind == "LayerNorm":
        return norm.layernorm_fwd(ops["x"], ops["gamma"], ops["beta"], EPS, zero_centered_gamma=zero_centered,
                                  **kw)
    return norm.rmsnorm_fwd(ops["x"], ops["gamma"], EPS, zero_centered_gamma=zero_centered, **kw)


def _check_forward(kind: str, ops: dict[str, Any], zero_centered: bool, res: Any) -> None:
    x64 = ops["x"].double().reshape(ROWS, HIDDEN)
    scale = _scale64(ops["gamma"], zero_centered)
    beta = ops["beta"].double() if ops["beta"] is not None else None
    stats = _stats64(kind, x64)
    mag = scale.abs() * stats.mag_xhat + (beta.abs() if beta is not None else 0.0)
    _assert_within("out", res.out.reshape(ROWS, HIDDEN), _forward64(kind, x64, scale, beta), K_FWD * U32 * mag)
    assert res.rsigma.dtype == torch.float32 and res.rsigma.shape == (ROWS,)
    _assert_within("rsigma", res.rsigma, stats.rs, K_FWD * U32 * stats.rs)
    if kind == "LayerNorm":
        assert res.mu.dtype == torch.float32 and res.mu.shape == (ROWS,)
        _assert_within("mu", res.mu, stats.mu, K_FWD * U32 * x64.abs().mean(1))
    else:
        assert res.mu is None


@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("kind", NORMS)
def test_forward_kernel_rounds_once_from_fp32(kind: str, dtype: str, zero_centered: bool) -> None:
    """Output in the requested dtype and the input's shape; fp32 ``mu``/``rsigma`` per row."""
    ops = _operands(kind, DTYPES[dtype], zero_centered, seed=len(kind) * 10 + len(dtype) + zero_centered)
    res = _fwd(kind, ops, zero_centered, out_dtype=DTYPES[dtype])
    assert res.out.dtype == DTYPES[dtype] and res.out.shape == SHAPE
    _check_forward(kind, ops, zero_centered, res)


@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("kind", NORMS)
def test_backward_kernel_matches_float64_autograd(kind: str, dtype: str, zero_centered: bool) -> None:
    """``dx`` in the input's dtype, ``dgamma``/``dbeta`` in gamma's, from the forward's fp32
    statistics; the reference is float64 autograd through the float64 forward."""
    dt = DTYPES[dtype]
    ops = _operands(kind, dt, zero_centered, seed=100 + len(kind) * 10 + len(dtype) + zero_centered)
    fwd = _fwd(kind, ops, zero_centered, out_dtype=dt)
    if kind == "LayerNorm":
        res = norm.layernorm_bwd(ops["dz"], ops["x"], fwd.mu, fwd.rsigma, ops["gamma"],
                                 zero_centered_gamma=zero_centered)
    else:
        res = norm.rmsnorm_bwd(ops["dz"], ops["x"], fwd.rsigma, ops["gamma"], zero_centered_gamma=zero_centered)
    assert res.dx.dtype == dt and res.dx.shape == SHAPE
    assert res.dgamma.dtype == dt and res.dgamma.shape == (HIDDEN,)
    assert (res.dbeta is None) == (kind == "RMSNorm")

    x64 = ops["x"].double().reshape(ROWS, HIDDEN).requires_grad_()
    gamma64 = ops["gamma"].double().requires_grad_()
    beta64 = ops["beta"].double().requires_grad_() if ops["beta"] is not None else None
    dz64 = ops["dz"].double().reshape(ROWS, HIDDEN)
    _forward64(kind, x64, gamma64 + (1.0 if zero_centered else 0.0), beta64).backward(dz64)
    stats = _stats64(kind, x64.detach())
    scale = _scale64(ops["gamma"], zero_centered)
    _assert_within("dx", res.dx.reshape(ROWS, HIDDEN), x64.grad,
                   K_BWD * U32 * _mag_dx(kind, stats, scale.abs() * dz64.abs()))
    _assert_within("dgamma", res.dgamma, gamma64.grad, K_BWD * U32 * (dz64.abs() * stats.mag_xhat).sum(0))
    if beta64 is not None:
        _assert_within("dbeta", res.dbeta, beta64.grad, K_BWD * U32 * dz64.abs().sum(0))


@pytest.mark.parametrize("kind", NORMS)
def test_forward_writes_a_preallocated_output_as_raw_memory(kind: str) -> None:
    """TE's ``ln_out``: the kernel fills the given tensor (in its own dtype, here bf16 from an
    fp32 input) and returns it; like the CUDA kernel, the write is invisible to autograd."""
    ops = _operands(kind, torch.float32, False, seed=7)
    out = torch.full(SHAPE, float("nan"), dtype=torch.bfloat16)
    version = out._version
    res = _fwd(kind, ops, False, out_dtype=torch.float32, out=out)
    assert res.out is out and out._version == version
    _check_forward(kind, ops, False, res)


@pytest.mark.parametrize("mutant", ["stats_in_bf16", "gamma_plus_one_in_bf16"])
def test_bound_rejects_a_forward_that_does_not_compute_in_fp32(mutant: str) -> None:
    """The bound is tight enough to tell fp32 compute from 16-bit compute: a LayerNorm whose
    statistics are computed in bf16, or whose ``gamma + 1`` is formed in bf16 (TE's cuDNN
    backend with ``NVTE_ZERO_CENTERED_GAMMA_IN_WTYPE``), fails it."""
    zero_centered = mutant == "gamma_plus_one_in_bf16"
    ops = _operands("LayerNorm", torch.bfloat16, zero_centered, seed=11)
    x = ops["x"].reshape(ROWS, HIDDEN)
    if mutant == "stats_in_bf16":
        mu = x.mean(1, keepdim=True)
        xhat = ((x - mu) * torch.rsqrt((x - mu).square().mean(1, keepdim=True) + EPS)).float()
        scale = ops["gamma"].float()
    else:
        xf = x.float()
        xhat = (xf - xf.mean(1, keepdim=True)) * torch.rsqrt(xf.var(1, unbiased=False, keepdim=True) + EPS)
        scale = (ops["gamma"] + 1).float()
    out = (scale * xhat + ops["beta"].float()).to(torch.bfloat16)
    fake = norm.NormForward(out, x.float().mean(1), torch.rsqrt(x.float().var(1, unbiased=False) + EPS))
    with pytest.raises(AssertionError, match="out: .* outside the bound"):
        _check_forward("LayerNorm", ops, zero_centered, fake)


@pytest.mark.parametrize("bad", ["no_beta", "hidden_size", "quantized_dtype", "out_shape", "dz_dtype"])
def test_kernels_reject_what_te_rejects(bad: str) -> None:
    x, gamma = torch.randn(4, 8), torch.ones(8)
    with pytest.raises(norm.NormError):
        if bad == "no_beta":
            norm.layernorm_fwd(x, gamma, None, EPS, zero_centered_gamma=False, out_dtype=torch.float32)
        elif bad == "hidden_size":
            norm.rmsnorm_fwd(x, torch.ones(7), EPS, zero_centered_gamma=False, out_dtype=torch.float32)
        elif bad == "quantized_dtype":
            norm.rmsnorm_fwd(x.to(torch.float8_e4m3fn), gamma, EPS, zero_centered_gamma=False,
                             out_dtype=torch.float32)
        elif bad == "out_shape":
            norm.rmsnorm_fwd(x, gamma, EPS, zero_centered_gamma=False, out_dtype=torch.float32,
                             out=torch.empty(8, 4))
        else:
            rsigma = torch.ones(4)
            norm.rmsnorm_bwd(torch.randn(4, 8, dtype=torch.bfloat16), x, rsigma, gamma, zero_centered_gamma=False)


# ---- TE's LayerNormLinear on te-cpu (one subprocess) ----------------------------------------
IN, OUT = 32, 16
LEAD = (3, 4)  # input (3, 4, IN): 12 rows
N = 12
#: the reductions of all paths together (module docstring), an upper bound for each: the norm's
#: 4*IN (forward statistics, reused by its backward, and the backward's two row means), the
#: forward GEMM's IN, the dgrad GEMM's OUT, the wgrad GEMM's and the column sums' N rows
K_MODULE = 4 * IN + IN + OUT + N + ELEMENTWISE
CONFIGS = [(kind, zc) for kind in NORMS for zc in (False, True)]

_SCRIPT = """
    import os, sys, torch
    import harness.backends.te_cpu.backend as backend
    from harness.backends.te_cpu import extension
    te = sys.modules["transformer_engine.pytorch"]
    tex = sys.modules["transformer_engine_torch"]
    IN, OUT, LEAD = {IN}, {OUT}, {LEAD}
    saved = {{}}

    def build(norm, zc, seed, **kw):
        g = torch.Generator().manual_seed(seed)
        m = te.LayerNormLinear(IN, OUT, eps=1e-5, bias=True, normalization=norm, params_dtype=torch.float32,
                               device="cpu", zero_centered_gamma=zc, **kw)
        with torch.no_grad():  # random parameters: gamma's +1 and beta must show in the result
            for p in m.parameters():
                around_one = p is m.layer_norm_weight and not zc
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if around_one else 0.0))
        return m, g

    def step(m, g):
        x = (torch.randn(*LEAD, IN, generator=g) * 2 + 0.5).requires_grad_()
        dy = torch.randn(*LEAD, OUT, generator=g)
        y = m(x)
        y.backward(dy)
        return x, dy, y

    for norm in ("LayerNorm", "RMSNorm"):
        for zc in (False, True):
            m, g = build(norm, zc, seed=len(norm) + zc)
            params = {{n: p.detach().clone() for n, p in m.named_parameters()}}
            x, dy, y = step(m, g)
            saved[f"{{norm}}-{{zc}}"] = {{"params": params, "x": x.detach(), "dy": dy, "y": y.detach(),
                                         "dx": x.grad, "grads": {{n: p.grad for n, p in m.named_parameters()}}}}

    # fuse_wgrad_accumulation: the wgrad GEMM accumulates into weight.main_grad (two steps)
    m, g = build("LayerNorm", False, seed=99, fuse_wgrad_accumulation=True)
    m.weight.main_grad = torch.zeros(OUT, IN, dtype=torch.float32)
    params = {{n: p.detach().clone() for n, p in m.named_parameters()}}
    steps = []
    for _ in range(2):
        x, dy, _ = step(m, g)
        steps.append({{"x": x.detach(), "dy": dy, "main_grad": m.weight.main_grad.clone()}})
    saved["fused"] = {{"params": params, "steps": steps, "weight_grad_is_none": m.weight.grad is None}}

    # the binding conventions (pybind argument names, return lists) and quantizers
    x, w, b = torch.randn(6, IN), torch.ones(IN), torch.zeros(IN)
    buf = torch.empty(6, IN)
    ln = tex.layernorm_fwd(input=x, weight=w, bias=b, eps=1e-5, ln_out=buf, quantizer=None,
                           otype=tex.DType.kBFloat16, sm_margin=0, zero_centered_gamma=False)
    rms = tex.rmsnorm_fwd(x, w, 1e-5, None, None, tex.DType.kBFloat16, 0, False)
    bwd = tex.layernorm_bwd(torch.randn(6, IN), x, ln[1], ln[2], w, 0, False)
    facts = {{"ln_fwd": [type(ln).__name__, len(ln), ln[0] is buf, str(ln[1].dtype), str(ln[2].dtype)],
              "rms_fwd": [len(rms), str(rms[0].dtype), rms[1] is None, str(rms[2].dtype)],
              "ln_bwd": [len(bwd), str(bwd[1].dtype), str(bwd[2].dtype)]}}
    try:
        tex.rmsnorm_bwd(dz=x, x=x, rsigma=rms[2], gamma=w, sm_margin=0, zero_centered_gamma=False)
    except TypeError:
        facts["bwd_positional_only"] = True
    from transformer_engine.pytorch.quantized_tensor import Quantizer
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer

    class OtherQuantizer(Quantizer):  # a quantizer te-cpu has no kernels for
        pass

    q = Float8Quantizer(torch.ones(1), torch.zeros(1), tex.DType.kFloat8E4M3)
    other = OtherQuantizer(rowwise=True, columnwise=False)
    f32 = tex.DType.kFloat32
    for name, call in (("layernorm_fwd", lambda q: tex.layernorm_fwd(x, w, b, 1e-5, None, q, f32, 0, False)),
                       ("rmsnorm_fwd", lambda q: tex.rmsnorm_fwd(x, w, 1e-5, None, q, f32, 0, False))):
        facts["fp8_" + name] = type(call(q)[0]).__name__  # served by harness/backends/te_cpu/quant
        try:
            call(other)
        except extension.MissingCpuKernel as exc:
            facts["quantizer_" + name] = str(exc)
    saved["facts"] = facts
    torch.save(saved, os.environ["DW_TE_SCRIPT_OUT"])
"""


@pytest.fixture(scope="module")
def te_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """TE's LayerNormLinear run on te-cpu in a subprocess (never in this process): its tensors."""
    return run_te_script(tmp_path_factory, 'te_norm', _SCRIPT, timeout=300, IN=IN, OUT=OUT, LEAD=LEAD)


@dataclass(frozen=True)
class Module64:
    """The float64 reference of one LayerNormLinear step: values and magnitudes per tensor."""

    ref: dict[str, torch.Tensor]
    mag: dict[str, torch.Tensor]


def _module64(kind: str, zero_centered: bool, params: dict[str, torch.Tensor], x: torch.Tensor,
              dy: torch.Tensor) -> Module64:
    """Float64 autograd through ``F.layer_norm`` (or RMSNorm) and ``F.linear``, and the
    absolute-value chain bounding every intermediate (module docstring)."""
    p64 = {n: t.double().requires_grad_() for n, t in params.items()}
    x64 = x.double().reshape(N, IN).requires_grad_()
    dy64 = dy.double().reshape(N, OUT)
    shift = 1.0 if zero_centered else 0.0
    beta = p64.get("layer_norm_bias")
    ln = _forward64(kind, x64, p64["layer_norm_weight"] + shift, beta)
    y = torch.nn.functional.linear(ln, p64["weight"], p64["bias"])
    y.backward(dy64)
    ref = {"y": y.detach(), "dx": x64.grad, **{n: t.grad for n, t in p64.items()}}

    stats = _stats64(kind, x64.detach())
    scale = (params["layer_norm_weight"].double() + shift).abs()
    w, dy_abs = params["weight"].double().abs(), dy64.abs()
    mag_ln = scale * stats.mag_xhat + (beta.detach().abs() if beta is not None else 0.0)
    mag_dln = dy_abs @ w
    mag = {"y": mag_ln @ w.t() + params["bias"].double().abs(), "dx": _mag_dx(kind, stats, scale * mag_dln),
           "weight": dy_abs.t() @ mag_ln, "bias": dy_abs.sum(0),
           "layer_norm_weight": (mag_dln * stats.mag_xhat).sum(0), "layer_norm_bias": mag_dln.sum(0)}
    return Module64(ref, mag)


@pytest.mark.parametrize("kind,zero_centered", CONFIGS, ids=[f"{k}-{'zc' if z else 'gamma'}" for k, z in CONFIGS])
def test_te_layernorm_linear_forward_backward(te_run: dict[str, Any], kind: str, zero_centered: bool) -> None:
    """TE's own LayerNormLinear (fp32) on te-cpu: output, input gradient and every parameter's
    gradient within the fp32 bound of float64 autograd."""
    run = te_run[f"{kind}-{zero_centered}"]
    want = {"weight", "bias", "layer_norm_weight"} | ({"layer_norm_bias"} if kind == "LayerNorm" else set())
    assert set(run["params"]) == want
    ref = _module64(kind, zero_centered, run["params"], run["x"], run["dy"])
    assert run["y"].shape == (*LEAD, OUT) and run["dx"].shape == (*LEAD, IN)
    got = {"y": run["y"].reshape(N, OUT), "dx": run["dx"].reshape(N, IN), **run["grads"]}
    for name in ("y", "dx", *sorted(want)):
        assert got[name].dtype == torch.float32, name
        _assert_within(name, got[name], ref.ref[name], K_MODULE * U32 * ref.mag[name])


def test_te_layernorm_linear_fused_wgrad_accumulates_into_main_grad(te_run: dict[str, Any]) -> None:
    """``fuse_wgrad_accumulation=True`` with an fp32 ``main_grad``: each backward's weight
    gradient is added into ``main_grad`` and ``weight.grad`` stays None (TE's contract)."""
    run = te_run["fused"]
    assert run["weight_grad_is_none"]
    total, mag = torch.zeros(OUT, IN, dtype=torch.float64), torch.zeros(OUT, IN, dtype=torch.float64)
    for step in run["steps"]:
        ref = _module64("LayerNorm", False, run["params"], step["x"], step["dy"])
        total, mag = total + ref.ref["weight"], mag + ref.mag["weight"]
        assert step["main_grad"].dtype == torch.float32
        _assert_within("main_grad", step["main_grad"], total, (K_MODULE + 1) * U32 * mag)


def test_extension_binding_conventions_and_quantizers(te_run: dict[str, Any]) -> None:
    """The kernels answer TE's calls as the pybind11 bindings do: named forward arguments, a
    filled ``ln_out`` returned as the output, fp32 statistics, ``[out, None, rsigma]`` for
    RMSNorm, positional-only backwards; an FP8 output quantizer gets an FP8 tensor (the
    quantization surface), a quantizer te-cpu has no kernels for raises MissingCpuKernel."""
    facts = te_run["facts"]
    assert facts["ln_fwd"] == ["list", 3, True, "torch.float32", "torch.float32"]
    assert facts["rms_fwd"] == [3, "torch.bfloat16", True, "torch.float32"]
    assert facts["ln_bwd"] == [3, "torch.float32", "torch.float32"]
    assert facts.get("bwd_positional_only")
    for name in ("layernorm_fwd", "rmsnorm_fwd"):
        assert facts["fp8_" + name] == "Float8Tensor"
        msg = facts.get("quantizer_" + name, "")
        prefix = f"transformer_engine_torch.{name} (output quantizer OtherQuantizer): no CPU kernel"
        assert msg.startswith(prefix), msg
        assert "LayerNormLinear" in msg


def test_this_process_never_imported_the_layer() -> None:
    """Loading ``norm.py`` by path and the subprocess left this process's torch alone."""
    for name in ("harness.backends.te_cpu.backend", "harness.backends.te_cpu.norm", "transformer_engine", "transformer_engine_torch"):
        assert name not in sys.modules, name
    assert torch.zeros(1).is_cuda is False
