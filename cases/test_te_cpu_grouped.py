"""te-cpu's grouped-tensor kernels, and TE 2.20.2's own grouped-tensor GroupedLinear paths on them.

TE's ``GroupedLinear(use_grouped_tensor=True)`` (``_forward_grouped_tensor`` /
``_backward_grouped_tensor``), the same with ``single_grouped_weight`` /
``single_grouped_bias``, and ``ops.GroupedLinear``'s grouped-tensor branch
(``_fuser_forward_grouped_tensor`` / ``_fuser_backward_grouped_tensor``) run when
``get_cublasLt_version`` answers 13.4+ on the sm_90 te-cpu reports
(``extension.cublaslt_version``), BF16/FP16 only, and - for the module - with ``m_splits`` in
device memory (``cuda_surface.on_device``).

Two levels, both against float64 math:

- kernels (``harness/backends/te_cpu/grouped.py``, loaded *by path*: importing the package
  ``harness.backends.te_cpu.backend`` patches ``torch``, which this process never does);
- TE's layers, in one subprocess that imports ``harness.backends.te_cpu.backend``, records which extension
  kernels TE called (the split-quantize path calls ``te_general_grouped_gemm``, the
  grouped-tensor path ``te_general_grouped_gemm_for_{grouped_tensor,discrete_in,discrete_out}``
  - a silent fallback fails the tests) and saves its tensors for this process to judge.

The bound. Operands are BF16/FP16, exact in fp32 and float64. The grouped GEMM accumulates in
fp32: first-order, a k-term reduction errs by at most ``k * u`` (u = 2^-24) times the sum of
its terms' absolute values, so the fp32 value before the final rounding lies within
``err = (k + 2) * u * magnitude`` of the float64 value (``magnitude``: the float64 GEMM on
absolute values; +2 covers the alpha/beta products). Rounding to the output dtype is
monotone, so the returned value lies in ``[round(ref - err), round(ref + err)]``. The
forward bias is a *second* kernel (``nvte_grouped_bias_add``): it adds the bias in fp32 to
the already rounded GEMM output and rounds again, so the forward's interval is that of the
GEMM output, shifted by the bias with one fp32 addition's error, rounded again. ``k`` is
``in_features`` (forward), ``out_features`` (dgrad), the group's rows (wgrad, and the bias
gradient's fp32 column sums); the fused wgrad adds the fp32 ``main_grad`` (beta = 1) in the
same accumulation, one more term.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from fixtures.te_script import load_kernels, run_te_script

U32 = 2.0**-24  # unit roundoff of the fp32 compute type
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


grouped = load_kernels("grouped")


def _assert_within(name: str, actual: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> None:
    """``lo <= actual <= hi`` elementwise (all float64), with the first offender named."""
    a = actual.double()
    bad = (a < lo) | (a > hi)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(f"{name}: {int(bad.sum())}/{bad.numel()} outside the bound; e.g. flat index {i}: "
                             f"{float(a.flatten()[i])!r} not in [{float(lo.flatten()[i])!r}, "
                             f"{float(hi.flatten()[i])!r}] ({actual.dtype})")


def _rounded_interval(ref: torch.Tensor, err: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``[round(ref - err), round(ref + err)]`` in ``dtype``, as float64 (module docstring)."""
    return (ref - err).to(dtype).double(), (ref + err).to(dtype).double()


def _gemm_interval(b: torch.Tensor, a: torch.Tensor, k: int, dtype: torch.dtype,
                   c: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The interval of ``round(b @ a [+ c])`` computed with fp32 accumulation (float64 inputs)."""
    ref, mag = b @ a, b.abs() @ a.abs()
    if c is not None:
        ref, mag = ref + c, mag + c.abs()
    return _rounded_interval(ref, (k + 2) * U32 * mag, dtype)


def _bias_interval(lo: torch.Tensor, hi: torch.Tensor, bias: torch.Tensor,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The second rounding: the rounded GEMM interval plus the bias in fp32, rounded again."""
    e = U32 * (torch.maximum(lo.abs(), hi.abs()) + bias.abs())
    return (lo + bias - e).to(dtype).double(), (hi + bias + e).to(dtype).double()


# ---- kernel level ---------------------------------------------------------------------------
def test_splits_to_offsets_scales_the_running_totals() -> None:
    """Per output: the running totals times the stride, with or without a leading zero, in
    the output's integer dtype; bulk allocation packs 16-byte aligned views of one buffer."""
    splits = torch.tensor([5, 0, 7, 2], dtype=torch.int32)
    outs = grouped.splits_to_offsets(splits, [1, 1, 16, 24], [False, True, True, True],
                                     [torch.int32, torch.int64, torch.int64, torch.int64], bulk_allocate=True)
    assert [o.tolist() for o in outs] == [[5, 5, 12, 14], [0, 5, 5, 12, 14], [0, 80, 80, 192, 224],
                                          [0, 120, 120, 288, 336]]
    assert [o.dtype for o in outs] == [torch.int32, torch.int64, torch.int64, torch.int64]
    base = outs[0].untyped_storage().data_ptr()
    assert all(o.untyped_storage().data_ptr() == base for o in outs)
    assert all((o.data_ptr() - base) % grouped.BULK_ALIGNMENT == 0 for o in outs)
    separate = grouped.splits_to_offsets(splits.long(), [3], [True], [torch.int64])
    assert separate[0].tolist() == [0, 15, 15, 36, 42]
    with pytest.raises(grouped.GroupedError, match="matching lengths"):
        grouped.splits_to_offsets(splits, [1, 2], [True], [torch.int64])
    with pytest.raises(grouped.GroupedError, match="non-empty 1D"):
        grouped.splits_to_offsets(torch.zeros(0, dtype=torch.int64), [1], [True], [torch.int64])


def _members(splits: list[int], cols: int, dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, list]:
    flat = torch.randn(sum(splits) * cols, generator=g).to(dtype)
    offsets = torch.tensor([0] + [s * cols for s in splits]).cumsum(0)
    layout = grouped.layout(len(splits), (sum(splits), cols), torch.tensor(splits), None, offsets)
    return flat, grouped.member_views(flat, layout)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_grouped_gemm_per_group_fp32_accumulation_one_rounding(dtype: str) -> None:
    """Forward (TN), dgrad (NN) and wgrad (NT) over varying groups, one of them empty: each
    group's output within the rounded fp32 bound of float64; the empty group's wgrad is
    zeros (beta = 0) or left alone when accumulating into an fp32 buffer (beta = 1)."""
    dt, g = DTYPES[dtype], torch.Generator().manual_seed(3)
    splits, k_in, n_out = [6, 0, 9], 16, 24
    _, xs = _members(splits, k_in, dt, g)
    _, dys = _members(splits, n_out, dt, g)
    ws = [torch.randn(n_out, k_in, generator=g).to(dt) for _ in splits]
    one, zero = torch.ones(1), torch.zeros(1)
    ys = [torch.full((s, n_out), float("nan"), dtype=dt) for s in splits]
    grouped.grouped_gemm(ws, True, xs, False, ys, alpha=one, beta=zero, per_group_alpha_beta=False)
    dxs = [torch.empty(s, k_in, dtype=dt) for s in splits]
    grouped.grouped_gemm(ws, False, dys, False, dxs, alpha=one, beta=zero, per_group_alpha_beta=False)
    main = [torch.randn(n_out, k_in, generator=g) for _ in splits]
    before = [m.clone() for m in main]
    grouped.grouped_gemm(xs, False, dys, True, main, alpha=one, beta=one, per_group_alpha_beta=False)
    wgrads = [torch.full((n_out, k_in), float("nan"), dtype=dt) for _ in splits]
    grouped.grouped_gemm(xs, False, dys, True, wgrads, alpha=one, beta=zero, per_group_alpha_beta=False)
    for i, s in enumerate(splits):
        x, dy, w = xs[i].double(), dys[i].double(), ws[i].double()
        _assert_within(f"y{i}", ys[i], *_gemm_interval(x, w.t(), k_in, dt))
        _assert_within(f"dx{i}", dxs[i], *_gemm_interval(dy, w, n_out, dt))
        _assert_within(f"wgrad{i}", wgrads[i], *_gemm_interval(dy.t(), x, s, dt))
        _assert_within(f"main_grad{i}", main[i], *_gemm_interval(dy.t(), x, s + 1, torch.float32, before[i].double()))
    assert bool((wgrads[1] == 0).all()) and torch.equal(main[1], before[1])


def test_grouped_gemm_takes_no_fp32_operands_and_checks_alpha_beta() -> None:
    """cuBLASLt's grouped GEMM has no fp32 operands (why TE's gates keep fp32 on the
    split-quantize path); Hopper takes one alpha/beta, Blackwell one per group."""
    a, b, d = [torch.ones(4, 8)], [torch.ones(2, 8)], [torch.empty(2, 4)]
    with pytest.raises(grouped.GroupedError, match="inputs must be FP8, BF16, or FP16"):
        grouped.grouped_gemm(a, True, b, False, d, alpha=torch.ones(1), beta=torch.zeros(1), per_group_alpha_beta=False)
    a16, b16 = [t.bfloat16() for t in a], [t.bfloat16() for t in b]
    with pytest.raises(grouped.GroupedError, match="alpha must have num_tensors"):
        grouped.grouped_gemm(a16, True, b16, False, d, alpha=torch.ones(2), beta=torch.zeros(1),
                             per_group_alpha_beta=True)
    grouped.grouped_gemm(a16, True, b16, False, d, alpha=torch.full((1,), 0.5), beta=torch.zeros(1),
                         per_group_alpha_beta=True)
    assert bool((d[0] == 4.0).all())


def test_grouped_bias_add_rounds_a_second_time() -> None:
    """The bias is added to the GEMM's rounded output in fp32 and rounded again - not fused
    into the GEMM's epilogue; ``n`` must be a multiple of the vector width (8 for 16-bit)."""
    g = torch.Generator().manual_seed(5)
    d = [(torch.randn(3, 16, generator=g) * 100).bfloat16(), torch.zeros(0, 16, dtype=torch.bfloat16)]
    bias = [(torch.randn(1, 16, generator=g) * 0.01).bfloat16() for _ in d]
    want = (d[0].float() + bias[0].float()).bfloat16()
    grouped.grouped_bias_add(d, bias)
    assert torch.equal(d[0], want)
    scaled = [torch.ones(2, 16, dtype=torch.bfloat16)]
    grouped.grouped_bias_add(scaled, [torch.ones(1, 16, dtype=torch.bfloat16)], torch.tensor([2.0, 3.0]), [0])
    assert scaled[0][:, 0].tolist() == [3.0, 4.0]
    with pytest.raises(grouped.GroupedError, match="divisible by 8"):
        grouped.grouped_bias_add([torch.zeros(2, 12, dtype=torch.bfloat16)], [torch.zeros(1, 12, dtype=torch.bfloat16)])
    with pytest.raises(grouped.GroupedError, match="matching dtypes"):
        grouped.grouped_bias_add([torch.zeros(2, 8, dtype=torch.bfloat16)], [torch.zeros(1, 8)])


def test_setup_workspace_size_is_tes_layout() -> None:
    """Eight 16-byte aligned pointer arrays, seven 4-byte arrays, rounded to 256 bytes."""
    assert [grouped.setup_workspace_size(n) for n in (1, 3, 8, 64)] == [256, 512, 768, 5888]


# ---- TE's layers on te-cpu (one subprocess) -------------------------------------------------
G, IN, OUT = 3, 16, 24  # OUT: a multiple of 8, as the grouped bias-add kernel requires
SPLITS = [5, 0, 7]  # an empty group included
ROWS = sum(SPLITS)
STEPS = 2
#: name -> (layer, dtype, single grouped parameters, fused wgrad accumulation)
CONFIGS: dict[str, tuple[str, str, bool, bool]] = {
    "module-bf16": ("module", "bf16", False, False),
    "module-fp16": ("module", "fp16", False, False),
    "module-bf16-fused": ("module", "bf16", False, True),
    "module-single-bf16": ("module", "bf16", True, False),
    "module-single-bf16-fused": ("module", "bf16", True, True),
    "ops-bf16": ("ops", "bf16", False, False),
    "ops-fp16": ("ops", "fp16", False, False),
    "ops-bf16-fused": ("ops", "bf16", False, True),
    "ops-single-bf16": ("ops", "bf16", True, False),
    "ops-single-bf16-fused": ("ops", "bf16", True, True),
}
SPLIT_QUANTIZE_GEMM = "te_general_grouped_gemm"
GROUPED_GEMMS = ("te_general_grouped_gemm_for_grouped_tensor", "te_general_grouped_gemm_for_discrete_in",
                 "te_general_grouped_gemm_for_discrete_out")

_SCRIPT = """
    import collections, os, sys, torch
    os.environ["NVTE_GROUPED_LINEAR_SINGLE_PARAM"] = "1"  # TE's switch for single grouped parameters
    import harness.backends.te_cpu.backend as backend
    from harness.backends.te_cpu import cuda_surface, extension
    te = sys.modules["transformer_engine.pytorch"]
    tex = sys.modules["transformer_engine_torch"]
    G, IN, OUT, SPLITS, STEPS = {G}, {IN}, {OUT}, {SPLITS}, {STEPS}
    CONFIGS = {CONFIGS}
    DTYPES = {{"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}}
    calls = collections.Counter()
    for name in ("te_general_grouped_gemm", "te_general_grouped_gemm_for_grouped_tensor",
                 "te_general_grouped_gemm_for_discrete_in", "te_general_grouped_gemm_for_discrete_out",
                 "splits_to_offsets_multi"):  # count the kernels TE calls (our module's functions)
        def counted(*a, _fn=getattr(tex, name), _name=name, **k):
            calls[_name] += 1
            return _fn(*a, **k)
        setattr(tex, name, counted)

    def build(layer, dt, single, fused, seed):
        if layer == "module":
            m = te.GroupedLinear(G, IN, OUT, bias=True, params_dtype=dt, device="cpu", use_grouped_tensor=True,
                                 single_grouped_weight=single, single_grouped_bias=single,
                                 fuse_wgrad_accumulation=fused)
        else:
            m = te.ops.GroupedLinear(G, IN, OUT, bias=True, dtype=dt, device="cpu", single_grouped_weight=single,
                                     single_grouped_bias=single, accumulate_into_main_grad=fused)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_((torch.randn(p.shape, generator=g) * 0.5).to(dt))
        for n, p in m.named_parameters():
            if fused and n.startswith("weight"):
                p.main_grad = torch.zeros(p.shape, dtype=torch.float32)
        return m, g

    def plain(t):  # a GroupedTensor's buffer, or the tensor
        return getattr(t, "rowwise_data", None) if hasattr(t, "rowwise_data") else t

    def per_group(m, which, get):
        ts = [get(getattr(m, which))] if hasattr(m, which) else [get(getattr(m, f"{{which}}{{i}}")) for i in range(G)]
        if ts[0] is None:
            return None
        return torch.cat([plain(t).detach().float().reshape(-1) for t in ts]).reshape(G, -1).clone()

    def splits_for(layer, splits):
        t = torch.tensor(splits, dtype=torch.int64)
        return cuda_surface.on_device(t) if layer == "module" else t

    def step(m, layer, dt, g, splits=SPLITS):
        x = torch.randn(sum(splits), IN, generator=g).to(dt).requires_grad_()
        dy = torch.randn(sum(splits), OUT, generator=g).to(dt)
        y = m(x, splits_for(layer, splits))
        y.backward(dy)
        return x, dy, y

    saved = {{}}
    for name, (layer, dtype, single, fused) in CONFIGS.items():
        dt = DTYPES[dtype]
        with extension.cublaslt_version(extension.GROUPED_GEMM_CUBLASLT_VERSION):
            m, g = build(layer, dt, single, fused, seed=len(name))
            params = {{"w": per_group(m, "weight", lambda p: p), "b": per_group(m, "bias", lambda p: p)}}
            steps = []
            calls.clear()
            for _ in range(STEPS):
                x, dy, y = step(m, layer, dt, g)
                steps.append({{"x": x.detach(), "dy": dy, "y": y.detach(), "dx": x.grad,
                              "wgrad": per_group(m, "weight", lambda p: p.grad),
                              "bgrad": per_group(m, "bias", lambda p: p.grad),
                              "main_grad": per_group(m, "weight", lambda p: getattr(p, "main_grad", None))}})
                for p in m.parameters():
                    p.grad = None
        saved[name] = {{"params": params, "steps": steps, "calls": dict(calls), "dtype": str(y.dtype)}}

    facts = {{}}
    # the default answer (cuBLASLt 12.9.1): TE takes its split-quantize path
    calls.clear()
    m, g = build("module", torch.bfloat16, False, False, seed=1)
    step(m, "module", torch.bfloat16, g)
    o, g = build("ops", torch.bfloat16, False, False, seed=2)
    step(o, "ops", torch.bfloat16, g)
    facts["default_calls"] = dict(calls)
    # fp32 is not on the grouped-tensor path by design, even with the version answered
    calls.clear()
    with extension.cublaslt_version(extension.GROUPED_GEMM_CUBLASLT_VERSION):
        m, g = build("module", torch.float32, False, False, seed=3)
        step(m, "module", torch.float32, g)
    facts["fp32_calls"] = dict(calls)
    with extension.cublaslt_version(extension.GROUPED_GEMM_CUBLASLT_VERSION):
        m, g = build("module", torch.bfloat16, False, False, seed=4)
        x = torch.randn(sum(SPLITS), IN, dtype=torch.bfloat16)
        try:  # TE's guard: m_splits must be in device memory
            m(x, torch.tensor(SPLITS))
        except ValueError as exc:
            facts["host_splits"] = str(exc)
        y = m(x.requires_grad_(), splits_for("module", SPLITS))
    try:  # the kernels check the run-time version: a backward outside the answer fails
        y.sum().backward()
    except RuntimeError as exc:
        facts["backward_outside"] = str(exc)
    try:
        build("module", torch.bfloat16, True, False, seed=5)[0](x, splits_for("module", SPLITS))
    except RuntimeError as exc:
        facts["single_without_version"] = str(exc)
    # when TE asks for the version: count get_cublasLt_version calls per phase
    asked = collections.Counter()
    answer = tex.get_cublasLt_version
    tex.get_cublasLt_version = lambda: (asked.update([phase]), answer())[1]
    with extension.cublaslt_version(extension.GROUPED_GEMM_CUBLASLT_VERSION):
        for layer in ("module", "ops"):
            phase = layer + "-construct"
            m, g = build(layer, torch.bfloat16, False, False, seed=6)
            for i in range(2):
                phase = layer + "-forward"
                x = torch.randn(sum(SPLITS), IN, dtype=torch.bfloat16, requires_grad=True)
                y = m(x, splits_for(layer, SPLITS))
                phase = layer + "-backward"
                y.sum().backward()
    facts["asked"] = dict(asked)
    saved["facts"] = facts
    torch.save(saved, os.environ["DW_TE_SCRIPT_OUT"])
"""


@pytest.fixture(scope="module")
def te_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """TE's grouped layers run on te-cpu in a subprocess (never in this process): its tensors."""
    return run_te_script(tmp_path_factory, 'te_grouped', _SCRIPT, timeout=600, G=G, IN=IN, OUT=OUT, SPLITS=SPLITS, STEPS=STEPS, CONFIGS=CONFIGS)


def _groups(t: torch.Tensor) -> list[torch.Tensor]:
    bounds = [0]
    for s in SPLITS:
        bounds.append(bounds[-1] + s)
    return [t[bounds[i]:bounds[i + 1]].double() for i in range(G)]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_te_grouped_tensor_path_forward_backward(te_run: dict[str, Any], name: str) -> None:
    """Output, input gradient, weight gradient (or fp32 ``main_grad``, accumulated over two
    steps) and bias gradient of TE's grouped-tensor path within the derived bound of float64,
    each group on its own weights; the empty group's gradients are exact zeros."""
    layer, dtype, single, fused = CONFIGS[name]
    run, dt = te_run[name], DTYPES[dtype]
    w, b = run["params"]["w"].double().reshape(G, OUT, IN), run["params"]["b"].double()
    main = torch.zeros(G, OUT, IN, dtype=torch.float64)
    for n, st in enumerate(run["steps"]):
        assert st["y"].dtype == dt and st["y"].shape == (ROWS, OUT) and st["dx"].shape == (ROWS, IN)
        ys, dxs = _groups(st["y"]), _groups(st["dx"])
        for i, (x, dy) in enumerate(zip(_groups(st["x"]), _groups(st["dy"]))):
            lo, hi = _bias_interval(*_gemm_interval(x, w[i].t(), IN, dt), b[i], dt)
            _assert_within(f"step{n}.y[{i}]", ys[i], lo, hi)
            _assert_within(f"step{n}.dx[{i}]", dxs[i], *_gemm_interval(dy, w[i], OUT, dt))
            k = SPLITS[i]
            bgrad = st["bgrad"][i].double()
            _assert_within(f"step{n}.bias_grad[{i}]", bgrad,
                           *_rounded_interval(dy.sum(0), (k + 2) * U32 * dy.abs().sum(0), dt))
            if fused:
                lo, hi = _gemm_interval(dy.t(), x, k + 1, torch.float32, main[i])
                main[i] += dy.t() @ x
                _assert_within(f"step{n}.main_grad[{i}]", st["main_grad"][i].reshape(OUT, IN), lo, hi)
            else:
                _assert_within(f"step{n}.wgrad[{i}]", st["wgrad"][i].reshape(OUT, IN),
                               *_gemm_interval(dy.t(), x, k, dt))
        empty = SPLITS.index(0)
        assert bool((st["bgrad"][empty] == 0).all())
        if fused:
            assert st["wgrad"] is None or layer == "ops", "TE's fused wgrad leaves weight.grad None"
        else:
            assert bool((st["wgrad"][empty] == 0).all()) and st["main_grad"] is None


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_te_took_the_grouped_tensor_path(te_run: dict[str, Any], name: str) -> None:
    """Evidence: TE called the grouped-tensor GEMMs - one grouped tensor GEMM per forward,
    dgrad and wgrad with a single grouped weight; discrete-input forward and dgrad plus a
    discrete-output wgrad otherwise - and never the split-quantize ``te_general_grouped_gemm``."""
    _, _, single, _ = CONFIGS[name]
    calls = te_run[name]["calls"]
    if single:
        want = {"te_general_grouped_gemm_for_grouped_tensor": 3 * STEPS}
    else:
        want = {"te_general_grouped_gemm_for_discrete_in": 2 * STEPS,
                "te_general_grouped_gemm_for_discrete_out": STEPS}
    assert {k: v for k, v in calls.items() if k in GROUPED_GEMMS or k == SPLIT_QUANTIZE_GEMM} == want, calls
    assert calls.get("splits_to_offsets_multi") == STEPS


def test_the_path_selection_and_its_guards(te_run: dict[str, Any]) -> None:
    """Without the cuBLASLt answer both layers take the split-quantize path (so the evidence
    above tells the paths apart); fp32 never takes the grouped-tensor path; the module
    refuses host ``m_splits``; a backward run without the answer fails in the grouped GEMM, as
    on a GPU whose cuBLASLt lacks it; single grouped parameters need the path. TE reads the
    version on every forward, never at construction or in the backward."""
    facts = te_run["facts"]
    assert facts["default_calls"].get(SPLIT_QUANTIZE_GEMM, 0) > 0
    assert not any(k in GROUPED_GEMMS for k in facts["default_calls"]), facts["default_calls"]
    assert facts["fp32_calls"].get(SPLIT_QUANTIZE_GEMM, 0) > 0
    assert not any(k in GROUPED_GEMMS for k in facts["fp32_calls"]), facts["fp32_calls"]
    assert "The native grouped_tensor path requires CUDA m_splits" in facts["host_splits"]
    assert "requires cuBLAS 13.3+, but run-time cuBLAS version is 120901" in facts["backward_outside"]
    assert "Single grouped parameters require the native grouped-tensor path" in facts["single_without_version"]
    assert facts["asked"] == {"module-forward": 2, "ops-forward": 2}, facts["asked"]


def test_this_process_never_imported_the_layer() -> None:
    """Loading ``grouped.py`` by path and the subprocess left this process's torch alone."""
    for name in ("harness.backends.te_cpu.backend", "harness.backends.te_cpu.grouped", "transformer_engine", "transformer_engine_torch"):
        assert name not in sys.modules, name
    assert torch.zeros(1).is_cuda is False


_NO_USAGE_SCRIPT = """
    import os, torch
    import harness.backends.te_cpu.backend as backend
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer

    x = torch.randn(256, 128, dtype=torch.bfloat16)
    splits = torch.tensor([128, 128], dtype=torch.int64)
    made = {{"current": lambda: Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, device="cpu"),
             "mxfp8": lambda: MXFP8Quantizer(tex.DType.kFloat8E4M3),
             "blockwise": lambda: Float8BlockQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=True)}}
    out = {{}}
    for name, make in made.items():
        kernels = [("group_quantize", tex.group_quantize)]
        if name != "current":
            kernels.append(("bgrad_group_quantize", tex.bgrad_group_quantize))
        for kernel, fn in kernels:
            for rowwise, columnwise in ((False, False), (True, False)):
                q = make()
                q.set_usage(rowwise=rowwise, columnwise=columnwise)
                try:
                    fn(x, q, 2, splits)
                    out[(name, kernel, rowwise)] = "ran"
                except RuntimeError as exc:
                    out[(name, kernel, rowwise)] = str(exc)
    torch.save(out, os.environ["DW_TE_SCRIPT_OUT"])
"""


def test_group_quantize_refuses_a_quantizer_of_neither_usage(tmp_path_factory: pytest.TempPathFactory) -> None:
    """TE's grouped quantization kernels check first that an output usage is allocated
    (``cast/{fp8,mxfp8,fp8_blockwise}/group_quantize_*.cuh``: "Either rowwise or columnwise output
    data need to be allocated."); te-cpu refuses as they do - a backward that needs neither dgrad
    nor wgrad asks for it (GroupedLinear's grouped-tensor path with copies that lack
    requires_grad) - and the same call with a usage runs."""
    out = run_te_script(tmp_path_factory, "te_no_usage", _NO_USAGE_SCRIPT, timeout=300)
    assert len(out) == 10, out
    for (name, kernel, rowwise), said in out.items():
        want = "ran" if rowwise else "Either rowwise or columnwise output data need to be allocated."
        assert said == want, (name, kernel, rowwise, said)
