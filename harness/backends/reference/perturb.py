"""Perturbation faults: a relative error of ``k * u`` planted in one kind of tensor.

How small an error does the harness catch? Each backend of this family is the reference
with some GEMM results scaled by ``1 + k * u`` - ``u`` the unit roundoff of the dtype the
result is produced in, the one the tolerance charges for it (``harness.cell.compare``) - and
rounded back to that dtype, per cell dtype and tensor kind:

- ``output``: the forward GEMM (``mb*.output``);
- ``input_grad``: the dgrad GEMM (``mb*.input_grad``);
- ``weight_grad``: the wgrad GEMM, whatever becomes of it - a ``main_grad`` accumulation, a
  reduce-scatter, ``.grad`` (``weight*.main_grad`` / ``weight*.grad``);
- ``bias_grad``: the bias-gradient reduction (``bias*.main_grad`` / ``bias*.grad``).

Each GEMM feeds only its own kind (the runner's upstream gradients are fixed inputs), so
one run measures all four kinds at once. Under a recipe (a spec entry named
``<recipe>.<dtype>.<kind>``) the quantized forward and dgrad GEMMs produce fp32 that the module
then rounds to the cell's dtype: ``u`` is the cell dtype's there. Select one as
``harness.backends.reference.perturb:<spec>``, e.g. ``harness.backends.reference.perturb:bf16.output=4,current.fp32.weight_grad=16``
(``harness.orchestration.sensitivity`` searches ``k`` per recipe, dtype and kind).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from harness.cell.compare import UNIT_ROUNDOFF
from harness.cell.inputs import DTYPES
from harness.vocabulary.perturbation import KINDS, format_spec, parse
from harness.backends.reference import _fp8
from harness.vocabulary.fault_classes import GEMM_MODULES, NORM
from harness.backends.reference.mutants import backend_from_fault

__all__ = ["KINDS", "format_spec", "get", "parse"]

_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class _Perturbed:
    """Scales the result of each GEMM whose (recipe, cell dtype, kind) has a factor."""

    factors: dict[tuple[str, str, str], float] = {}

    def _planted(self, value: torch.Tensor, operand: Any, kind: str) -> torch.Tensor:
        """``value`` scaled by ``1 + k u``; ``operand`` (a GEMM input) says the cell's dtype and
        recipe. ``u`` is that of the dtype the result is rounded to: its own, or - a quantized
        forward or dgrad GEMM, whose fp32 result the module rounds to the cell's dtype next -
        the cell's."""
        quantized = isinstance(operand, _fp8.QUANTIZED)
        recipe = operand.recipe if quantized else "none"
        k = self.factors.get((recipe, _NAMES.get(operand.dtype, ""), kind))
        if not k:
            return value
        rounded_to = operand.dtype if quantized and kind in ("output", "input_grad") else value.dtype
        u = UNIT_ROUNDOFF[_NAMES[rounded_to]]
        return (value.to(torch.float64) * (1.0 + k * u)).to(value.dtype)

    def fprop(self, x: Any, weight: Any) -> torch.Tensor:
        return self._planted(super().fprop(x, weight), x, "output")

    def dgrad(self, grad_out: Any, weight: Any) -> torch.Tensor:
        return self._planted(super().dgrad(grad_out, weight), grad_out, "input_grad")

    def wgrad(self, grad_out: Any, inp: Any, dtype: torch.dtype) -> torch.Tensor:
        return self._planted(super().wgrad(grad_out, inp, dtype), grad_out, "weight_grad")

    def bgrad(self, grad_out: torch.Tensor) -> torch.Tensor:
        # the bias gradient sums the unquantized gradient under a recipe too: no row of its own
        return self._planted(super().bgrad(grad_out), grad_out, "bias_grad")


@functools.lru_cache(maxsize=None)
def get(spec: str) -> types.ModuleType:
    """The backend planting ``spec`` (what ``harness.backends.reference.perturb:<spec>`` loads)."""
    factors = parse(spec)
    fault: Any = type("Perturbation", (_Perturbed,), {"factors": factors, "__module__": __name__})
    # every module class: LayerNormLinear's GEMMs are planted too
    return backend_from_fault("perturbation", f"relative error k*u planted in: {format_spec(factors)}", fault,
                              modules=GEMM_MODULES + NORM)
