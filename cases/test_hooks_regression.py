"""Hook regression: saved-tensor hooks must not change what the reference computes.

The bug (CONTRACTS, background): TE's ``_Linear``/``_GroupedLinear`` decided in backward
whether to take the distributed path by asking the *unpacked saved tensor*; under any
``saved_tensors_hooks`` (identity hooks, ``save_on_cpu``, non-reentrant checkpointing)
autograd hands back a plain ``Tensor``, so backward took the plain branch. Here, with a GTP
weight at world size 1 in-process:

- the fixed reference gives bit-identical results with and without each hook mode, and
  keeps the protocol (materialize/finalize counts) intact;
- the pre-fix backend (``harness.backends.reference.prefix``) fails ``GroupedLinear`` fused with
  TE's ``weight was removed while fuse_wgrad_accumulation=True``, and makes ``Linear`` (and
  unfused ``GroupedLinear``) skip the distributed backward entirely: no
  backward-materialize, no finalize, the gradient bypasses the GTP weight;
- ``ops.GroupedLinear`` reads its weights from its attributes and is unaffected in both.
"""

from __future__ import annotations

import pytest
import torch

import harness.backends.reference as reference
import harness.backends.reference.prefix as prefix
from fixtures.hook_modes import forward_executions, forward_under
from fixtures.modules import KINDS, attach_main_grad, bias_names, build, caller, load_full, weight_names
from fixtures.tensors import DTYPES, assert_within_bound, grouped_linear_f64, seeded, with_start
from harness.cell.gtp import GTPWeight, inject_gtp

pytestmark = pytest.mark.usefixtures("single_thread", "in_process_ws1")

IN_F, OUT_F = 6, 5
SPLITS = {"linear": [7], "grouped_linear": [3, 0, 4], "ops_grouped_linear": [3, 0, 4]}


def _step(backend, kind: str, mode: str, *, fused: bool, main_grad: bool = True, distributed: bool = True,
          dtype_name: str = "fp32", bias: bool = True) -> dict:
    """One forward (under ``mode``) and backward; returns everything observable.

    ``main_grad`` (DDP-style fp32, non-zero start) is attached to every parameter when
    ``main_grad`` or ``fused``. Inputs depend only on the kind and dtype (never on the
    backend or mode), so runs are directly comparable.
    """
    dtype = DTYPES[dtype_name]
    splits = SPLITS[kind]
    n = len(splits)
    W = [seeded((OUT_F, IN_F), dtype, 11 + i, 0.5) for i in range(n)]
    B = [seeded((OUT_F,), dtype, 21 + i, 0.5) for i in range(n)] if bias else []
    x = seeded((sum(splits), IN_F), dtype, 31)
    dy = seeded((sum(splits), OUT_F), dtype, 41)
    module = build(backend, kind, n, IN_F, OUT_F, bias=bias, dtype=dtype, fused=fused, delay=False)
    load_full(module, W, B)
    gtp = inject_gtp(module) if distributed else None
    starts = attach_main_grad(module, 5) if (main_grad or fused) else {}
    xin = x.clone().requires_grad_()
    out = forward_under(mode, caller(module, kind, splits), xin)
    out.backward(dy)
    params = dict(module.named_parameters(recurse=False))
    return {
        "module": module, "gtp": gtp, "starts": starts, "x": x, "dy": dy, "W": W, "B": B, "splits": splits,
        "out": out.detach(), "dgrad": xin.grad,
        "grad": {k: (None if p.grad is None else p.grad.clone()) for k, p in params.items()},
        "main_grad": {k: p.main_grad.clone() for k, p in params.items() if hasattr(p, "main_grad")},
        "flag": {k: getattr(p, "grad_added_to_main_grad", None) for k, p in params.items()},
        "counts": None if gtp is None else {
            k: gtp.log.count(k) for k in ("materialize_forward", "materialize_backward", "finalize", "grad_buffer")},
    }


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _assert_identical(run: dict, base: dict) -> None:
    """Everything observable is bit-identical (same ops in the same order on CPU)."""
    __tracebackhide__ = True
    assert _same(run["out"], base["out"]), "output differs"
    assert _same(run["dgrad"], base["dgrad"]), "input grad differs"
    for k in base["grad"]:
        assert _same(run["grad"][k], base["grad"][k]), f"{k}.grad differs"
    for k in base["main_grad"]:
        assert _same(run["main_grad"][k], base["main_grad"][k]), f"{k}.main_grad differs"
    assert run["flag"] == base["flag"]


def test_hook_mode_strips_the_subclass(hook_mode):
    """Under every mode, a saved GTP weight comes back to backward as a plain Tensor
    without the marker (and, without hooks, as the GTPWeight itself).

    Why: this is the condition of the bug; if a mode did not strip the subclass, the
    regression tests below would pass vacuously.
    """
    module = build(reference, "linear", 1, 3, 4, bias=False, dtype=torch.float32, fused=False, delay=False)
    inject_gtp(module)
    weight = module.weight
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w.t()

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            seen.append((type(w), getattr(w, "is_distributed_weight", False), w is weight))
            return g @ w, g.t() @ x

    for mode in ("off", hook_mode):
        x = torch.randn(2, 3, requires_grad=True)
        forward_under(mode, lambda t: Probe.apply(t, weight), x).sum().backward()
    assert seen[0] == (GTPWeight, True, True)
    assert seen[1] == (torch.Tensor, False, False)


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("kind", KINDS)
def test_reference_unchanged_by_hooks(kind, fused, dtype_name, hook_mode):
    """The fixed reference gives bit-identical outputs, grads, main_grads and flags with and
    without hooks (distributed weight, ws=1), keeps the protocol counts, and is correct.

    Why: the fix keeps the DistributedWeight objects on ``ctx``; any path that still looks
    at the unpacked saved tensor would show up as a difference here.
    """
    base = _step(reference, kind, "off", fused=fused, dtype_name=dtype_name)
    run = _step(reference, kind, hook_mode, fused=fused, dtype_name=dtype_name)
    _assert_identical(run, base)
    assert run["counts"] == {
        "materialize_forward": forward_executions(hook_mode), "materialize_backward": 1, "finalize": 1,
        "grad_buffer": len(run["splits"]) if fused else 0,
    }
    math = grouped_linear_f64(run["x"], run["W"], run["B"], run["splits"], run["dy"])
    assert_within_bound("output", run["out"], math.y, dtype_name)
    assert_within_bound("input_grad", run["dgrad"], math.dx, dtype_name)
    for i, name in enumerate(weight_names(run["module"])):
        assert run["flag"][name] is True
        assert_within_bound(f"{name}.main_grad", run["main_grad"][name],
                            with_start(math.dw[i], run["starts"][name]), "fp32")
    for i, name in enumerate(bias_names(run["module"])):
        assert_within_bound(f"{name}.grad", run["grad"][name], math.db[i], dtype_name)


@pytest.mark.parametrize("kind", KINDS)
def test_reference_unchanged_by_hooks_plain_weight(kind, hook_mode):
    """Plain weights, fused: hooks change nothing either (the fix must not break them).

    Why: the fixed backward now prefers ctx objects; for a plain weight those are the
    parameters themselves, whose ``main_grad`` must still receive the wgrad.
    """
    base = _step(reference, kind, "off", fused=True, distributed=False)
    run = _step(reference, kind, hook_mode, fused=True, distributed=False)
    _assert_identical(run, base)
    assert all(run["flag"][n] is True for n in weight_names(run["module"]))


def test_prefix_grouped_linear_fused_fails_under_hooks(hook_mode):
    """Pre-fix GroupedLinear, fused, distributed weight: backward raises TE's
    ``weight was removed while fuse_wgrad_accumulation=True`` under every hook mode, and
    works without hooks (so the hooks are the trigger).

    Why: this is the failure reported against TE; the harness must reproduce it at ws=1.
    """
    base = _step(prefix, "grouped_linear", "off", fused=True)
    assert base["counts"]["materialize_backward"] == 1 and base["counts"]["finalize"] == 1
    _assert_identical(base, _step(reference, "grouped_linear", "off", fused=True))
    with pytest.raises(AssertionError, match="weight was removed while fuse_wgrad_accumulation=True"):
        _step(prefix, "grouped_linear", hook_mode, fused=True)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_prefix_linear_skips_distributed_backward_under_hooks(fused, hook_mode):
    """Pre-fix Linear under hooks (observed behaviour): no error, but backward takes the
    plain branch - ``materialize_group_for_backward`` and ``finalize_group_grads`` are never
    called (0 instead of 1), nor ``grad_buffer``; fused, it adds the wgrad into ``main_grad``
    itself; unfused, the raw local wgrad lands in ``.grad`` while ``main_grad`` is never
    touched (``grad_added_to_main_grad`` stays False), where the fix delivers through
    finalize. Without hooks it matches the reference.

    Why: at ws=1 the shard is the whole weight, so the numbers can look right; the missing
    collectives are what would hang or corrupt a real multi-rank step.
    """
    base = _step(prefix, "linear", "off", fused=fused)
    ref_off = _step(reference, "linear", "off", fused=fused)
    _assert_identical(base, ref_off)
    assert base["counts"]["materialize_backward"] == 1 and base["counts"]["finalize"] == 1

    run = _step(prefix, "linear", hook_mode, fused=fused)
    assert run["counts"] == {"materialize_forward": forward_executions(hook_mode), "materialize_backward": 0,
                             "finalize": 0, "grad_buffer": 0}
    assert _same(run["out"], ref_off["out"]) and _same(run["dgrad"], ref_off["dgrad"])
    if fused:
        assert run["flag"]["weight"] is True
        assert not run["grad"]["weight"].any()
    else:
        assert run["flag"]["weight"] is False, "main_grad was flagged though finalize never ran"
        assert torch.equal(run["main_grad"]["weight"], run["starts"]["weight"])
        assert run["grad"]["weight"] is not None and run["grad"]["weight"].any()
        assert not ref_off["grad"]["weight"].any(), "the fix delivers finalize's dummy to autograd"
        assert ref_off["flag"]["weight"] is True


def test_prefix_grouped_linear_unfused_skips_distributed_backward(hook_mode):
    """Pre-fix GroupedLinear, unfused: no error, but no backward-materialize or finalize.

    Why: the unfused branch has no weakref assert to trip, so it fails silently.
    """
    run = _step(prefix, "grouped_linear", hook_mode, fused=False)
    assert run["counts"]["materialize_backward"] == 0 and run["counts"]["finalize"] == 0
    assert all(run["flag"][n] is False for n in weight_names(run["module"]))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("backend", [reference, prefix], ids=["reference", "prefix"])
def test_ops_grouped_linear_unaffected(backend, fused, hook_mode):
    """``ops.GroupedLinear`` reads its weights from its attributes, so hooks change nothing
    in either backend: results identical to the reference without hooks, protocol intact.

    Why: it is the control group - the regression is specific to saved-tensor lookups.
    """
    base = _step(reference, "ops_grouped_linear", "off", fused=fused)
    run = _step(backend, "ops_grouped_linear", hook_mode, fused=fused)
    _assert_identical(run, base)
    assert run["counts"]["materialize_backward"] == 1 and run["counts"]["finalize"] == 1
    assert run["counts"]["materialize_forward"] == forward_executions(hook_mode)


def test_harness_hooks_run_every_mode_of_the_matrix():
    """The hook modes are defined once, in the torch-free vocabulary (``hook_modes.NAMES``, the
    ``hooks`` axis's domain): ``harness.cell.hooks`` runs every mode whose installer is the
    harness's or torch's here (a mode added to the matrix without an implementation fails here,
    not in a cell), each giving the hooks-off gradient bit for bit and packing what it saves.
    TE's and Megatron's installers need their code (the te-cpu sweeps of the suite run them:
    cases/test_ledger_te.py); without a backend that has it, a clear error, not a silent no-op."""
    from harness.vocabulary import hook_modes, matrix
    from harness.cell import hooks

    assert matrix.HOOK_MODES is hook_modes.NAMES
    assert next(a for a in matrix.AXES if a.name == "hooks").values == hook_modes.NAMES
    w = seeded((4, 3), torch.float32, 7)
    x = seeded((2, 3), torch.float32, 8)
    grads = {}
    for mode, kind in hook_modes.KINDS.items():
        xin = x.clone().requires_grad_()
        if kind.needs_te:
            with pytest.raises(Exception):
                hooks.run_forward(mode, lambda t: torch.tanh(t @ w.t()), xin)
            continue
        with hooks.Packs().observing() as packs:
            hooks.run_forward(mode, lambda t: torch.tanh(t @ w.t()), xin).sum().backward()
        assert (packs.packs > 0) == kind.hooked, mode
        grads[mode] = xin.grad
        assert hooks.forward_executions(mode) == (2 if mode == "checkpoint" else 1)
    assert set(grads) == {m for m, k in hook_modes.KINDS.items() if not k.needs_te}
    assert all(torch.equal(g, grads["off"]) for g in grads.values())
    with pytest.raises(ValueError, match="unknown hook mode"):
        hooks.run_forward("no_such_mode", torch.tanh, x)
