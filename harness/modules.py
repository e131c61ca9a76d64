"""The ``module`` axis: what each value means (pure data, no torch).

One :class:`ModuleKind` per value says everything the rest of the harness needs to know of a
module: which backend class builds it and with which keyword arguments (CONTRACTS §1), how
its forward takes the row splits, whether it is a group of N GEMMs, and which normalization
runs before its GEMM. A new module is one new entry here, not a new branch in the matrix,
the runner and the oracle.

The matrix, the CLI and the reports import this module in the parent process, so it must
stay free of torch; :mod:`harness.runner` turns a kind into a module inside a rank.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModuleKind", "KINDS", "NAMES", "NORM_KINDS", "NORM_PARAMS", "api_names"]

#: a normalization's parameters, in order (RMSNorm has only the first)
NORM_PARAMS: tuple[str, ...] = ("layer_norm_weight", "layer_norm_bias")


@dataclass(frozen=True)
class ModuleKind:
    """One value of the ``module`` axis.

    Attributes:
        name: the axis value (also the cell-id part).
        summary: one line for ``list`` and the docs.
        api: the backend attribute that builds it (``"ops.GroupedLinear"`` is nested).
        grouped: N GEMMs over row splits (the ``num_gemms`` axis applies); otherwise a group
            of one, and a cell always has ``num_gemms=1``.
        splits: how ``forward`` takes the row splits: ``"none"``, ``"list"`` (``m_splits``)
            or ``"tensor"`` (``split_sizes``, an int64 tensor).
        ops: built with the op-fuser's keywords (``dtype``, ``accumulate_into_main_grad``)
            instead of the module keywords (``params_dtype``, ``fuse_wgrad_accumulation``).
        normalization: ``"LayerNorm"`` or ``"RMSNorm"`` before the GEMM, or None.
        zero_centered_gamma: the normalization scales by ``1 + gamma`` (Megatron's
            "layernorm 1p"); its gradient formula is unchanged, its values are not.
    """

    name: str
    summary: str
    api: str
    grouped: bool = False
    splits: str = "none"
    ops: bool = False
    normalization: str | None = None
    zero_centered_gamma: bool = False

    @property
    def norm_params(self) -> tuple[str, ...]:
        """The normalization's parameters (plain, replicated, with ordinary gradients)."""
        if self.normalization is None:
            return ()
        return NORM_PARAMS if self.normalization == "LayerNorm" else NORM_PARAMS[:1]


_ALL = (
    ModuleKind("linear", "Linear: y = x W^T + b", "Linear"),
    ModuleKind("grouped_linear", "GroupedLinear: N linears over row splits (m_splits list)",
               "GroupedLinear", grouped=True, splits="list"),
    ModuleKind("ops_grouped_linear", "ops.GroupedLinear: the op-fuser's grouped linear "
               "(split_sizes tensor)", "ops.GroupedLinear", grouped=True, splits="tensor", ops=True),
    ModuleKind("layernorm_linear", "LayerNormLinear, LayerNorm with a zero-centered gamma, then "
               "Linear", "LayerNormLinear", normalization="LayerNorm", zero_centered_gamma=True),
    ModuleKind("rmsnorm_linear", "LayerNormLinear, RMSNorm, then Linear", "LayerNormLinear",
               normalization="RMSNorm"),
)
KINDS: dict[str, ModuleKind] = {k.name: k for k in _ALL}
NAMES: tuple[str, ...] = tuple(KINDS)
#: the values with a normalization before the GEMM
NORM_KINDS: tuple[str, ...] = tuple(k.name for k in _ALL if k.normalization)


def api_names(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The backend attributes that the given module values need, in axis order, deduplicated."""
    return tuple(dict.fromkeys(KINDS[n].api for n in NAMES if n in names))
