"""``attach_weight``: a cell's ``weight`` value becomes the module's weights (in-process, ws=1).

Why: it is the runner's one call into the weight axis, so every value must give the
implementer and behaviour :mod:`harness.vocabulary.weights` promises, and the chain head that stands in
for the previous layer must drive Megatron's chain-order delivery exactly once per backward
- including under checkpointing, whose recomputed forward is not a new layer forward.
"""

from __future__ import annotations

import pytest
import torch

import harness.backends.reference as reference
from fixtures.modules import attach_main_grad, build, load_full
from fixtures.tensors import seeded
from harness.vocabulary import weights
from harness.cell.attach import attach_weight
from harness.cell.faults import HarnessBug
from harness.cell.gtp import GTPGroup, GTPWeight, WeightStateLost
from harness.cell.hooks import run_forward

pytestmark = pytest.mark.usefixtures("single_thread")

#: the harness weight's high-precision values (a native one needs TE's quantized_model_init:
#: cases/test_megatron_native_differential.py and the te-cpu sweeps judge it)
HARNESS_VALUES = [w for w, k in weights.KINDS.items() if k.implementer == "harness" and not k.native]
NATIVE_HARNESS_VALUES = [w for w, k in weights.KINDS.items() if k.implementer == "harness" and k.native]


def _linear(out_f: int = 5, in_f: int = 4):
    module = build(reference, "linear", 1, in_f, out_f, bias=False, dtype=torch.float32, fused=False, delay=False)
    full = seeded((out_f, in_f), torch.float32, 11)
    load_full(module, [full], [])
    return module, full


def test_plain_leaves_the_module_alone(in_process_ws1):
    module, _ = _linear()
    before = module.weight
    assert attach_weight(module, "plain") is None
    assert module.weight is before and not module._forward_pre_hooks


@pytest.mark.parametrize("value", HARNESS_VALUES)
def test_harness_values_get_their_behaviour(value, in_process_ws1):
    """Each harness value injects GTP weights with exactly its behaviour and padding; only
    the chained (asynchronous) values put a chain head before the module."""
    module, _ = _linear()
    group = attach_weight(module, value)
    kind = weights.KINDS[value]
    assert isinstance(group, GTPGroup) and isinstance(module.weight, GTPWeight)
    assert group.behaviour == kind.behaviour
    assert group.padded_rows == (16 if kind.pad_multiple == 16 else 5)
    assert bool(module._forward_pre_hooks) == kind.chained


@pytest.mark.parametrize("value", NATIVE_HARNESS_VALUES)
def test_a_native_value_needs_the_full_weights(value, in_process_ws1):
    """A native shard is quantized from the full weights' values, which the caller passes."""
    module, _ = _linear()
    with pytest.raises(ValueError, match="a native weight quantizes each shard from the full weights' values"):
        attach_weight(module, value, recipe="mxfp8")


def test_a_copy_without_state_is_the_backends_a_weight_without_it_the_harnesss(in_process_ws1):
    """A protocol call on an object of the weight's class that never joined a group (what
    autograd rebuilds from a saved native weight) is ``WeightStateLost``, a verdict; on a
    weight that joined and lost its group, a ``HarnessBug`` (exit 3), never a verdict."""
    module, _ = _linear()
    group = attach_weight(module, "distributed")
    weight = module.weight
    copy = GTPWeight(weight.detach().clone())
    with pytest.raises(WeightStateLost, match="GTPWeight without its group: a DistributedWeight method was called on a copy"):
        copy.materialize_group_for_backward()
    weight.gtp_group = None
    with pytest.raises(HarnessBug, match="GTPWeight lost its group after joining it"):
        weight.materialize_group_for_backward()
    weight.gtp_group = group


@pytest.mark.parametrize("mode", ["off", "checkpoint"])
def test_chain_head_delivers_after_the_whole_backward(mode, in_process_ws1):
    """gtp_async on a reference Linear: when the backend's finalize returns, ``main_grad`` is
    still the start value; once ``backward()`` returns, it holds start + wgrad and the flag
    is set. The head materializes forward once per forward (not on the checkpoint's
    recomputation) and finalizes once per backward."""
    module, full = _linear()
    group = attach_weight(module, "gtp_async")
    starts = attach_main_grad(module, 3)
    seen_at_return = []
    real_finalize = group.finalize

    def spy(caller, wgrads):
        out = real_finalize(caller, wgrads)
        seen_at_return.append((out, module.weight.main_grad.clone(), module.weight.grad_added_to_main_grad))
        return out

    group.finalize = spy
    head = group.prev
    assert head is None  # joins the chain at the first forward
    for mb in range(2):
        x = seeded((6, 4), torch.float32, 20 + mb)
        dy = seeded((6, 5), torch.float32, 30 + mb)
        out = run_forward(mode, lambda t: module(t), x.clone().requires_grad_())
        before = module.weight.main_grad.clone()
        out.backward(dy)
        head = group.prev
        assert head is not None and head.next is group
        ret, main_then, flag_then = seen_at_return[-1]
        assert ret is None and flag_then is False
        assert torch.equal(main_then, before), "main_grad changed before the chain head finalized"
        expected = starts["weight"] + sum((seeded((6, 5), torch.float32, 30 + k).t() @ seeded((6, 4), torch.float32, 20 + k))
                                          for k in range(mb + 1))
        assert torch.allclose(module.weight.main_grad, expected, rtol=0, atol=1e-5)
        assert module.weight.grad_added_to_main_grad is True
        module.weight.grad_added_to_main_grad = False
    assert head.log.count("materialize_forward") == 2
    assert head.log.count("materialize_backward") == 2 and head.log.count("finalize") == 2
    assert group.log.count("materialize_forward") == (4 if mode == "checkpoint" else 2)
