"""What a perturbation backend's name says (``harness.backends.reference.perturb:<spec>``), without
torch: the self-test's search writes these names in the CLI's own process."""

from __future__ import annotations

from harness.vocabulary import recipes

#: the cell dtypes a perturbation can name
DTYPE_NAMES: tuple[str, ...] = ("fp32", "bf16", "fp16")
#: the recipes a perturbation can name (``none``: the cells without one)
RECIPE_NAMES: tuple[str, ...] = recipes.NAMES
#: the tensor kinds a perturbation can target, each a family of check names
KINDS: tuple[str, ...] = ("output", "input_grad", "weight_grad", "bias_grad")


def parse(spec: str) -> dict[tuple[str, str, str], float]:
    """``"bf16.output=4,current.fp32.weight_grad=8"`` -> ``{("none", "bf16", "output"): 4.0,
    ("current", "fp32", "weight_grad"): 8.0}``: an entry planted in the cells of that recipe
    (named first; no name: the cells without one), dtype and kind.

    Raises:
        ValueError: a malformed entry, an unknown recipe, dtype or kind, or a k that is not > 0.
    """
    factors: dict[tuple[str, str, str], float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, eq, value = item.partition("=")
        parts = key.split(".")
        recipe, dtype, kind = (["none"] + parts if len(parts) == 2 else parts + ["", "", ""])[:3]
        if not eq or len(parts) not in (2, 3) or recipe not in RECIPE_NAMES or dtype not in DTYPE_NAMES \
                or kind not in KINDS:
            raise ValueError(f"bad perturbation {item!r}: expected [<recipe>.]<dtype>.<kind>=<k> with recipe "
                             f"one of {', '.join(RECIPE_NAMES)}, dtype one of {', '.join(DTYPE_NAMES)} and "
                             f"kind one of {', '.join(KINDS)}")
        k = float(value)
        if not k > 0:
            raise ValueError(f"bad perturbation {item!r}: k must be > 0")
        factors[(recipe, dtype, kind)] = k
    return factors


def format_spec(factors: dict[tuple[str, str, str], float]) -> str:
    """The inverse of :func:`parse` (sorted, so equal factors name the same backend)."""
    return ",".join(f"{'' if r == 'none' else r + '.'}{d}.{k}={v:g}" for (r, d, k), v in sorted(factors.items()))
