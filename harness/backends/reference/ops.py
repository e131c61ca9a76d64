"""The op-fuser ``GroupedLinear`` (``transformer_engine.pytorch.ops.GroupedLinear``).

Unlike the modules, the op reads its weights from its own attributes at backward time, so
saved-tensor hooks never see the weights; it is the control group of the hook bug.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.backends.reference._core import GemmCall, ReferenceImpl
from harness.backends.reference._modules import _GroupModule, check_splits


class OpsImpl(ReferenceImpl):
    """Saves only the input; backward looks the weights up on the op."""

    def save(self, ctx: Any, call: GemmCall, inp: torch.Tensor, weights: Any,
             gemm_weights: Any) -> None:
        ctx.save_for_backward(inp)

    def backward_weights(self, ctx: Any, call: GemmCall, saved: Any) -> list[Any]:
        return [getattr(call.module, name) for name in call.module._weight_names]


OPS_IMPL = OpsImpl()


class GroupedLinear(_GroupModule):
    """Grouped linear op: ``forward(x, split_sizes)`` with ``split_sizes`` an int64 tensor."""

    _impl = OPS_IMPL

    def __init__(self, num_groups: int, in_features: int, out_features: int, *, bias: bool = True,
                 device: Any = None, dtype: torch.dtype | None = None,
                 accumulate_into_main_grad: bool = False,
                 delay_wgrad_compute: bool = False) -> None:
        super().__init__()
        if num_groups < 1:
            raise ValueError(f"num_groups must be >= 1, got num_groups={num_groups}")
        self.num_groups = num_groups
        self._accumulate_into_main_grad = bool(accumulate_into_main_grad)
        self._build(num_groups, in_features, out_features, bias, dtype, device,
                    accumulate_into_main_grad, delay_wgrad_compute)

    def forward(self, x: torch.Tensor, split_sizes: torch.Tensor) -> torch.Tensor:
        sizes = split_sizes.tolist() if isinstance(split_sizes, torch.Tensor) else list(split_sizes)
        return self._run(x, check_splits(sizes, self.num_groups, x.shape[0]))
