"""The checks themselves: tolerance messages, and planted faults each new check must catch.

Every check in ``harness.cell.runner`` exists to catch something; these tests plant the
something (in-process, world size 1) and assert the named check fails - so a check that
silently stopped checking would turn this file red.
"""

from __future__ import annotations

import math

import pytest
import torch

import harness.backends.reference as reference
import harness.backends.reference.prefix as prefix
from harness.vocabulary import matrix, modules, selection
from harness.cell import compare, twin
from harness.cell.oracle import Reference
from harness.backends.reference import _core, _modules
from harness.backends.reference._core import ReferenceImpl
from harness.cell.runner import RankContext, run_cell
from harness.records.record import Check, RankResult


def _failed(backend, cell: matrix.Cell) -> set[str]:
    res = run_cell(backend, cell, RankContext())
    return {c.name for c in res.comparisons if not c.ok}


def _cell(**kw) -> matrix.Cell:
    base = dict(module="grouped_linear", weight="plain", hooks="off", fused=True, dtype="fp32",
                world_size=1, consumer="ddp", microbatches=2, num_gemms=4, bias=True,
                input_grad=True, delay_wgrad=True)
    base.update(kw)
    return matrix.Cell(**base)


class _Backend:
    """A module-like namespace around replacement classes (the reference for the rest)."""

    def __init__(self, **classes) -> None:
        self.Linear = classes.get("Linear", reference.Linear)
        self.GroupedLinear = classes.get("GroupedLinear", reference.GroupedLinear)
        self.ops = reference.ops


def test_reference_passes_the_cells_used_below():
    for fused in (True, False):
        assert not _failed(reference, _cell(fused=fused))


def test_hook_before_gradients_is_caught():
    class EarlyHook(ReferenceImpl):
        def weight_grads(self, call, *args):
            if call.delay:
                call.module._fire_wgrad_hooks()
            return super().weight_grads(call, *args)

        def fire_wgrad_hooks(self, module, call):
            pass

    class Grouped(_modules.GroupedLinear):
        _impl = EarlyHook()

    assert "wgrad_hooks_after_gradients" in _failed(_Backend(GroupedLinear=Grouped), _cell())


def test_bias_marked_but_not_delayed_is_caught():
    class Grouped(_modules.GroupedLinear):
        _delay_bias = False

        def _delayed_param_names(self):
            return self._weight_names + self._bias_names   # marks biases it does not delay

    assert "bias0.marked_iff_delayed" in _failed(_Backend(GroupedLinear=Grouped), _cell())


def test_unmarked_delayed_weight_is_caught():
    class Grouped(_modules.GroupedLinear):
        def _delayed_param_names(self):
            return self._bias_names

    failed = _failed(_Backend(GroupedLinear=Grouped), _cell())
    assert "weight0.skip_backward_post_hook" in failed


def test_weight_grad_in_main_backward_is_caught():
    """A backend that ignores delay for the weight gradient delivers it in the main backward
    and never fires the hooks: the gradient stays in .grad, main_grad misses it (§4)."""
    class Eager(ReferenceImpl):
        def fire_wgrad_hooks(self, module, call):
            module._fire_wgrad_hooks()

    class Grouped(_modules.GroupedLinear):
        _impl = Eager()

        def _run(self, inp, m_splits, first_microbatch=None):
            self.delay_wgrad_compute, was = False, self.delay_wgrad_compute
            try:
                return super()._run(inp, m_splits, first_microbatch)
            finally:
                self.delay_wgrad_compute = was

    failed = _failed(_Backend(GroupedLinear=Grouped), _cell(fused=False))
    assert "weight0.main_grad" in failed
    assert "wgrad_hook_calls" in failed


def test_main_grad_changed_by_delayed_main_backward_is_caught(monkeypatch):
    """A backend that writes main_grad in the main backward although wgrad is delayed."""
    orig = _core.GroupGemm.backward

    def backward(ctx, grad_out):
        if ctx.call.delay:
            for i in range(ctx.call.n):
                getattr(ctx.call.module, f"weight{i}").main_grad.mul_(1.5)
        return orig(ctx, grad_out)

    monkeypatch.setattr(_core.GroupGemm, "backward", staticmethod(backward))
    failed = _failed(reference, _cell(fused=True))
    assert {f"weight{i}.main_grad_untouched_by_main_backward" for i in range(4)} <= failed, failed


def _placeholder_in_main_backward(monkeypatch) -> None:
    """The delayed main backward hands autograd a non-zero placeholder weight gradient, as
    TE's does for Megatron (CONTRACTS §4 allows it, as long as it never reaches main_grad)."""
    orig = _core.GroupGemm.backward

    def backward(ctx, grad_out):
        grads = list(orig(ctx, grad_out))
        call = ctx.call
        if call.delay:
            for i in range(call.n):
                if ctx.needs_input_grad[2 + i]:
                    grads[2 + i] = torch.ones_like(getattr(call.module, f"weight{i}"))
        return tuple(grads)

    monkeypatch.setattr(_core.GroupGemm, "backward", staticmethod(backward))


def test_delayed_placeholder_that_never_reaches_main_grad_passes(monkeypatch):
    """Fused: backward_dw() marks the weights grad_added_to_main_grad, the consumer's hook
    drops the placeholder - allowed by §4, so nothing fails."""
    _placeholder_in_main_backward(monkeypatch)
    assert not _failed(reference, _cell(fused=True))


def test_delayed_placeholder_that_reaches_main_grad_is_caught(monkeypatch):
    """Unfused: backward_dw() adds the real wgrad onto the placeholder in .grad and the
    consumer folds both into main_grad - a wrong gradient of record."""
    _placeholder_in_main_backward(monkeypatch)
    failed = _failed(reference, _cell(fused=False))
    assert {f"weight{i}.main_grad" for i in range(4)} <= failed, failed
    assert not any(n.endswith("main_grad_untouched_by_main_backward") for n in failed), failed


def test_accumulating_into_grad_buffer_is_caught():
    """grad_buffer() is poisoned and reused: a backend that adds instead of overwriting fails."""
    class Accumulate(ReferenceImpl):
        def write_buffer(self, buf, wgrad, index):
            buf.add_(wgrad)

    class Grouped(_modules.GroupedLinear):
        _impl = Accumulate()

    cell = _cell(weight="distributed", delay_wgrad=False, microbatches=1)
    assert any(n.endswith("main_grad") for n in _failed(_Backend(GroupedLinear=Grouped), cell))


# ---- the tolerance policy -------------------------------------------------------------

def _ref(values: torch.Tensor, magnitude: float = 1.0, reduction: int = 16, roundings: int = 1) -> Reference:
    v = values.to(torch.float64)
    return Reference(v, torch.full_like(v, magnitude), reduction, roundings)


def test_bound_is_derived_from_unit_roundoff():
    """bf16 value, fp32 accumulation: C * (u16 * |v| + u16 * (r - 1) * mag + r * eta + u32 * sqrt(n) * mag)."""
    ref = _ref(torch.full((4,), 1.5), magnitude=2.0, reduction=16, roundings=2)
    u16, u32 = compare.UNIT_ROUNDOFF["bf16"], compare.UNIT_ROUNDOFF["fp32"]
    bound = compare.MARGIN * (u16 * 1.5 + u16 * 1 * 2.0 + 2 * 2.0**-134 + u32 * math.sqrt(16) * 2.0)
    inside = compare.compare_tensor("t", torch.full((4,), 1.5 + bound * 0.99, dtype=torch.float64), ref, "bf16")
    outside = compare.compare_tensor("t", torch.full((4,), 1.5 + bound * 1.01, dtype=torch.float64), ref, "bf16")
    assert inside.ok and inside.ratio == pytest.approx(0.99)
    assert not outside.ok and outside.mismatched == 4 and outside.ratio == pytest.approx(1.01)


def test_bf16_accumulation_exceeds_the_fp32_accumulation_bound():
    """Summing 1,024 random bf16 products recursively in bf16 (the class of TE PR #3397) fails
    the bound that assumes fp32 accumulation; the same sum in fp32, rounded once, passes."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 1024, generator=g).to(torch.bfloat16)
    b = torch.randn(1024, generator=g).to(torch.bfloat16)
    exact = a.double() @ b.double()
    ref = Reference(exact, a.double().abs() @ b.double().abs(), reduction=1024, roundings=1)
    acc = torch.zeros(64, dtype=torch.bfloat16)
    for k in range(1024):
        acc = acc + a[:, k] * b[k]
    assert not compare.compare_tensor("bf16 acc", acc, ref, "bf16").ok
    assert compare.compare_tensor("fp32 acc", (a.float() @ b.float()).to(torch.bfloat16), ref, "bf16").ok


def test_fp16_underflow_is_bounded_absolutely():
    """An fp16 value that rounds into the subnormals errs by up to 2^-25 whatever its size."""
    tiny = torch.tensor([3.1e-8, 1.0e-7], dtype=torch.float64)
    ref = Reference(tiny, tiny.abs(), reduction=1, roundings=1)
    assert compare.compare_tensor("t", tiny.to(torch.float16), ref, "fp16").ok
    assert not compare.compare_tensor("t", tiny.to(torch.float16) * 2, ref, "fp16").ok


def test_message_has_assert_close_shape_and_oracle_view():
    ref = _ref(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    actual = torch.tensor([[1.0, 2.0], [3.0, 4.5]])
    check = compare.compare_tensor("[rank 0]['weight1'].main_grad", actual, ref, "fp32")
    assert not check.ok
    assert check.message.startswith("Tensors are not close! Mismatched elements: 1 / 4 (25.0%)")
    assert "greatest abs diff 0.5 at (1, 1)" in check.message
    assert "fp64 oracle at (1, 1): expected 4, got 4.5" in check.message
    assert check.message.endswith("The failure occurred for item [rank 0]['weight1'].main_grad")
    assert check.index == [1, 1] and check.max_abs == pytest.approx(0.5)


def test_zero_magnitude_demands_exact_values():
    ref = _ref(torch.zeros(3), magnitude=0.0)
    assert compare.compare_tensor("t", torch.zeros(3), ref, "fp32").ok
    assert not compare.compare_tensor("t", torch.tensor([0.0, 1e-30, 0.0]), ref, "fp32").ok


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_values_never_pass(bad):
    ref = _ref(torch.ones(3), magnitude=1e9)
    assert not compare.compare_tensor("t", torch.tensor([1.0, bad, 1.0]), ref, "fp32").ok


def test_shape_and_missing_tensors_fail_with_a_reason():
    ref = _ref(torch.ones(2, 3))
    assert "shape (3, 2)" in compare.compare_tensor("t", torch.ones(3, 2), ref, "fp32").message
    assert "is None" in compare.compare_tensor("t", None, ref, "fp32").message


# ---- exact contract checks and twins (issue 13) -----------------------------------------

def test_padding_rows_are_checked_bit_for_bit(monkeypatch):
    """A backend that nudges every main_grad row by one part in 2^20 - far inside the
    tolerance - is caught on the padding rows, which must keep their start value exactly."""
    orig = _core.GroupGemm.backward

    def backward(ctx, grad_out):
        for i in range(ctx.call.n):
            getattr(ctx.call.module, f"weight{i}").main_grad.mul_(1 + 2 ** -20)
        return orig(ctx, grad_out)

    monkeypatch.setattr(_core.GroupGemm, "backward", staticmethod(backward))
    failed = _failed(reference, _cell(weight="gtp_pad16", delay_wgrad=False))
    assert {f"weight{i}.padding_rows_untouched" for i in range(4)} <= failed, failed


def test_main_grad_rebinding_is_caught_by_identity():
    from harness.backends.reference import mutants

    failed = _failed(mutants.get("main-grad-rebound"), _cell(delay_wgrad=False, fused=True))
    assert failed == {f"weight{i}.main_grad_kept" for i in range(4)}, failed


@pytest.mark.parametrize("hooks", ["identity", "offload", "save_on_cpu", "checkpoint"])
def test_reference_equals_its_hooks_off_twin_bitwise(hooks):
    res = run_cell(reference, _cell(weight="gtp_mcore", hooks=hooks, delay_wgrad=False, dtype="bf16"), RankContext())
    twins = [c for c in res.comparisons if c.kind == "twin"]
    assert res.status == "pass" and len(twins) >= 2 * 2 + 8 + 4, [c.name for c in twins]
    assert {c.name for c in twins} >= {"twin.mb0.output", "twin.mb1.input_grad", "twin.weight3.main_grad",
                                       "twin.materialize_forward_calls"}


def _verdicts(res) -> tuple:
    return res.status, [(c.name, c.ok, c.message) for c in res.comparisons]


@pytest.mark.parametrize("backend", [reference, prefix], ids=["reference", "pre-fix"])
def test_a_kept_twin_gives_the_verdicts_a_twin_run_gives(backend):
    """A lane's rank keeps the hooks-off runs for the hooked cells after them
    (``twin.Twins``): the hooks-off cell's own run serves every hook mode's cell, and each
    verdict - every check, a pre-fix twin failure included - is the one a fresh twin run gives."""
    cells = [_cell(weight="distributed", hooks=h, fused=False, delay_wgrad=False, dtype="bf16")
             for h in ("off", "identity", "offload", "save_on_cpu", "checkpoint")]
    kept = RankContext(twins=twin.Twins())
    for cell in cells:
        assert _verdicts(run_cell(backend, cell, kept)) == _verdicts(run_cell(backend, cell, RankContext())), cell.id
    assert kept.twins.hits == 4  # each hooked cell took the hooks-off cell's run
    hooked = RankContext(twins=twin.Twins())  # no hooks-off cell first: the first hooked cell runs it
    for cell in cells[1:]:
        run_cell(backend, cell, hooked)
    assert hooked.twins.hits == 3


def test_twins_keep_at_most_their_size_and_every_outcome():
    twins = twin.Twins(size=2)
    err = RankResult(0, "error", [Check("exception", "exception", False, "boom")], {"type": "RuntimeError"})
    for i in range(3):
        twins.put(("b", f"c{i}", "{}"), err if i == 2 else RankResult(0, "pass", [Check("x", "value", True)]),
                  twin.Kept(outputs=[torch.ones(2, requires_grad=True) * i]))
    assert twins.get(("b", "c0", "{}")) is None  # the oldest went
    result, kept = twins.get(("b", "c2", "{}"))
    assert result.status == "error" and result.comparisons[0].message == "boom"  # an error is kept whole
    assert not kept.outputs[0].requires_grad and float(kept.outputs[0][0]) == 2.0
    assert twins.get(("b", "c1", "{}"))[0].comparisons == []  # a run's own checks are not the twin's
    assert twins.hits == 2


def test_pre_fix_backend_fails_its_twin_at_ws1():
    """At world size 1 the pre-fix GroupedLinear's hooked values can pass the oracle's
    tolerance; its twin differs (the distributed path was skipped)."""
    res = run_cell(prefix, _cell(weight="distributed", hooks="offload", fused=False,
                                           delay_wgrad=False, dtype="bf16"), RankContext())
    twin_failed = {c.name for c in res.comparisons if c.kind == "twin" and not c.ok}
    assert "twin.materialize_backward_calls" in twin_failed and "twin.weight0.main_grad" in twin_failed, twin_failed


def test_pre_fix_backend_fails_its_twin_in_every_hooked_distributed_cell_that_runs_to_the_end():
    """Issue 13: every hooked distributed Linear/GroupedLinear cell of ``ci`` on which the
    pre-fix backend runs its step to the end (world size 1: at larger sizes its plain branch
    multiplies by the shard and raises) fails a twin check - whatever its values do."""
    cells = [c for c in matrix.select("ci") if c.world_size == 1 and c.distributed and c.hooks != "off"
             and not modules.KINDS[c.module].ops and not selection.requires(c)
             and not c.delay_wgrad]
    ran = 0
    for cell in cells:
        res = run_cell(prefix, cell, RankContext())
        if res.status == "error":
            continue
        ran += 1
        assert any(c.kind == "twin" and not c.ok for c in res.comparisons), cell.id
    assert ran >= len(cells) // 2, f"only {ran} of {len(cells)} cells ran to the end"


def test_native_weight_gathered_in_high_precision_is_caught():
    """A native weight's gathers must hand TE quantized data: one gather in high precision (the
    weight gathered as BF16, TE quantizing it, which MXFP8 values cannot tell apart) fails
    ``native_gathers_quantized``; all quantized passes; no gather at all fails too."""
    from types import SimpleNamespace

    from harness.cell.gtp import CallLog
    from harness.cell.runner import _protocol_checks

    cell = _cell(module="linear", weight="megatron_fp8", world_size=2, num_gemms=1, microbatches=2,
                 delay_wgrad=False, recipe="mxfp8")

    def verdict(*quantized: bool) -> bool:
        log = CallLog()
        for q in quantized:
            log.add("materialize_forward", 0, quantized=q)
        log.add("finalize", 0, dtypes=["float32"], shapes=[[32, 32]])
        checks = _protocol_checks(cell, SimpleNamespace(members=[None], log=log))
        return next(c.ok for c in checks if c.name == "native_gathers_quantized")

    assert verdict(True, True)
    assert not verdict(True, False)
    assert not verdict()
    plain = _protocol_checks(_cell(module="linear", weight="gtp_async", world_size=2, num_gemms=1,
                                   delay_wgrad=False), SimpleNamespace(members=[None], log=CallLog()))
    assert "native_gathers_quantized" not in {c.name for c in plain}


@pytest.mark.parametrize("module", ["linear", "grouped_linear"])
def test_is_first_microbatch_is_observable(module):
    """From the seeded non-zero start, a flagged cell tells TE's rule from its two faults: a
    fused plain weight's first wgrad replaces main_grad (ignoring the flag fails the weight's
    value), a distributed weight's accumulates (clearing main_grad for it fails too)."""
    from harness.backends.reference import mutants

    n = 4 if module == "grouped_linear" else 1
    plain = _cell(module=module, weight="plain", num_gemms=n, delay_wgrad=False, first_mb=True)
    dist = _cell(module=module, weight="distributed", num_gemms=n, delay_wgrad=False, first_mb=True)
    weights = {f"weight{i}.main_grad" for i in range(n)} if n > 1 else {"weight.main_grad"}
    assert not _failed(reference, plain) and not _failed(reference, dist)
    assert weights <= _failed(mutants.get("first-microbatch-ignored"), plain)
    assert not _failed(mutants.get("first-microbatch-ignored"), dist)
    assert weights <= _failed(mutants.get("first-microbatch-overwrites-distributed"), dist)
    assert not _failed(mutants.get("first-microbatch-overwrites-distributed"), plain)


def test_fp8_weight_caching_under_delayed_scaling_is_judged(monkeypatch):
    """Under delayed scaling a flagged cell's second microbatch multiplies the FP8 weight the
    first quantized (scale 1, before any update): the reference keeps it and passes; quantizing
    afresh with the updated scale - the flag ignored - fails the second microbatch's output."""
    from harness.backends.reference import _fp8

    cells = [_cell(module=m, weight=w, num_gemms=4 if m == "grouped_linear" else 1, delay_wgrad=False,
                   recipe="delayed", first_mb=True) for m in ("linear", "grouped_linear") for w in ("plain", "distributed")]
    assert all(not _failed(reference, c) for c in cells)
    fresh = _fp8.cached_weight
    monkeypatch.setattr(_fp8, "cached_weight", lambda fp8, module, i, w, first: fresh(fp8, module, i, w, None))
    assert all("mb1.output" in _failed(reference, c) for c in cells)


def test_fp8_scales_name_a_model_only_when_they_are_its_scales(monkeypatch):
    """A failing ``fp8_scales`` carries 0 for a dgrad-weight model exactly when the scales are
    that model's: the requantizing fault (TE's behaviour) matches ``dgrad_weight_requantized``
    with a tagged weight; a weight scale off for any other reason matches no model."""
    from harness.cell import runner
    from harness.backends.reference import mutants

    cell = _cell(module="linear", weight="gtp_tagged", num_gemms=1, delay_wgrad=False, recipe="delayed")

    def scales(backend):
        res = run_cell(backend, cell, RankContext())
        return next(c for c in res.comparisons if c.name == "fp8_scales")

    assert scales(reference).ok
    requantized = scales(mutants.get("fp8-dgrad-weight-requantized"))
    assert not requantized.ok and requantized.models == {"dgrad_weight_requantized": 0.0}
    true_scales = runner.lowp.scales_after
    monkeypatch.setattr(runner.lowp, "scales_after",
                        lambda m: {**true_scales(m), "weight": [2 * s for s in true_scales(m)["weight"]]})
    off = scales(reference)
    assert not off.ok and off.models == {"dgrad_weight_requantized": math.inf}


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 4), (2, 1, 5), (4, 3, 2, 3)])
def test_unravel_is_torchs_unravel_index(shape):
    """The index a check reports (its worst element) is ``torch.unravel_index``'s, for every
    element of scalars, vectors and tensors of up to four dimensions."""
    numel = math.prod(shape)
    for flat in range(numel):
        assert compare.unravel(flat, torch.Size(shape)) == tuple(
            int(i) for i in torch.unravel_index(torch.tensor(flat), shape)), (flat, shape)
