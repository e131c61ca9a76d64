"""The ``recipe`` axis: which of TE's low-precision recipes a cell runs under (pure data, no torch).

``none`` is every cell the harness ran before the axis existed: no ``autocast``, GEMMs in the
cell's dtype. The others run the step under TE's ``autocast`` with a TE recipe object built
with its defaults (``harness.cell.lowp``); the oracle quantizes the operands TE quantizes, as
the recipe says (``harness.cell.quantized``; docs/low-precision.md). ``nvfp4`` is TE's
``NVFP4BlockScaling`` with its random Hadamard transform and stochastic rounding switched
off (TE's own ``disable_rht`` / ``disable_stochastic_rounding``): the deterministic form, the
one a CPU can reproduce (docs/low-precision.md says why the defaults cannot be).

The matrix, the CLI and the reports import this module in the parent process, so it stays
free of torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["RecipeKind", "KINDS", "NAMES", "QUANTIZED", "BLOCKED", "MODELLED", "JUDGED", "judged", "unmodelled",
           "NO_FP16"]


@dataclass(frozen=True)
class RecipeKind:
    """One value of the ``recipe`` axis.

    Attributes:
        name: the axis value; a cell id names it (``-r<name>``) unless it is ``none``.
        summary: one line for ``list`` and the docs.
        te_class: the class of ``transformer_engine.common.recipe`` built (defaults), or None.
        forward, backward: the element formats of the forward operands (input, weight) and of
            the gradient operand (the output gradient): ``e4m3`` / ``e5m2``, None for ``none``.
        block: how a scale is shared: ``"tensor"`` (one fp32 scale per tensor), ``"mxfp8"``
            (one E8M0 scale per 32 elements along the GEMM's K), ``"block"`` (one fp32 scale per
            1x128 block of an input or gradient, per 128x128 tile of a weight), ``"nvfp4"`` (one
            E4M3 scale per 16 elements along K - per 16x16 tile of a weight - and one fp32
            scale per tensor from its amax).
        align: every dimension a quantized GEMM sees is a multiple of this (TE: "FP8
            execution requires ... the last dimension to be divisible by 16", the FP8 GEMM's
            leading-dimension rule on the wgrad GEMM's K, which is the rows; MXFP8 "requires
            tensor dims that are divisible by 32"): a cell's features and rows, and each
            group's rows, are rounded up to it (``harness.vocabulary.shape.aligned``).
        options: keyword arguments of the TE class other than its defaults, as pairs.
        block_length: the length of a 1-D block along the GEMM's K (MXFP8 32, FP8 block
            scaling 128, NVFP4 16: TE's ``MXFP8_BLOCK_SCALING_SIZE``, ``kBlockLen``, ``kNVFP4BlockSize``);
            0 for a per-tensor recipe, which has no blocked dimension.
        weight_tile: the edge of a weight's 2-D tile (FP8 block scaling 128, NVFP4 16 with its
            default 2-D weight quantization); 0 where the weight is in 1-D blocks (MXFP8) or per
            tensor. A tile's edge runs along both of the weight's dimensions.
        grouped_tensor: why TE 2.20.2 never takes its grouped-tensor path under this recipe
            (``is_module_grouped_tensor_path_supported``, ``is_op_fuser_grouped_tensor_path_supported``);
            "" where it does (on the device and cuBLASLt te-cpu presents for it).
        member_rows: on the grouped-tensor path every group's rows are a multiple of this: TE's
            grouped MXFP8 and FP8 block-scaling quantizers take members of whole 128-row tiles
            (``group_quantize_fp8_blockwise.cuh``: "each tensor's first dimension must be a
            multiple of 128"; ``test_cast_mxfp8_grouped.cu`` runs no other); 1 otherwise.
        modelled: the module values the quantization-aware oracle (``harness.cell.quantized``)
            models the recipe on; a cell of another module under it is refused before a launch
            (``unmodelled``): it could not be judged. Empty for ``none`` (every module).
        fp16: whether its GEMMs take an fp16 output (TE's ``cublaslt_gemm.cu``: "FP4 GEMM does
            not support FP16 output!"); where not, no fp16 cell runs it (a matrix constraint).
        blackwell: whether TE runs it only on Blackwell (compute capability 10.0,
            ``check_recipe_support``); the others run on Hopper (sm_90), the device te-cpu
            presents for them (``harness.backends.te_cpu.device``).
    """

    name: str
    summary: str
    te_class: str | None = None
    forward: str | None = None
    backward: str | None = None
    block: str = "tensor"
    align: int = 1
    options: tuple[tuple[str, object], ...] = ()
    block_length: int = 0
    weight_tile: int = 0
    grouped_tensor: str = ""
    member_rows: int = 1
    modelled: tuple[str, ...] = ()
    fp16: bool = True
    blackwell: bool = False

    @property
    def quantized(self) -> bool:
        return self.te_class is not None

    @property
    def blocked(self) -> bool:
        """Whether the recipe scales blocks of an operand (not one scale per tensor)."""
        return self.block_length > 0


#: the TE module values the oracle models every recipe on
_MODULES = ("linear", "grouped_linear", "ops_grouped_linear", "layernorm_linear", "rmsnorm_linear")
#: the grouped-tensor paths, modelled under the recipes TE takes them with (``grouped_tensor``;
#: ``harness.vocabulary.matrix``'s constraints): each group quantized alone, as on the split path
_TENSOR_PATHS = ("grouped_linear_tensor", "ops_grouped_linear_tensor")

_ALL = (
    RecipeKind("none", "no recipe: GEMMs in the cell's dtype (every cell before the recipe axis)"),
    RecipeKind("delayed", "DelayedScaling: per-tensor FP8, E4M3 forward / E5M2 gradients, scales "
               "from the amax history of earlier steps", "DelayedScaling", "e4m3", "e5m2", "tensor", 16,
               modelled=_MODULES, grouped_tensor="TE 2.20.2 takes no grouped-tensor path under DelayedScaling: its grouped "
               "quantization kernels are unavailable (is_module_grouped_tensor_path_supported)"),
    RecipeKind("current", "Float8CurrentScaling: per-tensor FP8, E4M3 forward / E5M2 gradients, "
               "each tensor's scale from its own amax", "Float8CurrentScaling", "e4m3", "e5m2", "tensor", 16,
               modelled=_MODULES + _TENSOR_PATHS),
    RecipeKind("mxfp8", "MXFP8BlockScaling: E4M3, one power-of-two (E8M0) scale per 32 elements "
               "along K (Blackwell)", "MXFP8BlockScaling", "e4m3", "e4m3", "mxfp8", 32,
               block_length=32, member_rows=128, modelled=_MODULES + _TENSOR_PATHS, blackwell=True),
    RecipeKind("blockwise", "Float8BlockScaling: E4M3, power-of-two fp32 scales per 1x128 block "
               "(inputs, gradients) and 128x128 tile (weights)", "Float8BlockScaling", "e4m3", "e4m3",
               "block", 16, block_length=128, weight_tile=128, member_rows=128, modelled=_MODULES + _TENSOR_PATHS),
    RecipeKind("nvfp4", "NVFP4BlockScaling (no Hadamard transform, no stochastic rounding): E2M1, one "
               "E4M3 scale per 16 elements (16x16 tiles for weights) and one fp32 scale per tensor "
               "(Blackwell)", "NVFP4BlockScaling", "e2m1", "e2m1", "nvfp4", 16,
               (("disable_rht", True), ("disable_stochastic_rounding", True)), block_length=16, weight_tile=16,
               modelled=_MODULES, fp16=False, blackwell=True, grouped_tensor="TE 2.20.2 takes its grouped-tensor path under NVFP4 only with the random "
               "Hadamard transform (is_module_grouped_tensor_path_supported: not recipe.disable_rht; "
               "group_quantize: 'graph safe grouped quant kernel for non-RHT path is not ready yet'), "
               "which te-cpu does not build"),
)
KINDS: dict[str, RecipeKind] = {k.name: k for k in _ALL}
NAMES: tuple[str, ...] = tuple(KINDS)
#: the values that quantize (every value but ``none``)
QUANTIZED: tuple[str, ...] = tuple(n for n, k in KINDS.items() if k.quantized)
#: the values that scale blocks of an operand (``RecipeKind.blocked``)
BLOCKED: tuple[str, ...] = tuple(n for n, k in KINDS.items() if k.blocked)

#: recipe -> the module values the oracle models it on (``RecipeKind.modelled``; ``none``: every module)
MODELLED: dict[str, tuple[str, ...]] = {n: k.modelled for n, k in KINDS.items()}
#: the recipes whose GEMMs refuse an fp16 output (``RecipeKind.fp16``)
NO_FP16: tuple[str, ...] = tuple(n for n, k in KINDS.items() if not k.fp16)


#: the recipe axis's default in the ``ci`` and ``full`` presets: ``none`` and every recipe the
#: oracle judges on some module (each on those modules only; ``harness.vocabulary.matrix.select``)
JUDGED: tuple[str, ...] = tuple(n for n in NAMES if n == "none" or MODELLED.get(n))


def judged(recipe: str, module: str) -> bool:
    """Whether the oracle judges ``module`` under ``recipe`` (every module without one)."""
    return recipe == "none" or module in MODELLED.get(recipe, ())


def unmodelled(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """The ``recipe/module`` pairs among ``(recipe, module)`` that the oracle cannot judge yet."""
    return [f"{recipe}/{module}" for recipe, module in dict.fromkeys(pairs) if not judged(recipe, module)]
