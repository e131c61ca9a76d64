"""Defect models: what a known numeric defect does to a value, by name (no torch).

A ledger entry for a numeric defect states the defect as a *prediction*
(``{ check = "weight.main_grad", model = "wgrad_in_activation_dtype" }``): the rank computes
the oracle with that defect applied (``harness.cell.predict``) and judges the check's value against
it with the normal bound, so damage beyond the defect still fails. The rank records, on each
failing value check, its error/bound ratio under every model that applies to it
(``Check.models``); the ledger (parent side) matches a model symptom when that ratio is at
most 1. This module is the vocabulary both sides share.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

__all__ = ["Model", "MODELS", "applies"]


@dataclass(frozen=True)
class Model:
    """One defect model: its meaning in a line, and the value checks it predicts."""

    name: str
    meaning: str
    checks: tuple[str, ...]  #: globs over value-check names


_MODELS = (
    Model("wgrad_in_activation_dtype",
          "each microbatch's weight gradient leaves its GEMM rounded to the activation dtype (fp32 "
          "accumulation, one rounding), is scaled by 1/W and summed over the W ranks in that dtype "
          "(the finalize's reduce-scatter), then added to main_grad",
          ("weight*.main_grad",)),
    Model("no_gradient",
          "no gradient reaches the parameter: its main_grad keeps its start value",
          ("weight*.main_grad", "bias*.main_grad")),
    Model("main_grad_rebound",
          "the backend rebinds param.main_grad to another tensor: the buffer the step started with "
          "(the one Megatron's DDP reads) keeps its start value",
          ("weight*.main_grad",)),
    Model("grad_assigned_last_microbatch",
          "the delayed wgrad is assigned to .grad instead of accumulated: .grad holds the last "
          "microbatch's weight gradient (rounded to the dtype), averaged over the ranks in that dtype",
          ("weight*.grad",)),
    Model("bias_grad_first_microbatch",
          "backward_dw() assigns a delayed bias gradient only while .grad is None: .grad holds the first "
          "microbatch's bias gradient (rounded to the dtype), averaged over the ranks in that dtype",
          ("bias*.grad",)),
    Model("dgrad_from_forward_copy",
          "the input gradient is computed from the forward-materialized copy of the weight (no "
          "backward materialize)",
          ("mb*.input_grad", "layer_norm_*.main_grad", "layer_norm_*.grad")),
    Model("dgrad_from_stored_weight",
          "the input gradient is computed from the module's stored weight (the unsharded parameter, at "
          "world size 1) instead of its backward-materialized copy",
          ("mb*.input_grad", "layer_norm_*.main_grad", "layer_norm_*.grad")),
    Model("dgrad_weight_requantized",
          "under delayed scaling the input gradient multiplies the backward-materialized weight "
          "quantized again with the weight's scale as updated after this microbatch's forward, not the "
          "weight the forward quantized; that quantize records the copy's amax, which enters the "
          "weight's next scale (fp8_scales: the model's scales exactly)",
          ("mb*.input_grad", "layer_norm_*.main_grad", "layer_norm_*.grad", "fp8_scales")),
    Model("dgrad_weight_unquantized",
          "under a recipe the input gradient multiplies the backward-materialized weight as it is, in "
          "the cell's dtype, beside the quantized output gradient (no re-quantization of the re-gathered "
          "weight); a normalization's parameter gradients follow from that input gradient",
          ("mb*.input_grad", "layer_norm_*.main_grad", "layer_norm_*.grad")),
    Model("native_local_scale",
          "the all-gathered native FP8 weight carries this rank's shard's scale-inverse for every "
          "shard: each shard's codes (quantized with its own current scale) are multiplied by the "
          "local one",
          ("mb*.output", "mb*.input_grad", "layer_norm_*.main_grad", "layer_norm_*.grad")),
    Model("native_local_scale_fp32_bias",
          "native_local_scale and fp8_bias_unrounded in one output: the local scale-inverse for every "
          "shard, and an fp32 layer's forward bias added in fp32",
          ("mb*.output",)),
    Model("unwritten_weight_buffer",
          "the GEMM multiplies a gathered weight read from a buffer nothing wrote: on te-cpu memory TE "
          "leaves uninitialized holds NaN codes and scales, so every output element is NaN",
          ("mb*.output",)),
    Model("fp8_bias_unrounded",
          "under a recipe an fp32 layer's forward bias is added in fp32 to the quantized GEMM's "
          "result, not rounded to bf16 first (TE's Linear rounds it: cuBLAS takes no fp32 bias in "
          "an FP8 GEMM)",
          ("mb*.output",)),
)
#: every model a ledger may name
MODELS: dict[str, Model] = {m.name: m for m in _MODELS}


def applies(model: str, check: str) -> bool:
    """Whether ``model`` predicts the value check ``check`` (a name, or a name-like glob such
    as ``weight*.main_grad``: its ``*`` read as a digit)."""
    name = check.replace("*", "0")
    return any(fnmatch.fnmatchcase(name, g) for g in MODELS[model].checks)
