"""What a perturbation backend's name says (``harness.reference.perturb:<spec>``), without
torch: the self-test's search writes these names in the CLI's own process."""

from __future__ import annotations

#: the cell dtypes a perturbation can name
DTYPE_NAMES: tuple[str, ...] = ("fp32", "bf16", "fp16")
#: the tensor kinds a perturbation can target, each a family of check names
KINDS: tuple[str, ...] = ("output", "input_grad", "weight_grad", "bias_grad")


def parse(spec: str) -> dict[tuple[str, str], float]:
    """``"bf16.output=4,fp32.bias_grad=8"`` -> ``{("bf16", "output"): 4.0, ...}``.

    Raises:
        ValueError: a malformed entry, an unknown dtype or kind, or a k that is not > 0.
    """
    factors: dict[tuple[str, str], float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, eq, value = item.partition("=")
        dtype, dot, kind = key.partition(".")
        if not (eq and dot) or dtype not in DTYPE_NAMES or kind not in KINDS:
            raise ValueError(f"bad perturbation {item!r}: expected <dtype>.<kind>=<k> with dtype one "
                             f"of {', '.join(DTYPE_NAMES)} and kind one of {', '.join(KINDS)}")
        k = float(value)
        if not k > 0:
            raise ValueError(f"bad perturbation {item!r}: k must be > 0")
        factors[(dtype, kind)] = k
    return factors


def format_spec(factors: dict[tuple[str, str], float]) -> str:
    """The inverse of :func:`parse` (sorted, so equal factors name the same backend)."""
    return ",".join(f"{d}.{k}={v:g}" for (d, k), v in sorted(factors.items()))
