"""TE 2.20.2's own layers under its low-precision recipes on te-cpu, against float64.

One subprocess imports ``harness.backends.te_cpu.backend`` (as the other te-cpu tests do), presents the device
each recipe needs (``harness.backends.te_cpu.device``) and runs ``Linear``, ``LayerNormLinear``
(LayerNorm and RMSNorm), ``GroupedLinear`` (split-quantize path) and ``ops.GroupedLinear``
forward and backward under ``te.autocast`` with ``DelayedScaling``, ``Float8CurrentScaling``,
``MXFP8BlockScaling`` and ``Float8BlockScaling``. Every quantized GEMM TE calls is recorded:
its two operands as the GEMM reads them (decoded exactly, in float64) and what it wrote.

The judgement, here: each output equals the float64 product of the same quantized operands up
to fp32 accumulation and the output rounding - ``|out - ref| <= (K + 8) * 2^-24 * |B||A|^T
* |factors| + u(out) * |ref|`` plus the bias / ``beta * D`` terms (a K-term fp32 sum errs by
at most K units of its magnitude; 8 more cover the factor, bias and beta roundings; the
output rounding is half an ulp, ``u(bf16) = 2^-8``, ``u(fp32) = 2^-24``). The decoding itself is
checked against TE's own Python (per-tensor FP8's CPU dequantize, FP8 block scaling's Python
dequantize); the quantizers themselves against TE's references in
``cases/test_te_cpu_quant_references.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fixtures.te_script import run_te_script

RECIPES = ("delayed", "current", "mxfp8", "blockwise", "nvfp4")
MODULES = ("linear", "layernorm_linear", "rmsnorm_linear", "grouped", "ops_grouped")
U = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}

_SCRIPT = """
    import os, sys, torch
    import harness.backends.te_cpu.backend as backend
    from harness.backends.te_cpu import device
    from harness.backends.te_cpu.quant import bindings as qb
    te = sys.modules["transformer_engine.pytorch"]
    tex = sys.modules["transformer_engine_torch"]
    from transformer_engine.common import recipe as R
    RECIPES = {RECIPES}
    MODULES = {MODULES}
    H, ROWS = 64, 64
    make = {{"delayed": R.DelayedScaling, "current": R.Float8CurrentScaling,
             "mxfp8": R.MXFP8BlockScaling, "blockwise": R.Float8BlockScaling,
             "nvfp4": lambda: R.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True)}}

    def dense(op):  # an Operand as a float64 [rows, K] matrix
        v = op.values.double()
        if op.k_scales is not None:
            v = v * op.k_scales.double().repeat_interleave(op.k_block, dim=1)[:, :v.shape[1]]
        if op.amax is not None:  # NVFP4: the tensor factor the GEMM folds into alpha, exact here
            v = v * (float(op.amax) / (6 * 448))
        return v * float(op.factor)

    records = []
    orig = qb.generic_gemm
    def recording(A, transA, B, transB, D, quantizer, output_dtype, bias, bias_type, gelu, gelu_in, grad,
                  ws, wss, accumulate, usa, *rest, **kw):
        a, b = dense(qb._operand(A, transA, "A")), dense(qb._operand(B, not transB, "B"))
        before = None if D is None else D.detach().clone()
        out = orig(A, transA, B, transB, D, quantizer, output_dtype, bias, bias_type, gelu, gelu_in, grad,
                   ws, wss, accumulate, usa, *rest, **kw)
        beta = kw.get("beta")
        records.append(dict(a=a, b=b, out=out[0].detach().clone(), before=before,
                            beta=(1.0 if accumulate else 0.0) if beta is None else beta,
                            alpha=kw.get("alpha", 1.0), bias=None if (bias is None or grad) else bias.detach().clone()))
        return out
    qb.generic_gemm = recording

    def build(kind):
        if kind == "linear":
            return te.Linear(H, H, bias=True, params_dtype=torch.bfloat16, device="cpu")
        if kind == "layernorm_linear":
            return te.LayerNormLinear(H, H, bias=True, params_dtype=torch.bfloat16, device="cpu")
        if kind == "rmsnorm_linear":
            return te.LayerNormLinear(H, H, bias=True, normalization="RMSNorm", params_dtype=torch.bfloat16, device="cpu")
        if kind == "grouped":
            return te.GroupedLinear(2, H, H, bias=True, params_dtype=torch.bfloat16, device="cpu")
        return te.ops.GroupedLinear(2, H, H, bias=True, dtype=torch.bfloat16, device="cpu")

    saved = {{"runs": {{}}}}
    for name in RECIPES:
        device.present(device.capability_for(name))
        for kind in MODULES:
            torch.manual_seed(len(kind) + len(name))
            m = build(kind)
            with torch.no_grad():
                for p in m.parameters():
                    p.copy_((torch.randn(p.shape) * 0.5).to(p.dtype))
            records.clear()
            backend.reset_path_evidence()
            weights = []
            for mb in range(2):
                x = (torch.randn(ROWS, H) * (1 + 30 * mb)).to(torch.bfloat16).requires_grad_()
                dy = torch.randn(ROWS, H).to(torch.bfloat16)
                n0 = len(records)
                with te.autocast(enabled=True, recipe=make[name]()):
                    if kind == "grouped":
                        y = m(x, [32, 32], is_first_microbatch=(mb == 0))
                    elif kind == "ops_grouped":
                        y = m(x, torch.tensor([32, 32]))
                    else:
                        y = m(x, is_first_microbatch=(mb == 0))
                weights.append(records[n0]["a"].clone())
                y.backward(dy)
                if mb == 0 and kind != "ops_grouped":
                    with torch.no_grad():  # a cached FP8 weight must not see this until the next first microbatch
                        for p in m.parameters():
                            p.add_(1.0)
            saved["runs"][(name, kind)] = dict(records=[dict(r) for r in records], evidence=backend.path_evidence(),
                                               weights=weights)

    # te-cpu's decodes against TE's Python (its quantizers against TE's references:
    # cases/test_te_cpu_quant_references.py)
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from transformer_engine.pytorch.tensor.storage.float8_blockwise_tensor_storage import Float8BlockwiseQTensorStorage
    device.present(device.HOPPER)
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(64, 96, generator=g).to(torch.bfloat16),
              (torch.randn(32, 32, generator=g) * 1e4).to(torch.bfloat16),
              torch.zeros(32, 32, dtype=torch.bfloat16)]
    inputs[0][3, 7] = 900.0
    ref_cmp = []
    for fp8 in (tex.DType.kFloat8E4M3, tex.DType.kFloat8E5M2):
        for x in inputs:
            q = Float8CurrentScalingQuantizer(fp8, device="cpu", rowwise=True, columnwise=True)
            got = tex.quantize(x, q)
            ref_cmp.append(dict(te_deq=got.dequantize(dtype=torch.float32), ours=qb.dequantize(got, tex.DType.kFloat32)))
    block_cmp = []
    for dim in (1, 2):
        x = (torch.randn(256, 192, generator=g) * torch.logspace(-3, 3, 192)).to(torch.bfloat16)
        q = Float8BlockQuantizer(tex.DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=dim)
        t = tex.quantize(x, q)
        col_only = Float8BlockwiseQTensorStorage(rowwise_data=None, rowwise_scale_inv=None,
                                                 columnwise_data=t._columnwise_data,
                                                 columnwise_scale_inv=t._columnwise_scale_inv,
                                                 fp8_dtype=t._fp8_dtype, quantizer=None, is_2D_scaled=dim == 2,
                                                 fake_dtype=torch.float32)
        block_cmp.append(dict(x=x, te_row=t.dequantize(dtype=torch.float32), ours_row=qb.dequantize(t, tex.DType.kFloat32),
                              te_col=col_only.dequantize(dtype=torch.float32),
                              ours_col=qb.dequantize(col_only, tex.DType.kFloat32)))
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer
    device.present(device.BLACKWELL)
    saved["ref_cmp"], saved["block_cmp"] = ref_cmp, block_cmp
    from harness.backends.te_cpu.quant import nvfp4 as nv
    big = (torch.randn(128, 256, generator=g) * torch.exp(torch.randn(128, 256, generator=g))).to(torch.bfloat16)
    tensors = []
    for gemm_layout in (True, False):  # TE's 2-D kernel writes swizzled scales for 128-aligned shapes
        q = NVFP4Quantizer(rowwise=True, columnwise=True, with_2d_quantization=True)
        q.optimize_for_gemm = gemm_layout
        tensors.append(tex.quantize(big, q))
    sw, lin = tensors
    saved["nvfp4_swizzle"] = dict(flags=(sw._with_gemm_swizzled_scales, lin._with_gemm_swizzled_scales),
                                  data=(torch.equal(sw._rowwise_data, lin._rowwise_data),
                                        torch.equal(sw._columnwise_data, lin._columnwise_data)),
                                  scales_differ=not torch.equal(sw._rowwise_scale_inv, lin._rowwise_scale_inv),
                                  rows=(nv.decode_rowwise(sw), nv.decode_rowwise(lin)),
                                  cols=(nv.decode_columnwise(sw), nv.decode_columnwise(lin)),
                                  deq=(qb.dequantize(sw, tex.DType.kFloat32), qb.dequantize(lin, tex.DType.kFloat32)))
    t = torch.arange(2 * 3 * 8, dtype=torch.uint8).reshape(2, 3, 8)
    saved["swap"] = (t, tex.swap_first_dims(t), tex.swap_first_dims(t, out=torch.empty(3, 2, 8, dtype=torch.uint8)))
    torch.save(saved, os.environ["DW_TE_SCRIPT_OUT"])
"""


@pytest.fixture(scope="module")
def te_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_te_script(tmp_path_factory, "te_quant", _SCRIPT, RECIPES=RECIPES, MODULES=MODULES)


def _bound(r: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 reference of one GEMM record and its derived bound (module docstring)."""
    a, b, out = r["a"], r["b"], r["out"]
    k = a.shape[1]
    ref = (b @ a.t()) * r["alpha"]
    mag = (b.abs() @ a.abs().t()) * abs(r["alpha"])
    if r["bias"] is not None and r["bias"].numel():
        ref = ref + r["bias"].double().reshape(1, -1)
        mag = mag + r["bias"].double().abs().reshape(1, -1)
    if r["beta"]:
        prev = r["before"].double().reshape(ref.shape)
        ref = ref + r["beta"] * prev
        mag = mag + abs(r["beta"]) * prev.abs()
    bound = (k + 8) * 2.0 ** -24 * mag + U[out.dtype] * ref.abs() + 2.0 ** -133
    return ref, bound


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("module", MODULES)
def test_quantized_gemms_are_float64_of_the_same_operands(te_runs: dict[str, Any], recipe: str, module: str) -> None:
    """Forward, dgrad and wgrad GEMMs of both microbatches: only accumulation and output rounding
    (NVFP4: its tensor factors taken exactly, their fp32 product in alpha within the 8 spare units)."""
    run = te_runs["runs"][(recipe, module)]
    recs = run["records"]
    grouped = module in ("grouped", "ops_grouped")
    assert len(recs) == (12 if grouped else 6), [len(recs), run["evidence"]]
    worst = 0.0
    for i, r in enumerate(recs):
        ref, bound = _bound(r)
        err = (r["out"].double().reshape(ref.shape) - ref).abs()
        assert (err <= bound).all(), (i, float((err / bound).max()))
        worst = max(worst, float((err / bound).max()))
    assert worst > 0  # the check compared something that rounds


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("module", ("linear", "layernorm_linear", "grouped"))
def test_fp8_weight_cache_holds_across_microbatches(te_runs: dict[str, Any], recipe: str, module: str) -> None:
    """``is_first_microbatch=False`` reuses the FP8 weight quantized in the first microbatch,
    though the weight changed in between (TE's weight caching runs on te-cpu)."""
    w0, w1 = te_runs["runs"][(recipe, module)]["weights"]
    assert torch.equal(w0, w1)


def test_ops_grouped_requantizes_each_step(te_runs: dict[str, Any]) -> None:
    """``ops.GroupedLinear`` (no microbatch caching) quantizes its weights on every forward."""
    w0, w1 = te_runs["runs"][("current", "ops_grouped")]["weights"]
    assert torch.equal(w0, w1)  # unchanged weights: the same quantization


def test_path_evidence_names_the_quantization_kernels(te_runs: dict[str, Any]) -> None:
    ev = te_runs["runs"][("delayed", "linear")]["evidence"]
    assert ev.get("quantize") and ev.get("generic_gemm") == 6
    assert ev.get("fused_amax_and_scale_update_after_reduction")  # delayed scaling's update ran
    assert te_runs["runs"][("mxfp8", "grouped")]["evidence"].get("split_quantize")


def test_current_scaling_decode_matches_tes_python_dequantize(te_runs: dict[str, Any]) -> None:
    """te-cpu's dequantize of a current-scaling tensor equals TE's own Python (CPU) dequantize
    (its quantize equals TE's reference: cases/test_te_cpu_quant_references.py)."""
    for c in te_runs["ref_cmp"]:
        assert torch.equal(c["te_deq"], c["ours"])


def test_blockwise_decode_matches_tes_python_dequantize(te_runs: dict[str, Any]) -> None:
    """Row-wise and (transposed, separately quantized) column-wise data decode as TE's Python
    ``Float8BlockwiseQTensorStorage.dequantize`` does, and stay within FP8's rounding of the input."""
    for c in te_runs["block_cmp"]:
        assert torch.equal(c["te_row"], c["ours_row"])
        assert torch.equal(c["te_col"], c["ours_col"])
        x = c["x"].double()
        # E4M3: half an ulp (2^-4 relative) for normals; below, half the subnormal step 2^-9 of a
        # block whose scale_inv is at most 2 * amax / 448 (power-of-two scales round down)
        floor = 2.0 ** -10 * 2 * x.abs().max() / 448
        for deq in (c["ours_row"], c["ours_col"]):
            assert ((deq.double() - x).abs() <= 2.0 ** -4 * x.abs() + floor).all()


def test_swap_first_dims_reorders_gathered_data(te_runs: dict[str, Any]) -> None:
    """``swap_first_dims`` (TE's NVFP4 all-gather reorders column-wise data with it): ``[w, a,
    b]`` -> ``[a, w, b]``, contiguous, into a new tensor or ``out``."""
    t, new, into = te_runs["swap"]
    want = t.transpose(0, 1).contiguous()
    assert torch.equal(new, want) and new.is_contiguous() and torch.equal(into, want)


def test_nvfp4_swizzled_scales_decode_as_the_linear_ones(te_runs: dict[str, Any]) -> None:
    """A 2-D NVFP4 quantizer asked to optimize for the GEMM writes its E4M3 scales in the GEMM's
    swizzled layout where TE's kernel does (Blackwell, both dimensions multiples of 128): the
    same codes, the scales in another order, and every decode - row-wise, column-wise,
    ``dequantize`` - equal to the linear layout's."""
    c = te_runs["nvfp4_swizzle"]
    assert c["flags"] == (True, False) and c["data"] == (True, True) and c["scales_differ"]
    for a, b in (c["rows"], c["cols"], c["deq"]):
        assert torch.equal(a, b)
