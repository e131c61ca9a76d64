"""The harness's GTP weight (CONTRACTS §3), checked at world size 1 in-process.

The GTP weight is the implementer every backend is judged against, so a bug here would
produce false verdicts everywhere. Larger worlds are checked arithmetically (the padding
rule of ``shard_rows`` and which rows each rank keeps, with ``torch.distributed`` faked so
no collective can run); the collectives themselves are exercised by
``cases/test_multiprocess.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import harness.backends.reference as reference
from fixtures.modules import attach_main_grad, build, load_full
from fixtures.process_group import fake_world
from fixtures.tensors import seeded
from harness.cell.gtp import (Behaviour, CallLog, GTPWeight, inject_gtp, live_referents, reset_chain, shard_rows,
                              weight_names)

pytestmark = pytest.mark.usefixtures("single_thread")


def _grouped(n: int = 3, in_f: int = 4, out_f: int = 5, dtype: torch.dtype = torch.float32):
    """A reference GroupedLinear loaded with seeded full weights, and those weights."""
    module = build(reference, "grouped_linear", n, in_f, out_f, bias=False, dtype=dtype, fused=False, delay=False)
    full = [seeded((out_f, in_f), dtype, 50 + i) for i in range(n)]
    load_full(module, full, [])
    return module, full


# ---- shard_rows: the padding rule ----------------------------------------------------------

@pytest.mark.parametrize(("rows", "ws", "pad_multiple", "expected"), [
    (30, 1, 1, (30, 30)),
    (30, 2, 1, (30, 15)),
    (30, 4, 1, (32, 8)),
    (30, 8, 1, (32, 4)),
    (5, 2, 1, (6, 3)),
    (30, 1, 4, (32, 32)),
    (30, 2, 4, (32, 16)),
    (7, 4, 1, (8, 2)),
])
def test_shard_rows_examples(rows, ws, pad_multiple, expected):
    """Worked examples of the padding rule (CONTRACTS §3: pad to ``N * pad_multiple``).

    Why: the harness's default shape (30 rows) must need tail padding at ws 4 and 8 and
    none at 1 and 2 (``harness.cell.inputs.Example``); this pins that arithmetic.
    """
    assert shard_rows(rows, ws, pad_multiple) == expected


@pytest.mark.parametrize(("rows", "ws"), [(1, 2), (3, 4), (5, 4)])
def test_shard_rows_rejects_padding_only_ranks(rows, ws):
    """Without an alignment (``pad_multiple=1``), a world in which the last rank would hold
    nothing but padding is a ValueError.

    Why: padding only to divisibility, such a world means the shapes are too small for it
    (a README choice); under Megatron's alignment it is legal (next test).
    """
    with pytest.raises(ValueError, match=rf"rank {ws - 1} would hold only padding"):
        shard_rows(rows, ws, 1)


@pytest.mark.parametrize(("rows", "ws", "pad_multiple", "expected"), [
    (30, 2, 32, (64, 32)), (30, 4, 16, (64, 16)), (1, 8, 16, (128, 16)), (5, 4, 2, (8, 2))])
def test_shard_rows_allows_padding_only_ranks_under_alignment(rows, ws, pad_multiple, expected):
    """With an alignment (``pad_multiple > 1``) ranks holding only padding are legal.

    Why: CONTRACTS §3 - Megatron pads rows to a multiple of 16·N, so at N=4 the default 30
    rows leave ranks 2 and 3 with nothing but padding; a backend must survive that.
    """
    assert shard_rows(rows, ws, pad_multiple) == expected


@pytest.mark.parametrize(("rows", "ws", "pad_multiple"), [(10, 0, 1), (10, 2, 0), (10, -1, 1), (0, 1, 1)])
def test_shard_rows_rejects_bad_arguments(rows, ws, pad_multiple):
    """Non-positive rows, world sizes and pad multiples are a ValueError naming them."""
    with pytest.raises(ValueError, match=rf"rows={rows}, world_size={ws} and pad_multiple={pad_multiple} must be >= 1"):
        shard_rows(rows, ws, pad_multiple)


@settings(max_examples=40, deadline=None, database=None)
@given(rows=st.integers(1, 300), ws=st.integers(1, 16), pad_multiple=st.integers(1, 8))
def test_shard_rows_invariants(rows, ws, pad_multiple):
    """For any shape: padded is the least multiple of ``ws * pad_multiple`` that holds the
    rows, every rank gets the same count, and (without an alignment) the error fires exactly
    when the last rank would start at or past the real rows.

    Why: an off-by-one here silently drops or duplicates weight rows at some world size.
    """
    unit = ws * pad_multiple
    expected_padded = -(-rows // unit) * unit
    per_rank = expected_padded // ws
    if pad_multiple == 1 and (ws - 1) * per_rank >= rows:
        with pytest.raises(ValueError, match="only padding"):
            shard_rows(rows, ws, pad_multiple)
        return
    padded, s = shard_rows(rows, ws, pad_multiple)
    assert (padded, s) == (expected_padded, per_rank)
    assert padded % unit == 0 and padded - rows < unit and s * ws == padded
    if pad_multiple == 1:
        assert (ws - 1) * s < rows  # the last rank holds at least one real row


@pytest.mark.parametrize(("out_f", "ws"), [(30, 4), (30, 8), (5, 2), (6, 2), (7, 4)])
def test_inject_shards_rows_per_rank(out_f, ws, monkeypatch):
    """With a faked world, rank r keeps rows ``[r*s, (r+1)*s)`` of the zero-padded weight;
    the ranks' shards tile the padded weight exactly.

    Why: the shard layout is what finalize's reduce-scatter and the oracle's ``record_of``
    assume; checked without a process group (any collective would fail the test).
    """
    n, in_f = 2, 3
    full = [seeded((out_f, in_f), torch.float32, 70 + i) for i in range(n)]
    padded, s = shard_rows(out_f, ws)
    shards = {i: [] for i in range(n)}
    for rank in range(ws):
        module = build(reference, "grouped_linear", n, in_f, out_f, bias=False, dtype=torch.float32,
                       fused=False, delay=False)
        load_full(module, full, [])
        fake_world(monkeypatch, ws, rank)
        gtp = inject_gtp(module)
        monkeypatch.undo()
        assert (gtp.world_size, gtp.rank, gtp.padded_rows, gtp.rows_per_rank) == (ws, rank, padded, s)
        for i, name in enumerate(weight_names(module)):
            w = getattr(module, name)
            assert isinstance(w, GTPWeight) and w.shape == (s, in_f)
            assert w.logical_shape == (out_f, in_f) and w.padded_shape == (padded, in_f)
            shards[i].append(w.detach())
    for i in range(n):
        tiled = torch.cat(shards[i])
        assert torch.equal(tiled[:out_f], full[i])
        assert not tiled[out_f:].any(), "padding rows must be zero"


def test_inject_rejects_padding_only_world(monkeypatch):
    """``inject_gtp`` refuses a world size that leaves a rank with only padding.

    Why: it must fail at injection (construction time), not mid-step in a collective.
    """
    module, _ = _grouped(n=2, out_f=3)
    fake_world(monkeypatch, 4, 0)
    with pytest.raises(ValueError, match="rank 3 would hold only padding"):
        inject_gtp(module)
    assert not isinstance(module.weight0, GTPWeight), "a failed injection must leave the module alone"


def test_inject_rejects_module_without_weights():
    """A module without ``weight``/``weightN`` parameters is a ValueError."""
    with pytest.raises(ValueError, match="has no weight parameters to shard"):
        inject_gtp(torch.nn.ReLU())


def test_weight_names_are_numeric_order():
    """``weight10`` follows ``weight9`` (numeric, not lexicographic, group order).

    Why: the leader is ``weights[0]`` and finalize's list is in group order; a lexicographic
    sort would pair ``weight10``'s gradient with ``weight2``'s shard.
    """
    module = build(reference, "grouped_linear", 12, 2, 2, bias=True, dtype=torch.float32, fused=False, delay=False)
    assert weight_names(module) == [f"weight{i}" for i in range(12)]


# ---- materialize ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pad_multiple", [1, 4])
def test_materialize_shapes_dtype_requires_grad(dtype, pad_multiple, in_process_ws1):
    """Both materializes return detached, fresh tensors of the logical shape, the parameter
    dtype and the parameter's ``requires_grad``, equal to the full weights; a bare tensor
    for a group of one and a list for N; each call is logged on the leader.

    Why: CONTRACTS §3; returning the shard (or an alias of it) would let a backend save or
    mutate the parameter through the gathered copy.
    """
    module, full = _grouped(n=3, out_f=5, dtype=dtype)
    module.weight1.requires_grad_(False)
    gtp = inject_gtp(module, pad_multiple=pad_multiple)
    members = [getattr(module, n) for n in weight_names(module)]
    assert [m.requires_grad for m in members] == [True, False, True]
    assert all(m.dtype == dtype and m.shape == (gtp.padded_rows, 4) for m in members)
    assert gtp.padded_rows == (5 if pad_multiple == 1 else 8)
    for kind, fn in (("materialize_forward", members[0].materialize_group_for_forward),
                     ("materialize_backward", members[0].materialize_group_for_backward)):
        out = fn()
        assert isinstance(out, list) and len(out) == 3
        for m, w, ref in zip(members, out, full):
            assert w.shape == (5, 4) and w.dtype == dtype
            assert w.requires_grad is m.requires_grad and w.grad_fn is None and w.is_leaf
            assert not isinstance(w, GTPWeight)
            assert torch.equal(w.detach(), ref)
            assert w.data_ptr() != m.data_ptr()
        with torch.no_grad():
            out[0].add_(1.0)
        assert torch.equal(members[0].detach()[:5], full[0]), "materialized tensor aliases the shard"
        assert gtp.log.count(kind, 0) == 1 and gtp.log.count(kind) == 1

    single = build(reference, "linear", 1, 4, 5, bias=False, dtype=dtype, fused=False, delay=False)
    inject_gtp(single, pad_multiple=pad_multiple)
    one = single.weight.materialize_group_for_forward()
    assert isinstance(one, torch.Tensor) and one.shape == (5, 4)


def test_inject_with_initialized_world_size_1(gloo_world_size_1):
    """With a real single-rank gloo group, injection uses it and behaves as in-process ws=1.

    Why: the worker initializes a process group even for ws=1 launches.
    """
    module, full = _grouped(n=2)
    gtp = inject_gtp(module)
    assert (gtp.world_size, gtp.rank, gtp.group) == (1, 0, None)
    out = module.weight0.materialize_group_for_backward()
    assert all(torch.equal(a, b) for a, b in zip(out, full))


# ---- grad_buffer --------------------------------------------------------------------------

@pytest.mark.parametrize("main_grad_dtype", [torch.float32, None])
def test_grad_buffer_lazy_dtype_reused_poisoned(main_grad_dtype, in_process_ws1):
    """``grad_buffer()`` is allocated on first call (not at injection), has the *logical*
    shape and ``main_grad``'s dtype (the parameter's without one), starts poisoned with
    finite non-zero values, and the same buffer (with its contents) comes back next time;
    members have distinct buffers; every call is logged with its dtype.

    Why: reuse with poison is how the harness catches a backend that accumulates into the
    buffer instead of overwriting it (CONTRACTS §3).
    """
    module, _ = _grouped(n=2, out_f=5, dtype=torch.bfloat16)
    gtp = inject_gtp(module, pad_multiple=4)
    if main_grad_dtype is not None:
        attach_main_grad(module, 1)
    w0, w1 = module.weight0, module.weight1
    assert w0._grad_buffer is None and w1._grad_buffer is None, "allocated eagerly"
    want = main_grad_dtype or torch.bfloat16
    b0 = w0.grad_buffer()
    assert b0.shape == (5, 4) and b0.dtype == want
    assert w1._grad_buffer is None, "a member's buffer allocated by another's call"
    assert torch.isfinite(b0).all() and b0.count_nonzero() > b0.numel() // 2
    b0.fill_(3.0)
    again = w0.grad_buffer()
    assert again is b0 and torch.equal(again, torch.full_like(b0, 3.0))
    b1 = w1.grad_buffer()
    assert b1.data_ptr() != b0.data_ptr() and b1.count_nonzero() > 0
    expected_dtype = str(want).replace("torch.", "")
    assert [(c["member"], c["dtype"]) for c in gtp.log.calls] == [(0, expected_dtype)] * 2 + [(1, expected_dtype)]


def test_grad_buffer_follows_main_grad_dtype_change(in_process_ws1):
    """If ``main_grad`` appears (or changes dtype) later, the buffer is re-made in its dtype.

    Why: the buffer must always be in ``main_grad``'s dtype, the dtype finalize reduces in.
    """
    module, _ = _grouped(n=1, dtype=torch.float16)
    inject_gtp(module)
    w = module.weight0
    assert w.grad_buffer().dtype == torch.float16
    w.main_grad = torch.zeros(w.shape, dtype=torch.float32)
    assert w.grad_buffer().dtype == torch.float32


# ---- finalize ----------------------------------------------------------------------------

@pytest.mark.parametrize("pad_multiple", [1, 3])
def test_finalize_into_main_grad(pad_multiple, in_process_ws1):
    """With ``main_grad``: each member's shard is *added* to its (non-zero) ``main_grad``,
    the flag is set, padding rows keep their start, and the returned dummies are zeros of
    the shard shape and parameter dtype (a list for N, a bare tensor for one).

    Why: CONTRACTS §3; "overwrite instead of add" and a full-shape dummy are classic bugs.
    """
    module, _ = _grouped(n=2, out_f=5, dtype=torch.bfloat16)
    gtp = inject_gtp(module, pad_multiple=pad_multiple)
    starts = attach_main_grad(module, 2)
    wgrads = [seeded((5, 4), torch.float32, 90 + i) for i in range(2)]
    out = module.weight0.finalize_group_grads(wgrads)
    assert isinstance(out, list) and len(out) == 2
    for i, name in enumerate(("weight0", "weight1")):
        p = getattr(module, name)
        expected = starts[name].clone()
        expected[:5] += wgrads[i]  # ws=1: the 1/N pre-scale is exact
        assert torch.equal(p.main_grad, expected)
        assert p.grad_added_to_main_grad is True
        assert out[i].shape == p.shape and out[i].dtype == torch.bfloat16 and not out[i].any()
    assert gtp.log.calls[-1] == {"kind": "finalize", "member": 0, "dtypes": ["float32", "float32"],
                                 "shapes": [[5, 4], [5, 4]]}
    assert gtp.log.finalize_dtypes() == ["float32", "float32"]

    single = build(reference, "linear", 1, 4, 5, bias=False, dtype=torch.float32, fused=False, delay=False)
    inject_gtp(single, pad_multiple=pad_multiple)
    attach_main_grad(single, 3)
    dummy = single.weight.finalize_group_grads(torch.ones(5, 4))
    assert isinstance(dummy, torch.Tensor) and dummy.shape == single.weight.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finalize_without_main_grad_returns_shard(dtype, in_process_ws1):
    """Without ``main_grad``: finalize returns the reduced shard (padded rows zero) in the
    dtype it was given and sets no flag.

    Why: unfused without main_grad, finalize's return value *is* the gradient autograd
    receives (CONTRACTS §2), so its shape must be the parameter's and its dtype unchanged.
    """
    module, _ = _grouped(n=2, out_f=5, dtype=dtype)
    gtp = inject_gtp(module, pad_multiple=2)
    wgrads = [seeded((5, 4), dtype, 95 + i) for i in range(2)]
    out = module.weight0.finalize_group_grads(wgrads)
    for i, name in enumerate(("weight0", "weight1")):
        p = getattr(module, name)
        assert out[i].shape == p.shape == (6, 4) and out[i].dtype == dtype
        assert torch.equal(out[i][:5], wgrads[i]) and not out[i][5:].any()
        assert not hasattr(p, "main_grad") and not getattr(p, "grad_added_to_main_grad", False)
    assert gtp.log.finalize_dtypes() == [str(dtype).replace("torch.", "")] * 2


def test_finalize_rejects_bad_wgrads(in_process_ws1):
    """Wrong count, wrong shape (e.g. the shard's) or a wrong-shaped ``main_grad`` raise
    ValueError with the expected shapes, before anything is written.

    Why: these are backend bugs the harness must name, not crash on obscurely.
    """
    module, _ = _grouped(n=2, out_f=5)
    inject_gtp(module, pad_multiple=2)
    w0 = module.weight0
    with pytest.raises(ValueError, match="got 1 wgrads for a group of 2"):
        w0.finalize_group_grads([torch.zeros(5, 4)])
    with pytest.raises(ValueError, match=r"wgrad 1 has shape \(6, 4\), expected the logical shape \(5, 4\)"):
        w0.finalize_group_grads([torch.zeros(5, 4), torch.zeros(6, 4)])
    for name in ("weight0", "weight1"):
        getattr(module, name).main_grad = torch.zeros(5, 4)  # logical, not shard, shape
    with pytest.raises(ValueError, match=r"weight0\.main_grad has shape \(5, 4\), expected the shard shape \(6, 4\)"):
        w0.finalize_group_grads([torch.ones(5, 4), torch.ones(5, 4)])


def test_call_log_counts_and_order():
    """``CallLog`` counts by kind and member, keeps order, and flattens finalize dtypes.

    Why: every protocol check of the harness (§2 call counts, finalize dtypes) reads it.
    """
    log = CallLog()
    log.add("materialize_forward", 0)
    log.add("grad_buffer", 1, dtype="float32")
    log.add("finalize", 0, dtypes=["float32", "bfloat16"], shapes=[[2, 2], [2, 2]])
    log.add("finalize", 1, dtypes=["float16"], shapes=[[2, 2]])
    assert log.count("finalize") == 2 and log.count("finalize", 0) == 1 and log.count("finalize", 2) == 0
    assert log.count("grad_buffer", 1) == 1 and log.count("materialize_backward") == 0
    assert log.finalize_dtypes() == ["float32", "bfloat16", "float16"]
    assert [c["kind"] for c in log.calls] == ["materialize_forward", "grad_buffer", "finalize", "finalize"]


def test_module_step_logs_protocol_on_leader(in_process_ws1):
    """A fused GroupedLinear step through the reference logs exactly: forward-materialize,
    backward-materialize, one grad_buffer per member, one finalize - all group calls on
    the leader - in that order.

    Why: the log must reflect what the backend did, call by call, for §2's checks to hold.
    """
    module, _ = _grouped(n=3, out_f=5)
    module.fuse_wgrad_accumulation = True
    gtp = inject_gtp(module)
    attach_main_grad(module, 4)
    module(torch.randn(4, 4), [1, 0, 3]).sum().backward()
    assert [(c["kind"], c["member"]) for c in gtp.log.calls] == [
        ("materialize_forward", 0), ("materialize_backward", 0),
        ("grad_buffer", 0), ("grad_buffer", 1), ("grad_buffer", 2), ("finalize", 0),
    ]
    assert math.prod(gtp.logical_shape) == 20


# ---- the Megatron behaviours (CONTRACTS §2 "what an implementer may do", each selectable) -

def _chained_pair(n: int = 2, behaviour: Behaviour | None = None):
    """A chain head (a Linear) and a GroupedLinear after it, both asynchronous, both with a
    seeded main_grad, joined in first-forward order."""
    behaviour = behaviour or Behaviour(async_finalize=True)
    reset_chain()
    head = build(reference, "linear", 1, 4, 5, bias=False, dtype=torch.float32, fused=False, delay=False)
    head_gtp = inject_gtp(head, behaviour=behaviour)
    module, full = _grouped(n=n, out_f=5)
    gtp = inject_gtp(module, behaviour=behaviour)
    attach_main_grad(head, 7)
    starts = attach_main_grad(module, 8)
    head.weight.materialize_group_for_forward()
    module.weight0.materialize_group_for_forward()
    return head, head_gtp, module, gtp, starts


def test_async_finalize_delivers_when_the_previous_chain_weight_finalizes(in_process_ws1):
    """Asynchronous: the later chain weight's finalize returns None (a tuple of Nones for a
    list) and leaves ``main_grad`` and the flag alone; the reduction - reading the wgrads
    *then* - lands when the previous weight (the chain head) finalizes, which itself is
    synchronous and returns its placeholder.

    Why: CONTRACTS §2 - Megatron's ``async_reduction=True`` delivers along the prefetch
    chain (backward runs in reverse forward order); a backend that reads ``main_grad`` or
    reuses its wgrads right after finalize must see what it would see with Megatron.
    """
    head, head_gtp, module, gtp, starts = _chained_pair()
    assert (head_gtp.prev, head_gtp.next, gtp.prev, gtp.next) == (None, gtp, head_gtp, None)
    wgrads = [seeded((5, 4), torch.float32, 60 + i) for i in range(2)]
    module.weight0.materialize_group_for_backward(nvtx_label="bwd")  # keyword arguments accepted
    assert module.weight0.finalize_group_grads(wgrads, nvtx_label="rs") == (None, None)
    for name in ("weight0", "weight1"):
        p = getattr(module, name)
        assert torch.equal(p.main_grad, starts[name]) and p.grad_added_to_main_grad is False
    wgrads[1].mul_(2.0)  # read at delivery, as Megatron's reduce-scatter reads without padding
    dummy = head.weight.finalize_group_grads(torch.zeros(5, 4))
    assert isinstance(dummy, torch.Tensor) and dummy.shape == head.weight.shape
    for i, name in enumerate(("weight0", "weight1")):
        p = getattr(module, name)
        assert torch.equal(p.main_grad, starts[name] + wgrads[i]) and p.grad_added_to_main_grad is True


def test_reset_chain_starts_a_new_model(in_process_ws1):
    """After :func:`reset_chain` a new group never links to a group of the previous model.

    Why: the chain is process-global (as Megatron's ``_chain_state``); without a reset a
    cell's weight would wait on the previous cell's weight to deliver its gradient.
    """
    _, _, _, old, _ = _chained_pair()
    reset_chain()
    module, _ = _grouped(n=1)
    fresh = inject_gtp(module, behaviour=Behaviour(async_finalize=True))
    module.weight0.materialize_group_for_forward()
    assert fresh.prev is None and old.next is None


def test_shared_buffers_go_stale_at_the_next_materialize(in_process_ws1):
    """Shared buffers: each materialize returns correct copies (fresh tensor objects), and
    the previous call's copies read NaN once the next materialize - forward or backward -
    has run.

    Why: CONTRACTS §2 - materializations may be borrowed from a cache "valid until the next
    materialize"; a copy kept across a later materialize must show.
    """
    module, full = _grouped(n=2, out_f=5)
    gtp = inject_gtp(module, behaviour=Behaviour(shared_buffers=True))
    fwd = module.weight0.materialize_group_for_forward()
    assert all(torch.equal(w.detach(), f) for w, f in zip(fwd, full))
    bwd = module.weight0.materialize_group_for_backward()
    assert all(torch.equal(w.detach(), f) for w, f in zip(bwd, full))
    assert all(torch.isnan(w).all() for w in fwd), "the forward copies outlived the next materialize"
    again = module.weight0.materialize_group_for_forward()
    assert all(torch.isnan(w).all() for w in bwd + fwd), "a stale copy became valid again"
    assert all(torch.equal(w.detach(), f) for w, f in zip(again, full))
    assert again[0] is not fwd[0] and all(w.requires_grad for w in again)
    del fwd, again
    assert gtp.live_forward_gathers() == 0


def test_live_referents_rules_out_cycles_and_collects_only_above_the_floor():
    """A tensor kept only by a reference cycle is not alive; one a caller holds is. At or
    below ``floor`` (the count the caller already has) the count is taken as it is: a
    cycle-held tensor still counts there, since that count cannot raise the caller's maximum."""
    import gc
    import weakref

    held, cyclic = torch.ones(2), torch.ones(2)
    loop: list = [cyclic]
    loop.append(loop)  # a cycle: only a collection frees it
    refs = [weakref.ref(held), weakref.ref(cyclic)]
    del cyclic, loop
    gc.disable()
    try:
        assert live_referents(refs, floor=2) == 2  # no collection: the cycle still holds it
        assert live_referents(refs) == 1           # above the floor: collected, exact
    finally:
        gc.enable()
    assert live_referents(refs, floor=1) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_fill_grad_buffer_and_placeholder(dtype, in_process_ws1):
    """NaN fill: every ``grad_buffer()`` call hands out NaN (uninitialised memory), and a
    synchronous finalize returns a NaN placeholder of ``main_grad``'s shape in the
    parameter's dtype - while ``main_grad`` gets exactly the reduced wgrad.

    Why: CONTRACTS §2 - Megatron's buffers and placeholders are uninitialised; NaN makes a
    backend that reads them (accumulates, or adds the placeholder) fail visibly.
    """
    module, _ = _grouped(n=2, out_f=5, dtype=dtype)
    inject_gtp(module, behaviour=Behaviour(nan_fill=True, pad_multiple=16))
    starts = attach_main_grad(module, 3)
    buf = module.weight1.grad_buffer()
    assert buf.shape == (5, 4) and buf.dtype == torch.float32 and torch.isnan(buf).all()
    buf.zero_()
    assert torch.isnan(module.weight1.grad_buffer()).all()
    wgrads = [seeded((5, 4), torch.float32, 40 + i) for i in range(2)]
    out = module.weight0.finalize_group_grads(wgrads)
    for i, name in enumerate(("weight0", "weight1")):
        p = getattr(module, name)
        assert p.shape == (16, 4) and out[i].shape == p.main_grad.shape and out[i].dtype == dtype
        assert torch.isnan(out[i]).all()
        expected = starts[name].clone()
        expected[:5] += wgrads[i]
        assert torch.equal(p.main_grad, expected)


def test_copies_without_requires_grad(in_process_ws1):
    """``copies_require_grad=False``: gathered copies never require grad, whatever the
    parameter says (TE PR #3517's implementer)."""
    module, _ = _grouped(n=2)
    inject_gtp(module, behaviour=Behaviour(copies_require_grad=False))
    assert module.weight0.requires_grad
    for fn in (module.weight0.materialize_group_for_forward, module.weight0.materialize_group_for_backward):
        assert not any(w.requires_grad for w in fn())


def test_inplace_scale_at_ws1_leaves_wgrads_alone(in_process_ws1):
    """In-place scaling multiplies by 1/N only when N > 1 (as Megatron's pre-scale): at
    N = 1 the caller's wgrads are untouched and still delivered.

    Why: a spurious ``mul_(1.0)`` is harmless, but a scale at N = 1 by anything else is a
    bug; N > 1 is proven against Megatron's class in the differential test.
    """
    module, _ = _grouped(n=1)
    inject_gtp(module, behaviour=Behaviour(inplace_scale=True))
    starts = attach_main_grad(module, 5)
    wg = seeded((5, 4), torch.float32, 33)
    keep = wg.clone()
    module.weight0.finalize_group_grads(wg)
    assert torch.equal(wg, keep) and torch.equal(module.weight0.main_grad, starts["weight0"] + keep)


# ---- Megatron's attach: how the weights are put into the module --------------------------

@pytest.mark.parametrize("kind", ["linear", "grouped_linear", "ops_grouped_linear"])
def test_megatron_attach_moves_the_weights_behind_the_biases(kind, in_process_ws1):
    """``megatron_attach``: every weight is re-registered as Megatron's
    ``_gtp_wrap_bf16_shard`` does (``delattr``, then ``_parameters[name] = ...``), so it moves
    behind the biases; the replaced parameter's tensor-parallel attributes come along, a
    grouped module's members carry ``is_routed_expert`` / ``expert_idx`` and the leader the
    member list as ``weight_list``. Without it each weight keeps its parameter's slot.

    Why: TE's op-fuser pairs gradients with ``list(op.parameters())``, which follows the
    registration order; a stand-in that kept the order could not show a backend that assumes
    it (the differential test proves the order, and these attributes, equal to Megatron's).
    """
    groups = 1 if kind == "linear" else 2
    mods = [build(reference, kind, groups, 4, 5, bias=True, dtype=torch.float32, fused=False, delay=False)
            for _ in range(2)]
    before = [n for n, _ in mods[0].named_parameters()]
    mods[0].get_parameter(weight_names(mods[0])[0]).partition_dim = 0  # as TE's set_tensor_model_parallel_attributes
    inject_gtp(mods[0], behaviour=Behaviour(megatron_attach=True))
    inject_gtp(mods[1])
    names = weight_names(mods[0])
    after = [n for n, _ in mods[0].named_parameters()]
    assert after == [n for n in before if n not in names] + names != before
    assert [n for n, _ in mods[1].named_parameters()] == before
    members = [mods[0].get_parameter(n) for n in names]
    assert members[0].partition_dim == 0 and not hasattr(mods[1].get_parameter(names[0]), "partition_dim")
    assert [m._debug_name for m in members] == names
    grouped = kind != "linear"
    assert [(m.is_routed_expert, m.expert_idx) for m in members] == [
        (grouped, i if grouped else None) for i in range(len(members))]
    leader_list = members[0].weight_list
    assert [id(w) for w in leader_list] == [id(m) for m in members] if grouped else leader_list is None
    assert all(m.weight_list is None for m in members[1:])
    assert all(m.get_data_tensors() == (m,) for m in members)  # TE's offload marking


def test_reference_survives_the_reregistered_weights(in_process_ws1):
    """The reference's ``ops.GroupedLinear`` takes its weights and biases by name, so a step
    with the weights re-registered behind the biases gives bitwise the gradients of a step
    without - the contract TE's op-fuser breaks (ledger ``ops-grads-in-registration-order-assumed``)."""
    results = []
    for attach in (False, True):
        module = build(reference, "ops_grouped_linear", 2, 4, 5, bias=True, dtype=torch.float32, fused=False,
                       delay=False)
        load_full(module, [seeded((5, 4), torch.float32, 60 + i) for i in range(2)],
                  [seeded((5,), torch.float32, 70 + i) for i in range(2)])
        inject_gtp(module, behaviour=Behaviour(megatron_attach=attach))
        attach_main_grad(module, 9, names=["weight0", "weight1"])
        assert [n for n, _ in module.named_parameters()][0] == ("bias0" if attach else "weight0")
        x = seeded((6, 4), torch.float32, 80).requires_grad_()
        module(x, torch.tensor([2, 4])).sum().backward()
        results.append({"x": x.grad, **{n: p.main_grad if n.startswith("weight") else p.grad
                                        for n, p in module.named_parameters()}})
    assert results[0].keys() == results[1].keys()
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def _block_layout(rows: int, cols: int) -> dict[str, torch.Tensor]:
    """A 2D-block-scaled tensor's parts in TE's layouts (``Float8BlockQuantizer``'s
    ``get_scale_shape`` and ``get_columnwise_shape``), numbered so that a slice shows: row-wise
    data (rows, cols) and scales (row tiles, col tiles padded to 4); column-wise data
    transposed (cols, rows) and scales (col tiles, row tiles padded to 4)."""
    tiles = lambda n: math.ceil(n / 128)  # noqa: E731
    pad4 = lambda n: math.ceil(n / 4) * 4  # noqa: E731
    return {"rowwise_data": torch.arange(rows * cols).reshape(rows, cols),
            "rowwise_scale_inv": torch.arange(tiles(rows) * pad4(tiles(cols)), dtype=torch.float32).reshape(tiles(rows), -1),
            "columnwise_data": torch.arange(rows * cols).reshape(rows, cols).t().contiguous(),
            "columnwise_scale_inv": torch.arange(tiles(cols) * pad4(tiles(rows)), dtype=torch.float32).reshape(tiles(cols), -1)}


@pytest.mark.parametrize("rows,padded,cols", [(30, 64, 32), (272, 512, 272), (100, 256, 48), (130, 1024, 300),
                                              (128, 256, 128), (500, 512, 128)])
def test_a_gathered_block_scaled_weight_loses_exactly_its_padding_rows(rows, padded, cols):
    """``gtp_native._strip_blocks``: what is left has the logical tensor's layout, holds the
    gathered tensor's first rows (data) and the scales of their tiles, zeros where TE pads the
    column-wise scales to a multiple of 4; a row-wise-only or column-wise-only tensor keeps
    its one part."""
    from harness.cell.gtp_native import _strip_blocks

    gathered, want = _block_layout(padded, cols), _block_layout(rows, cols)
    tiles = math.ceil(rows / 128)
    for keep in (("rowwise_data", "rowwise_scale_inv"), ("columnwise_data", "columnwise_scale_inv")):
        meta = {k: (v if k in keep else None) for k, v in gathered.items()}
        _strip_blocks(meta, rows, True)
        for k in keep:
            assert meta[k].shape == want[k].shape and meta[k].is_contiguous(), (k, meta[k].shape, want[k].shape)
        if "rowwise_data" in keep:
            assert torch.equal(meta["rowwise_data"], gathered["rowwise_data"][:rows])
            assert torch.equal(meta["rowwise_scale_inv"], gathered["rowwise_scale_inv"][:tiles])
        else:
            assert torch.equal(meta["columnwise_data"], gathered["columnwise_data"][:, :rows])
            assert torch.equal(meta["columnwise_scale_inv"][:, :tiles], gathered["columnwise_scale_inv"][:, :tiles])
            assert not meta["columnwise_scale_inv"][:, tiles:].any()
    with pytest.raises(NotImplementedError, match="1D block-scaled"):
        _strip_blocks(dict(gathered), rows, False)


@pytest.mark.parametrize("shard,whole", [(128, True), (256, True), (16, False), (80, False)])
def test_block_scaled_shards_of_whole_tiles_are_quantized_as_the_whole(shard, whole):
    """Why the native stand-in's block-scaled shards are whole 128-row tiles
    (``weights.STANDIN_BLOCK_PAD``): TE 2.20.2 gathers a 2D-block weight by dequantizing each
    shard - quantized under its own tiles - and quantizing the gathered whole again. A shard of
    whole tiles has the whole weight's tiles, so that equals the oracle's one quantization
    (``quantized.tiled``) every time; a shard of part of a tile has a smaller amax, a finer
    power-of-two scale, and where a value falls below FP8's normal range there the two
    roundings differ (Megatron's 16-row alignment: a 272-row weight's shards of 16 or 80 rows)."""
    from harness.cell.quantized import FORMATS, tiled

    fmt, rows, differing = FORMATS["e4m3"], 272, []
    for seed in range(5):
        w = seeded((rows, 272), torch.bfloat16, seed=seed).to(torch.float64)
        padded = torch.nn.functional.pad(w, (0, 0, 0, -rows % shard))
        twice = tiled(torch.cat([tiled(s, 128, fmt, torch.bfloat16) for s in padded.split(shard)]), 128, fmt,
                      torch.bfloat16)[:rows]
        differing.append(int((twice != tiled(w, 128, fmt, torch.bfloat16)).sum()))
    assert (not any(differing)) == whole, differing
