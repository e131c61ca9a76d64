"""Which device te-cpu presents to TE, per recipe: Hopper, or Blackwell where a recipe needs it.

TE refuses a recipe the device cannot run (``quantization.py check_recipe_support``,
``autocast``): the per-tensor FP8 recipes (``DelayedScaling``, ``Float8CurrentScaling``) and
FP8 block scaling (``Float8BlockScaling``) run on Hopper (sm_90) - the device te-cpu presents
by default, the one every non-quantized cell runs on - while ``MXFP8BlockScaling`` and
``NVFP4BlockScaling`` need Blackwell (compute capability 10.0). ``use_recipe`` presents the
device a recipe needs, as ``harness.backends.te_cpu.use_path`` presents a cuBLASLt version.

The device also decides TE code paths beyond the recipe check: on Blackwell FP8 GEMMs take
any layout (``is_non_tn_fp8_gemm_supported``: a per-tensor FP8 tensor keeps no transpose) and
the grouped GEMM takes per-group alpha/beta; ``extension.grouped_gemm_cublaslt_version()``
follows the device. TE caches what it derives from the capability, so switching clears those
caches (``TE_CACHES``); a switch takes effect for the next forward.
"""

from __future__ import annotations

import sys
from typing import Any

from harness.backends.te_cpu import cuda_surface
from harness.vocabulary import recipes

HOPPER = (9, 0)
BLACKWELL = (10, 0)
#: recipe value -> the capability te-cpu presents while it runs (``none``: no recipe), as the
#: recipe's kind says (``harness.vocabulary.recipes.RecipeKind.blackwell``)
RECIPE_CAPABILITY: dict[str, tuple[int, int]] = {
    name: BLACKWELL if kind.blackwell else HOPPER for name, kind in recipes.KINDS.items()}
#: (TE module, attribute) of every cache of capability-derived answers, and how to reset it:
#: ``cache_clear`` for an ``lru_cache``, ``None`` for a module global TE fills lazily
TE_CACHES: tuple[tuple[str, str, str], ...] = (
    ("transformer_engine.pytorch.utils", "_get_device_compute_capability", "cache_clear"),
    ("transformer_engine.pytorch.utils", "is_non_tn_fp8_gemm_supported", "cache_clear"),
    ("transformer_engine.pytorch.quantization", "_FP8_SUPPORT", "none"),
    ("transformer_engine.pytorch.quantization", "_MXFP8_SUPPORT", "none"),
    ("transformer_engine.pytorch.quantization", "_NVFP4_SUPPORT", "none"),
    ("transformer_engine.pytorch.quantization", "_FP8_BLOCK_SCALING_SUPPORT", "none"),
)


def capability_for(recipe: str) -> tuple[int, int]:
    """The capability ``recipe`` runs on; a ValueError names the known recipes."""
    if recipe not in RECIPE_CAPABILITY:
        raise ValueError(f"unknown recipe {recipe!r} (choose from {', '.join(RECIPE_CAPABILITY)})")
    return RECIPE_CAPABILITY[recipe]


def name(cap: tuple[int, int]) -> str:
    return f"sm_{cap[0]}{cap[1]}"


def present(cap: tuple[int, int]) -> tuple[int, int]:
    """Present ``cap`` and forget TE's cached answers derived from the previous one; returns
    the previous capability."""
    previous = cuda_surface.set_capability(cap)
    if previous != tuple(cap):
        clear_te_caches()
    return previous


def clear_te_caches() -> None:
    for module, attr, how in TE_CACHES:
        mod: Any = sys.modules.get(module)
        if mod is None or not hasattr(mod, attr):
            continue
        if how == "cache_clear":
            getattr(mod, attr).cache_clear()
        else:
            setattr(mod, attr, None)
