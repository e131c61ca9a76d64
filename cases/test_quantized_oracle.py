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
    assert not q.quantized and q.x(0, 0, 0, t) is t and q.weight(0, t, True) is t
    assert quantized.for_recipe("current").quantized
    with pytest.raises(NotImplementedError, match="does not model recipe 'mxfp8'"):
        quantized.for_recipe("mxfp8")
