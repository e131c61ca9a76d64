"""Which format family handles a TE quantizer or quantized tensor (by TE's class names).

The compiled extension converts a Python quantizer to its C++ twin by type
(``convert_quantizer``) and a Python tensor by its storage class
(``makeTransformerEngineTensor``); this module does the same lookup for the families of
:mod:`harness.backends.te_cpu.quant`. Names, not classes, so that nothing here imports TE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from harness.backends.te_cpu import refusal


@dataclass(frozen=True)
class Family:
    """A quantizer class and what te-cpu calls for it."""

    recipe: str  #: the recipe value (``harness.backends.te_cpu.device.RECIPE_CAPABILITY``)
    module: str  #: the module of harness.backends.te_cpu.quant with its kernels
    storage: str  #: the TE storage class its tensors derive from


#: TE quantizer class name -> family
QUANTIZERS: dict[str, Family] = {
    "Float8Quantizer": Family("delayed", "per_tensor", "Float8TensorStorage"),
    "Float8CurrentScalingQuantizer": Family("current", "per_tensor", "Float8TensorStorage"),
    "MXFP8Quantizer": Family("mxfp8", "mxfp8", "MXFP8TensorStorage"),
    "Float8BlockQuantizer": Family("blockwise", "blockwise", "Float8BlockwiseQTensorStorage"),
    "NVFP4Quantizer": Family("nvfp4", "nvfp4", "NVFP4TensorStorage"),
}
#: TE storage class name -> the module of its kernels
STORAGES: dict[str, str] = {f.storage: f.module for f in QUANTIZERS.values()}


def family(quantizer: Any) -> Family | None:
    """The family of a TE quantizer (None for a quantizer te-cpu has no kernels for)."""
    for cls in type(quantizer).__mro__:
        if cls.__name__ in QUANTIZERS:
            return QUANTIZERS[cls.__name__]
    return None


def storage_module(tensor: Any) -> str | None:
    """The family module of a TE quantized tensor or storage (None for anything else)."""
    for cls in type(tensor).__mro__:
        if cls.__name__ in STORAGES:
            return STORAGES[cls.__name__]
    return None


def is_quantized(t: Any) -> bool:
    """A TE quantized tensor or storage (anything but a plain tensor or None)."""
    if t is None:
        return False
    if storage_module(t) is not None:
        return True
    return not isinstance(t, torch.Tensor) or getattr(t, "_quantizer", None) is not None


def roundup(x: int, m: int) -> int:
    """``x`` rounded up to a multiple of ``m`` (TE's ``roundup``: padded scale buffers)."""
    return (x + m - 1) // m * m


def new_tensor(tensor_cls: type, storage_cls: type, shape: list[int], fake_dtype: torch.dtype,
               **buffers: Any) -> Any:
    """The end of a quantizer's ``create_tensor``: its storage class when the quantizer (in
    ``buffers``, as TE's constructors take it) is ``internal``, else its tensor class of
    ``shape`` (contiguous strides, on the CPU)."""
    if buffers["quantizer"].internal:
        return storage_cls(fake_dtype=fake_dtype, **buffers)
    stride = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    return tensor_cls(shape=list(shape), stride=stride, dtype=fake_dtype, device=torch.device("cpu"), **buffers)


def missing(detail: str) -> Exception:
    """``MissingCpuKernel`` for an option of ``quantize`` te-cpu cannot honour."""
    return refusal.missing("quantize", detail)
