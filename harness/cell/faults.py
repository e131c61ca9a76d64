"""The rank world's errors: whose fault a failure is, and what the rank-side code raises.

``BackendFault`` (a verdict on the backend) and ``HarnessBug`` (the harness's own failure,
status ``harness_error``, exit 3) live beside each other because every place that runs a cell
must tell them apart: ``harness.cell.runner`` tags each phase of a cell with its owner and
raises one or the other; ``harness.cell.compare`` raises ``HarnessBug`` from its checks. The
other classes are what the rank's weights, recipes and te-cpu's layer raise; an exception
raised while the backend runs is the backend's (the phase owner decides, not the class) -
unless a peer caused it (``peer_lost``: a collective broke because another rank went away or
never came), which the cell's fold weighs against what the other ranks did
(``harness.records.fold.decisive``). Pure Python (no torch). The parent's errors and the exit
codes are ``harness.vocabulary.errors``.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

from harness.records.fold import peer_loss_text


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


#: where torch's collectives live: an exception whose innermost frame is here came out of one
_DISTRIBUTED = f"{os.sep}torch{os.sep}distributed{os.sep}"


def _raised_by_collective(exc: BaseException) -> bool:
    """``exc`` is torch.distributed's own error type, or came out of a call into torch.distributed
    (gloo reports a broken transport as a plain ``RuntimeError`` from the collective's wait)."""
    if any(k.__name__ == "DistError" and k.__module__.startswith("torch.distributed") for k in type(exc).__mro__):
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and _DISTRIBUTED in tb.tb_frame.f_code.co_filename


def peer_lost(exc: BaseException) -> bool:
    """``exc`` (or an exception it wraps: a ``BackendFault``'s, the cause of a ``HarnessBug``) is a
    collective that broke or timed out because a peer went away or never came - the peer's
    failure, not this rank's: whoever owned the phase, it is no evidence against that owner.
    A collective's other errors (a wrong shape, a wrong group) stay the caller's."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if _raised_by_collective(e) and peer_loss_text(str(e)):
            return True
        todo += [getattr(e, "exc", None), e.__cause__, e.__context__]
    return False


class PhaseBoard:
    """Whose code this rank is running, and in which phase of its cell (``harness.cell.runner``
    posts every change of owner), in a file the launcher reads when it has to end a launch in
    which this rank never reported (``harness.launcher.forensics.silent_rank``): a rank that
    hung in the backend's forward is the backend's ``timeout``, one that hung in the harness's
    checks a harness bug. One fixed-size record rewritten in place (a ``pwrite``, microseconds),
    so the file always holds the last phase, however the rank stops."""

    SIZE = 192

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.now: tuple[str, str] = ("harness", "worker")
        self.post(*self.now)

    def post(self, owner: str, phase: str) -> tuple[str, str]:
        """Show ``owner``'s ``phase``; returns what the board showed before (to post it again)."""
        before, self.now = self.now, (owner, phase)
        os.pwrite(self._fd, f"{owner}\t{phase}".encode()[:self.SIZE].ljust(self.SIZE, b" "), 0)
        return before


#: this rank's board (set by ``harness.rank.worker``; None in a process that runs cells in-process)
BOARD: PhaseBoard | None = None


def use_board(board: PhaseBoard | None) -> None:
    """Make ``board`` the one the runner's phases are posted on."""
    global BOARD
    BOARD = board
