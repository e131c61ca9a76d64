"""The ``weight`` axis: what each value means (pure data, no torch).

A cell's weight is ``plain`` (ordinary parameters), one configuration of the harness's own
GTP weight (:mod:`harness.cell.gtp`), or Megatron-Core's real ``GTPShardedParam``
(:mod:`harness.cell.megatron_gtp`). The harness weight's configurations are the kind defaults
(``distributed``) and one variant per behaviour of CONTRACTS §2's "what an implementer may
do" list, plus ``gtp_mcore`` with every one of them at once and Megatron's way of putting the
weights into the module (``Behaviour.megatron_attach``, which has no variant of its own:
docs/decisions.md) - the configuration the differential test
(``cases/test_megatron_differential.py``) proves equal to Megatron's class.

The matrix, the CLI and the reports import this module in the parent process, so it must
stay free of torch; :mod:`harness.cell.attach` turns a value into weights inside a rank.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Behaviour", "WeightKind", "KINDS", "NAMES", "DEFAULT_NAMES", "FULL_NAMES",
           "shard_rows", "shardable", "pad_multiple", "unavailable", "NATIVE_RECIPES", "STANDIN_NATIVE_RECIPES", "NATIVE_API", "megatron_missing", "megatron_gtp_source", "te_installed",
           "MEGATRON_PAD", "MEGATRON_VERSION"]

#: Megatron-Core's ``GTP_CONFIG.pad_for_alignment`` default: rows pad to a multiple of 16·N
MEGATRON_PAD = 16
#: the megatron-core release whose GTPShardedParam the ``megatron`` value runs
MEGATRON_VERSION = "0.19.2"
MEGATRON_DISTRIBUTION = "megatron-core"
MEGATRON_GTP_FILE = "megatron/core/tensor_parallel/generalized_tensor_parallelism.py"


@dataclass(frozen=True)
class Behaviour:
    """Which of CONTRACTS §2's implementer freedoms the harness GTP weight exercises.

    Attributes:
        pad_multiple: rows pad to a multiple of ``N * pad_multiple`` (16: Megatron's
            alignment, under which a rank may hold only padding).
        async_finalize: the weight joins the prefetch chain; finalize of a weight that has a
            previous chain member returns ``None`` and ``main_grad`` is updated only when
            that previous weight finalizes (Megatron's ``async_reduction=True``).
        inplace_scale: finalize scales the caller's wgrad tensors in place by ``1/N``.
        shared_buffers: materializations are borrowed from the group's buffers and stay valid
            only until the next materialize, which fills them with NaN for good - the
            strictest reading of "valid until the next materialize" (Megatron's cache is
            keyed by shape, so there a kept copy goes stale only when a same-shaped weight
            is gathered next; a cell has no such weight).
        nan_fill: ``grad_buffer()`` and the placeholder a synchronous finalize returns are
            "uninitialised": NaN-filled, so any read shows.
        copies_require_grad: gathered copies carry the parameter's ``requires_grad``
            (False: an implementer as TE PR #3517 allows, whose copies do not).
        per_member_reduce: one reduce-scatter per member, as Megatron issues them (the kind
            weight concatenates the group into one collective). Sums then run in the same
            order as Megatron's, which the bitwise differential test needs.
        tag_forward / tag_backward: the forward / backward copies are the weight times an
            exactly representable factor (TE PR #3545's test: x2 and x4), and the oracle
            computes the output from the forward copy and the input gradient from the
            backward copy - so a backend that feeds a GEMM the wrong copy fails on values.
        megatron_attach: the weights are put into the module as Megatron's
            ``attach_gtp_to_presharded_module`` puts them: each one re-registered
            (``delattr``, then ``_parameters[name] = ...``), so every weight moves behind the
            module's other parameters in registration order (``bias``, ``bias0..``,
            ``layer_norm_*``); the replaced parameter's tensor-parallel attributes copied;
            ``is_routed_expert`` / ``expert_idx`` on the members of a grouped module and the
            member list as the leader's ``weight_list``; ``_debug_name``. A backend that
            pairs gradients with parameters by registration order fails (CONTRACTS §2).
    """

    pad_multiple: int = 1
    async_finalize: bool = False
    inplace_scale: bool = False
    shared_buffers: bool = False
    nan_fill: bool = False
    copies_require_grad: bool = True
    per_member_reduce: bool = False
    tag_forward: float = 1.0
    tag_backward: float = 1.0
    megatron_attach: bool = False


@dataclass(frozen=True)
class WeightKind:
    """One value of the ``weight`` axis.

    Attributes:
        name: the axis value (also the cell-id part).
        summary: one line for ``list`` and the docs.
        implementer: ``None`` (plain parameters), ``"harness"`` or ``"megatron"``.
        behaviour: the harness weight's configuration (harness implementer only).
        coverage: how thoroughly the ``ci`` preset covers the value: ``"full"`` (every hook
            mode x fused x module x world size), ``"hooks"`` (every hook mode x module x
            world size, fused alternating) or ``"light"`` (module x world size, hook mode and
            fused rotating) - the single-behaviour variants, whose all-at-once composite
            ``gtp_mcore`` gets ``"hooks"``.
        min_world_size: the smallest GTP group the implementer supports. Megatron never
            builds a GTP group of one (``wrap_module_params_gtp`` returns early), and its
            prefetch and asynchronous reduce-scatter read cache buffers that TE's
            collectives do not write at world size 1 (they return their input instead).
            The native stand-in follows it: at world size 1 TE's gather hands out the shard
            itself, the parameter, as the gathered weight.
        native: the shards are native quantized parameters (TE's ``quantized_model_init``:
            each rank's shard quantized on its own under the cell's recipe) and the weight
            hands them to TE's gather (Megatron's native-FP8 GTP path), which gathers them
            quantized - except a 2D-block (``blockwise``) weight, which TE 2.20.2 gathers in
            high precision and quantizes whole.
        recipes: the recipe values the weight exists under (None: any; Megatron's native
            weight: ``NATIVE_RECIPES``, the stand-in: ``STANDIN_NATIVE_RECIPES``); a matrix
            constraint keeps every other pair out.
    """

    name: str
    summary: str
    implementer: str | None = "harness"
    behaviour: Behaviour | None = None
    coverage: str = "full"
    min_world_size: int = 1
    native: bool = False
    recipes: tuple[str, ...] | None = None

    @property
    def distributed(self) -> bool:
        return self.implementer is not None

    @property
    def imports_te(self) -> bool:
        """The weight's own code runs TransformerEngine's, whatever the backend: Megatron's GTP
        module imports TE, and a native shard is one of TE's quantized tensors. Without a GPU
        TE runs only on te-cpu's layer, which the rank applies before such a cell
        (``harness.rank.worker``)."""
        return self.implementer == "megatron" or self.native

    @property
    def needs_ddp(self) -> bool:
        """Only valid with the ``ddp`` consumer: a distributed weight always has a
        ``main_grad`` (Megatron's GTP is only used under Megatron's DDP, CONTRACTS §2)."""
        return self.distributed

    @property
    def pad_multiple(self) -> int:
        if self.implementer == "megatron":
            return MEGATRON_PAD
        return self.behaviour.pad_multiple if self.behaviour else 1

    @property
    def tags(self) -> tuple[float, float]:
        """The factors the forward and backward copies carry (1, 1 for a faithful weight)."""
        b = self.behaviour
        return (b.tag_forward, b.tag_backward) if b else (1.0, 1.0)

    @property
    def chained(self) -> bool:
        """A harness-owned chain head precedes the module (Megatron's prefetch chain)."""
        if self.implementer == "megatron":
            return True
        return bool(self.behaviour and self.behaviour.async_finalize)


_MCORE = Behaviour(pad_multiple=MEGATRON_PAD, async_finalize=True, inplace_scale=True,
                   shared_buffers=True, nan_fill=True, per_member_reduce=True, megatron_attach=True)

#: the native stand-in takes every Megatron behaviour but the shared buffers: a quantized
#: gather has no NaN to hold (its data are codes), and TE reads a native weight's copies once
_MCORE_NATIVE = dataclasses.replace(_MCORE, shared_buffers=False)

#: the recipes Megatron's native weight (``megatron_fp8``) is built for: MXFP8, the path
#: Megatron's native GTP is written for (its padding strips MXFP8 and NVFP4 shards), per-tensor
#: current scaling, whose shards each carry their own scale, and delayed scaling, whose shards
#: keep the codes of the initial scale (the oracle's cached-weight rule). Not built: ``blockwise``
#: (Megatron cannot strip a padded block-scaled shard, and its prefetch reads a buffer TE's
#: block-scaled gather does not write) and ``nvfp4`` (TE's NVFP4 all-gather runs a Triton kernel
#: of TE's Python that te-cpu does not replace); docs/megatron.md says what each does
NATIVE_RECIPES: tuple[str, ...] = ("delayed", "current", "mxfp8")
#: the recipes the harness's native stand-in (``gtp_mcore_fp8``) is built for: Megatron's, and
#: ``blockwise``, whose 2D-block (128 x 128) shards - whole tiles, ``STANDIN_BLOCK_PAD`` - TE
#: 2.20.2 gathers in high precision and quantizes whole, the stand-in stripping the padding
#: rows (docs/megatron.md)
STANDIN_NATIVE_RECIPES: tuple[str, ...] = NATIVE_RECIPES + ("blockwise",)
_KINDS = (
    WeightKind("distributed", "the harness GTP weight, kind defaults: synchronous, fresh copies, "
               "no padding beyond divisibility", behaviour=Behaviour()),
    WeightKind("plain", "ordinary parameters (no DistributedWeight)", implementer=None),
    WeightKind("gtp_async", "asynchronous finalize: returns None, main_grad updated when the "
               "previous chain weight finalizes", behaviour=Behaviour(async_finalize=True),
               coverage="light"),
    WeightKind("gtp_inplace", "finalize scales the caller's wgrads in place by 1/N",
               behaviour=Behaviour(inplace_scale=True), coverage="light"),
    WeightKind("gtp_cached", "materializations borrowed from shared buffers, NaN after the next "
               "materialize", behaviour=Behaviour(shared_buffers=True), coverage="light"),
    WeightKind("gtp_nan", "grad_buffer() and finalize's placeholder uninitialised (NaN-filled)",
               behaviour=Behaviour(nan_fill=True), coverage="light"),
    WeightKind("gtp_pad16", "Megatron's padding: rows to a multiple of 16*N (ranks may hold "
               "only padding)", behaviour=Behaviour(pad_multiple=MEGATRON_PAD), coverage="light"),
    WeightKind("gtp_nograd", "gathered copies without requires_grad (TE PR #3517)",
               behaviour=Behaviour(copies_require_grad=False), coverage="light"),
    WeightKind("gtp_tagged", "forward copies x2, backward copies x4 (TE PR #3545's test): which "
               "copy fed which GEMM shows in the values", behaviour=Behaviour(tag_forward=2.0, tag_backward=4.0),
               coverage="light"),
    WeightKind("gtp_mcore", "every Megatron behaviour at once (async, in-place, shared buffers, "
               "NaN, 16*N padding, Megatron's attach: weights re-registered behind the biases)",
               behaviour=_MCORE, coverage="hooks"),
    WeightKind("gtp_mcore_fp8", "the harness weight over native quantized shards (TE's "
               "quantized_model_init), handed to TE's gather as Megatron's native-FP8 path does, "
               "with gtp_mcore's behaviours; needs a recipe", behaviour=_MCORE_NATIVE, coverage="hooks",
               min_world_size=2, native=True, recipes=STANDIN_NATIVE_RECIPES),
    WeightKind("megatron", "Megatron-Core 0.19.2's real GTPShardedParam (python -m harness "
               "install megatron)", implementer="megatron", min_world_size=2),
    WeightKind("megatron_fp8", "Megatron-Core 0.19.2's GTPShardedParam over native quantized shards "
               "(TE's quantized_model_init), all-gathered quantized; needs a recipe",
               implementer="megatron", min_world_size=2, native=True, recipes=NATIVE_RECIPES),
)

KINDS: dict[str, WeightKind] = {k.name: k for k in _KINDS}
NAMES: tuple[str, ...] = tuple(KINDS)
#: what a backend exposes to build a native weight's module (TE's own ``quantized_model_init``)
NATIVE_API = "quantized_model_init"
#: Megatron's alignment per recipe (``configure_gtp_remat_from_recipe``): 32 rows under MXFP8
MEGATRON_MXFP8_PAD = 32
#: the native stand-in's alignment under ``blockwise``: a shard of whole 128-row tiles is
#: quantized under the whole weight's 128 x 128 tiles, so TE's gather (dequantize, gather,
#: quantize the whole) gives the oracle's values. Under Megatron's 16 a shard holds part of a
#: tile, whose smaller amax gives it a finer scale: a value below FP8's normal range is then
#: rounded twice, to codes the oracle's one quantization does not give (cases/test_gtp.py)
STANDIN_BLOCK_PAD = 128
#: what a selection gets when it does not name weights: every value that needs nothing
#: installed and runs on every backend (Megatron's class is opted into with ``--weights
#: megatron``; a native weight, which needs TE's ``quantized_model_init``, with its name)
DEFAULT_NAMES: tuple[str, ...] = tuple(n for n, k in KINDS.items() if k.implementer != "megatron" and not k.native)
#: the ``full`` preset's default: the kind weight, plain, and the two strictest implementers
#: (every Megatron behaviour at once; TE PR #3517's copies); single-behaviour variants are
#: for diagnosis with ``--weights``
FULL_NAMES: tuple[str, ...] = ("distributed", "plain", "gtp_mcore", "gtp_nograd")


def shard_rows(rows: int, world_size: int, pad_multiple: int = 1) -> tuple[int, int]:
    """Return ``(padded_rows, rows_per_rank)`` for sharding ``rows`` over ``world_size``.

    Rows pad at the tail to a multiple of ``world_size * pad_multiple`` (CONTRACTS §3).
    Under an alignment (``pad_multiple > 1``, Megatron's ``pad_for_alignment``) a rank may
    hold only padding, which is legal; without one (divisibility only) such a world means
    the shapes are too small for it, and is refused.

    Raises:
        ValueError: a bad argument, or (``pad_multiple == 1``) a rank would hold nothing but
            padding.
    """
    if world_size < 1 or pad_multiple < 1 or rows < 1:
        raise ValueError(f"rows={rows}, world_size={world_size} and pad_multiple={pad_multiple} "
                         f"must be >= 1")
    unit = world_size * pad_multiple
    padded = math.ceil(rows / unit) * unit
    per_rank = padded // world_size
    if pad_multiple == 1 and (world_size - 1) * per_rank >= rows:
        raise ValueError(
            f"world size {world_size} cannot shard {rows} rows (pad_multiple={pad_multiple}): "
            f"rank {world_size - 1} would hold only padding"
        )
    return padded, per_rank


def pad_multiple(weight: str, recipe: str = "none") -> int:
    """The row alignment of a ``weight`` shard under ``recipe``: Megatron's follows the recipe
    (``configure_gtp_remat_from_recipe``: 32 under MXFP8, else 16), and so does a native
    harness weight's (an MXFP8 shard is whole 32-row blocks; a block-scaled one, which Megatron
    does not build, whole 128-row tiles: ``STANDIN_BLOCK_PAD``); the harness weight's otherwise
    is its behaviour's."""
    kind = KINDS[weight]
    if recipe == "mxfp8" and (kind.implementer == "megatron" or kind.native):
        return MEGATRON_MXFP8_PAD
    if recipe == "blockwise" and kind.native and kind.implementer != "megatron":
        return STANDIN_BLOCK_PAD
    return kind.pad_multiple


def shardable(weight: str, rows: int, world_size: int, recipe: str = "none") -> bool:
    """Whether a weight of kind ``weight`` can shard ``rows`` over ``world_size`` ranks."""
    kind = KINDS[weight]
    if not kind.distributed:
        return True
    try:
        shard_rows(rows, world_size, pad_multiple(weight, recipe))
        return True
    except ValueError:
        return False


def _megatron_version() -> str | None:
    try:
        return importlib.metadata.version(MEGATRON_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def megatron_gtp_source() -> Path | None:
    """Where the installed megatron-core's GTP module source is, or None."""
    try:
        dist = importlib.metadata.distribution(MEGATRON_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(MEGATRON_GTP_FILE))
    return path if path.is_file() else None


def te_installed() -> bool:
    """Any TransformerEngine: on CPU ``harness.backends.te_cpu.backend`` checks it is the version it serves;
    on a GPU machine Megatron's GTP module checks its own minimum (2.19)."""
    try:
        importlib.metadata.version("transformer_engine")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def megatron_missing() -> str | None:
    """None when Megatron's GTP module can be loaded here, else one line saying what is
    missing. Reads package metadata and paths only (no torch, no Megatron import)."""
    version = _megatron_version()
    if version is None:
        return f"megatron-core=={MEGATRON_VERSION} is not installed"
    if version != MEGATRON_VERSION:
        return f"megatron-core {version} is installed, the harness needs {MEGATRON_VERSION}"
    if megatron_gtp_source() is None:
        return f"megatron-core {version} has no {MEGATRON_GTP_FILE}"
    if not te_installed():
        return "Megatron's GTP module imports TransformerEngine, which is not installed"
    return None


def unavailable(names: set[str] | list[str] | tuple[str, ...]) -> str | None:
    """One line saying what the weights ``names`` need that is not installed, or None.

    Reads package metadata only (no torch, no Megatron import), so the CLI and pytest can
    refuse a selection up front instead of failing every cell in the ranks.
    """
    if any(KINDS[n].implementer == "megatron" for n in names):
        why = megatron_missing()
        if why is not None:
            return (f"weight {'/'.join(n for n in NAMES if n in names and KINDS[n].implementer == 'megatron')} needs Megatron-Core's GTP weight: {why} "
                    f"(run `python -m harness install megatron`)")
    return None
