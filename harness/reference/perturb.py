"""Perturbation faults: a relative error of ``k * u`` planted in one kind of tensor.

How small an error does the harness catch? Each backend of this family is the reference
with some GEMM results scaled by ``1 + k * u`` - ``u`` the unit roundoff of the dtype the
result is produced in, the one the tolerance charges for it (``harness.rank.compare``) - and
rounded back to that dtype, per cell dtype and tensor kind:

- ``output``: the forward GEMM (``mb*.output``);
- ``input_grad``: the dgrad GEMM (``mb*.input_grad``);
- ``weight_grad``: the wgrad GEMM, whatever becomes of it - a ``main_grad`` accumulation, a
  reduce-scatter, ``.grad`` (``weight*.main_grad`` / ``weight*.grad``);
- ``bias_grad``: the bias-gradient reduction (``bias*.main_grad`` / ``bias*.grad``).

Each GEMM feeds only its own kind (the runner's upstream gradients are fixed inputs), so
one run measures all four kinds at once. Select one as
``harness.reference.perturb:<spec>``, e.g. ``harness.reference.perturb:bf16.output=4,fp32.weight_grad=16``
(``harness.sensitivity`` searches ``k`` per dtype and kind).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from harness.rank.compare import UNIT_ROUNDOFF
from harness.rank.inputs import DTYPES
from harness.perturbation import KINDS, format_spec, parse
from harness.reference.mutants import backend_from_fault

__all__ = ["KINDS", "format_spec", "get", "parse"]

_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class _Perturbed:
    """Scales the result of each GEMM whose (cell dtype, kind) has a factor."""

    factors: dict[tuple[str, str], float] = {}

    def _planted(self, value: torch.Tensor, cell_dtype: torch.dtype, kind: str) -> torch.Tensor:
        k = self.factors.get((_NAMES.get(cell_dtype, ""), kind))
        if not k:
            return value
        u = UNIT_ROUNDOFF[_NAMES[value.dtype]]
        return (value.to(torch.float64) * (1.0 + k * u)).to(value.dtype)

    def fprop(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self._planted(super().fprop(x, weight), x.dtype, "output")

    def dgrad(self, grad_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self._planted(super().dgrad(grad_out, weight), grad_out.dtype, "input_grad")

    def wgrad(self, grad_out: torch.Tensor, inp: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self._planted(super().wgrad(grad_out, inp, dtype), grad_out.dtype, "weight_grad")

    def bgrad(self, grad_out: torch.Tensor) -> torch.Tensor:
        return self._planted(super().bgrad(grad_out), grad_out.dtype, "bias_grad")


@functools.lru_cache(maxsize=None)
def get(spec: str) -> types.ModuleType:
    """The backend planting ``spec`` (what ``harness.reference.perturb:<spec>`` loads)."""
    factors = parse(spec)
    fault: Any = type("Perturbation", (_Perturbed,), {"factors": factors, "__module__": __name__})
    return backend_from_fault("perturbation", f"relative error k*u planted in: {format_spec(factors)}", fault)
