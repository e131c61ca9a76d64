"""The reference backend: hook-safe ``Linear``/``GroupedLinear``/``ops.GroupedLinear``/
``LayerNormLinear``.

A backend is any module with the public names of ``transformer_engine.pytorch``; this one
is pure PyTorch (CPU or CUDA, fp32/bf16/fp16; under ``autocast`` TE's per-tensor FP8 recipes,
``harness.reference._fp8``). ``harness.reference.prefix`` is the same
backend with TE's pre-fix behaviour, to prove the harness catches the regression.
"""

from harness.reference import ops, recipe
from harness.reference._fp8 import autocast
from harness.reference._modules import GroupedLinear, LayerNormLinear, Linear

__all__ = ["Linear", "GroupedLinear", "LayerNormLinear", "ops", "autocast", "recipe"]
