"""What Megatron-Core's GTP weight needs on CPU and gloo, answered - inside a worker rank only.

Megatron's ``GTPShardedParam`` (0.19.2) is written for CUDA and NCCL. TE's own ``torch.cuda``
sites are answered by :mod:`harness.backends.te_cpu.backend` (which :mod:`harness.cell.megatron_gtp` applies
first); this module answers the few that only Megatron reaches, listed in :data:`SITES`.
It is applied by :func:`apply`, called only by :mod:`harness.cell.megatron_gtp` when a rank loads
Megatron's class, and by its native stand-in :mod:`harness.cell.gtp_native`, whose MXFP8
gather is TE's (the coalescing manager below) - never in the parent process or pytest's. Each answer is exact on CPU:

- Events and streams order GPU work; CPU work is done when a call returns, and Megatron
  only records an event after ``handle.wait()`` of the collective it guards - so recording,
  waiting and stream switching have nothing left to order.
- gloo has no coalescing manager: inside one, the collectives Megatron issues (with
  ``async_op`` unset) simply run one after another, in order, and are complete when the
  block ends.
- gloo refuses to all-gather a tensor that requires grad (its CPU copy into the output
  views trips autograd's view check); a c10d collective is never differentiable, so its
  input is detached.

Anything already answered (by ``harness.backends.te_cpu.backend``) is left alone, and with a real GPU
:func:`apply` does nothing.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

__all__ = ["Site", "SITES", "apply", "applied"]


@dataclass(frozen=True)
class Site:
    """One ``torch`` attribute answered for Megatron, and the Megatron code that needs it."""

    target: str
    needed_by: str


SITES: tuple[Site, ...] = (
    Site("cuda.Event", "_init_gtp_runtime_attrs (Event(external=True) per parameter); "
                       "_all_gather_weight / _reduce_scatter async paths (outer sync event)"),
    Site("cuda.Stream", "get_ag_stream / get_rs_stream (one per chain and group)"),
    Site("cuda.current_stream", "_all_gather_weight / _reduce_scatter async paths"),
    Site("cuda.stream", "_wait_param_gather / _wait_reduce_scatter and the async issue sites"),
    Site("distributed._coalescing_manager", "grouped_gather_along_first_dim, "
                                           "GTPShardedParam._reduce_scatter (groups of N > 1) on gloo; "
                                           "TE's _all_gather_mxfp8, which the native stand-in "
                                           "(harness.cell.gtp_native) reaches too"),
    Site("distributed.all_gather_into_tensor", "TE gather_along_first_dim of a GTPShardedParam "
                                              "(requires grad) on gloo"),
    Site("Quantizer.make_empty", "GTPWeightCache._allocate_buffer of a native quantized shard passes "
                                 "device=torch.cuda.current_device(), an int: torch's CUDA index, which a "
                                 "CPU torch cannot turn into a device; answered as cuda:<index>, which "
                                 "harness.backends.te_cpu.backend maps to the CPU"),
)


class CpuEvent:
    """``torch.cuda.Event`` on CPU: every recorded point is already reached."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, external: bool = False) -> None:
        self.external = external

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CpuStream:
    """``torch.cuda.Stream`` on CPU: work issued "on" it is complete when issued."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.priority = priority

    def wait_event(self, event: Any) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> CpuEvent:
        return event if event is not None else CpuEvent()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


DEFAULT_STREAM = CpuStream()


@contextlib.contextmanager
def stream_context(stream: Any) -> Iterator[None]:
    """``torch.cuda.stream(s)`` on CPU: work "on" a stream is complete when issued."""
    yield


class _Ran:
    """What a gloo coalescing block returns as its handle: the work already ran."""

    def wait(self) -> None:
        return None


def _is_gloo(group: Any) -> bool:
    return dist.get_backend(group) == dist.Backend.GLOO


def _coalescing_manager(original: Callable[..., Any]) -> Callable[..., Any]:
    @contextlib.contextmanager
    def coalescing_manager(group: Any = None, device: Any = None, async_ops: bool = False) -> Iterator[Any]:
        if not _is_gloo(group):
            with original(group=group, device=device, async_ops=async_ops) as cm:
                yield cm
            return
        yield _Ran()

    coalescing_manager.__harness_original__ = original  # type: ignore[attr-defined]
    return coalescing_manager


def _detaching_all_gather(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                               group: Any = None, async_op: bool = False) -> Any:
        if input_tensor.requires_grad and _is_gloo(group):
            input_tensor = input_tensor.detach()
        return original(output_tensor, input_tensor, group=group, async_op=async_op)

    all_gather_into_tensor.__harness_original__ = original  # type: ignore[attr-defined]
    return all_gather_into_tensor


def _indexed_device(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def make_empty(self: Any, shape: Any, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        if isinstance(device, int) and not isinstance(device, bool):
            device = torch.device("cuda", device)  # what the index means on a GPU
        return original(self, shape, *args, device=device, **kwargs)

    make_empty.__harness_original__ = original  # type: ignore[attr-defined]
    return make_empty


def _te_quantizer() -> Any:
    """TE's ``Quantizer`` base class when this process has imported TE (``harness.backends.te_cpu.backend``
    does, before the shims), else None: importing TE here could fail on CPU."""
    module = sys.modules.get("transformer_engine.pytorch.quantized_tensor")
    return getattr(module, "Quantizer", None)


_APPLIED: list[Site] = []


def _torch_own(owner: Any, attr: str) -> bool:
    """The attribute is still torch's (on a CPU build: a stub that raises), not an answer."""
    return getattr(getattr(owner, attr), "__module__", "").startswith("torch")


def apply() -> list[Site]:
    """Answer the sites above that this torch leaves unanswered (idempotent).

    Returns:
        The sites answered here (empty with a real GPU).

    Raises:
        RuntimeError: an answer already in place (not this module's) cannot serve Megatron.
    """
    if _APPLIED or torch.cuda.device_count() > 0:
        return list(_APPLIED)
    answers: dict[str, tuple[Any, str, Any]] = {
        "cuda.Event": (torch.cuda, "Event", CpuEvent),
        "cuda.Stream": (torch.cuda, "Stream", CpuStream),
        "cuda.current_stream": (torch.cuda, "current_stream", lambda device=None: DEFAULT_STREAM),
        "cuda.stream": (torch.cuda, "stream", stream_context),
        "distributed._coalescing_manager": (dist, "_coalescing_manager",
                                            _coalescing_manager(dist._coalescing_manager)),
        "distributed.all_gather_into_tensor": (dist, "all_gather_into_tensor",
                                               _detaching_all_gather(dist.all_gather_into_tensor)),
    }
    quantizer = _te_quantizer()
    if quantizer is not None and not hasattr(quantizer.make_empty, "__harness_original__"):
        answers["Quantizer.make_empty"] = (quantizer, "make_empty", _indexed_device(quantizer.make_empty))
    for site in SITES:
        if site.target not in answers:
            continue
        owner, attr, replacement = answers[site.target]
        if owner is dist or owner is quantizer or _torch_own(owner, attr):
            setattr(owner, attr, replacement)
            _APPLIED.append(site)
    try:
        torch.cuda.Event(external=True).record(torch.cuda.current_stream())
    except Exception as exc:  # another layer's answer does not fit Megatron's use
        raise RuntimeError(f"torch.cuda events/streams cannot serve Megatron's GTP on CPU: "
                           f"{type(exc).__name__}: {exc}") from exc
    return list(_APPLIED)


def applied() -> list[Site]:
    """The sites answered in this process so far."""
    return list(_APPLIED)
