"""The rank world's errors: whose fault a failure is, and what the rank-side code raises.

``BackendFault`` (a verdict on the backend) and ``HarnessBug`` (the harness's own failure,
status ``harness_error``, exit 3) live beside each other because every place that runs a cell
must tell them apart: ``harness.cell.runner`` tags each phase of a cell with its owner and
raises one or the other; ``harness.cell.compare`` raises ``HarnessBug`` from its checks. The
other classes are what the rank's weights, recipes and te-cpu's layer raise; an exception
raised while the backend runs is the backend's (the phase owner decides, not the class).
Pure Python (no torch). The parent's errors and the exit codes are ``harness.vocabulary.errors``.
"""

from __future__ import annotations

import traceback


class BackendFault(Exception):
    """Backend code raised during ``phase``: a verdict on the backend, never a harness bug."""

    def __init__(self, phase: str, exc: BaseException) -> None:
        super().__init__(f"{phase}: {type(exc).__name__}: {exc}")
        self.phase = phase
        self.exc = exc


class HarnessBug(RuntimeError):
    """The harness itself failed (set-up, oracle, checks); never a verdict on the backend.

    ``harness.cell.runner`` raises it for any exception of a harness-owned phase; the cell's
    status is then ``harness_error`` and the run exits 3.
    """


class WeightStateLost(RuntimeError):
    """A protocol method was called on an object of the weight's class that is not the weight:
    one autograd rebuilt from a saved tensor (a native quantized weight keeps its class
    through saving, but not the weight's own state)."""


class RecipeUnsupported(RuntimeError):
    """The backend has no ``autocast``: it cannot run a cell with a recipe."""


class MegatronUnavailable(ImportError):
    """Megatron-Core 0.19.2 (or TE, which its GTP module needs) is not usable here."""


class GemmError(ValueError):
    """Operands a TE GEMM would reject (shape or dtype), with TE's wording where it has one."""


class NormError(ValueError):
    """Operands TE's norm kernels would reject, with TE's wording where it has one."""


class GroupedError(ValueError):
    """Arguments TE's grouped kernels reject, with TE's wording where it has one."""


class QGemmError(ValueError):
    """Operands a quantized GEMM rejects (with TE's wording where it has one)."""


class TeUnavailable(ImportError):
    """TE (or the version te-cpu supports, or an import-time dependency) is not installed."""


class MissingCpuKernel(NotImplementedError):
    """TE called an extension function the CPU layer has no kernel for."""


class MissingExtensionAttribute(AttributeError):
    """TE read an extension attribute (a function, a class, an enum member) that the CPU
    stand-in does not have. An ``AttributeError``, so ``getattr(tex, name, default)`` and
    ``hasattr`` probes keep working; ``qualname`` names it (``transformer_engine_torch.X``)."""

    def __init__(self, qualname: str) -> None:
        self.qualname = qualname
        super().__init__(f"{qualname}: te-cpu's stand-in for TE's compiled extension has no such "
                         "attribute (harness/backends/te_cpu/extension.py)")


def error_info(exc: BaseException) -> dict[str, str]:
    """An exception as a rank result records it: type, first line, full traceback."""
    return {"type": type(exc).__name__, "message": str(exc).strip().splitlines()[0] if str(exc).strip() else "",
            "traceback": "".join(traceback.format_exception(exc))}
