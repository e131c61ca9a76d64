"""The scale rules of TE's recipes, in fp32 as TE's kernels compute them.

- Per-tensor current scaling (``Float8CurrentScaling``; ``common/recipe/recipe_common.cuh``
  ``compute_scale_from_amax``): ``amax`` floored at ``epsilon``; ``scale = max / amax``
  rounded once (``__fdiv_rn``); an infinite scale (amax too small) becomes ``value_for_inf``
  (fp32's max for per-tensor scaling); amax 0, inf or NaN gives ``scale = 1``; with power-of-two
  scales the mantissa bits are cleared (round down to a power of two).
- Delayed scaling (``DelayedScaling``; ``common/recipe/delayed_scaling.cu`` ``kernel_bulk``):
  per scale, the newest amax is the reduction buffer's entry when nonzero, else the history's
  row 0; when that is 0 nothing rolls; otherwise the history rolls up one row, the newest amax
  goes to the last row and row 0 is zeroed; the amax used is the maximum over the rolled
  window (``"max"``) or the newest (``"most_recent"``); ``scale = (max * 2^-margin) / amax``
  when that amax is finite and positive, else the previous scale; an infinite scale becomes
  fp32's max.
- The amax of a tensor (``amax_kernel``): the largest magnitude, NaNs ignored (the kernel's
  ``fmaxf`` / ``__hmax`` drop a NaN operand).
"""

from __future__ import annotations

import torch

FP32_MAX = torch.finfo(torch.float32).max


def amax(x: torch.Tensor) -> torch.Tensor:
    """The largest ``|x|`` as a 1-element fp32 tensor (0 for an empty tensor; NaNs ignored)."""
    if x.numel() == 0:
        return torch.zeros(1, dtype=torch.float32)
    a = x.detach().abs().to(torch.float32)
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return a.max().reshape(1)


def clear_mantissa(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` (fp32, positive) rounded down to a power of two (its mantissa bits cleared)."""
    bits = scale.to(torch.float32).contiguous().view(torch.int32)
    return (bits & torch.tensor(-8388608, dtype=torch.int32)).view(torch.float32)  # 0xFF800000


def scale_from_amax(amax_: torch.Tensor, fp8_max: float, *, force_pow_2: bool, epsilon: float,
                    value_for_inf: float = FP32_MAX) -> torch.Tensor:
    """TE's ``compute_scale_from_amax`` (module docstring), elementwise over fp32 ``amax_``."""
    a = amax_.to(torch.float32)
    a = torch.where(a < epsilon, torch.full_like(a, epsilon), a)  # a NaN amax stays NaN
    scale = torch.full_like(a, fp8_max) / a  # fp32 division, rounded to nearest
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, value_for_inf), scale)
    if force_pow_2:
        scale = clear_mantissa(scale)
    unusable = torch.isinf(a) | (a == 0) | torch.isnan(a)
    return torch.where(unusable, torch.ones_like(scale), scale)


def reciprocal(scale: torch.Tensor) -> torch.Tensor:
    """``1 / scale`` in fp32 (TE's ``reciprocal<float>``: the scale-inverse a cast writes)."""
    return torch.ones_like(scale, dtype=torch.float32) / scale.to(torch.float32)


def delayed_scaled_max(fp8_max: float, margin: float) -> float:
    """``fp8_max * 2^-margin`` rounded to fp32, as the recipe computes it on the host."""
    return float(torch.tensor(fp8_max, dtype=torch.float32) * torch.pow(torch.tensor(2.0), -float(margin)))


@torch.no_grad()
def delayed_update(amax_history: torch.Tensor, scale: torch.Tensor, newest: torch.Tensor | None,
                   *, algo: str, scaled_max: float) -> None:
    """One step of delayed scaling for one group of scales, in place (module docstring).

    Args:
        amax_history: ``[length, n]`` fp32, row 0 the amax recorded since the last step.
        scale: ``[n]`` fp32.
        newest: ``[n]`` fp32 entries of the amax reduction buffer (or None): a nonzero entry
            replaces row 0 as the newest amax.
        algo: ``"max"`` or ``"most_recent"``.
        scaled_max: ``fp8_max * 2^-margin`` (:func:`delayed_scaled_max`).
    """
    if algo not in ("max", "most_recent"):
        raise RuntimeError(f"Unsupported amax compute algorithm ({algo})")
    last = amax_history[0].clone()
    if newest is not None:
        last = torch.where(newest != 0, newest.to(torch.float32), last)
    rolls = last != 0
    older = amax_history[1:]
    # the window the kernel takes the maximum over: rows 1.. and the newest amax (fmaxf drops NaNs)
    window_max = _nan_max(torch.cat([older, last.reshape(1, -1)], dim=0))
    rolled = torch.cat([older, last.reshape(1, -1)], dim=0)
    rolled[0] = 0
    amax_history.copy_(torch.where(rolls.reshape(1, -1), rolled, amax_history))
    used = torch.where(rolls, window_max, torch.zeros_like(last)) if algo == "max" else last
    fresh = torch.full_like(used, scaled_max) / used
    new_scale = torch.where(torch.isfinite(used) & (used > 0), fresh, scale)
    new_scale = torch.where(torch.isinf(new_scale), torch.full_like(new_scale, FP32_MAX), new_scale)
    scale.copy_(new_scale)


def _nan_max(window: torch.Tensor) -> torch.Tensor:
    """Column maxima the way the kernel's ``fmaxf`` reduction takes them (NaNs dropped, 0 start)."""
    w = torch.nan_to_num(window, nan=0.0, posinf=float("inf"), neginf=0.0)
    return torch.clamp(w.amax(dim=0), min=0.0)
