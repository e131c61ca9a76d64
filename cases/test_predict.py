"""Defect models (``harness.cell.predict``): the oracle with a known defect applied, as intervals.

What must hold: rounding to a dtype is exact round-to-nearest-even (subnormals, overflow);
a sum in a dtype over ranks in any order lands in the modelled interval; a value computed the
way a defect computes it (a wgrad rounded to bf16 before a bf16 reduce-scatter, a ``.grad``
assigned per microbatch) is within its normal bound of the model (ratio <= 1), while the same
value with any further damage - the wgrad multiplied by ``1 + 2**-6`` - is far outside it.
No launch: the defect's arithmetic is replayed here with torch's own bf16/fp32 operations.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from harness.cell import compare, oracle, predict
from harness.cell.inputs import make_inputs, main_grad_start
from harness.vocabulary.shape import Example

BF16 = torch.bfloat16


@pytest.mark.parametrize("dtype, torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                                ("fp32", torch.float32)])
def test_round_to_is_round_to_nearest_even(dtype, torch_dtype):
    g = torch.Generator().manual_seed(0)
    # fp32 values (so torch's own conversion rounds once), over the whole range: subnormals,
    # ties (integers at the spacing's half), overflow
    x = (torch.randn(100_000, generator=g) * torch.exp(torch.randn(100_000, generator=g) * 12)).to(torch.float64)
    ties = torch.arange(-600, 600, dtype=torch.float64) / 4 + 256.0  # bf16 spacing 2 above 256: .5 ties
    x = torch.cat([x, ties, torch.tensor([0.0, -0.0, 65520.0, 65519.0, 1e-8, 3e38, 3.5e38])]).to(torch.float32)
    want = x.to(torch_dtype).to(torch.float64)
    got = predict.round_to(x.to(torch.float64), dtype)
    same = (got == want) | (torch.isinf(got) & torch.isinf(want) & (got.sign() == want.sign()))
    assert bool(same.all()), x[~same][:5]


def test_round_to_fp32_is_the_cast_of_any_float64():
    """The fp32 rounding is float64 -> float32 cast: equal to the format's definition on
    float64 values fp32 cannot hold - ties to even at every exponent, subnormals and their ties,
    the overflow boundary, signed zeros."""
    g = torch.Generator().manual_seed(1)
    f64 = torch.float64
    wide = torch.randn(200_000, generator=g, dtype=f64) * torch.exp(torch.randn(200_000, generator=g, dtype=f64) * 30)
    f = torch.randn(50_000, generator=g).to(torch.float32)
    ties = (f.to(f64) + torch.nextafter(f, torch.full_like(f, float("inf"))).to(f64)) / 2
    sub = torch.randint(-2**23, 2**23, (50_000,), generator=g).to(f64) * 2.0**-149
    top = 2.0**128 - 2.0**103  # the midpoint between fp32's largest value and the next power of two
    edges = torch.tensor([0.0, -0.0, top, -top, top * (1 - 2**-52), 1e39, 2.0**-150, -2.0**-150, 3 * 2.0**-151,
                          2.0**-151, float("inf"), float("-inf")], dtype=f64)
    x = torch.cat([wide, ties, -ties, sub + 2.0**-150, sub + 2.0**-151, edges])
    got, want = predict.round_to(x, "fp32"), predict.round_by_spacing(x, "fp32")
    assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want))


def test_a_sum_in_bf16_in_any_order_lands_in_the_interval():
    g = torch.Generator().manual_seed(1)
    terms = [torch.randn(4000, generator=g).to(BF16) for _ in range(4)]
    ivs = [predict.Interval(t.to(torch.float64), t.to(torch.float64)) for t in terms]
    got = predict.summed(ivs, "bf16")
    for order in itertools.permutations(range(4)):
        acc = terms[order[0]]
        for i in order[1:]:
            acc = acc + terms[i]  # bf16 + bf16: rounded to bf16 at each add
        acc = acc.to(torch.float64)
        assert bool(((got.lo <= acc) & (acc <= got.hi)).all()), order
    pairs = ((terms[0] + terms[1]) + (terms[2] + terms[3])).to(torch.float64)
    assert bool(((got.lo <= pairs) & (pairs <= got.hi)).all())
    # no wider than the classical bound's interval: 2 (W - 1) u sum|terms|
    size = sum(t.to(torch.float64).abs() for t in terms)
    assert bool((got.hi - got.lo <= 2 * 3 * 2.0**-8 * size).all())


def _trees(leaves: tuple[int, ...]) -> list:
    """Every binary summation tree over ``leaves``, up to swapping two operands."""
    if len(leaves) == 1:
        return [leaves[0]]
    first, rest = leaves[0], leaves[1:]
    out = []
    for k in range(len(rest)):
        for joined in itertools.combinations(rest, k):
            right = tuple(x for x in rest if x not in joined)
            out += [(a, b) for a in _trees((first, *joined)) for b in _trees(right)]
    return out


def _evaluate(tree, terms: list[torch.Tensor], dtype: str) -> torch.Tensor:
    if isinstance(tree, int):
        return terms[tree]
    return predict.round_to(_evaluate(tree[0], terms, dtype) + _evaluate(tree[1], terms, dtype), dtype)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_summed_interval_is_the_extremes_over_every_summation_tree(world, dtype):
    """``summed`` takes each subset's extreme over its splits; tree by tree, it is the
    same interval: the lowest and highest value any tree gives, and the exact sum rounded once."""
    assert [len(_trees(tuple(range(n)))) for n in (2, 3, 4)] == [1, 3, 15]
    g = torch.Generator().manual_seed(world)
    scale = 2.0 ** torch.randint(-6, 7, (world, 1), generator=g).double()
    los = list(torch.randn(world, 5000, generator=g, dtype=torch.float64) * scale)
    his = [lo + torch.rand(5000, generator=g, dtype=torch.float64) * lo.abs() * 2.0**-7 for lo in los]
    got = predict.summed([predict.Interval(lo, hi) for lo, hi in zip(los, his)], dtype)
    trees = _trees(tuple(range(world)))
    want_lo = predict.round_to(sum(los), dtype)
    want_hi = predict.round_to(sum(his), dtype)
    for t in trees:
        want_lo = torch.minimum(want_lo, _evaluate(t, los, dtype))
        want_hi = torch.maximum(want_hi, _evaluate(t, his, dtype))
    assert bool((got.lo == want_lo).all()) and bool((got.hi == want_hi).all())
    if world > 2:  # the orders do widen it (two terms have one order: the exact sum rounded)
        assert bool((got.lo < predict.round_to(sum(los), dtype)).any())


def _inputs(world: int, microbatches: int = 2, dtype: str = "bf16"):
    return make_inputs(7, Example(), dtype, world, microbatches, 1, False)


def _wgrad(inputs, r: int, m: int) -> torch.Tensor:
    """A rank's microbatch wgrad as TE computes it: bf16 operands, fp32 accumulation."""
    return inputs.dy[r][m].float().t() @ inputs.x[r][m].float()


def _defect_main_grad(inputs, world: int, rank: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``main_grad`` of a GTP shard when the unfused wgrad is rounded to bf16 and reduced in it
    (``unfused-wgrad-activation-dtype-*``), optionally multiplied by ``scale`` before finalize."""
    start = main_grad_start((30 // world, 24), 7, "weight", rank)
    main = start.clone()
    s = 30 // world
    for m in range(len(inputs.x[0])):
        per_rank = [(_wgrad(inputs, r, m).to(BF16) * scale) * (1.0 / world) for r in range(world)]
        total = per_rank[0]
        for t in per_rank[1:]:
            total = total + t
        main += total[rank * s:(rank + 1) * s]
    return main, start


@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_activation_dtype_wgrad_is_what_its_model_predicts_and_nothing_more(world):
    inputs = _inputs(world)
    rank = world - 1
    main, start = _defect_main_grad(inputs, world, rank)
    orc = oracle.compute(inputs, rank)
    s = 30 // world
    shard = (30, rank * s, s)
    ref = oracle.record_of(orc.wgrad_sums[0], start, shard)
    bound = compare.bound(ref, "fp32")
    models = predict.Predictor(inputs, rank, (1.0, 1.0), "bf16").weight(0, main, bound, start, shard, None)
    assert compare.compare_tensor("weight.main_grad", main, ref, "fp32").ratio > 100  # the defect shows
    assert models["wgrad_in_activation_dtype"] <= 1.0, models
    assert models["no_gradient"] > 1e4
    planted, _ = _defect_main_grad(inputs, world, rank, scale=1 + 2**-6)
    worse = predict.Predictor(inputs, rank, (1.0, 1.0), "bf16").weight(0, planted, bound, start, shard, None)
    assert worse["wgrad_in_activation_dtype"] > 100, worse


def test_a_model_every_rank_shares_is_computed_once_and_read_by_the_others(tmp_path):
    """``wgrad_in_activation_dtype`` and ``grad_assigned_last_microbatch`` are functions of the
    inputs, the recipe and the dtype: with a store, one rank computes each, the others read it,
    bit for bit what they would have computed."""
    from harness.cell import oracle_store

    inputs = _inputs(2, microbatches=3)
    digest = oracle.fingerprint(inputs)
    alone = predict.Predictor(inputs, 1, (1.0, 1.0), "bf16")
    first = predict.Predictor(inputs, 0, (1.0, 1.0), "bf16", store=oracle_store.Store(tmp_path), digest=digest)
    first.wgrad_in_activation_dtype(0), first.grad_assigned_last_microbatch(0)
    assert first.store.written == 2
    other = oracle_store.Store(tmp_path)
    second = predict.Predictor(inputs, 1, (1.0, 1.0), "bf16", store=other, digest=digest)
    for model in ("wgrad_in_activation_dtype", "grad_assigned_last_microbatch"):
        kept, fresh = getattr(second, model)(0), getattr(alone, model)(0)
        assert torch.equal(kept.lo, fresh.lo) and torch.equal(kept.hi, fresh.hi)
    assert other.read == 2 and other.written == 0 and second._terms is None  # nothing computed
    # a dgrad model's view of the oracle is this rank's: kept, read back by the same rank
    view = {"tags": (1.0, 0.5)}
    mine = predict.Predictor(inputs, 1, (1.0, 1.0), "bf16", store=other, digest=digest)._view("v", view)
    again = oracle_store.Store(tmp_path)
    kept = predict.Predictor(inputs, 1, (1.0, 1.0), "bf16", store=again, digest=digest)._view("v", view)
    fresh = alone._view("v", view)
    assert again.read == 1 and again.written == 0
    for a, b, c in zip(kept.dgrads, mine.dgrads, fresh.dgrads):
        assert torch.equal(a.value, c.value) and torch.equal(b.value, c.value)
    # another dtype is another model
    assert predict.Predictor(inputs, 1, (1.0, 1.0), "fp16", store=other, digest=digest).wgrad_in_activation_dtype(0) \
        is not None and other.written == 2


def test_nothing_reaching_main_grad_is_no_gradient_and_a_rebound_buffer_is_judged_by_the_kept_one():
    inputs = _inputs(2)
    start = main_grad_start((15, 24), 7, "weight", 0)
    ref = oracle.record_of(oracle.compute(inputs, 0).wgrad_sums[0], start, (30, 0, 15))
    bound = compare.bound(ref, "fp32")
    pred = predict.Predictor(inputs, 0, (1.0, 1.0), "bf16")
    assert pred.weight(0, start.clone(), bound, start, (30, 0, 15), None)["no_gradient"] == 0.0
    rebound = pred.weight(0, torch.ones(30, 24), bound, start, (30, 0, 15), kept=start.clone())
    assert rebound == {"main_grad_rebound": 0.0}  # the rebound tensor's shape: no other model applies
    touched = start.clone()
    touched[3, 4] += 1e-3
    assert pred.weight(0, touched, bound, start, (30, 0, 15), None)["no_gradient"] > 1


def test_a_grad_assigned_per_microbatch_is_the_last_microbatch():
    inputs = _inputs(2, microbatches=3)
    per_rank = [_wgrad(inputs, r, 2).to(BF16) for r in range(2)]
    grad = (per_rank[0] + per_rank[1]) / 2  # the consumer's all-reduce and 1/W, in bf16
    ref = oracle.record_of(oracle.compute(inputs, 0).wgrad_sums[0], None, None)
    bound = compare.bound(ref, "bf16")
    pred = predict.Predictor(inputs, 0, (1.0, 1.0), "bf16")
    assert pred.weight(0, grad, bound, None, None, None)["grad_assigned_last_microbatch"] <= 1.0
    first = ((_wgrad(inputs, 0, 0).to(BF16) + _wgrad(inputs, 1, 0).to(BF16)) / 2)
    assert pred.weight(0, first, bound, None, None, None)["grad_assigned_last_microbatch"] > 1.0


def test_the_oracle_memo_is_the_oracle_and_sees_inputs_changed_in_place():
    """``oracle.Memo``: equal inputs (a hooked cell and its hooks-off twin draw the same) give
    the kept oracle, equal to a fresh one; inputs a backend changed in place are new inputs."""
    memo = oracle.Memo(size=2)
    a = make_inputs(7, Example(), "bf16", 2, 2, 1, True, norm="LayerNorm")
    b = make_inputs(7, Example(), "bf16", 2, 2, 1, True, norm="LayerNorm")
    first = memo.compute(a, 1, recipe="mxfp8")
    assert memo.compute(b, 1, recipe="mxfp8") is first and memo.hits == 1
    fresh = oracle.compute(b, 1, recipe="mxfp8")
    for kept, new in zip(first.outputs + first.wgrad_sums + first.norm_sums, fresh.outputs + fresh.wgrad_sums + fresh.norm_sums):
        assert torch.equal(kept.value, new.value) and torch.equal(kept.magnitude, new.magnitude)
    # another rank, recipe or cached flag is another oracle
    assert memo.compute(b, 0, recipe="mxfp8") is not first and memo.hits == 1
    b.x[1][0][0, 0] += 1.0   # another rank's row: it enters the weight gradient
    assert memo.compute(b, 1, recipe="mxfp8") is not first and memo.hits == 1
    assert len(memo._kept) == 2   # bounded: the oldest went


@pytest.mark.parametrize("recipe, norm", [("none", None), ("delayed", "LayerNorm"), ("mxfp8", "RMSNorm"),
                                          ("blockwise", None)])
def test_a_models_view_without_weight_gradients_is_the_full_oracle_but_those(recipe, norm):
    """``Predictor``'s views are computed without the weight gradients (``weight_grads=False``):
    everything they are read for - outputs, input gradients, the normalization's and the bias's
    gradients, the recipe's scales after the step - is the full oracle's, bit for bit."""
    inputs = make_inputs(5, Example(32, 32, 32), "bf16", 2, 2, 1, True, norm=norm)
    view = {"distributed": True, "unquantized_dgrad_weight": recipe != "none"}
    full = oracle.compute(inputs, 1, recipe=recipe, **view)
    part = oracle.compute(inputs, 1, recipe=recipe, weight_grads=False, **view)
    assert full.wgrad_sums and part.wgrad_sums == []
    for field in ("outputs", "dgrads", "bgrad_sums", "norm_sums"):
        a, b = getattr(full, field), getattr(part, field)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert torch.equal(x.value, y.value) and torch.equal(x.magnitude, y.magnitude), field
            assert (x.reduction, x.roundings, x.operand_u) == (y.reduction, y.roundings, y.operand_u)

    def state(q: object) -> object:  # the quantizer's state: its scales, its delegate's, ...
        if isinstance(q, torch.Tensor):
            return q.tolist()
        if isinstance(q, dict):
            return {k: state(v) for k, v in q.items()}
        if isinstance(q, (list, tuple)):
            return [state(v) for v in q]
        if hasattr(q, "__dict__") and type(q).__module__ == "harness.cell.quantized":
            return (type(q).__name__, state({k: v for k, v in vars(q).items() if k != "inputs"}))
        return q

    assert state(full.quant) == state(part.quant)
