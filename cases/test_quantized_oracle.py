"""The oracle's float64 quantization (``harness.cell.quantized``) against te-cpu's kernels.

The oracle may not import te-cpu (a rank judges any backend), so it has its own cast and
scale rule; both must give te-cpu's codes exactly, or a recipe cell would be judged against
other operands than TE multiplied. In-process, a fraction of a second.
"""

from __future__ import annotations

import pytest
import torch

from fixtures.quant_numerics import load
from harness.cell import quantized

formats = load("formats")
scaling = load("scaling")
per_tensor = load("per_tensor")
mxfp8 = load("mxfp8")
blockwise = load("blockwise")
nvfp4 = load("nvfp4")


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
    assert isinstance(quantized.for_recipe("mxfp8"), quantized.BlockScaling)
    with pytest.raises(NotImplementedError, match="delayed scaling from a cell's inputs: none given"):
        quantized.for_recipe("delayed")  # delayed scaling's steps need the cell's inputs


def test_delayed_scaling_steps_as_te_cpus_update():
    """Scale 1 for the first microbatch; then te-cpu's delayed update (history roll, max over
    the window) of the amax max-reduced over the ranks; a distributed weight's dgrad operand
    takes the scale updated after its forward, a plain weight's the forward's."""
    from harness.cell.inputs import make_inputs
    from harness.vocabulary.shape import Example

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
    from harness.cell import oracle
    from harness.cell.inputs import make_inputs
    from harness.backends.reference import _norm
    from harness.vocabulary.shape import Example

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


# ---- block recipes: the oracle's and the reference's block quantization against te-cpu's ----

def _block_cases(dtype: torch.dtype) -> list[torch.Tensor]:
    """2-D tensors whose blocks hit every branch of the scale rules: ordinary magnitudes, an
    all-zero block, amaxes on and beside a power of two times the format's largest value,
    magnitudes too small for a finite fp32 scale, and sizes that leave a short last block."""
    g = torch.Generator().manual_seed(11)
    out = [torch.randn(64, 96, generator=g) * s for s in (1e-3, 1.0, 7.0, 3e3)]
    edge = torch.randn(64, 256, generator=g)
    edge[:, :32] = 0.0                                           # an all-zero block
    edge[0, 32], edge[1, 64], edge[2, 96] = 448.0, 896.0, 448.0 * (1 + 2.0**-7)
    edge[3, 128:160] = 1e-39                                    # fp32 scale overflows
    out.append(edge)
    out.append(torch.randn(96, 160, generator=g) * torch.logspace(-4, 4, 160))  # mixed blocks
    return [t.to(dtype) for t in out]


def _te_cpu_blocks(t: torch.Tensor, rule: str, axis: int) -> torch.Tensor:
    """te-cpu's quantize-dequantize of ``t`` (its kernels, float64 out)."""
    fmt = formats.E4M3
    x = t.to(torch.float32)
    x = x.t().contiguous() if axis == 0 else x
    if rule == "mxfp8":
        data, exps = mxfp8.quantize_blocks(x, fmt)
        out = mxfp8.decode_blocks(data, exps, fmt)
    else:
        q = type("Q", (), {"force_pow_2_scales": True, "amax_epsilon": 0.0})()
        fn = blockwise.quantize_2d if rule == "2d" else blockwise.quantize_1d
        data, inv = fn(x, fmt, q, t.dtype)
        block = blockwise.BLOCK
        rows = inv.repeat_interleave(block, 0)[:x.shape[0]] if rule == "2d" else inv
        out = fmt.decode(data) * rows.repeat_interleave(block, 1)[:, :x.shape[1]]
    out = out.to(torch.float64)
    return out.t() if axis == 0 else out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rule,axis", [("mxfp8", 1), ("mxfp8", 0), ("1d", 1), ("1d", 0), ("2d", 1)])
def test_block_quantization_gives_te_cpus_values(dtype, rule, axis):
    """The oracle's (float64) and the reference's (fp32) block quantize-dequantize are
    te-cpu's, value for value, along either axis (row-wise and column-wise data)."""
    from harness.backends.reference import _fp8

    fmt = quantized.FORMATS["e4m3"]
    for t in _block_cases(dtype):
        if rule == "mxfp8" and t.shape[axis] % 32:
            continue
        theirs = _te_cpu_blocks(t, rule, axis)
        if rule == "2d":
            ours = quantized.tiled(t.to(torch.float64), 128, fmt, dtype)
        else:
            ours = quantized.blocked(t.to(torch.float64), axis, 32 if rule == "mxfp8" else 128, fmt,
                                     "mxfp8" if rule == "mxfp8" else "block", dtype)
        ref = _fp8.block_quantized(t.to(torch.float32), rule, axis, "e4m3", dtype).to(torch.float64)
        assert torch.equal(ours, theirs), (rule, axis, (ours - theirs).abs().max())
        assert torch.equal(ref, theirs), (rule, axis, (ref - theirs).abs().max())


def test_block_scales_by_hand():
    """One block worked by hand. MXFP8: amax 500, ``500 / 448`` rounds up to the scale-inverse
    2: 500 -> 250 -> E4M3 256 -> 512; 1 -> 0.5 -> 1; 2^-11 -> 2^-12, under E4M3's smallest
    subnormal (2^-9) -> 0. Block scaling: ``448 / 500`` rounds down to the scale 0.5: the same
    values. An all-zero block stays zero; a block of amax 100: 400 is a tie between 384 and
    416, to even: 96."""
    fmt = quantized.FORMATS["e4m3"]
    t = torch.zeros(1, 64, dtype=torch.float64)
    t[0, :3] = torch.tensor([500.0, 1.0, 2.0**-11])
    t[0, 32] = 100.0
    want = torch.zeros(1, 64, dtype=torch.float64)
    want[0, :2] = torch.tensor([512.0, 1.0])
    want[0, 32] = 96.0
    assert torch.equal(quantized.blocked(t, 1, 32, fmt, "mxfp8", torch.float32), want)
    one_block = torch.zeros(1, 128, dtype=torch.float64)
    one_block[0, :3] = t[0, :3]
    want_b = torch.zeros(1, 128, dtype=torch.float64)
    want_b[0, :2] = torch.tensor([512.0, 1.0])
    assert torch.equal(quantized.blocked(one_block, 1, 128, fmt, "block", torch.float32), want_b)


def test_block_recipes_quantize_each_gemm_along_its_k():
    """The wgrad GEMM reads the input and the gradient blocked along the rows, the forward and
    dgrad GEMMs along the features; MXFP8's weight along ``in`` forward and ``out`` for dgrad;
    block scaling's weight in the same tiles both ways."""
    g = torch.Generator().manual_seed(3)
    t = torch.randn(64, 64, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, 64, dtype=torch.float64)
    mx = quantized.for_recipe("mxfp8")
    assert mx.by_direction and mx.scale_u == 0.0
    assert torch.equal(mx.x(0, 0, 0, t), quantized.blocked(t, 1, 32, mx.fmt, "mxfp8", torch.float32))
    assert torch.equal(mx.x_wgrad(0, 0, 0, t), quantized.blocked(t, 0, 32, mx.fmt, "mxfp8", torch.float32))
    assert not torch.equal(mx.x(0, 0, 0, t), mx.x_wgrad(0, 0, 0, t))
    assert not torch.equal(mx.weight(0, 0, t, False), mx.weight(0, 0, t, True))
    bw = quantized.for_recipe("blockwise")
    assert torch.equal(bw.weight(0, 0, t, False), bw.weight(0, 0, t, True))
    assert quantized.for_recipe("current").scale_u == quantized.SCALE_U


@pytest.mark.parametrize("rule", ["mxfp8", "block"])
def test_block_quantization_of_an_empty_group(rule):
    """A group that routes no row to a rank's microbatch (GroupedLinear) quantizes to nothing
    along either axis, and its interval form too."""
    from harness.backends.reference import _fp8

    fmt = quantized.FORMATS["e4m3"]
    for shape in ((0, 32), (32, 0)):
        t = torch.zeros(shape, dtype=torch.float64)
        for axis in (0, 1):
            assert quantized.blocked(t, axis, 32, fmt, rule, torch.bfloat16).shape == shape
            assert quantized.blocked_box(t, t, axis, 32, fmt, rule, torch.bfloat16)[1].shape == shape
            assert _fp8.block_quantized(t.float(), "mxfp8" if rule == "mxfp8" else "1d", axis, "e4m3",
                                        torch.bfloat16).shape == shape


def _nvfp4_cases(dtype):
    g = torch.Generator().manual_seed(11)
    wide = (torch.randn(48, 80, generator=g) * torch.exp(torch.randn(48, 80, generator=g) * 3)).to(dtype)
    zero_block = torch.randn(32, 32, generator=g).to(dtype)
    zero_block[:16, :16] = 0
    return [wide, zero_block, torch.zeros(16, 16, dtype=dtype)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("axis,tile", [(1, False), (0, False), (1, True)])
def test_nvfp4_gives_te_cpus_values(dtype, axis, tile):
    """The oracle's (float64) and the reference's NVFP4 quantize-dequantize are te-cpu's, value
    for value: 1-D blocks along either axis (row-wise data, the transpose's for column-wise)
    and 16x16 tiles, with the tensor factor ``amax / (448 * 6)`` applied exactly."""
    from harness.backends.reference import _fp8

    for t in _nvfp4_cases(dtype):
        x = t.to(torch.float32)
        amax = nvfp4._amax(x)
        src = x if axis == 1 else x.t().contiguous()
        data, scales = nvfp4.quantize_rows(src, amax, tile)
        theirs = nvfp4.decode_rows(data, scales).to(torch.float64) * (float(amax) / 2688.0)
        theirs = theirs if axis == 1 else theirs.t()
        ours = quantized.nvfp4_tiled(t) if tile else quantized.nvfp4_blocked(t, axis)
        ref = _fp8.block_quantized(x, "nvfp4-2d" if tile else "nvfp4", axis, "e4m3", dtype).to(torch.float64) \
            * (float(amax) / 2688.0)
        assert torch.equal(ours, theirs), (axis, tile, (ours - theirs).abs().max())
        assert torch.equal(ref, theirs), (axis, tile, (ref - theirs).abs().max())


def test_nvfp4_quantizes_each_gemm_along_its_k_and_the_weight_in_tiles():
    """The wgrad GEMM reads the input and the gradient blocked along the rows, the others along
    the features; the weight in the same 16x16 tiles both ways; an empty group is empty; the
    scale-inverse term is the GEMM's alpha (four fp32 roundings)."""
    g = torch.Generator().manual_seed(3)
    t = torch.randn(64, 64, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, 64, dtype=torch.float64)
    q = quantized.for_recipe("nvfp4")
    assert isinstance(q, quantized.Nvfp4Scaling) and q.by_direction
    assert q.scale_u == quantized.NVFP4_SCALE_U == quantized.scale_u("nvfp4") == 4 * 2.0**-24
    assert not torch.equal(q.x(0, 0, 0, t), q.x_wgrad(0, 0, 0, t))
    assert not torch.equal(q.dy(0, 0, 0, t), q.dy_wgrad(0, 0, 0, t))
    assert torch.equal(q.weight(0, 0, t, False), q.weight(0, 0, t, True))
    assert not torch.equal(q.weight(0, 0, t, False), q.x(0, 0, 0, t))  # tiles, not 1-D blocks
    for shape in ((0, 32), (32, 0)):
        empty = torch.zeros(shape, dtype=torch.float64)
        assert q.x(0, 0, 0, empty).shape == shape and q.x_wgrad(0, 0, 0, empty).shape == shape
        assert q.x_box(0, 0, 0, empty, empty)[1].shape == shape


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("recipe", ["mxfp8", "blockwise", "nvfp4"])
def test_a_normalized_input_is_block_quantized_within_its_box(norm, dtype, recipe):
    """LayerNormLinear's normalized rows under a block recipe: the normalization in fp32,
    rounded to the cell's dtype or not, quantized in blocks along the features (forward) and
    along the rows (wgrad), each lands within the oracle's centre +- slack of that direction;
    the unquantized rows do not."""
    from harness.cell import oracle
    from harness.cell.inputs import make_inputs
    from harness.backends.reference import _fp8, _norm
    from harness.vocabulary.shape import Example

    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    rule = {"mxfp8": "mxfp8", "blockwise": "1d", "nvfp4": "nvfp4"}[recipe]
    for seed in range(4):
        inputs = make_inputs(seed, Example(64, 32, 64), dtype, 1, 1, 1, True, norm=norm, unit=32)
        gi = oracle.gemm_inputs(inputs, recipe)
        centre, _, _ = gi(0, 0)
        slack = gi.slack(0, 0)
        _, centre_w, _, slack_w = gi.wgrad(0, 0)
        n = inputs.norm
        x = inputs.x[0][0]
        h32 = _norm.forward(x.float(), n.gamma, n.beta, _norm.NormCall(None, n.kind, n.zero_centered, n.eps))
        for h in (h32.to(torch_dtype).float(), h32):
            for axis, c, s in ((1, centre, slack), (0, centre_w, slack_w)):
                q = _fp8.block_quantized(h, rule, axis, "e4m3", torch_dtype).to(torch.float64)
                if recipe == "nvfp4":  # the reference leaves the tensor factor to its GEMM
                    q = q * (float(h.abs().max()) / 2688.0)
                assert bool(((q - c).abs() <= s).all()), (seed, recipe, dtype, axis)
        unquantized = oracle._normalize(x.to(torch.float64), n).h
        assert bool(((unquantized - centre).abs() > slack).any())


def test_shard_scaled_view_puts_every_shard_under_the_local_scale():
    """The defect model ``native_local_scale``: each shard's codes under the scale of its own
    amax, every shard dequantized with the local rank's scale-inverse. The local shard is
    its own current quantization; a foreign shard has the same codes, mis-scaled; a rank that
    holds only padding scales by 1. Only per-tensor current scaling has the view."""
    torch.manual_seed(3)
    w = torch.randn(64, 32, dtype=torch.float64)
    w[32:] *= 1e-3  # the second shard's amax is a thousandth of the first's
    current = quantized.for_recipe("current")
    fmt = quantized.FORMATS["e4m3"]
    s0, s1 = quantized.current_scale(w[:32], fmt), quantized.current_scale(w[32:], fmt)
    scales = (s0, s1)
    for local, (own, other) in enumerate(((slice(0, 32), slice(32, 64)), (slice(32, 64), slice(0, 32)))):
        view = quantized.for_recipe("current", shard_scaled=(32, local)).weight(0, 0, w, False)
        assert torch.equal(view[own], current.weight(0, 0, w[own], False))
        inv_local = 1.0 / float(torch.tensor(scales[local], dtype=torch.float32))
        inv_local = float(torch.tensor(inv_local, dtype=torch.float32))
        assert torch.equal(view[other], quantized.cast(w[other], scales[1 - local], fmt) * inv_local)
    padding_only = quantized.for_recipe("current", shard_scaled=(32, 3)).weight(0, 0, w, False)
    assert torch.equal(padding_only, torch.cat([quantized.cast(w[:32], s0, fmt), quantized.cast(w[32:], s1, fmt)]))
    with pytest.raises(ValueError, match="current scaling only"):
        quantized.for_recipe("mxfp8", shard_scaled=(32, 0))
