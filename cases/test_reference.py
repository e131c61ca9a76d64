"""Single-process unit tests of the reference backend against float64 plain-torch math.

The reference (``harness.backends.reference``) is the yardstick every other backend is judged by,
so it is itself checked here against independent float64 math (``fixtures.tensors``), for
``Linear``, ``GroupedLinear`` and ``ops.GroupedLinear``; fused accumulation on/off; delayed
wgrad on/off; bias on/off; plain weights and GTP weights injected at world size 1
in-process; fp32/bf16/fp16. Shapes, row splits (zero-row groups included), the input's
``requires_grad`` and the ``pad_multiple`` of the GTP weight are drawn by hypothesis.

Tolerances are ``harness.cell.compare``'s derived bound (``harness.cell.compare.bound``: final rounding,
earlier roundings and fp32 accumulation), with ``u`` the unit roundoff of the dtype the value is produced in (fp32
``main_grad`` for fused / distributed-with-main_grad weight gradients, CONTRACTS §2).

The last section checks that bad input fails early with a clear error (CONTRACTS §1-§2).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness.backends.reference as reference
from fixtures.modules import (KINDS, WgradHookRecorder, attach_main_grad, bias_names, build, caller,
                              load_full, param_state, weight_names)
from fixtures.strategies import grouped_case
from fixtures.tensors import DTYPE_NAMES, DTYPES, assert_within_bound, grouped_linear_f64, pad_rows, seeded, with_start
from harness.cell.gtp import GTPWeight, inject_gtp

pytestmark = pytest.mark.usefixtures("single_thread")

SETTINGS = settings(max_examples=25, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

# (weight, fused, delay): delayed wgrad with a distributed weight is unsupported by
# contract and is tested separately (it must raise).
CONFIGS = [
    ("plain", False, False), ("plain", True, False), ("plain", False, True), ("plain", True, True),
    ("distributed", False, False), ("distributed", True, False),
]


def _config_id(c: tuple[str, bool, bool]) -> str:
    return f"{c[0]}-{'fused' if c[1] else 'unfused'}-{'delay' if c[2] else 'nodelay'}"


def _make_inputs(case: dict, dtype: torch.dtype):
    """Full weights, biases, input and upstream gradient of one drawn case (dtype-rounded)."""
    seed, n = case["seed"], case["groups"]
    in_f, out_f = case["in_features"], case["out_features"]
    weights = [seeded((out_f, in_f), dtype, seed + 1 + i, scale=0.5) for i in range(n)]
    biases = [seeded((out_f,), dtype, seed + 101 + i, scale=0.5) for i in range(n)] if case["bias"] else []
    x = seeded((*case["lead_shape"], in_f), dtype, seed + 1001)
    dy = seeded((*case["lead_shape"], out_f), dtype, seed + 2002)
    return weights, biases, x, dy


def _check_step(kind: str, dtype_name: str, weight: str, fused: bool, delay: bool, case: dict,
                unfused_main_grad: bool, pad_multiple: int) -> None:
    """One forward/backward (+ ``backward_dw``) of the reference, every observable checked."""
    dtype = DTYPES[dtype_name]
    distributed = weight == "distributed"
    n, in_f, out_f = case["groups"], case["in_features"], case["out_features"]
    W, B, x, dy = _make_inputs(case, dtype)
    module = build(reference, kind, n, in_f, out_f, bias=case["bias"], dtype=dtype, fused=fused, delay=delay)
    load_full(module, W, B)
    gtp = inject_gtp(module, pad_multiple=pad_multiple) if distributed else None
    wnames, bnames = weight_names(module), bias_names(module)
    has_main_grad = fused or unfused_main_grad
    starts = attach_main_grad(module, case["seed"]) if has_main_grad else {}
    hooks = WgradHookRecorder(module)

    xin = x.clone().requires_grad_(case["input_grad"])
    out = caller(module, kind, case["splits"])(xin)
    assert out.shape == (*case["lead_shape"], out_f) and out.dtype == dtype
    out.backward(dy)

    math = grouped_linear_f64(x.reshape(-1, in_f), W, B, case["splits"], dy.reshape(-1, out_f))
    assert_within_bound("output", out.detach().reshape(-1, out_f), math.y, dtype_name)
    if case["input_grad"]:
        assert xin.grad is not None and xin.grad.dtype == dtype
        assert_within_bound("input_grad", xin.grad.reshape(-1, in_f), math.dx, dtype_name)
    else:
        assert xin.grad is None

    assert module.need_backward_dw() is delay
    for name in wnames:
        assert bool(getattr(getattr(module, name), "skip_backward_post_hook", False)) is delay, name
    if delay:
        # While wgrad is delayed the main backward delivers no weight gradient (§4).
        for name in wnames:
            p = getattr(module, name)
            assert p.grad is None, f"{name}.grad delivered by a delayed backward"
            if has_main_grad:
                assert torch.equal(p.main_grad, starts[name]) and p.grad_added_to_main_grad is False
        # A bias is marked exactly when its gradient is delayed (§4).
        for name in bnames:
            p = getattr(module, name)
            assert bool(getattr(p, "skip_backward_post_hook", False)) is (p.grad is None), name
        assert hooks.calls == 0
        module.backward_dw()
        assert hooks.calls == 1, "the wgrad hook must fire once per backward_dw that computed"
        assert all(hooks.snapshots[0].values()), f"hook fired before the gradients: {hooks.snapshots}"
        module.backward_dw()  # nothing queued: no computation, no hook
        assert hooks.calls == 1
    else:
        for name in bnames:
            assert not getattr(getattr(module, name), "skip_backward_post_hook", False), name
        module.backward_dw()  # a no-op without delayed wgrad
        assert hooks.calls == 0

    for i, name in enumerate(wnames):
        p = getattr(module, name)
        padded = gtp.padded_rows if gtp is not None else None
        if fused or (distributed and has_main_grad):
            # Formed in main_grad's fp32 (§2) and added to the non-zero start; the padding
            # rows of a GTP shard keep their start value.
            assert_within_bound(f"{name}.main_grad", p.main_grad, with_start(math.dw[i], starts[name], padded), "fp32")
            assert p.main_grad.dtype == torch.float32
            assert p.grad_added_to_main_grad is True
            if not delay:
                # The dummy returned to autograd has the parameter's own (shard) shape/dtype.
                assert p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype
                assert not p.grad.any()
        else:
            ref = pad_rows(math.dw[i], padded) if padded is not None else math.dw[i]
            assert p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == dtype
            assert_within_bound(f"{name}.grad", p.grad, ref, dtype_name)
            if has_main_grad:  # plain unfused: the backend leaves main_grad to the consumer
                assert torch.equal(p.main_grad, starts[name]) and p.grad_added_to_main_grad is False
    for i, name in enumerate(bnames):
        p = getattr(module, name)
        assert p.grad is not None and p.grad.dtype == dtype
        assert_within_bound(f"{name}.grad", p.grad, math.db[i], dtype_name)
        if has_main_grad:  # a bias's main_grad is never the backend's to write
            assert torch.equal(p.main_grad, starts[name]) and p.grad_added_to_main_grad is False

    if gtp is not None:
        log = gtp.log
        assert isinstance(getattr(module, wnames[0]), GTPWeight)
        # Per step on the leader: forward-materialize once, backward-materialize once
        # (also when the input needs no gradient), finalize once (§2).
        for kind_ in ("materialize_forward", "materialize_backward", "finalize"):
            assert log.count(kind_, 0) == 1, (kind_, log.calls)
            assert log.count(kind_) == 1, f"{kind_} called on a follower: {log.calls}"
        for m in range(n):
            assert log.count("grad_buffer", m) == (1 if fused else 0), log.calls
        want = "float32" if has_main_grad else str(dtype).replace("torch.", "")
        assert log.finalize_dtypes() == [want] * n


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
@pytest.mark.parametrize("config", CONFIGS, ids=_config_id)
@pytest.mark.parametrize("kind", KINDS)
@SETTINGS
@given(data=st.data())
def test_reference_matches_float64(kind, config, dtype_name, data):
    """Every output, gradient, flag, mark, hook call and protocol call of one step is right.

    Why: the reference is the yardstick for every backend, so it must be correct across
    the whole supported combination space, including zero-row groups, empty inputs and
    GTP padding rows (which must keep main_grad's start value).
    """
    weight, fused, delay = config
    case = data.draw(grouped_case(kind), label="case")
    unfused_main_grad = False if fused else data.draw(st.booleans(), label="unfused_main_grad")
    pad_multiple = data.draw(st.integers(1, 3), label="pad_multiple") if weight == "distributed" else 1
    _check_step(kind, dtype_name, weight, fused, delay, case, unfused_main_grad, pad_multiple)


def test_float64_math_is_not_vacuous():
    """The bound rejects a wrong answer (one element off by a few ulps of the magnitude).

    Why: a tolerance that accepts anything would make every numerical test above pass.
    """
    case = {"seed": 7, "groups": 2, "in_features": 5, "out_features": 4, "bias": True,
            "lead_shape": (6,), "splits": [2, 4], "input_grad": True}
    W, B, x, dy = _make_inputs(case, torch.bfloat16)
    math = grouped_linear_f64(x, W, B, case["splits"], dy)
    good = math.y.value.to(torch.bfloat16)
    assert_within_bound("output", good, math.y, "bf16")
    bad = good.to(torch.float64).clone()
    bad[0, 0] += 8 * 2.0**-8 * (math.y.magnitude[0, 0] + 1)
    with pytest.raises(AssertionError, match="Mismatched elements: 1 /"):
        assert_within_bound("output", bad, math.y, "bf16")


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("kind", KINDS)
def test_frozen_distributed_weights_are_not_finalized(kind, fused, in_process_ws1):
    """Frozen GTP weights (``requires_grad=False``): backward still materializes once for
    the input gradient but never calls ``grad_buffer`` or finalize, and no weight gradient
    or ``main_grad`` changes.

    Why: CONTRACTS §2 - finalize runs exactly once *when the weight requires a gradient*;
    a reduce-scatter for a frozen weight is a wasted (and on some ranks unmatched) collective.
    """
    n = 1 if kind == "linear" else 2
    module = build(reference, kind, n, 3, 4, bias=True, dtype=torch.float32, fused=fused, delay=False)
    for name in weight_names(module):
        getattr(module, name).requires_grad_(False)
    gtp = inject_gtp(module)
    starts = attach_main_grad(module, 8)
    x = torch.randn(3, 3, requires_grad=True)
    caller(module, kind, [3] if n == 1 else [1, 2])(x).sum().backward()
    assert x.grad is not None
    assert [(c["kind"], c["member"]) for c in gtp.log.calls] == [("materialize_forward", 0),
                                                                 ("materialize_backward", 0)]
    for name in weight_names(module):
        p = getattr(module, name)
        assert p.grad is None and torch.equal(p.main_grad, starts[name]) and p.grad_added_to_main_grad is False


# ---- delayed wgrad across microbatches ---------------------------------------------------

@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("kind", KINDS)
def test_delayed_wgrad_two_microbatches(kind, fused):
    """Two queued backwards: each ``backward_dw`` computes one, fires the hook once, and
    the gradients of both microbatches accumulate (``.grad`` or ``main_grad``).

    Why: Megatron calls ``backward_dw()`` once per microbatch; a hook that fires on only
    one branch, twice, or before the gradients are in place corrupts DDP's reduction.
    """
    n = 1 if kind == "linear" else 3
    in_f, out_f, dtype = 5, 4, torch.float32
    W = [seeded((out_f, in_f), dtype, 10 + i, 0.5) for i in range(n)]
    B = [seeded((out_f,), dtype, 20 + i, 0.5) for i in range(n)]
    module = build(reference, kind, n, in_f, out_f, bias=True, dtype=dtype, fused=fused, delay=True)
    load_full(module, W, B)
    starts = attach_main_grad(module, 3) if fused else {}
    hooks = WgradHookRecorder(module)
    splits_per_mb = [[6], [3]] if kind == "linear" else [[2, 0, 4], [0, 3, 0]]
    maths = []
    for mb, splits in enumerate(splits_per_mb):
        x = seeded((sum(splits), in_f), dtype, 30 + mb)
        dy = seeded((sum(splits), out_f), dtype, 40 + mb)
        out = caller(module, kind, splits)(x.clone().requires_grad_())
        out.backward(dy)
        maths.append(grouped_linear_f64(x, W, B, splits, dy))
    assert hooks.calls == 0
    for expected in (1, 2):
        module.backward_dw()
        assert hooks.calls == expected
        assert all(hooks.snapshots[-1].values())
    module.backward_dw()
    assert hooks.calls == 2, "backward_dw with nothing queued must not fire the hook"

    for i, name in enumerate(weight_names(module)):
        p = getattr(module, name)
        total = maths[0].dw[i]
        total = type(total)(total.value + maths[1].dw[i].value, total.magnitude + maths[1].dw[i].magnitude,
                            total.reduction + maths[1].dw[i].reduction, total.roundings + 1)
        if fused:
            assert_within_bound(f"{name}.main_grad", p.main_grad, with_start(total, starts[name]), "fp32")
            assert p.grad_added_to_main_grad is True
        else:
            assert_within_bound(f"{name}.grad", p.grad, total, "fp32")
    for i, name in enumerate(bias_names(module)):
        p = getattr(module, name)
        db = maths[0].db[i]
        total = type(db)(db.value + maths[1].db[i].value, db.magnitude + maths[1].db[i].magnitude,
                         db.reduction + maths[1].db[i].reduction, db.roundings + 1)
        assert_within_bound(f"{name}.grad", p.grad, total, "fp32")


@pytest.mark.parametrize("kind", KINDS)
def test_no_hook_without_delay(kind):
    """Without delayed wgrad, a registered hook never fires (grads come from backward).

    Why: a hook firing outside ``backward_dw`` would make DDP reduce twice.
    """
    n = 1 if kind == "linear" else 2
    module = build(reference, kind, n, 3, 2, bias=True, dtype=torch.float32, fused=False, delay=False)
    hooks = WgradHookRecorder(module)
    out = caller(module, kind, [4] if n == 1 else [1, 3])(torch.randn(4, 3))
    out.sum().backward()
    module.backward_dw()
    assert hooks.calls == 0 and module.need_backward_dw() is False
    assert all(getattr(module, w).grad is not None for w in weight_names(module))


# ---- skip_backward_post_hook marks -------------------------------------------------------

@pytest.mark.parametrize("delay", [True, False], ids=["delay", "nodelay"])
@pytest.mark.parametrize("kind", KINDS)
def test_skip_marks_survive_weight_replacement(kind, delay, in_process_ws1):
    """Delayed parameters stay marked ``skip_backward_post_hook`` after being replaced
    (by a fresh ``nn.Parameter`` or by GTP injection); nothing is marked without delay.

    Why: Megatron injects GTP weights *after* construction; a mark lost there makes DDP
    reduce the weight from a post-accumulate hook that never sees a gradient.
    """
    n = 1 if kind == "linear" else 2
    module = build(reference, kind, n, 3, 4, bias=True, dtype=torch.float32, fused=False, delay=delay)
    delays_bias = kind == "grouped_linear"  # TE's GroupedLinear delays bias grads, the others don't
    first = weight_names(module)[0]
    setattr(module, first, torch.nn.Parameter(torch.zeros(4, 3)))
    for name in weight_names(module):
        assert bool(getattr(getattr(module, name), "skip_backward_post_hook", False)) is delay, name
    b0 = bias_names(module)[0]
    setattr(module, b0, torch.nn.Parameter(torch.zeros(4)))
    for name in bias_names(module):
        assert bool(getattr(getattr(module, name), "skip_backward_post_hook", False)) is (delay and delays_bias)
    inject_gtp(module)
    for name in weight_names(module):
        p = getattr(module, name)
        assert isinstance(p, GTPWeight)
        assert bool(getattr(p, "skip_backward_post_hook", False)) is delay, name


# ---- bad input gets a clear error -------------------------------------------------------

class _FakeDistributed:
    """A non-tensor carrying the marker; records any protocol call made on it."""

    is_distributed_weight = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name):
        self.calls.append(name)
        raise AssertionError(f"backend used {name} on a non-tensor before rejecting it")


@pytest.mark.parametrize("kind", KINDS)
def test_non_tensor_distributed_weight_is_type_error(kind):
    """A non-tensor with ``is_distributed_weight=True`` as a weight raises TypeError.

    Why: CONTRACTS §2 requires a ``torch.Tensor`` subclass; anything else must be refused
    before the backend calls its protocol methods.
    """
    n = 1 if kind == "linear" else 2
    module = build(reference, kind, n, 3, 4, bias=False, dtype=torch.float32, fused=False, delay=False)
    name = weight_names(module)[0]
    fake = _FakeDistributed()
    delattr(module, name)            # drop the Parameter, then plant the object as attribute
    object.__setattr__(module, name, fake)
    with pytest.raises(TypeError, match=r"is_distributed_weight=True but is a _FakeDistributed, not a torch\.Tensor"):
        caller(module, kind, [2] if n == 1 else [1, 1])(torch.randn(2, 3))
    assert object.__getattribute__(fake, "calls") == []


def test_mixed_distributed_and_plain_group_is_type_error():
    """A group mixing GTP and plain weights raises TypeError (the leader can't speak for it).

    Why: group-level calls go through the leader only (§2); a half-distributed group would
    silently skip gathering some members.
    """
    module = build(reference, "grouped_linear", 2, 3, 4, bias=False, dtype=torch.float32, fused=False, delay=False)
    gtp = inject_gtp(module)
    module.weight1 = torch.nn.Parameter(torch.zeros(4, 3))
    with pytest.raises(TypeError, match="mixes distributed and plain weights"):
        module(torch.randn(2, 3), [1, 1])
    assert gtp.log.calls == []


@pytest.mark.parametrize("kind", ["grouped_linear", "ops_grouped_linear"])
@pytest.mark.parametrize(("splits", "match"), [
    ([2, 2], r"m_splits=\[2, 2\] sums to 4 but the input has 5 rows"),
    ([5, 0, 0], r"m_splits has 3 entries but num_gemms=2"),
    ([5], r"m_splits has 1 entries but num_gemms=2"),
    ([6, -1], r"m_splits=\[6, -1\] has a negative entry"),
])
def test_bad_m_splits_are_value_errors(kind, splits, match, in_process_ws1):
    """Splits that don't sum to the rows, of the wrong length or negative raise ValueError
    before any GEMM or collective (checked on a GTP weight: nothing was gathered).

    Why: a bad split reaching ``torch.split`` gives an opaque error, and on a distributed
    weight it would happen after ranks already entered collectives.
    """
    module = build(reference, kind, 2, 3, 4, bias=True, dtype=torch.float32, fused=False, delay=False)
    gtp = inject_gtp(module)
    with pytest.raises(ValueError, match=match):
        caller(module, kind, splits)(torch.randn(5, 3))
    assert gtp.log.calls == []


@pytest.mark.parametrize("bad_member", [0, 1])
@pytest.mark.parametrize("kind", KINDS)
def test_wrong_shape_grad_buffer_is_value_error(kind, bad_member, monkeypatch, in_process_ws1):
    """A ``grad_buffer()`` not of the full logical shape raises ValueError naming it,
    before finalize runs and without touching ``main_grad``.

    Why: writing a wgrad into a buffer of another shape would broadcast or truncate
    silently; the reduce-scatter would then deliver garbage into ``main_grad``.
    """
    n = 1 if kind == "linear" else 2
    bad_member = min(bad_member, n - 1)
    module = build(reference, kind, n, 3, 4, bias=False, dtype=torch.float32, fused=True, delay=False)
    gtp = inject_gtp(module)
    starts = attach_main_grad(module, 5)
    bad = getattr(module, weight_names(module)[bad_member])
    monkeypatch.setattr(bad, "grad_buffer", lambda: torch.zeros(3, 4), raising=False)
    out = caller(module, kind, [2] if n == 1 else [1, 1])(torch.randn(2, 3))
    with pytest.raises(ValueError, match=r"grad_buffer\(\) of weight\d has shape \(3, 4\); expected the full "
                                         r"logical shape \(4, 3\)"):
        out.sum().backward()
    assert gtp.log.count("finalize") == 0
    for name, start in starts.items():
        p = getattr(module, name)
        assert torch.equal(p.main_grad, start) and p.grad_added_to_main_grad is False


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("kind", KINDS)
def test_delay_with_distributed_weight_raises_before_anything(kind, fused, in_process_ws1):
    """``delay_wgrad_compute=True`` + a distributed weight raises NotImplementedError at
    forward, naming both, before any protocol call and with every gradient untouched.

    Why: the delayed wgrad would be finalized before it is computed (CONTRACTS §2); a
    rank that raised after entering a collective would hang the others.
    """
    n = 1 if kind == "linear" else 2
    module = build(reference, kind, n, 3, 4, bias=True, dtype=torch.float32, fused=fused, delay=True)
    gtp = inject_gtp(module)
    attach_main_grad(module, 9)
    before = param_state(module)
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"delay_wgrad_compute=True.*DistributedWeight"):
        caller(module, kind, [2] if n == 1 else [1, 1])(x)
    assert gtp.log.calls == [], f"protocol calls before the error: {gtp.log.calls}"
    after = param_state(module)
    for name, (grad, main_grad, flag) in before.items():
        g2, mg2, f2 = after[name]
        assert grad is None and g2 is None and f2 is flag and torch.equal(mg2, main_grad), name
    assert x.grad is None


def test_reference_autocast_steps_delayed_scales_and_nests_as_te():
    """The reference's own ``autocast``: after a delayed-scaling step each scale is
    ``fp8_max / amax`` of what was quantized (the first step multiplies at scale 1); nested,
    the innermost recipe applies (a current-scaling step keeps no delayed state)."""
    import harness.backends.reference as ref
    from harness.backends.reference.recipe import DelayedScaling, Float8CurrentScaling

    torch.manual_seed(0)
    m = ref.Linear(32, 32, params_dtype=torch.bfloat16)
    x = torch.randn(16, 32, dtype=torch.bfloat16, requires_grad=True)
    with ref.autocast(recipe=DelayedScaling()):
        with ref.autocast(recipe=Float8CurrentScaling()):
            m(x).sum().backward()
    assert [type(r).__name__ for r, _ in m._fp8_states.values()] == ["Float8CurrentScaling"]
    def scale(fmax: float, t: torch.Tensor) -> float:
        return float(torch.tensor(fmax, dtype=torch.float32) / t.detach().abs().float().max())

    with ref.autocast(recipe=DelayedScaling()):
        y = m(x)
    # the forward amaxes are stepped at autocast's exit, the gradient's at the end of backward
    forward = {"input": [scale(448.0, x)], "weight": [scale(448.0, m.weight)]}
    assert m.fp8_scales() == {**forward, "grad_output": [1.0]}
    y.sum().backward()
    assert m.fp8_scales() == {**forward, "grad_output": [57344.0]}  # dy = ones: amax 1


def test_a_recipe_cell_that_never_quantizes_is_red():
    """The hollow case of a recipe cell: a backend whose ``autocast`` does nothing runs every
    GEMM unquantized - each recipe cell fails against the quantization-aware oracle (and a
    delayed one has no scales to show), while the real reference passes the same cells."""
    import contextlib
    import types

    import harness.backends.reference as ref
    from harness.vocabulary import matrix, recipes, selection
    from harness.cell.runner import RankContext, run_cell

    hollow = types.ModuleType("hollow_autocast")
    hollow.__dict__.update({k: getattr(ref, k) for k in ref.__all__})
    hollow.autocast = lambda **kw: contextlib.nullcontext()
    ws1 = [c for c in matrix.select("ci") if c.world_size == 1 and c.expect == "pass" and not selection.requires(c)]
    cells = [c for r in recipes.QUANTIZED for c in [c for c in ws1 if c.recipe == r][:3]]
    assert len(cells) == 3 * len(recipes.QUANTIZED) == 15
    for c in cells:
        assert run_cell(ref, c, RankContext()).status == "pass", c.id
        failed = {k.name for k in run_cell(hollow, c, RankContext()).comparisons if not k.ok}
        assert any(n.startswith("mb") for n in failed), (c.id, failed)
        if c.recipe == "delayed":
            assert "fp8_scales" in failed, c.id
