"""The ``module`` axis: what each value means (pure data, no torch).

One :class:`ModuleKind` per value says everything the rest of the harness needs to know of a
module: which backend class builds it and with which keyword arguments (CONTRACTS §1), how
its forward takes the row splits, whether it is a group of N GEMMs, and which normalization
runs before its GEMM. A new module is one new entry here, not a new branch in the matrix,
the runner and the oracle.

Two values are not one TE module but Megatron-Core's expert layer, ``TEGroupedMLP`` (fc1,
the activation times the routing probabilities, fc2: two TE ``GroupedLinear``), built by
Megatron's own constructor, which shards and attaches the expert weights itself: a chunk of
``layers`` MoE layers run for two iterations of ``microbatches`` each (``ModuleKind.layer``;
``harness.cell.mlp`` runs them).

The matrix, the CLI and the reports import this module in the parent process, so it must
stay free of torch; :mod:`harness.cell.runner` turns a kind into a module inside a rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ModuleKind", "KINDS", "NAMES", "APIS", "LAYERS", "NORM_PARAMS", "on_path"]

#: a normalization's parameters, in order (RMSNorm has only the first)
NORM_PARAMS: tuple[str, ...] = ("layer_norm_weight", "layer_norm_bias")


@dataclass(frozen=True)
class ModuleKind:
    """One value of the ``module`` axis.

    Attributes:
        name: the axis value (also the cell-id part).
        summary: one line for ``list`` and the docs.
        api: the backend attribute that builds it (``"ops.GroupedLinear"`` is nested).
        grouped: N GEMMs over row splits (the ``num_gemms`` axis applies); otherwise a group
            of one, and a cell always has ``num_gemms=1``.
        splits: how ``forward`` takes the row splits: ``"none"``, ``"list"`` (``m_splits``),
            ``"tensor"`` (``split_sizes``, an int64 CPU tensor) or ``"device"`` (an int64
            tensor in the run's device memory, as the grouped-tensor path insists: on te-cpu
            the backend's ``device_tensor`` marks a CPU tensor device-resident).
        ops: built with the op-fuser's keywords (``dtype``, ``accumulate_into_main_grad``)
            instead of the module keywords (``params_dtype``, ``fuse_wgrad_accumulation``).
        normalization: ``"LayerNorm"`` or ``"RMSNorm"`` before the GEMM, or None.
        zero_centered_gamma: the normalization scales by ``1 + gamma`` (Megatron's
            "layernorm 1p"); its gradient formula is unchanged, its values are not.
        evidence: the TE extension functions a backend that reports its path
            (``path_evidence()``, te-cpu) must have called when the cell ran: the proof that
            TE took the path the cell names (its forward GEMM, its normalization).
        excludes: extension functions that must not have been called (another path's GEMM:
            TE may fall back from one grouped path to the other without a word).
        quantized_evidence, quantized_excludes: the same under a recipe: the path's own
            quantizer (the grouped-tensor path's ``group_quantize``) and another path's
            (``split_quantize``): the proof that the recipe ran on the path named.
        path: the TE execution path (``"split_quantize"``, ``"grouped_tensor"``) or ``""``;
            a backend that can choose (``use_path``, te-cpu: its cuBLASLt version answer) is
            told before each cell.
        options: extra constructor keywords (``use_grouped_tensor=True``).
        dtypes: the cell dtypes the path exists for (TE's grouped-tensor GEMM: bf16, fp16).
        bias_multiple: with a bias, ``out_features`` is rounded up to a multiple of this
            (the grouped-tensor path adds the bias with a vectorised kernel that needs 8
            16-bit elements per row; TE refuses other widths).
        layer: Megatron-Core's ``TEGroupedMLP`` built by Megatron (needs megatron-core and a TE
            backend); the cell's ``num_gemms`` is its experts, ``layers`` its MoE layers per
            model chunk, ``iterations`` its training iterations.
        activation: the layer's activation between fc1 and fc2 (``"swiglu"``: Megatron's gated
            SiLU, fc1 twice as wide; ``"gelu"``), or None.
        iterations: training iterations per cell (a layer's state carried between steps is
            judged in the second): 1 for a module.
        weights: the weight values the module takes (None: every one). Megatron's layer shards
            and attaches its own weights: plain (no expert GTP) or Megatron's.
        consumers: the consumers it runs under (Megatron's layer: only its DDP's ``main_grad``).
        takes_first_microbatch: its forward takes ``is_first_microbatch``.
        delays_wgrad: a cell may delay its weight gradient (``backward_dw``).
        offload_leaves_path: TE's CPU offloading makes it leave the path it names
            (``GroupedLinear``'s grouped-tensor path: ``harness.vocabulary.hook_modes``).
    """

    name: str
    summary: str
    api: str
    grouped: bool = False
    splits: str = "none"
    ops: bool = False
    normalization: str | None = None
    zero_centered_gamma: bool = False
    evidence: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    quantized_evidence: tuple[str, ...] = ()
    quantized_excludes: tuple[str, ...] = ()
    path: str = ""
    options: tuple[tuple[str, Any], ...] = ()
    dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")
    bias_multiple: int = 1
    layer: bool = False
    activation: str | None = None
    iterations: int = 1
    weights: tuple[str, ...] | None = None
    consumers: tuple[str, ...] = ("ddp", "autograd")
    takes_first_microbatch: bool = True
    delays_wgrad: bool = True
    offload_leaves_path: bool = False

    def out_features(self, out: int, bias: bool) -> int:
        """The ``out_features`` a cell builds with, given the example's ``out``."""
        m = self.bias_multiple if bias else 1
        return -(-out // m) * m

    def path_mismatch(self, called: dict[str, int], quantized: bool = False) -> str | None:
        """Why the extension functions ``called`` do not prove this kind's path (None: they do);
        ``quantized``: the cell ran under a recipe (the quantizer evidence counts too)."""
        evidence = self.evidence + (self.quantized_evidence if quantized else ())
        excludes = self.excludes + (self.quantized_excludes if quantized else ())
        missing = [f for f in evidence if not called.get(f)]
        foreign = [f for f in excludes if called.get(f)]
        if not missing and not foreign:
            return None
        ran = ", ".join(sorted(called)) or "no extension function"
        why = []
        if missing:
            why.append(f"never called {', '.join(missing)}")
        if foreign:
            why.append(f"called {', '.join(foreign)}, which belongs to another path")
        return (f"path evidence: a {self.name} cell must run TE's {self.summary.split(':')[0]} "
                f"path, but the backend {' and '.join(why)} (called: {ran})")


#: TE's per-group GEMM (the split-quantize paths) and its one-GEMM-per-module kernel
_SPLIT_GEMM, _GEMM = "te_general_grouped_gemm", "generic_gemm"
_NORMS = ("layernorm_fwd", "rmsnorm_fwd")
#: the grouped-tensor paths' GEMMs: discrete weights in (forward, dgrad) and out (wgrad)
_GT_IN, _GT_OUT, _GT_SINGLE = ("te_general_grouped_gemm_for_discrete_in",
                               "te_general_grouped_gemm_for_discrete_out",
                               "te_general_grouped_gemm_for_grouped_tensor")
_GT = (_GT_IN, _GT_OUT, _GT_SINGLE)
#: the grouped-tensor path's quantizer (every recipe it takes quantizes the input with it) and
#: the split-quantize path's
_GROUP_Q, _SPLIT_Q = "group_quantize", "split_quantize"
_HALF = ("bf16", "fp16")
#: the weights Megatron's expert layer is built with: its own experts (no expert GTP), or its
#: constructor's expert GTP shards (``GTPShardedParam``)
_MEGATRON_LAYER_WEIGHTS = ("plain", "megatron")

_ALL = (
    ModuleKind("linear", "Linear: y = x W^T + b", "Linear", evidence=(_GEMM,),
               excludes=_NORMS + (_SPLIT_GEMM,)),
    ModuleKind("grouped_linear", "GroupedLinear on its split-quantize path: N linears over row "
               "splits (m_splits list)", "GroupedLinear", grouped=True, splits="list",
               evidence=(_SPLIT_GEMM,), excludes=(_GEMM,) + _GT, path="split_quantize"),
    ModuleKind("ops_grouped_linear", "ops.GroupedLinear on its split-quantize path: the "
               "op-fuser's grouped linear (split_sizes tensor)", "ops.GroupedLinear", grouped=True,
               splits="tensor", ops=True, evidence=(_SPLIT_GEMM,), excludes=(_GEMM,) + _GT,
               path="split_quantize", takes_first_microbatch=False),
    ModuleKind("layernorm_linear", "LayerNormLinear, LayerNorm with a zero-centered gamma, then "
               "Linear", "LayerNormLinear", normalization="LayerNorm", zero_centered_gamma=True,
               evidence=("layernorm_fwd", _GEMM), excludes=("rmsnorm_fwd", _SPLIT_GEMM)),
    ModuleKind("rmsnorm_linear", "LayerNormLinear, RMSNorm, then Linear", "LayerNormLinear",
               normalization="RMSNorm", evidence=("rmsnorm_fwd", _GEMM),
               excludes=("layernorm_fwd", _SPLIT_GEMM)),
    ModuleKind("grouped_linear_tensor", "GroupedLinear on its grouped-tensor path "
               "(use_grouped_tensor=True): one grouped GEMM over device-resident m_splits",
               "GroupedLinear", grouped=True, splits="device", evidence=(_GT_IN,),
               excludes=(_SPLIT_GEMM, _GEMM), path="grouped_tensor", quantized_evidence=(_GROUP_Q,),
               quantized_excludes=(_SPLIT_Q,), options=(("use_grouped_tensor", True),), dtypes=_HALF,
               bias_multiple=8, offload_leaves_path=True),
    ModuleKind("ops_grouped_linear_tensor", "ops.GroupedLinear on its grouped-tensor path: "
               "one grouped GEMM (split_sizes tensor)", "ops.GroupedLinear", grouped=True,
               splits="tensor", ops=True, evidence=(_GT_IN,), excludes=(_SPLIT_GEMM, _GEMM),
               path="grouped_tensor", quantized_evidence=(_GROUP_Q,), quantized_excludes=(_SPLIT_Q,),
               dtypes=_HALF, bias_multiple=8, takes_first_microbatch=False),
    ModuleKind("mcore_grouped_mlp", "Megatron-Core's TEGroupedMLP with SwiGLU: fc1, SiLU-gated linear "
               "unit times the routing probabilities, fc2 (two TE GroupedLinear); built, sharded and "
               "attached by Megatron's constructor", "GroupedLinear", grouped=True, splits="list",
               evidence=(_SPLIT_GEMM,), excludes=(_GEMM,) + _GT, path="split_quantize", layer=True,
               activation="swiglu", iterations=2, weights=_MEGATRON_LAYER_WEIGHTS, consumers=("ddp",),
               takes_first_microbatch=False, delays_wgrad=False, dtypes=("fp32", "bf16")),
    ModuleKind("mcore_grouped_mlp_gelu", "Megatron-Core's TEGroupedMLP with GELU: fc1, GELU times the "
               "routing probabilities, fc2", "GroupedLinear", grouped=True, splits="list",
               evidence=(_SPLIT_GEMM,), excludes=(_GEMM,) + _GT, path="split_quantize", layer=True,
               activation="gelu", iterations=2, weights=_MEGATRON_LAYER_WEIGHTS, consumers=("ddp",),
               takes_first_microbatch=False, delays_wgrad=False, dtypes=("fp32", "bf16")),
)
KINDS: dict[str, ModuleKind] = {k.name: k for k in _ALL}
NAMES: tuple[str, ...] = tuple(KINDS)
#: the backend classes the values need, in axis order (``ops.GroupedLinear`` is nested)
APIS: tuple[str, ...] = tuple(dict.fromkeys(k.api for k in _ALL))
#: the values that are Megatron's expert layer (``ModuleKind.layer``)
LAYERS: tuple[str, ...] = tuple(k.name for k in _ALL if k.layer)



def on_path(kind: ModuleKind, path: str) -> ModuleKind | None:
    """The module value of the same class on TE's other execution ``path`` (``grouped_linear``
    for ``grouped_linear_tensor`` on ``"split_quantize"``): whose evidence proves what TE ran
    when it took that path instead (None: the class has no such path)."""
    return next((k for k in _ALL if k.api == kind.api and k.ops == kind.ops and k.layer == kind.layer
                 and k.path == path), None)
