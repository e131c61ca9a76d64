"""The verification matrix: axes, cells and the presets that select them.

Pure Python (no torch), so every rank, the CLI and the reports can rebuild the same matrix
cheaply. Every rank calls :func:`select` with the same arguments and compares
:func:`ids_digest` before any cell runs; after that only indices travel.

A cell fixes one value on each of sixteen axes, in this order::

    module, weight, hooks, fused, dtype, world_size, consumer, microbatches, num_gemms,
    bias, input_grad, delay_wgrad, recipe, first_mb, layers, shape

``recipe`` (``harness.vocabulary.recipes``) is ``none`` for every cell that runs no low-precision recipe:
the cells that existed before the axis, whose ids it leaves unchanged (a recipe is named in
the id only when it is not ``none``: ``...-nodelay-rcurrent``). Under a recipe the cell's
shapes are aligned to it (``harness.vocabulary.shape.fitted``). ``layers`` (the MoE layers of
a model chunk of Megatron's expert layer, ``harness.vocabulary.modules``) is 1 for every other
module, and named in the id only when it is not 1 (``...-l2``); so is ``first_mb`` (``-fmb``).
``shape`` (``harness.vocabulary.shape``) is ``base`` for every cell that runs the example's
shapes, and named in the id only when it is not (``...-rblockwise-sblocks``): ``blocks`` cells
span at least two blocks of their recipe along every blocked dimension of every GEMM operand.

Each constraint below is a rule of the axis value it names (``modules.ModuleKind``,
``weights.WeightKind``, ``hook_modes.HookMode``, ``recipes.RecipeKind``), asked here, never
restated; these combinations are invalid and never generated:

- ``consumer='autograd'`` with ``fused=True``: there is no ``main_grad`` to fuse into
  (CONTRACTS §4);
- a module that is not grouped (``linear``, ``layernorm_linear``, ``rmsnorm_linear``) with
  ``num_gemms != 1``: a cell of such a module always has ``num_gemms=1``, even when 1 is not
  in the ``num_gemms`` domain;
- a distributed weight (any value but ``plain``) with ``consumer='autograd'``: a distributed
  weight always has a ``main_grad`` (CONTRACTS §2);
- Megatron's class at world size 1, which it never builds;
- a dtype the module's path does not have (``modules.ModuleKind.dtypes``: the grouped-tensor
  paths have no fp32);
- ``delayed`` or ``nvfp4`` on a grouped-tensor path (``grouped_linear_tensor``,
  ``ops_grouped_linear_tensor``): TE 2.20.2 never takes that path under ``DelayedScaling``, and
  under NVFP4 only with the random Hadamard transform, which the ``nvfp4`` value switches off
  (``is_module_grouped_tensor_path_supported``; ``recipes.RecipeKind.grouped_tensor``);
- ``shape='blocks'`` without a recipe that scales blocks (``mxfp8``, ``blockwise``, ``nvfp4``):
  ``none`` and the per-tensor recipes have no block to span;
- ``hooks='checkpoint'`` with ``recipe='delayed'``: torch's checkpoint, which the hook mode
  uses, recomputes the forward during backward with the scales delayed scaling has updated
  since (and records its amaxes again); TE restores the forward's scales for a recompute only
  under its own ``checkpoint``, so the recomputed step is not the one the cell names;
- TE's own CPU offloading (``te_offload``, ``te_offload_v1``) on ``grouped_linear_tensor``:
  TE's ``GroupedLinear`` leaves its grouped-tensor path while offloading is on, so the cell
  would never run the path it names;
- Megatron's expert layer (``mcore_grouped_mlp``, ``mcore_grouped_mlp_gelu``) with a weight
  other than ``plain`` or ``megatron`` (its constructor shards and attaches its own weights),
  the ``autograd`` consumer, a delayed wgrad or ``first_mb``; ``layers != 1`` on any other
  module.

Recipes are opt-in: every preset's recipe domain is ``("none",)`` unless ``--recipes`` names
others. Under a recipe a cell's feature counts and rows are multiples of 16 (TE's FP8 GEMM
alignment; ``harness.vocabulary.recipes.RecipeKind.align``) and the oracle must model the recipe on the
module (``harness.vocabulary.recipes.MODELLED``; the CLI refuses other cells).

``delay_wgrad`` with a distributed weight is valid but *expected to raise* (CONTRACTS §2).

The ``weight`` axis's default domain is every value that needs nothing installed;
``megatron`` (Megatron-Core's real class) is selected explicitly (``--weights megatron``).
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.vocabulary.errors import MatrixError
from harness.vocabulary import filters, hook_modes, modules, recipes, selection_cache, shape, weights

__all__ = [
    "AXES", "AXIS_NAMES", "AXIS_OPTIONS", "HOOK_MODES", "PRESETS", "Axis", "Cell", "MatrixError",
    "SEED", "compile_filter", "describe", "ids_digest", "parse_sample", "parse_values", "plan", "product",
    "restricts", "sample", "select", "why_empty",
]

#: the saved-tensor hook modes a cell's forward runs under (``harness.vocabulary.hook_modes``;
#: ``harness.cell.hooks`` installs them)
HOOK_MODES: tuple[str, ...] = hook_modes.NAMES

_CHOICES: dict[str, tuple[str, ...]] = {
    "module": modules.NAMES,
    "weight": weights.NAMES,
    "hooks": HOOK_MODES,
    "dtype": ("fp32", "bf16", "fp16"),
    "consumer": ("ddp", "autograd"),
    "recipe": recipes.NAMES,
    "shape": shape.NAMES,
}
_BOOL_AXES = ("fused", "bias", "input_grad", "delay_wgrad", "first_mb")
_INT_AXES = ("world_size", "microbatches", "num_gemms", "layers")
_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "module": _CHOICES["module"], "weight": weights.DEFAULT_NAMES, "hooks": _CHOICES["hooks"],
    "fused": (True, False), "dtype": _CHOICES["dtype"], "world_size": (1, 2, 4),
    "consumer": _CHOICES["consumer"], "microbatches": (1, 2), "num_gemms": (1, 4),
    "bias": (True, False), "input_grad": (True, False), "delay_wgrad": (False, True),
    # ``ci`` and ``full`` add the recipes the oracle judges (``select``); smoke and seed: none
    "recipe": ("none",),
    # ``ci`` and ``full`` add the flagged microbatches (``select``); smoke and seed: not passed
    "first_mb": (False,),
    # MoE layers per chunk of Megatron's expert layer (every other module: 1)
    "layers": (1, 2),
    # ``ci`` adds the block-spanning shapes under the block recipes (``select``, ``_block_cells``)
    "shape": ("base",),
}
AXIS_NAMES: tuple[str, ...] = tuple(_DEFAULTS)
AXIS_OPTIONS: dict[str, str] = {
    "--modules": "module", "--weights": "weight", "--hooks": "hooks", "--fused": "fused",
    "--dtypes": "dtype", "--world-sizes": "world_size", "--consumers": "consumer",
    "--microbatches": "microbatches", "--num-gemms": "num_gemms", "--bias": "bias",
    "--input-grad": "input_grad", "--delay-wgrad": "delay_wgrad", "--recipes": "recipe",
    "--first-microbatch": "first_mb", "--layers": "layers", "--shapes": "shape",
}
PRESETS: tuple[str, ...] = ("ci", "full", "smoke", "seed")
#: the production combination of the original hook defect's report: Megatron's expert layer
#: (``TEGroupedMLP``, 4 experts, two MoE layers per chunk, two microbatches) over Megatron's
#: expert-GTP bf16 weights with fused wgrad, under Megatron's fine-grained activation offloading
#: of ``expert_fc1`` and ``moe_act`` (``hooks`` ``mcore_offload``; each with its hooks-off control)
SEED: dict[str, Any] = {"module": "mcore_grouped_mlp", "weight": "megatron", "fused": True,
                        "dtype": "bf16", "consumer": "ddp", "delay_wgrad": False, "num_gemms": 4,
                        "layers": 2, "microbatches": 2, "bias": False}
#: the seed's hook modes: the installer of the report, and its control
SEED_HOOKS: tuple[str, ...] = ("mcore_offload", "off")


def _check_axis_name(name: str) -> None:
    if name not in _DEFAULTS:
        raise MatrixError(f"Unknown axis {name!r} (axes: {', '.join(AXIS_NAMES)})")


def _check_value(name: str, value: Any) -> None:
    """Raise MatrixError unless ``value`` is a legal value of axis ``name``."""
    if name in _CHOICES:
        if value not in _CHOICES[name]:
            raise MatrixError(f"Unknown value {value!r} for axis {name} "
                              f"(choose from {', '.join(_CHOICES[name])})")
    elif name in _BOOL_AXES:
        if not isinstance(value, bool):
            raise MatrixError(f"{name} must be a bool, got {name}={value!r}")
    elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MatrixError(f"{name} must be an int >= 1, got {name}={value!r}")


# Constraints between two axes: (axis a, axis b, ok(value_a, value_b), reason). _feasible
# decides exactly whether a partial assignment completes, by searching each connected
# group of constrained axes (a handful of values each).
_CONSTRAINTS: tuple[tuple[str, str, Callable[[Any, Any], bool], str], ...] = (
    ("consumer", "fused", lambda c, f: not (c == "autograd" and f),
     "consumer='autograd' requires fused=False (no main_grad to fuse into)"),
    ("module", "num_gemms", lambda m, g: modules.KINDS[m].grouped or g == 1,
     "a module that is not grouped (linear, layernorm_linear, rmsnorm_linear) requires num_gemms=1"),
    ("weight", "consumer", lambda w, c: c == "ddp" or not weights.KINDS[w].needs_ddp,
     "a distributed weight always has a main_grad (Megatron's GTP runs only under its DDP, "
     "CONTRACTS §2) and requires consumer='ddp'"),
    ("module", "dtype", lambda m, d: d in modules.KINDS[m].dtypes,
     "TE's grouped-tensor path (grouped_linear_tensor, ops_grouped_linear_tensor) exists for "
     "bf16 and fp16 only (its grouped GEMM rejects fp32; TE falls back to the split path)"),
    ("weight", "world_size", lambda w, ws: ws >= weights.KINDS[w].min_world_size,
     "weight='megatron', 'megatron_fp8' and 'gtp_mcore_fp8' require world_size >= 2 (Megatron never "
     "builds a GTP group of one; its native stand-in follows it)"),
    ("weight", "recipe", lambda w, r: weights.KINDS[w].recipes is None or r in weights.KINDS[w].recipes,
     f"weight='megatron_fp8' (native quantized shards) requires a recipe in {', '.join(weights.NATIVE_RECIPES)} "
     f"and 'gtp_mcore_fp8' one in {', '.join(weights.STANDIN_NATIVE_RECIPES)}: a native parameter exists only "
     f"under a recipe, Megatron's native blockwise weight does not work and the native NVFP4 weights are not "
     f"built (docs/megatron.md)"),
    ("module", "recipe", lambda m, r: modules.KINDS[m].path != "grouped_tensor" or not recipes.KINDS[r].grouped_tensor,
     "recipe 'delayed' or 'nvfp4' on a grouped-tensor path (grouped_linear_tensor, ops_grouped_linear_tensor) "
     "does not exist in TE 2.20.2: it takes no grouped-tensor path under DelayedScaling, and under NVFP4 only "
     "with the random Hadamard transform (harness.vocabulary.recipes.RecipeKind.grouped_tensor)"),
    ("shape", "recipe", lambda s, r: not shape.KINDS[s].spans_blocks or recipes.KINDS[r].blocked,
     f"shape='blocks' requires a recipe that scales blocks ({', '.join(recipes.BLOCKED)}): none and the "
     f"per-tensor recipes have no block to span"),
    ("module", "first_mb", lambda m, f: not f or modules.KINDS[m].takes_first_microbatch,
     "first_mb (is_first_microbatch) requires a module whose forward takes it: ops.GroupedLinear's "
     "(ops_grouped_linear, ops_grouped_linear_tensor) and Megatron's expert layer's do not"),
    ("microbatches", "first_mb", lambda n, f: not f or n >= 2,
     "first_mb (is_first_microbatch: True, then False) requires microbatches >= 2"),
    ("dtype", "recipe", lambda d, r: not (d == "fp16" and r in recipes.NO_FP16),
     f"recipe {' / '.join(recipes.NO_FP16)} with dtype='fp16' does not exist in TE: its FP4 GEMM refuses "
     f"an fp16 output ('FP4 GEMM does not support FP16 output!')"),
    ("hooks", "recipe", lambda h, r: not (hook_modes.KINDS[h].recomputes_forward and r == "delayed"),
     "hooks='checkpoint' with recipe='delayed' is not built: torch's checkpoint recomputes the forward "
     "with the scales the step has since updated (TE restores them only under its own checkpoint)"),
    ("module", "hooks", lambda m, h: not (modules.KINDS[m].offload_leaves_path
                                          and hook_modes.KINDS[h].leaves_grouped_tensor_path),
     "TE's own CPU offloading (te_offload, te_offload_v1) on grouped_linear_tensor is not built: TE's "
     "GroupedLinear leaves its grouped-tensor path while offloading is on"),
    ("module", "weight", lambda m, w: modules.KINDS[m].weights is None or w in modules.KINDS[m].weights,
     "Megatron's expert layer (mcore_grouped_mlp, mcore_grouped_mlp_gelu) requires weight='plain' or "
     "'megatron': its constructor shards and attaches its own expert weights"),
    ("module", "consumer", lambda m, c: c in modules.KINDS[m].consumers,
     "Megatron's expert layer requires consumer='ddp' (it runs under Megatron's DDP: main_grad)"),
    ("module", "delay_wgrad", lambda m, d: not d or modules.KINDS[m].delays_wgrad,
     "Megatron's expert layer requires delay_wgrad=off (its delayed wgrad is driven by Megatron's "
     "overlapped schedule, which a layer cell does not run)"),
    ("module", "layers", lambda m, n: n == 1 or modules.KINDS[m].layer,
     "layers != 1 requires Megatron's expert layer (a module is one layer)"),
)


@dataclass(frozen=True, repr=False)
class Axis:
    """One axis of the matrix and its domain; immutable, validated when built.

    Args:
        name: one of ``AXIS_NAMES``.
        values: the domain, in order; duplicates are dropped.

    Raises:
        MatrixError: unknown name, empty domain or an illegal value.
    """

    name: str
    values: tuple[Any, ...]
    _expr: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _check_axis_name(self.name)
        values = tuple(dict.fromkeys(self.values))  # dedupe, keep order
        if not values:
            raise MatrixError(f"Axis {self.name} has no values, got values={self.values!r}")
        for v in values:
            _check_value(self.name, v)
        object.__setattr__(self, "values", values)

    def __repr__(self) -> str:
        return self._expr or f"Axis({self.name!r}, {self.values!r})"

    def filter(self, pred: Callable[[Any], bool]) -> Axis:
        """Return the axis keeping the values for which ``pred`` is true."""
        expr = f"{self!r}.filter({getattr(pred, '__name__', repr(pred))})"
        return Axis(self.name, tuple(v for v in self.values if pred(v)), expr)

    def restrict(self, values: Iterable[Any]) -> Axis:
        """Return the axis restricted to ``values``, which must already be in the domain.

        Raises:
            MatrixError: a value is not in this axis's domain.
        """
        values = tuple(values)
        for v in values:
            if v not in self.values:
                raise MatrixError(f"Cannot restrict axis {self.name} to {v!r}: "
                                  f"not in values={self.values!r}")
        return Axis(self.name, values, f"{self!r}.restrict({values!r})")

    def __or__(self, other: Axis) -> Axis:
        if not isinstance(other, Axis):
            return NotImplemented
        if other.name != self.name:
            raise MatrixError(f"Cannot union axis {self.name} with axis {other.name}")
        return Axis(self.name, self.values + other.values, f"{self!r} | {other!r}")


AXES: tuple[Axis, ...] = tuple(Axis(n, v) for n, v in _DEFAULTS.items())


@dataclass(frozen=True, slots=True)
class Cell:
    """One combination of axis values: one test case, run on ``world_size`` ranks.

    Raises:
        MatrixError: an illegal value, or an invalid combination (see module docstring).
    """

    module: str
    weight: str
    hooks: str
    fused: bool
    dtype: str
    world_size: int
    consumer: str
    microbatches: int
    num_gemms: int
    bias: bool
    input_grad: bool
    delay_wgrad: bool
    recipe: str = "none"
    first_mb: bool = False
    layers: int = 1
    shape: str = "base"

    def __post_init__(self) -> None:
        for name in AXIS_NAMES:
            _check_value(name, getattr(self, name))
        for a, b, ok, reason in _CONSTRAINTS:
            va, vb = getattr(self, a), getattr(self, b)
            if not ok(va, vb):
                raise MatrixError(f"Invalid cell: {reason}, got {a}={va!r}, {b}={vb!r}")

    @property
    def id(self) -> str:
        """Stable, readable id: pytest param id, JUnit name, report anchor and JSON key."""
        return (f"{self.module}-{self.weight}-hooks_{self.hooks}-"
                f"{'fused' if self.fused else 'unfused'}-{self.dtype}-ws{self.world_size}-"
                f"{self.consumer}-mb{self.microbatches}-g{self.num_gemms}-"
                f"{'bias' if self.bias else 'nobias'}-"
                f"{'igrad' if self.input_grad else 'noigrad'}-"
                f"{'delay' if self.delay_wgrad else 'nodelay'}"
                f"{'' if self.recipe == 'none' else f'-r{self.recipe}'}"
                f"{'-fmb' if self.first_mb else ''}"
                f"{'' if self.layers == 1 else f'-l{self.layers}'}"
                f"{'' if self.shape == 'base' else f'-s{self.shape}'}")

    @property
    def distributed(self) -> bool:
        """Whether the cell's weights are DistributedWeights (any value but ``plain``)."""
        return weights.KINDS[self.weight].distributed

    @property
    def expect(self) -> str:
        """``"error"`` when the backend must raise by contract (CONTRACTS §2), else ``"pass"``."""
        return "error" if self.delay_wgrad and self.distributed else "pass"

    @property
    def seed(self) -> int:
        """A 63-bit seed from the id with the weight kind and the hook mode left out (sha256,
        because ``hash()`` differs per process).

        Cells that differ only in how the weight is held (plain, GTP, Megatron's) or in which
        saved-tensor hook runs draw the same numbers: a hooked cell's inputs are those of its
        hooks-off cell (the twin it is compared with bit for bit), so a difference between
        them is the hook's or the weight's alone; and te-cpu's remembered kernel launches
        (``harness/backends/te_cpu/launch_memo.py``) serve all of them from one interpretation."""
        key = self._id_with(weight="*", hooks="hooks_*")
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 1

    @property
    def twin_id(self) -> str:
        """The id of the cell's hooks-off twin (its own id when it has no hook)."""
        return self._id_with(hooks="hooks_off")

    def _id_with(self, weight: str | None = None, hooks: str | None = None) -> str:
        """The id with its weight and/or hook field replaced (the one place that knows their
        positions: ``module-weight-hooks_...-...``)."""
        parts = self.id.split("-")
        if weight is not None:
            parts[1] = weight
        if hooks is not None:
            parts[2] = hooks
        return "-".join(parts)

    def serialize(self) -> dict[str, Any]:
        """Return the axis values as a JSON-able dict (bools stay bools)."""
        return {name: getattr(self, name) for name in AXIS_NAMES}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cell:
        """Rebuild a cell from :meth:`serialize` output.

        A dict without ``recipe``, ``first_mb``, ``layers`` or ``shape`` (a record written before
        the axis existed) is a cell without a recipe, without the flag, of one layer, of the
        example's shapes.

        Raises:
            MatrixError: missing or unknown keys, or bad values.
        """
        d = {"recipe": "none", "first_mb": False, "layers": 1, "shape": "base", **d}
        missing = [n for n in AXIS_NAMES if n not in d]
        extra = [k for k in d if k not in _DEFAULTS]
        if missing or extra:
            raise MatrixError(f"Cannot build a cell: missing={missing!r}, unknown={extra!r}")
        return cls(**{n: d[n] for n in AXIS_NAMES})

    @classmethod
    def from_id(cls, cell_id: str) -> Cell:
        """Parse an id made by :attr:`id` back into a cell.

        Raises:
            MatrixError: the id is malformed, not canonical, or names an invalid cell.
        """
        parts = cell_id.split("-")
        recipe, first_mb, layers, shape_ = "none", False, 1, "base"
        if len(parts) > 12 and parts[-1][:1] == "s" and parts[-1][1:] in shape.NAMES:
            shape_ = parts.pop()[1:]
        if len(parts) > 12 and parts[-1][:1] == "l" and parts[-1][1:].isdigit():
            layers = int(parts.pop()[1:])
        if len(parts) > 12 and parts[-1] == "fmb":
            parts.pop()
            first_mb = True
        if len(parts) == 13 and parts[12].startswith("r"):
            recipe = parts.pop()[1:]
        if len(parts) != 12:
            raise MatrixError(f"Malformed cell id {cell_id!r}: expected 12 '-'-separated "
                              f"parts (then r<recipe> with a recipe, fmb with the first-microbatch "
                              f"flag, l<layers> with more than one layer, s<shape> with another shape "
                              f"than the example's), got {len(cell_id.split('-'))}")

        def flag(i: int, yes: str, no: str) -> bool:
            if parts[i] not in (yes, no):
                raise MatrixError(f"Malformed cell id {cell_id!r}: part {i + 1} is "
                                  f"{parts[i]!r}, expected {yes!r} or {no!r}")
            return parts[i] == yes

        def number(i: int, prefix: str) -> int:
            digits = parts[i][len(prefix):]
            if not parts[i].startswith(prefix) or not digits.isdigit():
                raise MatrixError(f"Malformed cell id {cell_id!r}: part {i + 1} is "
                                  f"{parts[i]!r}, expected {prefix}<int>")
            return int(digits)

        if not parts[2].startswith("hooks_"):
            raise MatrixError(f"Malformed cell id {cell_id!r}: part 3 is {parts[2]!r}, "
                              f"expected hooks_<value>")
        try:
            cell = cls(parts[0], parts[1], parts[2][len("hooks_"):], flag(3, "fused", "unfused"),
                       parts[4], number(5, "ws"), parts[6], number(7, "mb"), number(8, "g"),
                       flag(9, "bias", "nobias"), flag(10, "igrad", "noigrad"),
                       flag(11, "delay", "nodelay"), recipe, first_mb, layers, shape_)
        except MatrixError as e:
            if str(e).startswith("Malformed"):
                raise
            raise MatrixError(f"Malformed cell id {cell_id!r}: {e}") from None
        if cell.id != cell_id:
            raise MatrixError(f"Malformed cell id {cell_id!r}: not canonical "
                              f"(expected {cell.id!r})")
        return cell


# --- domains and feasibility ----------------------------------------------------------

Domains = dict[str, tuple[Any, ...]]
Assignment = dict[str, Any]


def _options(name: str, assign: Assignment, domains: Domains) -> tuple[Any, ...]:
    """Values ``name`` may take given ``assign`` (an ungrouped module's num_gemms is always 1, a
    module's layers too: whatever those axes' domains)."""
    kind = modules.KINDS[assign["module"]] if "module" in assign else None
    if name == "num_gemms" and kind is not None and not kind.grouped:
        base: tuple[Any, ...] = (1,)
    elif name == "layers" and kind is not None and not kind.layer:
        base = (1,)
    else:
        base = domains[name]
    if name in assign:
        return (assign[name],) if assign[name] in base else ()
    return base


def _components() -> list[tuple[list[str], list[tuple[str, str, Callable[[Any, Any], bool], str]]]]:
    """Constrained axes grouped by shared constraints (in axis order), with their constraints."""
    groups: list[tuple[set[str], list]] = []
    for con in _CONSTRAINTS:
        axes = {con[0], con[1]}
        joined = [g for g in groups if g[0] & axes]
        for g in joined:
            groups.remove(g)
            axes |= g[0]
        groups.append((axes, [c for g in joined for c in g[1]] + [con]))
    order = {n: i for i, n in enumerate(AXIS_NAMES)}
    return [(sorted(axes, key=order.__getitem__), cons) for axes, cons in groups]


_COMPONENTS = _components()
#: the axes whose options a module value fixes (``_options``)
_MODULE_FIXED = frozenset({"num_gemms", "layers"})


#: answers of :func:`_component_feasible`, keyed by the component, its axes' fixed values and
#: domains (a preset asks the same few thousand questions many times)
_FEASIBLE: dict[tuple[Any, ...], bool] = {}


class _Witnesses:
    """The valid assignments of a component's axes that searches found under one set of
    domains: a question whose fixed values one of them holds needs no search. Pairs (and
    single values) are looked up in the set of those every witness holds - a covering
    design asks for every pair of values, and most are held by an earlier witness; a longer
    question is tried against the last few witnesses (a cell is completed one axis at a
    time, each question the one before it and one value more)."""

    RECENT = 4

    def __init__(self) -> None:
        self.pairs: set[tuple[tuple[str, Any], ...]] = set()
        self.recent: list[dict[str, Any]] = []

    def hold(self, fixed: tuple[tuple[str, Any], ...]) -> bool:
        if len(fixed) <= 2:
            return fixed in self.pairs
        return any(all(w[a] == v for a, v in fixed) for w in self.recent)

    def add(self, witness: dict[str, Any], axes: list[str]) -> None:
        items = [(a, witness[a]) for a in axes]  # in the component's axis order, as ``fixed``
        self.pairs.update((item,) for item in items)
        self.pairs.update(itertools.combinations(items, 2))
        self.recent = [witness, *self.recent[:self.RECENT - 1]]


#: per component and its domains, the witnesses found (bounded with ``_FEASIBLE``)
_WITNESSES: dict[tuple[Any, ...], _Witnesses] = {}


def _feasible(assign: Assignment, domains: Domains) -> bool:
    """True when the partial assignment extends to a valid cell (exact: a backtracking search
    per connected group of constrained axes; groups share no axis, so they are independent;
    a valid assignment a search found answers every later question it holds, ``_Witnesses``)."""
    for index, (axes, _) in enumerate(_COMPONENTS):
        fixed = tuple((a, assign[a]) for a in axes if a in assign)
        key = (index, fixed, tuple(domains[a] for a in axes))
        if key not in _FEASIBLE:
            if len(_FEASIBLE) > 200_000:  # bounded: a long-lived process selects many presets
                _FEASIBLE.clear()
                _WITNESSES.clear()
            witnesses = _WITNESSES.setdefault((index, key[2]), _Witnesses())
            if witnesses.hold(fixed):
                _FEASIBLE[key] = True
            else:
                live = _supported(index, key[2])
                witness = (_component_feasible(index, dict(fixed), {**domains, **live})
                           if all(v in live[a] for a, v in fixed if a in live) else None)
                if witness is not None:
                    witnesses.add(witness, axes)
                _FEASIBLE[key] = witness is not None
        if not _FEASIBLE[key]:
            return False
    return True


@functools.lru_cache(maxsize=1024)
def _supported(index: int, component_domains: tuple[tuple[Any, ...], ...]) -> dict[str, tuple[Any, ...]]:
    """Component ``index``'s domains (``component_domains``, in its axis order) without the
    values no valid cell can take: each value must meet, under every constraint, some value
    of the other axis, until nothing changes (arc consistency). Sound: only impossible
    values go, so the search over what is left stays exact; it finds at once what it would
    otherwise prove by trying every earlier axis (``microbatches=1`` when every cell passes
    ``first_mb``). ``num_gemms`` and ``layers`` keep their domains (a module that is not
    grouped, or not a layer, takes 1 outside them)."""
    axes, cons = _COMPONENTS[index]
    live = {a: list(d) for a, d in zip(axes, component_domains) if a not in _MODULE_FIXED}
    pairs = [(a, b, ok) for a, b, ok, _ in cons if a in live and b in live]
    changed = True
    while changed:
        changed = False
        for a, b, ok in pairs:
            keep_a = [va for va in live[a] if any(ok(va, vb) for vb in live[b])]
            keep_b = [vb for vb in live[b] if any(ok(va, vb) for va in keep_a)]
            if len(keep_a) != len(live[a]) or len(keep_b) != len(live[b]):
                live[a], live[b], changed = keep_a, keep_b, True
    return {a: tuple(v) for a, v in live.items()}


@functools.lru_cache(maxsize=None)
def _search_plan(index: int, fixed: frozenset[str]) -> tuple[list[list[tuple[str, str, Callable[[Any, Any], bool]]]],
                                                             list[list[str]]]:
    """For component ``index`` with the axes ``fixed`` given: the constraints due at each axis
    (checked as soon as both their axes have values; a fixed axis has its value from the
    start) and the earlier free axes the search from each axis on reads. The same few
    shapes of question recur thousands of times in a preset."""
    axes, cons = _COMPONENTS[index]
    position = {a: -1 if a in fixed else i for i, a in enumerate(axes)}
    due: list[list[tuple[str, str, Callable[[Any, Any], bool]]]] = [[] for _ in axes]
    for a, b, ok, _ in cons:
        due[max(position[a], position[b], 0)].append((a, b, ok))
    # the earlier free values the search from axis i on reads (num_gemms' and layers' options read module)
    reads = [{a for later in due[i:] for con in later for a in con[:2] if 0 <= position[a] < i}
             | ({"module"} if _MODULE_FIXED & set(axes[i:]) and 0 <= position.get("module", -1) < i else set())
             for i in range(len(axes))]
    return due, [sorted(r, key=position.__getitem__) for r in reads]


def _component_feasible(index: int, fixed: Assignment, domains: Domains) -> dict[str, Any] | None:
    """A valid assignment of component ``index``'s axes that extends ``fixed``, every one of
    its constraints holding (None: there is none): a backtracking search in axis order
    (:func:`_search_plan`) that remembers the dead ends: what remains from axis ``i`` on
    depends only on the earlier values that later constraints read, so a dead end is never
    searched twice."""
    axes = _COMPONENTS[index][0]
    due, frontier = _search_plan(index, frozenset(fixed))
    partial = dict(fixed)
    dead: set[tuple[Any, ...]] = set()

    def extend(i: int) -> bool:
        if i == len(axes):
            return True
        key = (i, *(partial[a] for a in frontier[i]))
        if key in dead:
            return False
        name = axes[i]
        # the most demanding values first (``_preferred``): the witness found is then the
        # completion ``_complete`` makes, and each of its questions is answered by it
        for v in _preferred(name, _options(name, partial, domains)):
            partial[name] = v
            for a, b, ok in due[i]:
                if not ok(partial[a], partial[b]):
                    break
            else:
                if extend(i + 1):
                    return True
        if name in fixed:
            partial[name] = fixed[name]
        else:
            partial.pop(name, None)
        dead.add(key)
        return False

    return partial if extend(0) else None


@functools.lru_cache(maxsize=4096)  # the search asks at every step it takes
def _preferred(name: str, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` ordered most demanding first: the values most likely to expose a bug."""
    first = {"weight": "distributed", "hooks": "off", "fused": True, "dtype": "bf16",
             "consumer": "ddp", "bias": True, "input_grad": True, "delay_wgrad": False}
    if name in _INT_AXES:
        return tuple(sorted(values, reverse=True))
    if name in first and first[name] in values:
        return (first[name],) + tuple(v for v in values if v != first[name])
    return values


def _complete(fixed: Assignment, domains: Domains) -> Cell | None:
    """Fill the free axes with their most demanding feasible values; None if impossible."""
    assign = dict(fixed)
    if any(v not in domains[k] for k, v in assign.items() if k not in _MODULE_FIXED) or not _feasible(assign, domains):
        return None
    for name in AXIS_NAMES:
        if name not in assign:
            # _feasible is exact, so the first feasible value never needs backtracking.
            assign[name] = next(v for v in _preferred(name, _options(name, assign, domains))
                                if _feasible({**assign, name: v}, domains))
    return Cell(**assign)


def _domains(overrides: Mapping[str, Sequence[Any] | Axis] | None) -> Domains:
    domains = {a.name: a.values for a in AXES}
    for name, values in (overrides or {}).items():
        _check_axis_name(name)
        axis = values if isinstance(values, Axis) else Axis(name, tuple(values))
        if axis.name != name:
            raise MatrixError(f"Override for axis {name} is axis {axis.name}")
        domains[name] = axis.values
    return domains


# --- presets ---------------------------------------------------------------------------

def product(axes: Iterable[Axis] = AXES) -> list[Cell]:
    """All valid cells of the cartesian product; axes not given keep their defaults.

    Cells of ungrouped modules take ``num_gemms=1`` whatever the num_gemms domain (once).
    """
    return list(_valid(_domains({a.name: a for a in axes})))


def _valid(domains: Domains) -> Iterator[Cell]:
    """The valid cells of the product of ``domains``, in the order of
    ``itertools.product`` over ``AXIS_NAMES`` (an ungrouped module's cells take num_gemms=1,
    a module that is not a layer layers=1, once). Each constraint is checked as soon as both
    its axes have values, so a dead prefix is never extended; the cells come out validated and
    are built without checking again (``_trusted``): ``full`` is hundreds of thousands of them.
    They are made one valid prefix of the first ``_PREFIX`` axes at a time, so a caller that
    keeps few of them (``select`` with a sample) never holds them all.

    Why a table per axis: the constraints are pairwise, so the values an axis may take after a
    prefix depend only on the few earlier axes its constraints name. Those are worked out once
    per combination of them (a few hundred at most) instead of once per prefix (``full`` has
    hundreds of thousands), and a prefix is extended only by values already known to be valid."""
    position = {n: i for i, n in enumerate(AXIS_NAMES)}
    due: list[list[tuple[int, int, Callable[[Any, Any], bool]]]] = [[] for _ in AXIS_NAMES]
    for a, b, ok in ((position[a], position[b], ok) for a, b, ok, _ in _CONSTRAINTS):
        due[max(a, b)].append((a, b, ok))
    values = [tuple(domains[n]) for n in AXIS_NAMES]
    ungrouped = {m for m in domains["module"] if not modules.KINDS[m].grouped}
    one_layer = {m for m in domains["module"] if not modules.KINDS[m].layer}
    forced = {position["num_gemms"]: ungrouped, position["layers"]: one_layer}
    module_at = position["module"]
    # per axis: the earlier axes its constraints name, and the allowed ends per their values
    keys = [sorted({a if b == i else b for a, b, _ in checks} | ({module_at} if i in forced else set()))
            for i, checks in enumerate(due)]
    key_of = [operator.itemgetter(*k) if k else None for k in keys]
    tables: list[dict[Any, tuple[tuple[Any], ...]]] = [{} for _ in AXIS_NAMES]

    def grow(rows: list[tuple[Any, ...]], upto: int) -> list[tuple[Any, ...]]:
        """``rows`` extended to their first ``upto`` axes (breadth first: the order of depth first)."""
        for i in range(len(rows[0]) if rows else 0, upto):
            if key_of[i] is None:
                ends = [(v,) for v in values[i]]
                rows = [row + end for row in rows for end in ends]
                continue
            table, key_i, grown = tables[i], key_of[i], []
            for row in rows:
                ends = table.get(key := key_i(row))
                if ends is None:
                    ends = table[key] = tuple((v,) for v in _allowed(row, values[i], due[i], forced.get(i, ()), module_at))
                for end in ends:
                    grown.append(row + end)
            rows = grown
        return rows

    # one valid prefix of the first axes at a time: a caller that keeps few cells never holds all
    for prefix in grow([()], _PREFIX):
        yield from _trusted(grow([prefix], len(AXIS_NAMES)))


#: the axes ``_valid`` fixes before it makes the rest (the cells of one such prefix are few)
_PREFIX = 3


def _allowed(row: tuple[Any, ...], domain: tuple[Any, ...],
             checks: list[tuple[int, int, Callable[[Any, Any], bool]]], one_of: set[str],
             module_at: int) -> tuple[Any, ...]:
    """The values of the next axis (in ``domain`` order) that every constraint due there allows
    after the prefix ``row``; ``(1,)`` where the prefix's module fixes the axis to 1."""
    if row[module_at] in one_of:
        return (1,)
    out = []
    for v in domain:
        cand = (*row, v)
        if all(ok(cand[a], cand[b]) for a, b, ok in checks):
            out.append(v)
    return tuple(out)


def _full_of_ids(domains: Domains, ids: Iterable[str]) -> list[Cell]:
    """The cells of the product of ``domains`` (``_valid``'s, in its order) whose ids are among
    ``ids``, built from the ids: a valid, canonical id whose every axis value is in its domain
    (an ungrouped module's ``num_gemms`` and a non-layer module's ``layers`` are 1 whatever
    the domain, as ``_valid`` makes them)."""
    rank = {n: {v: i for i, v in enumerate(domains[n])} for n in AXIS_NAMES}
    found: list[tuple[tuple[int, ...], Cell]] = []
    for text in ids:
        try:
            cell = Cell.from_id(text)
        except MatrixError:
            continue
        if cell.id != text:
            continue
        forced = {"num_gemms": not modules.KINDS[cell.module].grouped, "layers": not modules.KINDS[cell.module].layer}
        key = []
        for n in AXIS_NAMES:
            v = getattr(cell, n)
            if forced.get(n):
                key.append(0)
            elif v in rank[n]:
                key.append(rank[n][v])
            else:
                break
        else:
            found.append((tuple(key), cell))
    return [c for _, c in sorted(found, key=lambda kc: kc[0])]


def _trusted(rows: Iterable[Sequence[Any]]) -> list[Cell]:
    """Cells from rows of axis values in ``AXIS_NAMES`` order already known legal and valid
    (from :func:`_valid`): ``Cell``'s own checks skipped (one loop, no call per cell: ``full``
    is hundreds of thousands of them). ``Cell`` is a slotted class: each axis' slot is filled
    by its descriptor."""
    new, slots, cells = object.__new__, _slot_setters(), []
    for row in rows:
        cell = new(Cell)
        for put, v in zip(slots, row):
            put(cell, v)
        cells.append(cell)
    return cells


@functools.cache
def _slot_setters() -> tuple[Callable[[Cell, Any], None], ...]:
    """Each axis' slot setter of ``Cell``, in ``AXIS_NAMES`` order."""
    return tuple(getattr(Cell, n).__set__ for n in AXIS_NAMES)


class PackedCells(Sequence[Cell]):
    """Cells held as one byte per axis value, each made into a ``Cell`` again as it is read.

    Why: a sweep holds its selection for the whole run, and a large sample's ``Cell``s - a
    slotted object each, with the memory of the cells made and dropped around them while the
    matrix was made - were the largest part of its parent's memory (docs/performance.md, "the
    parent's memory"). Here a cell is ``len(AXIS_NAMES)`` bytes. A cell read back is equal to
    the one stored, not the same object: a ``Cell`` is frozen, so no reader can tell.
    """

    def __init__(self, cells: Iterable[Cell] = ()) -> None:
        self._rows = bytearray()
        for cell in cells:
            self._rows += _packed(cell)

    def __len__(self) -> int:
        return len(self._rows) // len(AXIS_NAMES)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("cell index out of range")
        return _unpacked(self._rows, i * len(AXIS_NAMES))

    def __iter__(self) -> Iterator[Cell]:
        rows, width = self._rows, len(AXIS_NAMES)
        for start in range(0, len(rows), width):
            yield _unpacked(rows, start)


#: each axis' values seen by ``PackedCells`` (a cell's byte is the index of its value here),
#: and the other way round, keyed with the value's type (``True == 1`` in a dict)
_PACKED_VALUES: tuple[list[Any], ...] = tuple([] for _ in AXIS_NAMES)
_PACKED_CODES: tuple[dict[tuple[type, Any], int], ...] = tuple({} for _ in AXIS_NAMES)


def _packed(cell: Cell) -> bytes:
    out = bytearray()
    for name, values, codes in zip(AXIS_NAMES, _PACKED_VALUES, _PACKED_CODES):
        v = getattr(cell, name)
        code = codes.get((type(v), v))
        if code is None:
            if len(values) > 255:
                raise MatrixError(f"more than 256 values of axis {name} in one process")
            code = codes[(type(v), v)] = len(values)
            values.append(v)
        out.append(code)
    return bytes(out)


def _unpacked(rows: bytearray, start: int) -> Cell:
    cell = object.__new__(Cell)
    for put, values, code in zip(_slot_setters(), _PACKED_VALUES, rows[start:start + len(AXIS_NAMES)]):
        put(cell, values[code])
    return cell


def restricts(expr: str) -> bool:
    """Whether the filter ``expr`` leaves out some valid cell of the whole matrix (every axis
    value, every weight). Exact and quick: its value depends only on the axes it names, so
    each feasible combination of those is completed to one valid cell and tried (every cell
    when it names ``id``).

    Raises:
        MatrixError: a malformed filter.
    """
    pred = compile_filter(expr)
    domains = _domains({"weight": weights.NAMES})
    names = filters.names_in(expr)
    if "id" in names:
        return not all(pred(c) for c in _valid(domains))
    named = [n for n in AXIS_NAMES if n in names]
    for combo in itertools.product(*(domains[n] for n in named)):
        cell = _complete(dict(zip(named, combo)), domains)
        if cell is not None and not pred(cell):
            return True
    return False


def _pairs(cell: Cell) -> Iterable[tuple[tuple[str, Any], tuple[str, Any]]]:
    items = [(n, getattr(cell, n)) for n in AXIS_NAMES]
    return itertools.combinations(items, 2)


def _weight_tiers(domain: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """The domain's weights by ``coverage`` (:class:`harness.vocabulary.weights.WeightKind`); when no
    value asks for full coverage (the user picked variants), every value gets it."""
    tiers = {t: tuple(w for w in domain if weights.KINDS[w].coverage == t)
             for t in ("full", "hooks", "light")}
    return tiers if tiers["full"] else {"full": domain, "hooks": (), "light": ()}


def _module_slots(domain: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The modules as the covering design's loops see them: the module values of one TE class
    share one slot and take turns in it - ``layernorm_linear`` / ``rmsnorm_linear``
    (``LayerNormLinear``), and each grouped class's split-quantize and grouped-tensor paths.
    They run one distributed-weight contract through different arithmetic or GEMM kernels,
    so every combination a loop fixes reaches that class once, through one of its values;
    the all-pairs pass then covers each value against every value of every other axis."""
    slots: dict[tuple[str, bool], list[str]] = {}
    for m in domain:
        slots.setdefault((modules.KINDS[m].api, modules.KINDS[m].layer), []).append(m)
    return [tuple(v) for v in slots.values()]


def _ci(domains: Domains, judged_only: bool = False) -> list[Cell]:
    """The ``ci`` preset: the covering design (:func:`_covering`) of the cells without a
    recipe, and an all-pairs design for each other recipe selected (:func:`_recipe_cells`);
    when ``none`` is not selected, the covering design of each selected recipe. All of them
    run the example's shapes; the block-spanning shape adds a few cells per block recipe and
    module (:func:`_block_cells`)."""
    blocks = _block_cells({**domains, "first_mb": (False,)}, judged_only) if any(
        shape.KINDS[s].spans_blocks for s in domains["shape"]) and False in domains["first_mb"] else []
    if "base" not in domains["shape"]:
        return blocks
    domains = {**domains, "shape": ("base",)}
    return list(dict.fromkeys(_ci_base(domains, judged_only) + blocks))


#: the cells of the block-spanning shape, per block recipe and module value (``_block_cells``):
#: a distributed weight of full coverage at the largest world size, fused, in bf16 (its gathered
#: weight quantized whole, tile edges across shard edges); and a plain weight at the smallest
#: world size, unfused, in fp32 (where the smallest scale errors show: an fp32 output rounds
#: far below a quantization step). Hooks off, an input gradient and no delayed wgrad in both:
#: the hooked and must-raise forms of a recipe's weight handling are the base shapes' cells.
BLOCK_CELLS: tuple[dict[str, Any], ...] = (
    {"weight": "distributed", "hooks": "off", "fused": True, "dtype": "bf16", "world_size": max,
     "input_grad": True, "delay_wgrad": False},
    {"weight": "plain", "hooks": "off", "fused": False, "dtype": "fp32", "world_size": min,
     "input_grad": True, "delay_wgrad": False},
)


def _block_cells(domains: Domains, judged_only: bool) -> list[Cell]:
    """The ``blocks`` shape's cells (``harness.vocabulary.shape``): for each block recipe
    selected, each module value (the oracle's on that recipe when the recipe axis took its
    default) and each of :data:`BLOCK_CELLS` whose values the domains hold, the cell with the
    other axes at their most demanding values. A few cells, not a design: a larger shape costs
    every GEMM, the quantizes and the oracle more, and what it buys is the sight of blocks,
    tiles and scale layouts, which one cell per weight handling shows."""
    out: dict[Cell, None] = {}
    spanning = tuple(s for s in domains["shape"] if shape.KINDS[s].spans_blocks)
    for r in (r for r in domains["recipe"] if recipes.KINDS[r].blocked):
        for m in (m for m in domains["module"] if not judged_only or recipes.judged(r, m)):
            for s, template in itertools.product(spanning, BLOCK_CELLS):
                fixed = {k: (v(domains[k]) if callable(v) else v) for k, v in template.items()}
                fixed = {k: v for k, v in fixed.items() if v in domains[k]}
                cell = _complete({"module": m, "recipe": r, "shape": s, **fixed}, domains)
                if cell is not None:
                    out.setdefault(cell)
    return list(out)


def _ci_base(domains: Domains, judged_only: bool) -> list[Cell]:
    """:func:`_ci` over the example's shapes."""
    flagged = _flagged_cells(domains, judged_only) if True in domains["first_mb"] else []
    domains = {**domains, "first_mb": (False,)} if False in domains["first_mb"] else domains
    recipes_ = domains["recipe"]
    if "none" not in recipes_:
        cells = [c for r in recipes_ for c in _covering({**domains, "recipe": (r,)})]
        return list(dict.fromkeys(cells + flagged))
    cells = _covering({**domains, "recipe": ("none",)})
    lowp = [r for r in recipes_ if r != "none"]
    return list(dict.fromkeys(cells + _recipe_cells(domains, lowp, judged_only) + flagged))


def _flagged_cells(domains: Domains, judged_only: bool) -> list[Cell]:
    """The cells that pass ``is_first_microbatch`` (``first_mb``): one all-pairs design over
    every other axis, recipes included (each on the modules the oracle judges it on when the
    recipe axis took its default), seeded with one hooks-off fused cell per module and
    distributed weight of full coverage, where the flag meets the DistributedWeight's
    exemption from TE's first-microbatch overwrite."""
    d = {**domains, "first_mb": (True,)}
    if judged_only:  # every judged recipe is judged on every module that takes one
        d["recipe"] = tuple(r for r in d["recipe"] if any(recipes.judged(r, m) for m in d["module"]))
    seed = [c for m in d["module"] for w in _weight_tiers(d["weight"])["full"] if weights.KINDS[w].distributed
            if (c := _complete({"module": m, "weight": w, "hooks": "off", "fused": True}, d)) is not None]
    if "plain" in d["weight"] and "ddp" in d["consumer"]:  # where TE's first microbatch overwrites main_grad
        seed += [c for m in d["module"] if (c := _complete({"module": m, "weight": "plain", "hooks": "off",
                                                            "fused": True, "consumer": "ddp"}, d)) is not None]
    return [c for c in _all_pairs(d, seed) if not judged_only or recipes.judged(c.recipe, c.module)]


def _recipe_cells(domains: Domains, lowp: list[str], judged_only: bool) -> list[Cell]:
    """For each low-precision recipe, an all-pairs design (:func:`_all_pairs`) of its cells:
    every value of every axis meets every value of every other axis under that recipe, on the
    module values the oracle judges it on (``judged_only``: the recipe axis took its default;
    a recipe the user names keeps every module, and the CLI refuses what cannot be judged).
    It starts from one hooks-off cell per distributed weight of full coverage and module (an
    input gradient, no delayed wgrad: the hook-free form of a recipe's weight handling), and
    one plain-weight cell with a delayed wgrad and a bias per module (where a recipe computes
    the bias gradient: the FP8 interaction the TE ledger names beyond pairs)."""
    out: dict[Cell, None] = {}
    for r in lowp:
        mods = tuple(m for m in domains["module"] if not judged_only or recipes.judged(r, m))
        if not mods:
            continue
        d = {**domains, "recipe": (r,), "module": mods}
        seed = [c for m in mods for w in _weight_tiers(d["weight"])["full"] if weights.KINDS[w].distributed
                if (c := _complete({"module": m, "weight": w, "hooks": "off", "input_grad": True,
                                    "delay_wgrad": False}, d)) is not None]
        seed += [c for m in mods if (c := _complete({"module": m, "weight": "plain", "hooks": "off",
                                                     "delay_wgrad": True, "bias": True}, d)) is not None]
        out.update(dict.fromkeys(_all_pairs(d, seed)))
    return list(out)


def _covering(domains: Domains) -> list[Cell]:
    """Covering design: (b) hooks x fused x weight per module and world size and (c)
    delayed wgrad per module, both over the weights and hook modes with full coverage; (i)
    per hook mode of light coverage (TE's and Megatron's installers), each module at each world
    size with fused and the distributed weights of full coverage rotating; (h) per weight with
    hooks coverage, every hook mode per module and world size, fused alternating; (v) per light
    weight, each module at each world size with hooks and fused rotating; (n) per distributed
    weight with full coverage, a hooked step without an input gradient per module and fused
    value, and (d) delayed wgrad on every module value; (l) Megatron's expert layer (each cell a
    chunk of layers over two iterations): every hook mode once per weight it takes, world size
    and fused rotating, and a one-layer chunk of several microbatches under Megatron's
    offloading (a known Megatron defect needs exactly that); then (a) a greedy all-pairs pass
    over what they left uncovered. "Per module" is per slot of :func:`_module_slots`: the
    module values of one TE class (or Megatron's layer) alternate in one slot.
    """
    tiers = _weight_tiers(domains["weight"])
    every_slot = _module_slots(domains["module"])
    slots = [slot for slot in every_slot if not modules.KINDS[slot[0]].layer]
    layer_slots = [slot for slot in every_slot if modules.KINDS[slot[0]].layer]
    full_hooks = tuple(h for h in domains["hooks"] if hook_modes.KINDS[h].coverage == "full")
    light_hooks = tuple(h for h in domains["hooks"] if hook_modes.KINDS[h].coverage == "light")
    cells: dict[Cell, None] = {}
    turns: dict[tuple[str, ...], int] = {}

    def add(slot: tuple[str, ...], **fixed: Any) -> bool:
        turn = turns.get(slot, 0)
        turns[slot] = turn + 1
        for i in range(len(slot)):  # this turn's module, or the next one the combination admits
            cell = _complete({"module": slot[(turn + i) % len(slot)], **fixed}, domains)
            if cell is not None:
                cells.setdefault(cell)
                return True
        return False

    for m, h, f, w, ws in itertools.product(slots, full_hooks or domains["hooks"], domains["fused"],
                                            tiers["full"], domains["world_size"]):
        add(m, hooks=h, fused=f, weight=w, world_size=ws)
    spread = [w for w in tiers["full"] if weights.KINDS[w].distributed] or list(tiers["full"])
    if full_hooks:
        for hi, h in enumerate(light_hooks):
            for i, (m, ws) in enumerate(itertools.product(slots, domains["world_size"])):
                if not add(m, hooks=h, world_size=ws, weight=spread[(i + hi) % len(spread)],
                           fused=domains["fused"][(i + hi) % len(domains["fused"])]):
                    add(m, hooks=h, world_size=ws)  # the rotation's weight or fused cannot: any that can
    for m, d, f, w in itertools.product(slots, domains["delay_wgrad"], domains["fused"],
                                        tiers["full"]):
        add(m, delay_wgrad=d, fused=f, weight=w, world_size=max(domains["world_size"]))
    hooks, fused = domains["hooks"], domains["fused"]
    for w in tiers["hooks"]:
        for i, (m, ws, h) in enumerate(itertools.product(slots, domains["world_size"], hooks)):
            add(m, weight=w, world_size=ws, hooks=h, fused=fused[i % len(fused)])
    for vi, w in enumerate(tiers["light"]):
        for i, (m, ws) in enumerate(itertools.product(slots, domains["world_size"])):
            add(m, weight=w, world_size=ws, hooks=hooks[(i + vi) % len(hooks)],
                fused=fused[i % len(fused)])
    # (n) and (d): interactions a known defect needs beyond pairs (the TE ledger's entries, each
    # exercised by ci): a distributed weight under a saved-tensor hook whose input needs no
    # gradient (no dgrad GEMM: a backward that lost the weight fails elsewhere), per slot and
    # fused value, hook modes rotating; and delayed wgrad with a distributed weight on every
    # module value, not only one per slot (each path rejects it, or not, on its own)
    hooked = [h for h in hooks if hook_modes.KINDS[h].hooked]
    for w in [w for w in tiers["full"] if weights.KINDS[w].distributed]:
        for i, (m, f) in enumerate(itertools.product(slots, fused) if hooked else ()):
            add(m, weight=w, hooks=hooked[i % len(hooked)], fused=f, input_grad=False, delay_wgrad=False)
        for m in domains["module"]:
            cell = _complete({"module": m, "weight": w, "delay_wgrad": True}, domains)
            if cell is not None:
                cells.setdefault(cell)
    sizes = domains["world_size"]
    for slot in layer_slots:
        takes = [w for w in domains["weight"] if w in (modules.KINDS[slot[0]].weights or domains["weight"])]
        for wi, w in enumerate(takes):
            # without a bias: Megatron's expert GTP builds biases it never gathers (a defect of
            # its own, in the ledger), which would fail every hooked cell before its hook did
            for i, h in enumerate(hooks):
                add(slot, weight=w, hooks=h, world_size=sizes[(i + wi) % len(sizes)],
                    fused=fused[(i + wi) % len(fused)], bias=False)
        if "mcore_offload" in hooks:  # Megatron's one-layer chunk (docs/megatron.md)
            add(slot, hooks="mcore_offload", layers=1, microbatches=max(domains["microbatches"]))

    return _all_pairs(domains, list(cells))


def _all_pairs(domains: Domains, seed: list[Cell]) -> list[Cell]:
    """``seed`` and then cells until every feasible pair of axis values is in one: AETG-style
    greedy - start each new cell from the first uncovered pair, then give every other axis
    the feasible value that covers the most still-uncovered pairs."""
    cells: dict[Cell, None] = dict.fromkeys(seed)
    uncovered = {((a, va), (b, vb))
                 for (a, b) in itertools.combinations(AXIS_NAMES, 2)
                 for va in domains[a] for vb in domains[b]
                 if _feasible({a: va, b: vb}, domains)}
    for cell in cells:
        uncovered.difference_update(_pairs(cell))
    order = {n: i for i, n in enumerate(AXIS_NAMES)}

    def key(p: tuple[tuple[str, Any], tuple[str, Any]]) -> tuple[int, ...]:
        (a, va), (b, vb) = p
        return order[a], domains[a].index(va), order[b], domains[b].index(vb)

    while uncovered:
        (a, va), (b, vb) = min(uncovered, key=key)
        assign: Assignment = {a: va, b: vb}
        for name in AXIS_NAMES:
            if name in assign:
                continue
            # the feasible value covering the most uncovered pairs, the first such in option
            # order: gains are cheap, feasibility is a search, so only the best are searched
            gains = [(-sum(((o, assign[o]), (name, v)) in uncovered if order[o] < order[name]
                           else ((name, v), (o, assign[o])) in uncovered for o in assign), i, v)
                     for i, v in enumerate(_options(name, assign, domains))]
            assign[name] = next(v for _, _, v in sorted(gains) if _feasible({**assign, name: v}, domains))
        cell = Cell(**assign)
        cells.setdefault(cell)
        uncovered.difference_update(_pairs(cell))
    return list(cells)


def _smoke(domains: Domains) -> list[Cell]:
    """Per module, hooks_identity and hooks_off at the smallest multi-rank world size."""
    multi = [ws for ws in domains["world_size"] if ws >= 2]
    ws = min(multi) if multi else min(domains["world_size"])
    hooks = [h for h in ("identity", "off") if h in domains["hooks"]] or [domains["hooks"][0]]
    cells: dict[Cell, None] = {}
    for m, h in itertools.product(domains["module"], hooks):
        cell = _complete({"module": m, "hooks": h, "world_size": ws}, domains)
        if cell is not None:
            cells.setdefault(cell)
    return list(cells)


def _seed(domains: Domains) -> list[Cell]:
    """The original report's production combination (:data:`SEED`) under Megatron's offloading,
    with hooks off as the control, at every world size of the domain Megatron's weight takes
    (the most demanding values elsewhere). An axis the user restricted away from that value
    keeps the user's values."""
    fixed = {k: v for k, v in SEED.items() if v in domains[k]}
    attempts = [fixed]
    if modules.KINDS[fixed.get("module", SEED["module"])].layer and "grouped_linear" in domains["module"]:
        # the layer takes only Megatron's weight or a plain one: where the user's values rule it
        # out, its experts' own class, TE's GroupedLinear, one layer
        attempts.append({**{k: v for k, v in fixed.items() if k != "layers"}, "module": "grouped_linear"})
    cells: dict[Cell, None] = {}
    for h, ws in itertools.product([h for h in SEED_HOOKS if h in domains["hooks"]],
                                   domains["world_size"]):
        cell = next((c for f in attempts if (c := _complete({**f, "hooks": h, "world_size": ws}, domains))), None)
        if cell is not None:
            cells.setdefault(cell)
    return list(cells)


#: the last cell a filter read and its axis values (``_axes_of``)
_LAST_AXES: tuple[Cell | None, dict[str, Any]] = (None, {})


def _axes_of(cell: Cell) -> dict[str, Any]:
    """``cell.serialize()``, kept for the next filter that reads the same cell: a ledger tests
    every entry's filter on each verdict, and serializing the cell again for each was a third
    of judging it. One (cell, values) pair, replaced whole, so a thread never reads another's."""
    global _LAST_AXES
    last_cell, axes = _LAST_AXES
    if last_cell is not cell:
        axes = cell.serialize()
        _LAST_AXES = (cell, axes)
    return axes


def compile_filter(expr: str) -> Callable[[Cell], bool]:
    """A filter over the matrix's axes (``harness.vocabulary.filters``), as a predicate on cells.

    Raises:
        MatrixError: a malformed filter, an unknown name or a value an axis does not have.
    """
    try:
        pred = filters.compile_expr(expr, AXIS_NAMES, _check_value)
    except filters.FilterError as exc:
        raise MatrixError(str(exc)) from None

    with_id = "id" in filters.names_in(expr)  # a cell's id is built only for a filter that reads it

    def on_cell(cell: Cell) -> bool:
        try:
            return pred({**_axes_of(cell), "id": cell.id} if with_id else _axes_of(cell))
        except filters.FilterError as exc:
            raise MatrixError(str(exc)) from None
    return on_cell


def select(preset: str = "ci", overrides: Mapping[str, Sequence[Any] | Axis] | None = None,
           filter_expr: str | None = None, sample: tuple[int, int] | None = None) -> list[Cell]:
    """Select the cells to run, identically on every rank.

    Args:
        preset: ``"ci"`` (covering design, see :func:`_ci`), ``"full"`` (whole product;
            its weight domain defaults to ``weights.FULL_NAMES``), ``"smoke"`` (a handful
            of demanding cells) or ``"seed"`` (the production combination of the original hook defect's report, weight
            ``megatron`` unless overridden, see :data:`SEED`).
        overrides: axis name -> values (or an :class:`Axis`) that replace its default domain,
            e.g. ``{"world_size": [1, 2, 4, 8]}``.
        filter_expr: a boolean expression over axis names, e.g.
            ``'module == "linear" and world_size >= 2'`` or ``'hooks in ("offload",) and not
            fused'``; bool axes are bools.

    Returns:
        The cells, deduplicated, ordered by world size, then generation order; with
        ``DW_SELECTION_CACHE`` set, the same cells another process of the run made
        (:mod:`harness.vocabulary.selection_cache`; never for ``full``).

    Raises:
        MatrixError: unknown preset, axis or value, or a malformed filter.
    """
    pred = compile_filter(filter_expr) if filter_expr is not None else None
    domains, judged_only = _preset_domains(preset, overrides)
    ids = filters.exact_ids(filter_expr) if filter_expr is not None else None
    streamed = preset == "full" and ids is None
    saved_in = selection_cache.folder() if preset != "full" else None
    if saved_in is not None:  # made by another process of this run (harness/vocabulary/selection_cache.py)
        name = selection_cache.key([preset, judged_only, [[a, list(domains[a])] for a in AXIS_NAMES],
                                    filter_expr, list(sample) if sample is not None else None])
        rows = selection_cache.load(saved_in, name, AXIS_NAMES)
        try:
            if rows is not None:
                return [Cell(**dict(zip(AXIS_NAMES, row, strict=True))) for row in rows]
        except (TypeError, ValueError, MatrixError):  # a damaged file: made again, and saved
            pass
        cells = _selected(preset, domains, judged_only, pred, ids, streamed, sample)
        selection_cache.save(saved_in, name, AXIS_NAMES, [[getattr(c, a) for a in AXIS_NAMES] for c in cells])
        return cells
    return _selected(preset, domains, judged_only, pred, ids, streamed, sample)


def _selected(preset: str, domains: Domains, judged_only: bool, pred: Callable[[Cell], bool] | None,
              ids: frozenset[str] | None, streamed: bool, sample: tuple[int, int] | None) -> list[Cell]:
    """:func:`select`'s cells, made here."""

    def made() -> Iterable[Cell]:
        cells: Iterable[Cell]
        if preset == "full" and ids is not None:
            cells = _full_of_ids(domains, ids)  # a repro, --cells: not the whole product
            if judged_only:
                cells = [c for c in cells if recipes.judged(c.recipe, c.module)]
        elif streamed:  # a stream: with a sample, only the sample is ever held
            cells = _valid(_domains({n: Axis(n, v) for n, v in domains.items()}))
            if judged_only:
                cells = (c for c in cells if recipes.judged(c.recipe, c.module))
        elif preset == "ci":
            cells = _ci(domains, judged_only)
        else:
            cells = {"smoke": _smoke, "seed": _seed}[preset](domains)
        return cells if pred is None else (c for c in cells if pred(c))

    if sample is None:
        chosen = made()
    elif streamed:  # made twice (``_sampled``): ranked, then kept
        chosen = _sampled(made, *sample)
    else:
        held = list(made())
        chosen = _sampled(lambda: held, *sample)
    return sorted(chosen, key=lambda c: c.world_size)  # stable: keeps generation order


def _preset_domains(preset: str, overrides: Mapping[str, Sequence[Any] | Axis] | None) -> tuple[Domains, bool]:
    """The domains a preset draws from - the user's ``overrides`` over the preset's own
    defaults (``full``'s and ``seed``'s weights, ``ci``'s and ``full``'s judged recipes and
    flagged microbatches) over the axes' - and whether the recipes are the judged default.

    Raises:
        MatrixError: an unknown preset, axis or value.
    """
    if preset not in PRESETS:
        raise MatrixError(f"Unknown preset {preset!r} (presets: {', '.join(PRESETS)})")
    if preset in ("full", "seed") and "weight" not in (overrides or {}):
        default = weights.FULL_NAMES if preset == "full" else (SEED["weight"],)
        overrides = {**(overrides or {}), "weight": default}
    judged_only = preset in ("ci", "full") and "recipe" not in (overrides or {})
    if judged_only:
        overrides = {**(overrides or {}), "recipe": recipes.JUDGED}
    if preset in ("ci", "full") and "first_mb" not in (overrides or {}):
        overrides = {**(overrides or {}), "first_mb": (False, True)}
    if preset == "ci" and "shape" not in (overrides or {}):
        overrides = {**(overrides or {}), "shape": shape.NAMES}
    return _domains(overrides), judged_only


def why_empty(preset: str = "ci", overrides: Mapping[str, Sequence[Any] | Axis] | None = None,
              filter_expr: str | None = None) -> str:
    """Why ``select(preset, overrides, filter_expr)`` selects no cell, in one line: the axis
    rule (a constraint above, in its own words) that no combination of the domains' values
    meets, naming the values and whether the user or the preset chose them; else the preset
    drawing nothing from these values; else the filter matching none of the preset's cells.

    Why: "the selection is empty" alone leaves the user to guess which of a dozen rules an
    option broke (``--preset smoke --weights gtp_mcore_fp8``: smoke runs no recipe, and a
    native weight exists only under one).
    """
    domains, _ = _preset_domains(preset, overrides)
    given = {option: axis for option, axis in AXIS_OPTIONS.items() if axis in (overrides or {})}
    chosen = {axis: option for option, axis in given.items()}

    def values(axis: str, vals: Sequence[Any]) -> str:
        shown = ",".join(_show(v) for v in vals)
        if axis in chosen:
            return f"{chosen[axis]} {shown}"
        option = next(o for o, a in AXIS_OPTIONS.items() if a == axis)
        return f"{axis} {shown} (preset {preset}'s; {option} names others)"

    rule = _emptying_rule(domains)
    if rule is not None:
        a, b, reason, pruned = rule

        def gone(axis: str) -> str:  # values another rule took from the axis first
            by = [f"{_show(v)} by {other} {','.join(_show(o) for o in domains[other])}"
                  for v, other in pruned.get(axis, ())]
            return f" ({'; '.join(by)} ruled out first)" if by else ""

        return f"{values(a, domains[a])}{gone(a)} with {values(b, domains[b])}{gone(b)}: {reason}"
    drawn = select(preset, overrides)
    restricted = "".join(f", {o} {','.join(_show(v) for v in domains[a])}" for o, a in given.items())
    if not drawn:
        return f"preset {preset} draws no cell from these values{restricted} (docs/cli.md, Presets)"
    return (f"the filter {filter_expr!r} (--filter and --cells) matches none of the {len(drawn)} cell(s) of "
            f"preset {preset}{restricted}")


def _show(value: Any) -> str:
    """An axis value as the command line spells it (``on``/``off`` for a boolean)."""
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _emptying_rule(domains: Domains) -> tuple[str, str, str, dict[str, list[tuple[Any, str]]]] | None:
    """``(axis a, axis b, reason, pruned)`` of the constraint that leaves no valid cell in
    ``domains``: first one that no pair of their values meets; else the one that removed the
    last value of an axis while the rules of a connected group pruned each other (arc
    consistency, as :func:`_supported`), with ``pruned``: axis -> the ``(value, other axis)``
    each earlier rule took from it. None when every axis keeps a value. ``num_gemms`` and
    ``layers`` take 1 outside their domains for the modules that fix them, so no rule on them
    empties."""
    usable = [(a, b, ok, why) for a, b, ok, why in _CONSTRAINTS if not {a, b} & _MODULE_FIXED]
    for a, b, ok, why in usable:
        if not any(ok(va, vb) for va in domains[a] for vb in domains[b]):
            return a, b, why, {}
    live = {a: list(v) for a, v in domains.items()}
    pruned: dict[str, list[tuple[Any, str]]] = {}
    changed = True
    while changed:
        changed = False
        for a, b, ok, why in usable:
            keep_a = [va for va in live[a] if any(ok(va, vb) for vb in live[b])]
            keep_b = [vb for vb in live[b] if any(ok(va, vb) for va in keep_a)]
            if not keep_a or not keep_b:
                return a, b, why, pruned
            for axis, other, keep in ((a, b, keep_a), (b, a, keep_b)):
                pruned.setdefault(axis, []).extend((v, other) for v in live[axis] if v not in keep)
            if len(keep_a) != len(live[a]) or len(keep_b) != len(live[b]):
                live[a], live[b], changed = keep_a, keep_b, True
    return None


def values_help(axis_name: str) -> str:
    """The values an axis option takes, for ``--help``: ``on,off`` for a bool axis; an int
    axis's default values (any int >= 1 parses); a choice axis's every value (``weight``:
    the ``full`` preset's, megatron included)."""
    _check_axis_name(axis_name)
    if axis_name in _BOOL_AXES:
        return "on, off"
    if axis_name in _INT_AXES:
        return ", ".join(map(str, _DEFAULTS[axis_name])) + " (any int >= 1)"
    if axis_name == "weight":
        return ", ".join(weights.NAMES)
    if axis_name == "recipe":  # the presets' default differs from the other axes'
        # each module once: the modules every judged recipe is judged on, then the recipes
        # judged on more of them, grouped by those extra modules
        quantized = [r for r in recipes.JUDGED if r != "none"]
        common = [m for m in recipes.MODELLED[quantized[0]] if all(m in recipes.MODELLED[r] for r in quantized)]
        extra: dict[tuple[str, ...], list[str]] = {}
        for r in quantized:
            more = tuple(m for m in recipes.MODELLED[r] if m not in common)
            if more:
                extra.setdefault(more, []).append(r)
        judged = f"{', '.join(quantized)} on {', '.join(common)}" + "".join(
            f"; {', '.join(rs)} also on {', '.join(ms)}" for ms, rs in extra.items())
        return f"{', '.join(_CHOICES[axis_name])} (ci and full default: none and the judged {judged})"
    if axis_name == "shape":
        return (f"{', '.join(_CHOICES[axis_name])} (ci's default: both, blocks under "
                f"{', '.join(recipes.BLOCKED)} only, a few cells each; elsewhere base)")
    return ", ".join(_CHOICES[axis_name])


def parse_values(axis_name: str, text: str) -> tuple[Any, ...]:
    """Parse a CLI option's comma-separated values for ``axis_name``.

    Bool axes take on/off, true/false or 1/0; int axes take ints >= 1.

    Raises:
        MatrixError: unknown axis, an empty item or a value that does not parse or validate.
    """
    _check_axis_name(axis_name)
    values: list[Any] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            raise MatrixError(f"Empty value in {axis_name}={text!r}")
        if axis_name in _BOOL_AXES:
            truth = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
            if item.lower() not in truth:
                raise MatrixError(f"{axis_name} takes on/off, true/false or 1/0, "
                                  f"got {axis_name}={item!r}")
            values.append(truth[item.lower()])
        elif axis_name in _INT_AXES:
            try:
                values.append(int(item))
            except ValueError:
                raise MatrixError(f"{axis_name} must be an int >= 1, "
                                  f"got {axis_name}={item!r}") from None
        else:
            values.append(item)
    return Axis(axis_name, tuple(values)).values


def parse_sample(text: str) -> tuple[int, int]:
    """``N`` or ``N@SEED`` (``--sample``): how many cells, and the seed (default 0).

    Raises:
        MatrixError: not of that form, or N < 1.
    """
    count, at, seed = text.strip().partition("@")
    try:
        n, s = int(count), int(seed if at else 0)
    except ValueError:
        raise MatrixError(f"--sample takes N or N@SEED (integers), got {text!r}") from None
    if n < 1 or s < 0:
        raise MatrixError(f"--sample takes N >= 1 and SEED >= 0, got {text!r}")
    return n, s


def sample(cells: Sequence[Cell], count: int, seed: int = 0) -> list[Cell]:
    """A deterministic sample of ``count`` cells (all when there are no more), in selection
    order: the cells whose sha256 of ``"SEED:ID"`` is smallest - the same on every machine
    and Python, and a cell's membership depends only on its id, the seed and the ranking."""
    return _sampled(lambda: cells, count, seed)


def _sampled(cells: Callable[[], Iterable[Cell]], count: int, seed: int) -> list[Cell]:
    """``sample`` of the cells ``cells()`` makes, in two passes over them: the positions of the
    sample are ranked first, then the cells at those positions are kept from a second pass.

    Why two passes: a cell kept from the first pass sits among the hundreds of thousands made
    and dropped around it, and the memory they took stays with it; kept from the second, the
    sample's cells lie together. Why ranked by position, not by cell: hashing a few hundred
    thousand cells (every axis value) cost as much as drawing the sample. Why each rank is one
    integer (the digest, then the position) and the positions end as a bitmap: a (digest,
    position) tuple per cell, and a set of positions made among the first pass's cells, held
    their memory - the pages of the cells dropped around them - until the sweep ended
    (docs/performance.md, "the parent's memory"). Digests of distinct ids differ, so the
    integer ranks exactly as the digest does.
    """
    salt = hashlib.sha256(f"{seed}:".encode())
    # a max-heap of the ``count`` smallest ranks so far (negated: heapq keeps a min-heap)
    heap: list[int] = []
    for i, c in enumerate(cells()):
        h = salt.copy()
        h.update(c.id.encode())
        rank = -((int.from_bytes(h.digest(), "big") << 32) | i)
        if len(heap) < count:
            heapq.heappush(heap, rank)
        elif rank > heap[0]:
            heapq.heapreplace(heap, rank)
    positions = [(-r) & 0xFFFFFFFF for r in heap]  # a position fills the rank's low 32 bits
    del heap
    keep = bytearray(max(positions, default=-1) + 1)
    for i in positions:
        keep[i] = 1
    return [c for i, c in enumerate(cells()) if i < len(keep) and keep[i]]


def describe(cells: Sequence[Cell]) -> str:
    """A short summary: the count, per-axis value counts and the expected-error count."""
    def show(v: Any) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else str(v)

    errors = sum(c.expect == "error" for c in cells)
    lines = [f"{len(cells)} cells ({errors} expected to raise)"]
    for name in AXIS_NAMES:
        counts = Counter(getattr(c, name) for c in cells)
        rank = {v: i for i, v in enumerate(_DEFAULTS[name])}
        values = sorted(counts, key=lambda v: (rank.get(v, len(rank)), v))
        lines.append(f"  {name}: " + ", ".join(f"{show(v)}={counts[v]}" for v in values))
    return "\n".join(lines)


def ids_digest(cells: Iterable[Cell]) -> str:
    """sha256 hex of the newline-joined ids; ranks compare it before running anything."""
    return hashlib.sha256("\n".join(c.id for c in cells).encode()).hexdigest()


def plan(cells: Iterable[Cell]) -> dict[int, list[Cell]]:
    """Group cells by world size (ascending), keeping their order: one launch per size."""
    groups: dict[int, list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.world_size, []).append(c)
    return dict(sorted(groups.items()))
