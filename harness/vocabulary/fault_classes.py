"""The fault classes the self-test plants (docs/fault-classes.md), as data: what each fault
does wrong, where it can show and what a kill *about it* looks like (no torch: the self-test's
parent reads this catalog; ``harness.backends.reference.mutants`` plants each fault in the reference).

``evidence`` patterns tell "the harness caught this bug" from "the harness failed for some
other reason":

- ``check:<glob>``: a failing check whose name matches the ``fnmatch`` glob
  (``followers.*_calls``);
- ``text:<substring>``: a failing check whose message contains the substring - the
  ``exception`` check carries the backend's exception as ``Type: message``.

A generic torch error text (``GENERIC_TEXTS``: any shape bug raises it) is evidence only
together with a ``check:`` pattern failing in the same cell; alone it proves only that
something broke.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Iterable

from harness.vocabulary import hook_modes, modules, recipes

__all__ = ["CATALOG", "REFERENCE", "TE", "FaultClass", "GEMM_MODULES", "GENERIC_TEXTS", "MODULE_CLASSES", "NORM", "evidence_found"]

#: where the GEMM path's faults are planted: the three modules that path was written for.
#: ``LayerNormLinear`` runs ``Linear``'s very GEMM code in the reference, so planting them
#: there too would rerun the same code; its own faults are the normalization's (``NORM``).
GEMM_MODULES = ("linear", "grouped_linear", "ops_grouped_linear")
NORM = ("layernorm_linear", "rmsnorm_linear")
#: the module values whose classes decide "distributed?" in the reference's GroupGemm (the
#: op-fuser's read their own attributes)
MODULE_CLASSES = ("linear", "grouped_linear", "grouped_linear_tensor") + NORM
#: torch's own error texts that any shape bug raises: evidence only beside a fault's check
GENERIC_TEXTS = ("shapes cannot be multiplied", "must match the size", "invalid gradient",
                 "expected shape compatible with")


@dataclass(frozen=True)
class FaultClass:
    """One fault class of docs/fault-classes.md.

    Attributes:
        name: its id; ``harness.backends.reference.mutants:<name>`` is the backend planting it.
        description: one line: what the backend does wrong.
        modules: the cell ``module`` values whose classes deviate; the others are the
            reference's own classes and must pass.
        min_world_size: the smallest world size at which the fault changes anything the
            contract observes (at ws=1 a shard is the full weight - unless the weight pads
            to an alignment, as Megatron's does).
        evidence: what a kill about this fault looks like (module docstring).
        recipes: the cell ``recipe`` values the fault can show under (None: every one); a
            fault of the FP8 path changes nothing in a cell without a recipe.
        first_mb: the fault is in what ``is_first_microbatch`` changes: only cells that pass
            the flag (``first_mb``) run it.
        backend: where it is planted: ``"reference"`` (``harness.backends.reference.mutants``)
            or ``"te-cpu"`` (``harness.backends.te_cpu.mutants``: TE's own code on CPU, on the
            project's patched TE tree - a fault only TE's and Megatron's installers or
            Megatron's expert layer can show).
        hooks: the hook modes it can show under (None: every one).
        shapes: the ``shape`` values whose cells run it (None: every one). A fault planted in
            te-cpu's kernels runs where its self-test side pays te-cpu's cost for it: the
            block-spanning cells, the only ones whose operands its fault changes.
        fused_backward_dw: the fault is in ``backward_dw()``'s fused branch: only cells that
            delay the wgrad (``delay_wgrad``), fuse its accumulation (``fused``) and are not
            expected to raise run it (``runs_in``; the self-test's first round then holds such
            a cell, where it ran every cell of the module in a third round).
        distributed_only: the fault is in what the backend does with a distributed weight:
            a cell whose weights are plain parameters runs the clean code path.
    """

    name: str
    description: str
    modules: tuple[str, ...] = GEMM_MODULES
    min_world_size: int = 1
    evidence: tuple[str, ...] = ()
    recipes: tuple[str, ...] | None = None
    first_mb: bool = False
    backend: str = "reference"
    hooks: tuple[str, ...] | None = None
    shapes: tuple[str, ...] | None = None
    fused_backward_dw: bool = False
    distributed_only: bool = False

    def applies(self, module: str, recipe: str, first_mb: bool = False, hooks: str | None = None,
                shape: str | None = None) -> bool:
        """Whether a cell of ``module`` under ``recipe`` (passing ``is_first_microbatch`` or
        not, under ``hooks``, of ``shape``) may run this fault's code."""
        return (module in self.modules and (self.recipes is None or recipe in self.recipes)
                and (first_mb or not self.first_mb)
                and (self.hooks is None or hooks is None or hooks in self.hooks)
                and (self.shapes is None or shape is None or shape in self.shapes))

    def runs_in(self, cell: Any) -> bool:
        """Whether ``cell`` (a ``harness.vocabulary.matrix.Cell``) can show this fault: ``applies``,
        at ``min_world_size`` or more (below it the fault changes nothing the contract observes),
        with a distributed weight for a ``distributed_only`` fault, and for a fault of
        ``backward_dw()``'s fused branch a cell that delays its wgrad with fused accumulation and
        is not expected to raise (a distributed weight's delayed wgrad is rejected before any
        backward). In any other cell the faulty backend computes what the clean one does."""
        return (self.applies(cell.module, cell.recipe, cell.first_mb, cell.hooks, cell.shape)
                and cell.world_size >= self.min_world_size
                and (cell.distributed or not self.distributed_only)
                and (not self.fused_backward_dw or (cell.delay_wgrad and cell.fused and cell.expect == "pass")))


#: the module values the oracle judges under both per-tensor recipes (the FP8 mutants' cells)
_FP8_MODULES = tuple(m for m in recipes.MODELLED["current"] if m in recipes.MODELLED["delayed"])
#: the GEMM modules whose forward takes ``is_first_microbatch`` (the op-fuser's does not)
_FLAG_MODULES = ("linear", "grouped_linear")
#: the module values the oracle judges under MXFP8 (the MXFP8 mutant's cells)
_MXFP8_MODULES = recipes.MODELLED["mxfp8"]
#: the module values the oracle judges under every block recipe (the block mutants' cells)
_BLOCK_MODULES = tuple(m for m in recipes.MODELLED["mxfp8"]
                       if all(m in recipes.MODELLED[r] for r in recipes.BLOCKED))

_ALL = (
    FaultClass("hooks-strip-subclass",
               "backward decides 'distributed?' from the unpacked saved tensor, which "
               "saved-tensor hooks turn into a plain Tensor (TE's pre-fix behaviour)",
               modules=MODULE_CLASSES, evidence=(
                   "check:leader.materialize_backward_calls",
                   "text:weight was removed while fuse_wgrad_accumulation=True",
                   "text:shapes cannot be multiplied",  # ws>=2: the plain branch multiplies by the shard
               )),
    FaultClass("wgrad-compute-dtype",
               "a distributed weight's wgrad is computed and reduced in the compute dtype, "
               "not main_grad's (fused: the GEMM's buffer; unfused: the GEMM's dtype)",
               evidence=("check:finalize_dtypes",)),
    FaultClass("shared-grad-buffer",
               "the leader's grad_buffer() is used for every member of the group, so every "
               "expert is finalized with the last expert's wgrad",
               modules=("grouped_linear", "ops_grouped_linear"),
               evidence=("check:weight*.grad_buffer_calls", "check:weight*.main_grad")),
    FaultClass("full-shape-dummy",
               "fused: the dummy gradient returned to autograd has the full (gathered) "
               "shape instead of the shard's",
               evidence=("check:autograd_grad_shape",)),
    FaultClass("unfused-finalize-dropped",
               "unfused: finalize's return value is ignored and autograd receives the local, "
               "unreduced full wgrad",
               evidence=("check:autograd_grad_shape", "check:weight*.grad", "check:weight*.main_grad")),
    FaultClass("ops-double-add",
               "ops GroupedLinear accumulates a distributed weight's wgrad into main_grad "
               "itself and then lets finalize add it too",
               modules=("ops_grouped_linear",),
               evidence=("check:weight*.main_grad", "text:must match the size")),
    FaultClass("dgrad-forward-copy",
               "backward reuses the forward's gathered weights (kept on ctx) and never calls "
               "materialize_group_for_backward",
               evidence=("check:leader.materialize_backward_calls",
                                        "check:forward_gathers_alive_at_backward",
                                        "check:mb*.input_grad")),  # gtp_tagged: x2, not x4
    FaultClass("per-member-materialize",
               "materialize_group_for_forward/backward is called on every member instead of "
               "once through the leader",
               modules=("grouped_linear", "ops_grouped_linear"),
               evidence=("check:followers.*_calls",)),
    FaultClass("dw-fused-hook-skipped",
               "backward_dw() fires the wgrad accumulation-and-reduce hooks only on the "
               "unfused branch",
               evidence=("check:wgrad_hook_calls",), fused_backward_dw=True),
    FaultClass("delay-with-dw-accepted",
               "delay_wgrad_compute=True with a distributed weight is not rejected up front; "
               "the delayed wgrad is finalized later in backward_dw()",
               evidence=("check:expected_exception",)),
        # killed only by the harness weight's Megatron behaviours (gtp_* values)
    FaultClass("wgrads-reused-after-finalize",
               "unfused: when finalize returns None (asynchronous), autograd gets the wgrads "
               "finalize consumed instead",
               evidence=("check:weight*.main_grad", "check:autograd_grad_shape")),
    FaultClass("main-grad-read-after-finalize",
               "reads main_grad right after finalize and, finding it not yet updated "
               "(asynchronous), accumulates its local wgrad into it",
               evidence=("check:weight*.main_grad",)),
    FaultClass("materialized-copy-kept",
               "computes later microbatches' dgrad with the first backward's materialized "
               "weights, kept across later materializations",
               evidence=("check:mb*.input_grad",)),
    FaultClass("requires-grad-from-copies",
               "decides whether the weights need a gradient from the gathered copies' "
               "requires_grad, so copies without it get no wgrad and no finalize",
               evidence=("check:leader.finalize_calls",)),
        # caught only by an exact check: every value is right
    FaultClass("main-grad-rebound",
               "fused: accumulates the wgrad out of place and rebinds main_grad to the sum "
               "(values right, the DDP buffer main_grad viewed left behind)",
               evidence=("check:weight*.main_grad_kept",)),
        # subtle numeric faults: each killed by a value check
    FaultClass("wgrad-rounded-through-bf16",
               "the weight gradient is rounded once through bf16 before the fp32 main_grad "
               "accumulation (fused)",
               evidence=("check:weight*.main_grad",)),
    FaultClass("main-grad-accumulated-in-bf16",
               "fused, plain weights: main_grad accumulated in bf16 instead of fp32",
               evidence=("check:weight*.main_grad",)),
    FaultClass("dgrad-with-bf16-weight",
               "fp32 cells: the input gradient is computed with the weight rounded to bf16",
               evidence=("check:mb*.input_grad",)),
    FaultClass("tf32-declared-ieee",
               "fp32 forward GEMMs with TF32 operands while the backend declares IEEE fp32",
               evidence=("check:mb*.output",)),
    FaultClass("grouped-tensor-path-no-dw",
               "GroupedLinear's grouped-tensor path keeps the gathered copies for backward "
               "and runs backward on them as on plain weights (no materialize, no finalize)",
               modules=("grouped_linear_tensor",),
               evidence=("check:leader.materialize_backward_calls", "check:leader.finalize_calls",
                     "check:forward_gathers_alive_at_backward")),
        # LayerNormLinear's normalization
    FaultClass("norm-dgamma-dropped",
               "LayerNormLinear: the normalization's backward drops the layer_norm_weight "
               "gradient", modules=NORM,
               evidence=("check:layer_norm_weight.*",)),
    FaultClass("norm-dbeta-on-gamma",
               "LayerNormLinear (LayerNorm): the layer-norm bias gradient is delivered to "
               "layer_norm_weight and the scale's to layer_norm_bias",
               modules=("layernorm_linear",),
               evidence=("check:layer_norm_weight.*", "check:layer_norm_bias.*")),
    FaultClass("norm-zero-centered-ignored-in-backward",
               "LayerNormLinear with zero_centered_gamma: the input gradient scales by gamma "
               "instead of 1 + gamma",
               modules=("layernorm_linear",), evidence=("check:mb*.input_grad",)),
    
    # the FP8 path (cells under a recipe): the reference quantizes every GEMM's operands, so
    # each runs on the modules the oracle judges under its recipes (_FP8_MODULES)
    FaultClass("fp8-per-shard-amax",
               "a distributed weight's FP8 scale (current scaling) is taken from this rank's shard, "
               "not from the whole gathered weight",
               modules=_FP8_MODULES, min_world_size=2, recipes=("current",),
               evidence=("check:mb*.output",)),
    FaultClass("fp8-stale-weight-workspace",
               "the FP8 weight the first microbatch quantized is multiplied again by later "
               "microbatches (delayed scaling: with the first microbatch's scale)",
               modules=_FP8_MODULES, recipes=("delayed",), evidence=("check:mb*.output",)),
    FaultClass("fp8-e4m3-gradient",
               "the output gradient is quantized to E4M3, not HYBRID's E5M2",
               modules=_FP8_MODULES, recipes=("current", "delayed"),
               evidence=("check:mb*.input_grad", "check:weight*.main_grad", "check:weight*.grad")),
    FaultClass("fp8-dgrad-weight-unquantized",
               "a distributed weight's dgrad multiplies the re-gathered high-precision weight: "
               "the backward re-quantization is missing",
               modules=_FP8_MODULES, recipes=recipes.QUANTIZED, evidence=("check:mb*.input_grad",)),
    FaultClass("fp8-dgrad-weight-requantized",
               "delayed scaling: a distributed weight's dgrad re-quantizes the re-gathered weight "
               "with the scale updated after the forward, not the forward's",
               modules=_FP8_MODULES, recipes=("delayed",), evidence=("check:mb*.input_grad",)),
    FaultClass("mxfp8-scale-rounded-down",
               "MXFP8: the weight's E8M0 block scale is rounded down from amax / 448, not up, so "
               "a block's largest elements saturate",
               modules=_MXFP8_MODULES, recipes=("mxfp8",), evidence=("check:mb*.output",)),
    FaultClass("nvfp4-shard-tensor-scale",
               "NVFP4: a distributed weight's tensor scale is taken from the amax of this rank's "
               "shard, not of the whole gathered weight (the other shards' largest elements saturate)",
               modules=recipes.MODELLED["nvfp4"], min_world_size=2, recipes=("nvfp4",),
               evidence=("check:mb*.output",)),
    # the blocks of the block recipes: each fault changes nothing in an operand of one block
    # (or without a ragged edge); only the block-spanning shape (shape "blocks") shows it
    FaultClass("block-amax-from-neighbour",
               "MXFP8, FP8 block scaling, NVFP4: each block (weight tile) of a GEMM operand is scaled "
               "from the amax of the next block along K, not its own",
               modules=_BLOCK_MODULES, recipes=recipes.BLOCKED,
               evidence=("check:mb*.output", "check:mb*.input_grad", "check:weight*.main_grad",
                         "check:weight*.grad")),
    FaultClass("block-tile-boundary-off-by-one",
               "FP8 block scaling: a block's (weight tile's) boundary taken one block early, so the "
               "ragged edge - the short last block along K - is scaled with the full block before it",
               modules=recipes.MODELLED["blockwise"], recipes=("blockwise",),
               evidence=("check:mb*.output", "check:mb*.input_grad", "check:weight*.main_grad",
                         "check:weight*.grad")),
    FaultClass("first-microbatch-ignored",
               "is_first_microbatch=True is ignored: a fused plain weight's first wgrad is added "
               "to main_grad instead of replacing it",
               modules=_FLAG_MODULES, first_mb=True, evidence=("check:weight*.main_grad",)),
    FaultClass("first-microbatch-overwrites-distributed",
               "is_first_microbatch=True is applied to a distributed weight too: main_grad is "
               "cleared before the first finalize, losing what it held",
               modules=_FLAG_MODULES, first_mb=True, evidence=("check:weight*.main_grad",)),
    # planted in TE's own code on CPU (harness.backends.te_cpu.mutants): only the cells that
    # need TE - its installers, Megatron's expert layer - can show them
    FaultClass("offload-installs-no-hooks",
               "TE's get_cpu_offload_context hands back a context that installs no saved-tensor "
               "hook: the cell runs unhooked and proves nothing about hooks",
               modules=modules.NAMES, backend="te-cpu", hooks=("te_offload", "te_offload_v1"),
               evidence=("check:hook_packs",)),
    FaultClass("fc2-fix-missing",
               "the hook-safe fix applied to an expert layer's fc1 but not its fc2: under a hook "
               "fc2's GroupedLinear forgets its distributed weights on the autograd context",
               modules=modules.LAYERS, min_world_size=2, backend="te-cpu", distributed_only=True,
               hooks=tuple(h for h in hook_modes.NAMES if hook_modes.KINDS[h].hooked and h != "mcore_offload"),
               evidence=("text:weight was removed while fuse_wgrad_accumulation=True",
                         "text:GEMM requested the columnwise representation",
                         "check:*linear_fc2.leader.materialize_backward_calls")),
    FaultClass("mxfp8-scale-swizzle-order",
               "MXFP8: te-cpu's quantizer writes the GEMM-ready (swizzled) scales with the two 4-wide "
               "indices of a 128x4 tile exchanged - (r % 32) * 16 + c * 4 + r // 32, not TE's "
               "(r % 32) * 16 + (r // 32) * 4 + c - while the GEMM reads TE's layout: a scale lands on "
               "another block wherever a row past the first 32 of a tile or a second block along K exists",
               modules=("linear",), recipes=("mxfp8",), backend="te-cpu", hooks=("off",), shapes=("blocks",),
               evidence=("check:mb*.output", "check:mb*.input_grad", "check:weight*.main_grad")),
    FaultClass("probs-grad-lost-under-hooks",
               "under a saved-tensor hook the routing probabilities' gradient is taken from a copy "
               "the graph does not link back to them: none reaches them",
               modules=modules.LAYERS, backend="te-cpu",
               hooks=tuple(h for h in hook_modes.NAMES if hook_modes.KINDS[h].hooked and h != "mcore_offload"),
               evidence=("check:*probs.grad",)),
)
CATALOG: dict[str, FaultClass] = {f.name: f for f in _ALL}
#: the faults planted in the reference, and those planted in TE's own code on CPU
REFERENCE: dict[str, FaultClass] = {n: f for n, f in CATALOG.items() if f.backend == "reference"}
TE: dict[str, FaultClass] = {n: f for n, f in CATALOG.items() if f.backend == "te-cpu"}


def evidence_found(fault: Any, checks: Iterable[Any]) -> list[str]:
    """The failing checks that are evidence of ``fault`` (anything with ``evidence``), as
    ``name: message``.

    Args:
        fault: the fault class (or mutant) whose ``evidence`` patterns to match.
        checks: ``Check`` objects (or dicts with ``name``/``ok``/``message``), e.g. every
            rank's ``RankResult.comparisons`` of a killed cell.
    """
    found, generic, by_check = [], [], False
    for c in checks:
        get_ = c.get if isinstance(c, dict) else (lambda k, c=c: getattr(c, k, None))
        if get_("ok"):
            continue
        cname, message = get_("name") or "", get_("message") or ""
        for pattern in fault.evidence:
            kind, _, value = pattern.partition(":")
            if kind == "check" and fnmatch.fnmatchcase(cname, value):
                found.append(f"{cname}: {message}".strip())
                by_check = True
                break
            if kind == "text" and value in message:
                (generic if any(g in value for g in GENERIC_TEXTS) else found).append(f"{cname}: {message}".strip())
                break
    return found + generic if by_check else found
