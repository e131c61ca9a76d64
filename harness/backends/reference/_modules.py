"""``Linear``, ``GroupedLinear`` and ``LayerNormLinear`` with the public signatures of
``transformer_engine.pytorch``."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Sequence

import torch

from harness.backends.reference import _fp8
from harness.backends.reference._core import GemmCall, GroupGemm, ReferenceImpl
from harness.backends.reference._norm import NormCall, Normalize
from harness.backends.reference._wgrad import DelayedWgradMixin

REFERENCE_IMPL = ReferenceImpl()


def _new_param(shape: tuple[int, ...], dtype: torch.dtype | None, device: Any,
               fan_in: int) -> torch.nn.Parameter:
    data = torch.empty(shape, dtype=dtype or torch.get_default_dtype(), device=device)
    bound = 1.0 / math.sqrt(max(fan_in, 1))
    torch.nn.init.uniform_(data, -bound, bound)
    return torch.nn.Parameter(data)


def check_splits(m_splits: Sequence[int], num_gemms: int, rows: int) -> list[int]:
    """Validate row splits up front so a bad split never reaches a GEMM or a collective.

    Raises:
        ValueError: wrong length, a negative entry, or a sum different from the rows.
    """
    splits = [int(s) for s in m_splits]
    if len(splits) != num_gemms:
        raise ValueError(f"m_splits has {len(splits)} entries but num_gemms={num_gemms}")
    if any(s < 0 for s in splits):
        raise ValueError(f"m_splits={splits} has a negative entry")
    if sum(splits) != rows:
        raise ValueError(f"m_splits={splits} sums to {sum(splits)} but the input has {rows} rows")
    return splits


class _GroupModule(DelayedWgradMixin, torch.nn.Module):
    """Shared parameter layout and forward plumbing of the three modules."""

    _impl: ClassVar[ReferenceImpl] = REFERENCE_IMPL
    #: names of the weight parameters in group order (leader first)
    _weight_names: tuple[str, ...]
    _bias_names: tuple[str, ...]
    #: whether a delayed backward also delays the bias gradients (TE's modules differ)
    _delay_bias: ClassVar[bool] = False

    def _build(self, n: int, in_features: int, out_features: int, bias: bool,
               dtype: torch.dtype | None, device: Any, fused: bool, delay: bool,
               single: bool = False) -> None:
        self.in_features = in_features
        self.out_features = out_features
        self.fuse_wgrad_accumulation = bool(fused)
        self._init_wgrad(delay)
        self._weight_names = ("weight",) if single else tuple(f"weight{i}" for i in range(n))
        self._bias_names = (("bias",) if single else tuple(f"bias{i}" for i in range(n))) if bias else ()
        for name in self._weight_names:
            self.register_parameter(name, _new_param((out_features, in_features), dtype, device, in_features))
        for name in self._bias_names:
            p = _new_param((out_features,), dtype, device, in_features)
            self.register_parameter(name, p)
        self._mark_delayed_params()

    def fp8_scales(self) -> dict[str, list[float]] | None:
        """The delayed-scaling scales of the last recipe this module ran under, per operand
        and member (what the runner's ``fp8_scales`` check reads); None without one."""
        states = self.__dict__.get("_fp8_states") or {}
        if not states:
            return None
        state = list(states.values())[-1][1]
        return {"input": [s.scale for s in state.x], "weight": [s.scale for s in state.w],
                "grad_output": [s.scale for s in state.dy]}

    def _delayed_param_names(self) -> tuple[str, ...]:
        return self._weight_names + (self._bias_names if self._delay_bias else ())

    def _run(self, inp: torch.Tensor, m_splits: list[int], first_microbatch: bool | None = None) -> torch.Tensor:
        weights = [getattr(self, n) for n in self._weight_names]
        biases = [getattr(self, n) for n in self._bias_names]
        distributed = self._impl.check_supported(self, weights)
        self._mark_delayed_params()
        call = GemmCall(
            module=self, impl=self._impl, m_splits=m_splits, fused=self.fuse_wgrad_accumulation,
            delay=self.delay_wgrad_compute, delay_bias=self._delay_bias,
            distributed=distributed, n=len(weights), has_bias=bool(biases),
            fp8=_fp8.for_forward(self, len(weights)), first_microbatch=first_microbatch,
        )
        return GroupGemm.apply(inp, call, *weights, *biases)


class Linear(_GroupModule):
    """``y = x W^T + b``; ``weight`` may be replaced by a DistributedWeight."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 params_dtype: torch.dtype | None = None, device: Any = None,
                 fuse_wgrad_accumulation: bool = False, delay_wgrad_compute: bool = False) -> None:
        super().__init__()
        self._build(1, in_features, out_features, bias, params_dtype, device,
                    fuse_wgrad_accumulation, delay_wgrad_compute, single=True)

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        lead = inp.shape[:-1]
        flat = inp.reshape(-1, inp.shape[-1])
        out = self._run(flat, [flat.shape[0]], is_first_microbatch)
        return out.reshape(*lead, self.out_features)


class GroupedLinear(_GroupModule):
    """N independent linears over row splits of one input (MoE experts)."""

    _delay_bias = True

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True,
                 params_dtype: torch.dtype | None = None, device: Any = None,
                 fuse_wgrad_accumulation: bool = False, delay_wgrad_compute: bool = False,
                 use_grouped_tensor: bool = False) -> None:
        super().__init__()
        if num_gemms < 1:
            raise ValueError(f"num_gemms must be >= 1, got num_gemms={num_gemms}")
        self.num_gemms = num_gemms
        # TE's two execution paths share one contract (CONTRACTS §1): one hook-safe path here
        self.use_grouped_tensor = bool(use_grouped_tensor)
        self._build(num_gemms, in_features, out_features, bias, params_dtype, device,
                    fuse_wgrad_accumulation, delay_wgrad_compute)

    def forward(self, inp: torch.Tensor, m_splits: Sequence[int],
                is_first_microbatch: bool | None = None) -> torch.Tensor:
        splits = check_splits(m_splits, self.num_gemms, inp.shape[0])
        return self._run(inp, splits, is_first_microbatch)


class LayerNormLinear(_GroupModule):
    """``y = norm(x) W^T + b``: LayerNorm or RMSNorm, then ``Linear``.

    ``layer_norm_weight`` / ``layer_norm_bias`` stay plain parameters; only ``weight`` may
    be replaced by a DistributedWeight, and its GEMMs are ``Linear``'s (one hook-safe
    ``GroupGemm``), fed with the normalization's output rounded to the input's dtype.
    """

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5, bias: bool = True,
                 normalization: str = "LayerNorm", params_dtype: torch.dtype | None = None,
                 device: Any = None, fuse_wgrad_accumulation: bool = False,
                 zero_centered_gamma: bool = False, delay_wgrad_compute: bool = False) -> None:
        super().__init__()
        if normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"normalization must be 'LayerNorm' or 'RMSNorm', "
                             f"got normalization={normalization!r}")
        self.normalization = normalization
        self.eps = float(eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        dtype = params_dtype or torch.get_default_dtype()
        init = torch.zeros if zero_centered_gamma else torch.ones
        self.layer_norm_weight = torch.nn.Parameter(init(in_features, dtype=dtype, device=device))
        if normalization == "LayerNorm":
            self.layer_norm_bias = torch.nn.Parameter(torch.zeros(in_features, dtype=dtype, device=device))
        else:
            self.layer_norm_bias = None
        self._build(1, in_features, out_features, bias, params_dtype, device,
                    fuse_wgrad_accumulation, delay_wgrad_compute, single=True)

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        lead = inp.shape[:-1]
        flat = inp.reshape(-1, inp.shape[-1])
        call = NormCall(self._impl, self.normalization, self.zero_centered_gamma, self.eps)
        norm_params = [self.layer_norm_weight] + ([self.layer_norm_bias] if self.layer_norm_bias is not None else [])
        normed = Normalize.apply(flat, call, *norm_params)
        out = self._run(normed, [flat.shape[0]], is_first_microbatch)
        return out.reshape(*lead, self.out_features)
