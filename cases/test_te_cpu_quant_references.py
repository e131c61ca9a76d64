"""te-cpu's quantizers against TE's own references, bit for bit, for all five recipes.

One subprocess imports ``harness.backends.te_cpu.backend`` (as the other te-cpu tests do) and
quantizes through TE's quantizer classes and ``tex.quantize`` - the binding TE's modules call -
on the device each recipe needs, then compares every byte TE's reference gives:

| recipe | TE's reference | compared |
|---|---|---|
| `delayed` | ``tests/cpp/operator/test_cast.cu`` ``compute_ref``, ported (``fixtures/te_references/cpp_refs.py``) | data, transpose, scale-inverse, the recorded amax |
| `current` | ``CurrentScalingQuantizerRef`` (TE 2.20.2's wheel, ``custom_recipes/reference_current_scaling.py``) | data, transpose, scale-inverse |
| `mxfp8` | ``tests/cpp/operator/test_cast_mxfp8.cu`` ``compute_ref`` and ``test_swizzle.cu`` ``compute_ref_swizzle``, ported | row- and column-wise data, E8M0 scales, the GEMM-ready (swizzled) scales |
| `blockwise` | ``tests/pytorch/references/blockwise_quantizer_reference.py`` (vendored: ``fixtures/te_references/``) | data, scales, column-wise data and scales (1x128 and 128x128; power-of-two and fp32 scales), as TE's ``test_float8_blockwise_scaling_exact.py`` compares them |
| `nvfp4` | ``NVFP4QuantizerRef`` (TE 2.20.2's wheel, ``custom_recipes/reference_nvfp4.py``) | E2M1 data both ways, E4M3 block scales both ways, the amaxes (1x16 and 16x16) |
| `current grouped` | ``tests/cpp/operator/test_cast_current_scaling_grouped.cu``, ported | ``group_quantize``: each group's data and transpose, the amax, scale and scale-inverse buffers (an empty group among them) |
| `mxfp8 grouped` | ``tests/cpp/operator/test_cast_mxfp8_grouped.cu`` and ``test_swizzle.cu``, ported | ``group_quantize`` of 128-row groups: data both ways, each group's padded scales, and in the GEMM's layout |
| `blockwise grouped` | ``blockwise_quantizer_reference.py`` per group | ``group_quantize`` of 128-row groups: each member's data and scales both ways, 1x128 and 128x128 |

Inputs: shapes of one block and of several, with ragged edges where TE pads (multiples of the
recipe's alignment that are not of its block or of the scale padding), in fp32 and bf16, both
FP8 formats; standard-normal values, a wide dynamic range (``randn * exp(3 randn)``), the block
magnitude profile of the block-spanning cells (``harness.cell.inputs.profile``), all zeros, all
``-0.0``, signed zeros among values, and denormals of the input dtype.

Two differences are the references' own (TE's CUDA code is the spec; docs/te-cpu.md), each
recognised here element by element, counted, and required to occur - so the inputs that show
them stay in - and nothing else may differ:

- **NVFP4, -0.0**: ``reference_utils.cast_to_fp4x2`` maps a scaled element that is exactly
  ``-0.0`` (an input ``-0.0``, or a negative value whose product with the scale underflows) to
  code 0 (``x >= 0.0`` holds for ``-0.0``); TE's conversion (``cvt.rn.satfinite.e2m1x2.f32``, in
  ``util/ptx_arch_spec.cuh``) keeps the sign, code 8, as te-cpu does. Equal as numbers.
- **Current scaling, an all-denormal bf16 tensor**: where ``fp8_max / amax`` overflows fp32 (an
  amax below about 1.3e-36: only bf16 and fp32 denormals reach it), TE's kernel takes fp32's
  largest value as the scale (``recipe/current_scaling.cu``: ``compute_scale_from_amax(...,
  std::numeric_limits<float>::max())``); ``CurrentScalingQuantizerRef`` takes the input dtype's
  (bf16: 3.3895e38, not 3.4028e38), so its scale-inverse differs. fp32 inputs agree; the data
  agree (every element saturates or rounds alike under either scale).
"""

from __future__ import annotations

from typing import Any

import pytest

from fixtures.te_script import run_te_script

RECIPES = ("delayed", "current", "mxfp8", "blockwise", "nvfp4", "current grouped", "mxfp8 grouped",
           "blockwise grouped")

_SCRIPT = """
    import math, os, torch
    import harness.backends.te_cpu.backend as backend
    from harness.backends.te_cpu import device
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer, Float8CurrentScalingQuantizer
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer
    from transformer_engine.pytorch.custom_recipes.reference_current_scaling import CurrentScalingQuantizerRef
    from transformer_engine.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef
    from transformer_engine.pytorch.custom_recipes.reference_utils import Fp4Formats
    from fixtures.te_references import cpp_refs
    from fixtures.te_references.blockwise_quantizer_reference import BlockwiseQuantizerReference, QuantizeResult
    from harness.cell.inputs import profile

    g = torch.Generator().manual_seed(20)
    FP8 = ((tex.DType.kFloat8E4M3, torch.float8_e4m3fn), (tex.DType.kFloat8E5M2, torch.float8_e5m2))
    DTYPES = (torch.float32, torch.bfloat16)

    def inputs(shape, dtype):
        r, c = shape
        tiny = 2.0 ** -126 if dtype == torch.float32 else torch.finfo(dtype).tiny
        signed = torch.randn(r, c, generator=g)
        signed[signed.abs() < 0.5] = -0.0
        out = dict(normal=torch.randn(r, c, generator=g),
                   wide=torch.randn(r, c, generator=g) * torch.exp(torch.randn(r, c, generator=g) * 3),
                   profile=torch.randn(r, c, generator=g) * profile(r, c),
                   zeros=torch.zeros(r, c), negzero=-torch.zeros(r, c), signed_zeros=signed,
                   denormal=torch.randn(r, c, generator=g).sign() * torch.rand(r, c, generator=g) * tiny)
        return {{k: v.to(dtype) for k, v in out.items()}}

    counts = {{}}  # (recipe, field) -> [values, unexplained mismatches, quirk mismatches]

    def compare(recipe, field, ours, ref, quirk=None):
        ours, ref = ours.reshape(-1), ref.reshape(-1)
        assert ours.shape == ref.shape, (recipe, field, ours.shape, ref.shape)
        if ours.dtype.is_floating_point:
            bad = ~((ours == ref) & (torch.signbit(ours) == torch.signbit(ref)) | (ours.isnan() & ref.isnan()))
        else:
            bad = ours != ref
        known = quirk(ours, ref) & bad if quirk is not None else torch.zeros_like(bad)
        c = counts.setdefault((recipe, field), [0, 0, 0])
        c[0] += ours.numel(); c[1] += int((bad & ~known).sum()); c[2] += int(known.sum())

    def negzero_nibble(ours, ref):  # NVFP4: a nibble 8 (-0) where the reference wrote 0 (+0), nothing else
        diff = ours ^ ref
        lo, hi = diff & 0x0F, diff >> 4
        lo_ok = (lo == 0) | ((lo == 8) & ((ours & 0x0F) == 8))
        hi_ok = (hi == 0) | ((hi == 8) & ((ours >> 4) == 8))
        return lo_ok & hi_ok

    # delayed scaling (Hopper: a transpose is kept): te-cpu's quantize with a given scale
    device.present(device.HOPPER)
    for dtype in DTYPES:
        for shape in ((64, 96), (272, 272)):
            for x in inputs(shape, dtype).values():
                for fp8, torch_fp8 in FP8:
                    for scale in (1.0, 0.37, 2.0 ** 10):
                        q = Float8Quantizer(torch.tensor([scale]), torch.zeros(1), fp8)
                        got = tex.quantize(x, q)
                        data, amax, scale_inv = cpp_refs.per_tensor_ref(x, scale, torch_fp8)
                        compare("delayed", "data", got._data, data)
                        compare("delayed", "transpose", got._transpose, data.reshape(shape).t())
                        compare("delayed", "scale_inv", got._scale_inv, torch.tensor([scale_inv]))
                        compare("delayed", "amax", q.amax, torch.tensor([amax]))

    def all_denormal_scale(ours, ref):  # the reference's infinite scale: bf16's largest value, not fp32's
        return (ours == 1.0 / torch.finfo(torch.float32).max) & (ref == 1.0 / torch.finfo(torch.bfloat16).max)

    for dtype in DTYPES:
        for shape in ((64, 96), (303, 300)):
            for x in inputs(shape, dtype).values():
                for fp8, torch_fp8 in FP8:
                    got = tex.quantize(x, Float8CurrentScalingQuantizer(fp8, device="cpu", rowwise=True, columnwise=True))
                    qx, sx, qx_t, _ = CurrentScalingQuantizerRef(dtype=torch_fp8)._quantize(x)
                    compare("current", "data", got._data, qx.view(torch.uint8))
                    compare("current", "transpose", got._transpose, qx_t.view(torch.uint8))
                    compare("current", "scale_inv", got._scale_inv, sx.float(), all_denormal_scale)

    # FP8 block scaling (Hopper), as TE's test_float8_blockwise_scaling_exact.py compares it
    ref = BlockwiseQuantizerReference()

    def compare_blockwise(recipe, got, x, torch_fp8, pow2, tile):
        want = ref.quantize(x, quant_dtype=torch_fp8, return_transpose=True, eps=0.0, pow_2_scales=pow2,
                            quant_tile_shape=tile)
        m, n = x.shape
        for field, data, scale, want_data, want_scale, grid in (
                ("rowwise", got._rowwise_data, got._rowwise_scale_inv, want.data, want.scale, (m, n)),
                ("columnwise", got._columnwise_data, got._columnwise_scale_inv, want.data_t, want.scale_t, (n, m))):
            mask = ref.scale_munger.munge_scale_shapes_for_backend(QuantizeResult(
                None, torch.ones(math.ceil(grid[0] / tile[0]), math.ceil(grid[1] / tile[1])), None, None),
                tile).scale  # the scale buffer's padding is don't-care
            compare(recipe, f"{{field}} data", data, want_data.view(torch.uint8))
            compare(recipe, f"{{field}} scales", scale * mask, want_scale)

    for dtype in DTYPES:
        for shape in ((128, 128), (256, 272), (303, 300)):
            for x in inputs(shape, dtype).values():
                for fp8, torch_fp8 in FP8:
                    for dim, tile in ((1, (1, 128)), (2, (128, 128))):
                        for pow2 in (True, False):
                            q = Float8BlockQuantizer(fp8, rowwise=True, columnwise=True, amax_epsilon=0.0,
                                                     force_pow_2_scales=pow2, block_scaling_dim=dim)
                            compare_blockwise("blockwise", tex.quantize(x, q), x, torch_fp8, pow2, tile)

    # the grouped-tensor path's grouped quantization (group_quantize), member by member, against
    # TE's grouped references: current scaling and FP8 block scaling on Hopper here, MXFP8 below
    def grouped_inputs(rows, k, dtype):
        return inputs((sum(rows), k), dtype), torch.tensor(rows, dtype=torch.int64)

    for dtype in DTYPES:
        for rows, k in (([64, 0, 96, 16], 96), ([128, 256], 272)):
            xs, splits = grouped_inputs(rows, k, dtype)
            for x in xs.values():
                for fp8, torch_fp8 in FP8:
                    q = Float8CurrentScalingQuantizer(fp8, device="cpu", rowwise=True, columnwise=True)
                    got = tex.group_quantize(x, q, len(rows), splits)
                    want = cpp_refs.current_grouped_ref(x, rows, torch_fp8)
                    compare("current grouped", "data", got.rowwise_data, want["rowwise"])
                    compare("current grouped", "transpose", got.columnwise_data, want["colwise"])
                    for field in ("scale_inv", "amax", "scale"):
                        compare("current grouped", field, getattr(got, field), want[field])
        for rows, k in (([128, 0, 256], 272), ([256, 128], 128)):
            xs, splits = grouped_inputs(rows, k, dtype)
            for x in xs.values():
                for fp8, torch_fp8 in FP8:
                    for dim, tile in ((1, (1, 128)), (2, (128, 128))):
                        q = Float8BlockQuantizer(fp8, rowwise=True, columnwise=True, amax_epsilon=0.0,
                                                 force_pow_2_scales=True, block_scaling_dim=dim)
                        got = tex.group_quantize(x, q, len(rows), splits)
                        start = 0
                        for member, r in zip(got.split_into_quantized_tensors(), rows):
                            if r:
                                compare_blockwise("blockwise grouped", member, x[start:start + r], torch_fp8, True, tile)
                            start += r

    # MXFP8 and NVFP4 (Blackwell)
    device.present(device.BLACKWELL)
    for dtype in DTYPES:
        for shape in ((64, 96), (96, 96), (288, 160)):
            r, c = shape
            for x in inputs(shape, dtype).values():
                for fp8, torch_fp8 in FP8:
                    want = cpp_refs.mxfp8_ref(x, torch_fp8)
                    for swizzled in (False, True):
                        q = MXFP8Quantizer(fp8, rowwise=True, columnwise=True)
                        q.optimize_for_gemm = swizzled
                        got = tex.quantize(x, q)
                        compare("mxfp8", "rowwise data", got._rowwise_data, want["rowwise"])
                        compare("mxfp8", "columnwise data", got._columnwise_data, want["colwise"])
                        rows, cols = got._rowwise_scale_inv, got._columnwise_scale_inv
                        if swizzled:  # te-cpu pads with zeros (TE leaves the padding unwritten)
                            padded_r = torch.zeros(rows.shape, dtype=torch.uint8)
                            padded_r[:r, :c // 32] = want["scales_rowwise"]
                            padded_c = torch.zeros(cols.shape, dtype=torch.uint8)
                            padded_c[:r // 32, :c] = want["scales_colwise"]
                            compare("mxfp8", "rowwise scales, GEMM layout", rows, cpp_refs.swizzle_ref(padded_r, True))
                            compare("mxfp8", "columnwise scales, GEMM layout", cols, cpp_refs.swizzle_ref(padded_c, False))
                        else:
                            compare("mxfp8", "rowwise scales", rows[:r, :c // 32], want["scales_rowwise"])
                            compare("mxfp8", "columnwise scales", cols[:r // 32, :c], want["scales_colwise"])
    for dtype in DTYPES:
        for rows, k in (([128, 0, 256], 96), ([256, 128], 160)):
            xs, splits = grouped_inputs(rows, k, dtype)
            for x in xs.values():
                for fp8, torch_fp8 in FP8:
                    want = cpp_refs.mxfp8_grouped_ref(x, rows, torch_fp8)
                    for swizzled in (False, True):
                        q = MXFP8Quantizer(fp8, rowwise=True, columnwise=True)
                        q.optimize_for_gemm = swizzled
                        got = tex.group_quantize(x, q, len(rows), splits)
                        compare("mxfp8 grouped", "rowwise data", got.rowwise_data, want["rowwise"])
                        compare("mxfp8 grouped", "columnwise data", got.columnwise_data, want["colwise"])
                        if swizzled:  # the GEMM's layout, member by member (whole 128-row members)
                            rows_sw = torch.cat([cpp_refs.swizzle_ref(b, True) for b in want["scale_blocks_rowwise"]])
                            cols_sw = torch.cat([cpp_refs.swizzle_ref(b, False) for b in want["scale_blocks_colwise"]])
                            compare("mxfp8 grouped", "rowwise scales, GEMM layout", got.scale_inv, rows_sw)
                            compare("mxfp8 grouped", "columnwise scales, GEMM layout", got.columnwise_scale_inv, cols_sw)
                        else:
                            compare("mxfp8 grouped", "rowwise scales", got.scale_inv, want["scales_rowwise"])
                            compare("mxfp8 grouped", "columnwise scales", got.columnwise_scale_inv, want["scales_colwise"])
    for dtype in DTYPES:
        for shape in ((48, 48), (64, 96), (272, 272)):
            r, c = shape
            for x in inputs(shape, dtype).values():
                for tile in (False, True):
                    got = tex.quantize(x, NVFP4Quantizer(rowwise=True, columnwise=True, with_2d_quantization=tile))
                    qx, sx, qx_t, sx_t, amax_r, amax_c = NVFP4QuantizerRef(
                        dtype=Fp4Formats.E2M1, quant_tile_shape=(16, 16) if tile else (1, 16))._quantize(x)
                    compare("nvfp4", "rowwise data", got._rowwise_data, qx, negzero_nibble)
                    compare("nvfp4", "columnwise data", got._columnwise_data, qx_t, negzero_nibble)
                    compare("nvfp4", "rowwise scales", got._rowwise_scale_inv[:r, :c // 16], sx.view(torch.uint8)[:r, :c // 16])
                    compare("nvfp4", "columnwise scales", got._columnwise_scale_inv[:c, :r // 16],
                            sx_t.view(torch.uint8)[:c, :r // 16])
                    compare("nvfp4", "amax", torch.cat([got._amax_rowwise.reshape(-1), got._amax_columnwise.reshape(-1)]),
                            torch.cat([amax_r.reshape(-1), amax_c.reshape(-1)]))
    torch.save(counts, os.environ["DW_TE_SCRIPT_OUT"])
"""

#: the fields a reference quirk may show in (module docstring), and nowhere else
QUIRKS = {("current", "scale_inv"), ("nvfp4", "rowwise data"), ("nvfp4", "columnwise data")}


@pytest.fixture(scope="module")
def counts(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], list[int]]:
    return run_te_script(tmp_path_factory, "te_quant_refs", _SCRIPT, timeout=900)


@pytest.mark.parametrize("recipe", RECIPES)
def test_quantizer_equals_tes_reference_bit_for_bit(counts: dict[tuple[str, str], list[int]], recipe: str) -> None:
    """Every byte of data and scales (and every amax) te-cpu writes equals TE's reference, apart
    from the references' own quirks, which occur where the docstring says and nowhere else."""
    mine = {field: c for (r, field), c in counts.items() if r == recipe}
    assert mine and all(values > 0 for values, _, _ in mine.values()), mine
    unexplained = {field: (bad, values) for field, (values, bad, _) in mine.items() if bad}
    assert not unexplained, f"{recipe}: mismatches (field: mismatched, compared): {unexplained}"
    quirks = {(recipe, field) for field, (_, _, known) in mine.items() if known}
    assert quirks == {q for q in QUIRKS if q[0] == recipe}, quirks


def test_values_compared(counts: dict[tuple[str, str], list[int]]) -> Any:
    """The comparison covers millions of values per recipe (docs/te-cpu.md gives the counts)."""
    per = {r: sum(v for (rr, _), (v, _, _) in counts.items() if rr == r) for r in RECIPES}
    assert all(n >= 500_000 for n in per.values()), per
