"""The reference backend: hook-safe ``Linear``/``GroupedLinear``/``ops.GroupedLinear``/
``LayerNormLinear``.

A backend is any module with the public names of ``transformer_engine.pytorch``; this one
is pure PyTorch (CPU or CUDA, fp32/bf16/fp16; under ``autocast`` TE's per-tensor FP8 recipes,
``harness.backends.reference._fp8``). ``harness.backends.reference.prefix`` is the same
backend with TE's pre-fix behaviour, to prove the harness catches the regression.
"""

from harness.backends.reference import ops, recipe
from harness.backends.reference._fp8 import autocast
from harness.backends.reference._modules import GroupedLinear, LayerNormLinear, Linear

__all__ = ["Linear", "GroupedLinear", "LayerNormLinear", "ops", "autocast", "recipe"]
