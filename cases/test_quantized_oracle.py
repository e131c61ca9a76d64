"""The oracle's float64 quantization (``harness.rank.quantized``) against te-cpu's kernels.

The oracle may not import te-cpu (a rank judges any backend), so it has its own cast and
scale rule; both must give te-cpu's codes exactly, or a recipe cell would be judged against
other operands than TE multiplied. In-process, a fraction of a second.
"""

from __future__ import annotations

import pytest
import torch

from fixtures.quant_numerics import load
from harness.rank import quantized

formats = load("formats")
scaling = load("scaling")
per_tensor = load("per_tensor")


def _every_value(fmt: quantized.Fp8) -> torch.Tensor:
    """Every finite value of ``fmt``, the midpoints between neighbours and values just off them."""
    codes = torch.arange(256, dtype=torch.uint8).view(fmt.dtype).to(torch.float64)
    v = torch.unique(codes[torch.isfinite(codes)])
    mids = (v[1:] + v[:-1]) / 2
    off = torch.cat([mids * (1 + 2.0**-20), mids * (1 - 2.0**-20)])
    return torch.cat([v, mids, off, torch.tensor([fmt.max * 1.01, -fmt.max * 3, 1e9, float("nan")], dtype=torch.float64)])


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale", [1.0, 0.75, 3.0e3, 2.0**-7])
def test_cast_gives_te_cpus_codes(name, scale):
    fmt = quantized.FORMATS[name]
    te = formats.E4M3 if name == "e4m3" else formats.E5M2
    x = (_every_value(fmt) / scale).to(torch.float32)  # the values a kernel would be handed
    ours = quantized.cast(x, scale, fmt)
    theirs = te.decode(per_tensor.cast(x, torch.tensor([scale], dtype=torch.float32), te)).to(torch.float64)
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs))
    assert torch.equal(torch.nan_to_num(ours), torch.nan_to_num(theirs))


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_current_scale_is_te_cpus(name):
    fmt = quantized.FORMATS[name]
    te = formats.E4M3 if name == "e4m3" else formats.E5M2
    g = torch.Generator().manual_seed(5)
    cases = [torch.randn(7, 9, generator=g) * s for s in (1e-30, 1e-3, 1.0, 3.3, 1e4)]
    cases += [torch.zeros(4), torch.tensor([float("inf"), 1.0]), torch.tensor([float("nan"), 2.0]), torch.empty(0)]
    for t in cases:
        t16 = t.to(torch.bfloat16)
        ref = scaling.scale_from_amax(scaling.amax(t16), te.max, force_pow_2=False, epsilon=0.0)
        assert quantized.current_scale(t16, fmt) == float(ref), t


def test_dequantized_is_codes_times_fp32_scale_inverse():
    fmt = quantized.FORMATS["e4m3"]
    t = torch.tensor([0.3, -1.7, 2.2], dtype=torch.bfloat16)
    s = quantized.current_scale(t, fmt)
    inv = float(scaling.reciprocal(torch.tensor([s], dtype=torch.float32)))
    assert torch.equal(quantized.dequantized(t, s, fmt), quantized.cast(t, s, fmt) * inv)
    assert quantized.cast(t, s, fmt).abs().max() == fmt.max  # the amax lands on the largest code


def test_without_a_recipe_nothing_is_quantized_and_unmodelled_recipes_raise():
    q = quantized.for_recipe("none")
    t = torch.randn(3, 4, dtype=torch.float64)
    assert not q.quantized and q.x(0, 0, 0, t) is t and q.weight(0, 0, t, True) is t
    assert quantized.for_recipe("current").quantized
    with pytest.raises(NotImplementedError, match="does not model recipe 'mxfp8'"):
        quantized.for_recipe("mxfp8")


def test_delayed_scaling_steps_as_te_cpus_update():
    """Scale 1 for the first microbatch; then te-cpu's delayed update (history roll, max over
    the window) of the amax max-reduced over the ranks; a distributed weight's dgrad operand
    takes the scale updated after its forward, a plain weight's the forward's."""
    from harness.rank.inputs import make_inputs
    from harness.shape import Example

    cell_inputs = make_inputs(3, Example(32, 32, 16), "bf16", 2, 2, 1, False, unit=16)
    plain = quantized.for_recipe("delayed", cell_inputs)
    dist = quantized.for_recipe("delayed", cell_inputs, distributed=True)
    assert plain.sx[0, 0] == (1.0, 1.0) and plain.swf[0, 0] == plain.sdy[0, 0] == 1.0

    def te_update(amaxes: list[float], fmax: float) -> float:
        hist, scale = torch.zeros(1024, 1), torch.ones(1)
        for a in amaxes:
            hist[0, 0] = a
            scaling.delayed_update(hist, scale, None, algo="max", scaled_max=scaling.delayed_scaled_max(fmax, 0))
        return float(scale)

    amax_x = max(float(cell_inputs.x[r][0].abs().float().max()) for r in range(2))
    amax_dy = max(float(cell_inputs.dy[r][0].abs().float().max()) for r in range(2))
    amax_w = float(cell_inputs.weights[0].abs().float().max())
    assert plain.sx[1, 0] == (te_update([amax_x], 448.0),) * 2
    assert plain.sdy[1, 0] == te_update([amax_dy], 57344.0)
    assert plain.swf[1, 0] == te_update([amax_w], 448.0) == dist.swb[0, 0]
    assert plain.swb[0, 0] == 1.0 and plain.swb[1, 0] == plain.swf[1, 0]


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_a_normalized_input_is_quantized_within_its_box(norm, dtype, recipe):
    """LayerNormLinear's normalized rows under a recipe: every chain a backend takes - the
    normalization in fp32 (the reference's), rounded to the cell's dtype (current scaling:
    TE's norm-then-quantize) or, under delayed scaling, also unrounded (TE's fused kernel) -
    quantizes to a value within the oracle's centre +- slack; and the box is tight: few
    elements may take another code, and the unquantized rows lie outside it."""
    from harness.rank import oracle
    from harness.rank.inputs import make_inputs
    from harness.reference import _norm
    from harness.shape import Example

    fmt = quantized.FORMATS["e4m3"]
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    for seed in range(6):
        inputs = make_inputs(seed, Example(32, 32, 16), dtype, 1, 1, 1, True, norm=norm, unit=16)
        centre, _, _ = oracle.gemm_inputs(inputs, recipe)(0, 0)
        slack = oracle.gemm_inputs(inputs, recipe).slack(0, 0)
        n = inputs.norm
        call = _norm.NormCall(None, n.kind, n.zero_centered, n.eps)
        x = inputs.x[0][0]
        h32 = _norm.forward(x.float(), n.gamma, n.beta, call)  # fp32 statistics and arithmetic
        chains = [h32.to(torch_dtype)] + ([h32] if recipe == "delayed" else [])
        for h in chains:
            # current: the scale of the tensor's own amax; delayed, first microbatch: scale 1
            scale = quantized.current_scale(h, fmt) if recipe == "current" else 1.0
            q = quantized.dequantized(h.to(torch.float64), scale, fmt)
            assert bool(((q - centre).abs() <= slack).all()), (seed, recipe, dtype)
        # an element whose code may differ (slack of an FP8 step, 2^-4 relative) is rare; the
        # rest carry at most the scale's own uncertainty (fp32: the amax's fp32 error)
        assert float((slack > 2.0**-8 * centre.abs()).double().mean()) < 0.2, (seed, recipe, dtype)
        unquantized = oracle._normalize(x.to(torch.float64), n).h
        assert bool(((unquantized - centre).abs() > slack).any())
