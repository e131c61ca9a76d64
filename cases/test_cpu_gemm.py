"""The te-cpu GEMM kernels (``harness.backends.te_cpu.gemm``) against float64 math.

TE's contract for its non-quantized GEMMs on a GPU (CONTRACTS §5): 16-bit operands multiply
exactly, the products accumulate in fp32, and the output - with its bias and ``beta * D``
terms - is rounded once to its dtype. Two kinds of checks:

- integer-valued operands, for which every product and partial sum is exact in fp32: the
  output must then equal the float64 result rounded *once* to the output dtype, bit for bit
  (a second rounding, or accumulation in the output dtype, breaks this);
- general operands: the error stays within fp32 accumulation's bound
  ``gamma_k(fp32) * (|op(B)| @ |op(A)| + |bias| + |C|)`` plus one rounding of the result.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.strategies import splits_strategy
from harness.backends.te_cpu import gemm as cpu_gemm

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
U = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _op(x: torch.Tensor, trans: bool) -> torch.Tensor:
    return x.t() if trans else x


def _operands(seed: int, shape_a: tuple[int, int], shape_b: tuple[int, int], dtype: torch.dtype,
              integer: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if integer:
        # exact in every operand dtype (|x| <= 64), products and sums exact in fp32 (< 2^24),
        # but sums need more bits than bf16/fp16 keep: the output rounding is visible
        return (torch.randint(-64, 65, shape_a, generator=g).to(dtype),
                torch.randint(-64, 65, shape_b, generator=g).to(dtype))
    return torch.randn(shape_a, generator=g).to(dtype), torch.randn(shape_b, generator=g).to(dtype)


@st.composite
def gemm_case(draw: st.DrawFn) -> dict:
    m, n, k = (draw(st.integers(0, 9), label=x) for x in "mnk")
    transa, transb = draw(st.booleans(), label="transa"), draw(st.booleans(), label="transb")
    return {"m": m, "n": n, "k": k, "transa": transa, "transb": transb,
            "dtype": DTYPES[draw(st.sampled_from(sorted(DTYPES)), label="dtype")],
            "out_dtype": DTYPES[draw(st.sampled_from(sorted(DTYPES)), label="out_dtype")],
            "bias": draw(st.booleans(), label="bias"), "accumulate": draw(st.booleans(), label="accumulate"),
            "seed": draw(st.integers(0, 2**31 - 1), label="seed")}


def _run(case: dict, integer: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, float64 reference, float64 magnitude) of one drawn GEMM.

    ``D = op(B) @ op(A)`` with ``op(A)``: (k, n) and ``op(B)``: (m, k), as TE lays them out.
    """
    m, n, k, ta, tb = case["m"], case["n"], case["k"], case["transa"], case["transb"]
    a, b = _operands(case["seed"], (n, k) if ta else (k, n), (k, m) if tb else (m, k), case["dtype"], integer)
    g = torch.Generator().manual_seed(case["seed"] + 1)
    bias = torch.randint(-64, 65, (n,), generator=g).to(case["out_dtype"]) if case["bias"] else None
    start = torch.randint(-999, 1000, (m, n), generator=g).to(case["out_dtype"])
    out = start.clone()
    res = cpu_gemm.gemm(a, ta, b, tb, out_dtype=case["out_dtype"], out=out if case["accumulate"] else None,
                        bias=bias, accumulate=case["accumulate"])
    a64, b64 = _op(a.double(), ta), _op(b.double(), tb)
    ref = b64 @ a64
    mag = b64.abs() @ a64.abs()
    if a.numel() == 0 or b.numel() == 0:
        # TE's extension skips cuBLAS for an empty operand: zeros, or D left as it was when
        # accumulating - no bias is added (pytorch/csrc/extensions/gemm.cpp, gemm())
        bias = None
    if bias is not None:
        ref, mag = ref + bias.double(), mag + bias.double().abs()
    if case["accumulate"]:
        ref, mag = ref + start.double(), mag + start.double().abs()
        assert res.out is out, "accumulate writes into the given output"
    assert res.out.dtype == case["out_dtype"] and tuple(res.out.shape) == (m, n)
    assert res.bias_grad is None
    return res.out, ref, mag


@settings(max_examples=150, deadline=None)
@given(gemm_case())
def test_exact_operands_round_once(case: dict) -> None:
    out, ref, _ = _run(case, integer=True)
    want = ref.to(case["out_dtype"])  # float64 -> dtype: one rounding of the exact value
    assert torch.equal(out, want), f"{case}: {out} != {want}"


@settings(max_examples=150, deadline=None)
@given(gemm_case())
def test_error_within_fp32_accumulation_bound(case: dict) -> None:
    out, ref, mag = _run(case, integer=False)
    terms = case["k"] + (1 if case["bias"] else 0) + (1 if case["accumulate"] else 0)
    u32 = 2.0**-24
    gamma = terms * u32 / (1 - terms * u32)
    bound = gamma * mag * (1 + U[case["out_dtype"]]) + U[case["out_dtype"]] * ref.abs()
    err = (out.double() - ref).abs()
    assert bool((err <= bound * 1.0001).all()), f"{case}: max err {float(err.max()):.3g}"


@settings(max_examples=100, deadline=None)
@given(m=st.integers(0, 9), n=st.integers(1, 9), k=st.integers(0, 9), dtype=st.sampled_from(sorted(DTYPES)),
       seed=st.integers(0, 2**31 - 1))
def test_wgrad_layout_with_bias_gradient(m: int, n: int, k: int, dtype: str, seed: int) -> None:
    """TE's wgrad GEMM (``"NT"``, grad with a bias): ``dW = dY^T @ X`` and the bias gradient
    is the column sum of ``dY`` (cuBLASLt's BGRADB epilogue), both fp32-accumulated."""
    x, dy = _operands(seed, (k, n), (k, m), DTYPES[dtype], integer=True)
    placeholder = torch.empty(m, dtype=DTYPES[dtype])
    res = cpu_gemm.gemm(x, False, dy, True, out_dtype=DTYPES[dtype], bias=placeholder, grad=True)
    assert torch.equal(res.out, (dy.double().t() @ x.double()).to(DTYPES[dtype]))
    assert torch.equal(res.bias_grad, dy.double().sum(0).to(DTYPES[dtype]))


@settings(max_examples=100, deadline=None)
@given(splits=splits_strategy(4), n=st.integers(1, 7), k=st.integers(1, 7), dtype=st.sampled_from(sorted(DTYPES)),
       bias=st.booleans(), single=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_grouped_forward_with_empty_groups(splits: list[int], n: int, k: int, dtype: str, bias: bool,
                                           single: bool, seed: int) -> None:
    """TE's forward grouped GEMM (``"TN"``): group i computes ``x_i @ W_i^T (+ b_i)``; a group
    without rows produces nothing; one output buffer is filled group after group."""
    dt = DTYPES[dtype]
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randint(-4, 5, (s, k), generator=g).to(dt) for s in splits]
    ws = [torch.randint(-4, 5, (n, k), generator=g).to(dt) for _ in splits]
    bs = [torch.randint(-4, 5, (n,), generator=g).to(dt) if bias else torch.empty(0, dtype=dt) for _ in splits]
    buffer = torch.full((sum(splits), n), float("nan"), dtype=dt)
    results = cpu_gemm.grouped_gemm(ws, True, xs, False, out_dtype=dt, single_output=buffer if single else None,
                                    biases=bs)
    want = [(x.double() @ w.double().t() + (b.double() if bias else 0)).to(dt) for x, w, b in zip(xs, ws, bs)]
    for res, w in zip(results, want):
        assert torch.equal(res.out, w)
    if single:
        assert torch.equal(buffer, torch.cat(want) if want else buffer)


@settings(max_examples=100, deadline=None)
@given(splits=splits_strategy(4), n=st.integers(1, 7), k=st.integers(1, 7), dtype=st.sampled_from(sorted(DTYPES)),
       accumulate=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_grouped_wgrad_with_empty_groups(splits: list[int], n: int, k: int, dtype: str, accumulate: bool,
                                         seed: int) -> None:
    """TE's grouped wgrad (``"NT"``, grad, bias): an empty group writes zeros (or leaves the
    accumulated output alone) and a zero bias gradient, as TE's extension does."""
    dt = DTYPES[dtype]
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randint(-4, 5, (s, k), generator=g).to(dt) for s in splits]
    dys = [torch.randint(-4, 5, (s, n), generator=g).to(dt) for s in splits]
    starts = [torch.randint(-8, 9, (n, k), generator=g).to(dt) for _ in splits]
    outs = [s.clone() for s in starts]
    placeholders = [torch.empty(n, dtype=dt) for _ in splits]
    results = cpu_gemm.grouped_gemm(xs, False, dys, True, out_dtype=dt, outs=outs, biases=placeholders,
                                    grad=True, accumulate=accumulate)
    for x, dy, start, out, res in zip(xs, dys, starts, outs, results):
        want = dy.double().t() @ x.double() + (start.double() if accumulate else 0)
        assert res.out is out and torch.equal(out, want.to(dt))
        assert torch.equal(res.bias_grad, dy.double().sum(0).to(dt))


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=2.0**-100, max_value=2.0**100, allow_nan=False), st.booleans())
def test_tf32_rounds_to_nearest_even_with_10_mantissa_bits(x: float, negative: bool) -> None:
    value = torch.tensor([-x if negative else x], dtype=torch.float32)
    got = float(cpu_gemm.round_to_tf32(value))
    v = float(value)
    ulp = 2.0 ** (math.floor(math.log2(abs(v))) - 10)
    q = v / ulp
    want = round(q) * ulp  # Python's round: ties to even
    assert got == want, f"{v!r}: tf32 {got!r}, expected {want!r}"
    assert abs(got - v) <= 2.0**-11 * abs(v)


def test_tf32_mode_rounds_fp32_operands_only() -> None:
    a = torch.tensor([[1.0 + 2.0**-12]], dtype=torch.float32)  # not representable in TF32
    one = torch.ones(1, 1, dtype=torch.float32)
    ieee = cpu_gemm.gemm(a, False, one, False, out_dtype=torch.float32).out
    tf32 = cpu_gemm.gemm(a, False, one, False, out_dtype=torch.float32, fp32_mode="tf32").out
    assert float(ieee) == 1.0 + 2.0**-12 and float(tf32) == 1.0
    half = cpu_gemm.gemm(a.bfloat16(), False, one.bfloat16(), False, out_dtype=torch.float32, fp32_mode="tf32")
    assert float(half.out) == float(a.bfloat16())  # 16-bit operands are exact in TF32
    assert float(cpu_gemm.round_to_tf32(torch.tensor([float("nan")]))) != 0.0
    assert torch.isinf(cpu_gemm.round_to_tf32(torch.tensor([float("inf")]))).all()


@pytest.mark.parametrize("bad", ["shape", "out_dtype", "beta"])
def test_rejects_what_te_rejects(bad: str) -> None:
    a, b = torch.ones(3, 4), torch.ones(5, 4)
    with pytest.raises(cpu_gemm.GemmError):
        if bad == "shape":
            cpu_gemm.gemm(a, False, b, False, out_dtype=torch.float32)
        elif bad == "out_dtype":
            cpu_gemm.gemm(a, True, b, False, out_dtype=torch.float32, out=torch.empty(5, 3, dtype=torch.bfloat16))
        else:
            cpu_gemm.gemm(a, True, b, False, out_dtype=torch.float32, beta=1.0)
