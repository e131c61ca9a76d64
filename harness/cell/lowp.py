"""The recipe a cell's forward runs under: TE's ``autocast`` with a TE recipe object built with
its defaults (``harness.vocabulary.recipes``; docs/low-precision.md).

The one home of the runner's low-precision wiring. The autocast wraps the module's call
itself, inside whatever the hook mode puts around it, so a recomputed forward (hook mode
``checkpoint``) runs under the same recipe as the original, as Megatron's recompute does.
A backend runs recipes when it exposes TE's ``autocast`` (``transformer_engine.pytorch``,
te-cpu); te-cpu also presents the device the recipe needs (``use_recipe``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from harness.cell.faults import RecipeUnsupported
from harness.vocabulary import recipes
from harness.vocabulary.weights import NATIVE_API

__all__ = ["RecipeUnsupported", "present", "under_recipe", "native_parameters", "describe", "scales_after"]


def present(backend: ModuleType, recipe: str) -> None:
    """Make the backend present the device ``recipe`` needs for the cell (te-cpu's
    ``use_recipe``; a real GPU is what it is). Called for every cell, ``none`` included, so a
    cell after a Blackwell one sees Hopper again."""
    use = getattr(backend, "use_recipe", None)
    if callable(use):
        use(recipe)


def fresh_state(backend: ModuleType) -> None:
    """Forget TE's global FP8 state (``FP8GlobalStateManager.reset``) before a cell's step
    (a backend with its own ``recipe`` namespace, the reference, keeps its FP8 state on each
    module: a cell's modules are new).

    TE registers every module's delayed-scaling amaxes, with the process group of their
    ``autocast``, in one process-wide buffer that it reduces at every ``autocast`` exit and
    never prunes: in a rank that runs cell after cell, the modules of earlier cells (and
    their groups, which span other ranks) would be reduced with this one's - a hang, and
    another step than the cell names. A training process has one model; so does a cell."""
    if getattr(backend, "recipe", None) is not None:
        return
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager  # recipe cells only

    FP8GlobalStateManager.reset()


def recipe_object(backend: ModuleType, recipe: str) -> Any:
    """A fresh recipe object of the recipe's TE class, with TE's defaults but the recipe's
    ``options`` (``nvfp4``: no Hadamard transform, no stochastic rounding): from the backend's
    ``recipe`` namespace when it has one (the reference, which needs no TE), else TE's."""
    namespace = getattr(backend, "recipe", None)
    if namespace is None:
        from transformer_engine.common import recipe as namespace  # only ranks running a recipe
    kind = recipes.KINDS[recipe]
    return getattr(namespace, kind.te_class)(**dict(kind.options))


Wrap = Callable[[Callable[[torch.Tensor], torch.Tensor]], Callable[[torch.Tensor], torch.Tensor]]


def under_recipe(backend: ModuleType, recipe: str, group: Any = None) -> Wrap:
    """What wraps each microbatch's module call of a cell: the call under
    ``autocast(enabled=True, recipe=..., amax_reduction_group=group)``, with one recipe object
    for the whole cell (TE keys its amax buffers by the recipe; a new object per microbatch
    would not be the one training loop the cell names); the call unchanged for ``none``.
    ``group`` is the cell's process group: delayed scaling max-reduces its amaxes over it
    (TE's default, the whole world, would span the other cells a packed launch runs).

    Raises:
        RecipeUnsupported: the backend has no ``autocast``.
    """
    if not recipes.KINDS[recipe].quantized:
        return lambda call: call
    autocast = getattr(backend, "autocast", None)
    if not callable(autocast):
        raise RecipeUnsupported(f"backend {getattr(backend, '__name__', backend)!r} has no autocast: "
                                f"it cannot run recipe {recipe!r}")
    fresh_state(backend)
    obj = recipe_object(backend, recipe)

    def wrap(call: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        def quantized_call(x: torch.Tensor) -> torch.Tensor:
            with autocast(enabled=True, recipe=obj, amax_reduction_group=group):
                return call(x)
        return quantized_call

    return wrap


def native_parameters(backend: ModuleType, recipe: str) -> Any:
    """``with native_parameters(backend, recipe): build the module``: its weights are born
    quantized (TE's ``quantized_model_init`` under a fresh recipe object), as a model built
    for Megatron's native-FP8 GTP path has them (weight ``megatron_fp8``).

    Raises:
        RecipeUnsupported: the backend has no ``quantized_model_init`` (the CLI refuses such a
            selection before a launch: ``harness.orchestration.preflight.check_native``).
    """
    init = getattr(backend, NATIVE_API, None)
    if not callable(init):
        raise RecipeUnsupported(f"backend {getattr(backend, '__name__', backend)!r} has no {NATIVE_API}: "
                                f"it cannot build native quantized weights")
    return init(enabled=True, recipe=recipe_object(backend, recipe))


def scales_after(module: torch.nn.Module) -> dict[str, list[float]] | None:
    """A module's delayed-scaling scales after the step - ``{"input", "weight",
    "grad_output"}``, one per GEMM (group member) - as the backend keeps them: TE's
    ``fp8_meta`` (``Linear``: forward input and weight, the output gradient; ``GroupedLinear``:
    the same per member, at its ``_offsets`` strided by ``_num_fp8_tensors_per_gemm``), an
    op's recipe state (``ops.GroupedLinear``: input ``2i``, weight ``2i + 1``, gradient ``i``),
    or the reference's ``fp8_scales()``; None when the module keeps none."""
    meta = getattr(module, "fp8_meta", None)
    if isinstance(meta, dict) and "scaling_fwd" in meta and "scaling_bwd" in meta:
        fwd, bwd = meta["scaling_fwd"].scale, meta["scaling_bwd"].scale
        offsets = getattr(module, "_offsets", None)
        if offsets is None:
            return {"input": [float(fwd[0])], "weight": [float(fwd[1])], "grad_output": [float(bwd[0])]}
        stride, n = module._num_fp8_tensors_per_gemm, module.num_gemms
        return {"input": [float(fwd[offsets["input"] + i * stride["fwd"]]) for i in range(n)],
                "weight": [float(fwd[offsets["weight"] + i * stride["fwd"]]) for i in range(n)],
                "grad_output": [float(bwd[offsets["grad_output"] + i * stride["bwd"]]) for i in range(n)]}
    metas = getattr(module, "_fp8_metas", None)
    if isinstance(metas, dict) and metas.get("forward") and metas.get("backward"):
        fwd, bwd = (metas[m][k].scale for m, k in (("forward", "scaling_fwd"), ("backward", "scaling_bwd")))
        n = len(bwd)
        return {"input": [float(fwd[2 * i]) for i in range(n)], "weight": [float(fwd[2 * i + 1]) for i in range(n)],
                "grad_output": [float(bwd[i]) for i in range(n)]}
    own = getattr(module, "fp8_scales", None)
    return own() if callable(own) else None


def describe(backend: ModuleType, recipe: str) -> dict[str, Any] | None:
    """What a rank result records of the recipe that ran (None for ``none``): the value, TE's
    class and the compute capability the backend presented (``sm_90``), when it says."""
    kind = recipes.KINDS[recipe]
    if not kind.quantized:
        return None
    cap = getattr(backend, "recipe_device", None)
    return {"recipe": recipe, "te_class": kind.te_class, "device": cap(recipe) if callable(cap) else None}
