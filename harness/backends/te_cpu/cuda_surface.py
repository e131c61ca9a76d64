"""The ``torch.cuda`` surface TE touches, answered for CPU - inside a worker rank only.

TE's modules assume a GPU: they refuse to build without ``torch.cuda.is_available()``,
reject inputs that are not ``is_cuda``, allocate scratch tensors with ``device="cuda"`` and
size workspaces from the device's properties. Here the CPU plays the CUDA device: each site
below is answered so that TE's own Python code runs unchanged on CPU tensors.

``apply()`` patches the listed attributes in place (process-wide, once). It is called only by
``harness.backends.te_cpu.backend`` - which only worker ranks and the backend probe import - so the parent
process, pytest and other backends never see a patched ``torch``. Anything not listed is left
alone: a CUDA API TE reaches on another path fails as it would on a CPU build of torch.

Device-resident tensors: a CUDA allocation is a CPU tensor here, so it reports
``device.type == "cpu"``. Where TE asks a caller-supplied tensor to *be* on the device
(``GroupedLinear``'s grouped-tensor path wants its ``m_splits`` "CUDA int64 tensor",
``module/grouped_linear.py`` ``_GroupedLinear.forward``), :func:`on_device` marks a CPU tensor
as living in device memory: the same storage, viewed as :class:`DeviceResident`, whose
``device`` answers ``cuda:0``. Nothing else about it changes: it takes no part in torch
function dispatch (every op computes on the CPU storage and returns a plain tensor), and
the extension's kernels read it through :func:`plain`.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import torch

from harness.cell.megatron_shims import DEFAULT_STREAM, CpuEvent, CpuStream, stream_context

#: the device TE is told it runs on by default: an sm_90 (Hopper) part, TE's main production
#: target, the one every cell without a Blackwell recipe runs on (``harness.backends.te_cpu.device``
#: presents sm_100 for MXFP8 and NVFP4); on the GEMM paths this sizes workspaces, lies inside
#: the [9.0, 11.0] range of TE's grouped-tensor gates (so ``extension``'s cuBLASLt answer
#: decides that path: 13.4+ on Hopper) and makes the grouped GEMM take one alpha/beta for all groups
DEVICE_NAME = "te-cpu (CPU standing in for CUDA device 0)"
COMPUTE_CAPABILITY = (9, 0)
MULTI_PROCESSOR_COUNT = 132
#: the CUDA version ``torch.version.cuda`` answers: 12.9, the toolkit of the cuBLASLt 12.9.1
#: that ``extension`` reports by default (``Float8BlockScaling`` asks for CUDA >= 12.9 on Hopper)
CUDA_VERSION = "12.9"

#: the capability presented now: :data:`COMPUTE_CAPABILITY` unless :func:`set_capability`
#: chose another (a recipe that needs Blackwell: ``harness.backends.te_cpu.device``)
_CAPABILITY = [COMPUTE_CAPABILITY]


def capability() -> tuple[int, int]:
    """The compute capability TE is told the device has, now."""
    return _CAPABILITY[0]


def set_capability(cap: tuple[int, int]) -> tuple[int, int]:
    """Present ``cap`` from here on (``cuda.get_device_properties``); returns the previous one.
    TE caches what it derives from the capability: ``harness.backends.te_cpu.device`` clears those caches."""
    major, minor = (int(c) for c in cap)
    previous, _CAPABILITY[0] = _CAPABILITY[0], (major, minor)
    return previous


#: what a device-resident tensor's ``device`` answers: CUDA device 0, the device TE is told
#: it runs on (``current_device`` answers 0)
DEVICE = torch.device("cuda", 0)


class DeviceResident(torch.Tensor):
    """A CPU tensor standing in for a tensor in CUDA device 0's memory (module docstring).

    Only ``device`` differs from the CPU tensor it views; ``__torch_function__`` is disabled,
    so operations on it run on the CPU storage and return plain tensors (a method that
    returns its input, such as a no-op ``to``, returns it unchanged).
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return DEVICE

    def __deepcopy__(self, memo: dict[int, Any]) -> "DeviceResident":
        return on_device(copy.deepcopy(plain(self), memo))

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, tuple[torch.Tensor]]:
        return on_device, (plain(self),)


def on_device(t: torch.Tensor) -> DeviceResident:
    """``t`` (a CPU tensor) marked as resident in device memory: same storage, ``device``
    answers ``cuda:0``. For a tensor TE insists be on CUDA, e.g. ``GroupedLinear``'s
    ``m_splits`` on its grouped-tensor path."""
    if not isinstance(t, torch.Tensor) or torch.Tensor.device.__get__(t).type != "cpu":
        raise TypeError(f"on_device marks a CPU tensor, got {type(t).__name__}")
    return t.as_subclass(DeviceResident)  # type: ignore[return-value]


def plain(t: torch.Tensor) -> torch.Tensor:
    """The CPU tensor behind a device-resident one (the same storage); other tensors unchanged."""
    return t.as_subclass(torch.Tensor) if isinstance(t, DeviceResident) else t


@dataclass(frozen=True)
class Site:
    """One attribute of ``torch`` that the layer answers, and the TE code that needs it."""

    target: str  #: dotted name under ``torch``, e.g. ``cuda.is_available``
    answer: str  #: what it returns here
    needed_by: str  #: the TE site(s) that reach it (TE 2.20.2)


def _is_cuda(self: torch.Tensor) -> bool:
    return self.device.type in ("cpu", "cuda")


def _tensor_cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
                 memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
    return self if memory_format is torch.preserve_format else self.contiguous(memory_format=memory_format)


def _device_properties(device: Any = None) -> SimpleNamespace:
    major, minor = capability()
    return SimpleNamespace(name=DEVICE_NAME, major=major, minor=minor,
                           multi_processor_count=MULTI_PROCESSOR_COUNT, total_memory=0)


def _on_cpu(device: Any) -> Any:
    """A device argument that names CUDA (``"cuda"``, ``"cuda:0"``, ``torch.device``, or an
    int, which torch reads as a CUDA index) mapped to the CPU; anything else unchanged."""
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu")
    if isinstance(device, str) and device.split(":")[0] == "cuda":
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


def _factory(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        if kwargs.get("pin_memory"):  # page-locked host memory only speeds up a GPU's copies
            kwargs["pin_memory"] = False
        return fn(*args, **kwargs)

    return wrapper


def _tensor_to_wrapper(to: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(to)
    def tensor_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not kwargs and len(args) == 1 and type(args[0]) is torch.dtype:
            return to(self, args[0])  # the common call (a dtype only): nothing to map
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        if args and not isinstance(args[0], (torch.dtype, torch.Tensor)):
            args = (_on_cpu(args[0]), *args[1:])
        return to(self, *args, **kwargs)

    return tensor_to


def _wrapper_subclass(make: Callable[..., torch.Tensor]) -> Any:
    def make_wrapper_subclass(cls: type, *args: Any, **kwargs: Any) -> torch.Tensor:
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        return make(cls, *args, **kwargs)

    return staticmethod(make_wrapper_subclass)


def _answers() -> dict[str, tuple[Any, str, str]]:
    """target -> (replacement, answer, the TE 2.20.2 sites that reach it on these paths)."""
    device_arg = "a CUDA device argument -> CPU"
    return {
        "cuda.is_available": (lambda: True, "True",
                              "module/base.py TransformerEngineBaseModule.__init__ (refuses to build without CUDA)"),
        "cuda.current_device": (lambda: 0, "0",
                                "utils.py get_device_compute_capability, get_sm_count; "
                                "cpp_extensions/gemm.py get_cublas_workspace_size_bytes"),
        "cuda.get_device_properties": (_device_properties,
                                       f"sm_{COMPUTE_CAPABILITY[0]}{COMPUTE_CAPABILITY[1]} "
                                       f"(sm_100 while a Blackwell recipe runs), {MULTI_PROCESSOR_COUNT} SMs",
                                       "utils.py _get_device_compute_capability, get_sm_count; "
                                       "cpp_extensions/gemm.py get_cublas_workspace_size_bytes"),
        "cuda.is_current_stream_capturing": (lambda: False, "False",
                                             "quantization.py FP8GlobalStateManager.fp8_graph_capturing"),
        "Tensor.is_cuda": (property(_is_cuda), "True for CPU tensors",
                           "module/base.py prepare_forward (rejects inputs not on CUDA)"),
        "Tensor.cuda": (_tensor_cuda, "the tensor itself", "utils.py _empty_tensor"),
        "Tensor.to": (_tensor_to_wrapper(torch.Tensor.to), device_arg,
                      "module/linear.py, module/grouped_linear.py __init__ (device='cuda:0' from "
                      "utils.canonicalize_device)"),
        "empty": (_factory(torch.empty), f"{device_arg}; pin_memory=True -> False",
                  "module/base.py get_dummy_wgrad, cpp_extensions/gemm.py general_grouped_gemm "
                  "(bias-gradient buffers) use device='cuda'; the modules' parameters use 'cuda:0'; "
                  "cpu_offload_v1.py offload (pin_memory=True)"),
        "ones": (_factory(torch.ones), device_arg,
                 "quantization.py DelayedScalingRecipeState.__init__ (the scales, device='cuda')"),
        "eye": (_factory(torch.eye), device_arg,
                "tensor/nvfp4_tensor.py get_rht_matrix (NVFP4Quantizer's Hadamard matrix, "
                "device=torch.cuda.current_device(), an int)"),
        "zeros": (_factory(torch.zeros), device_arg,
                  "ops/basic/grouped_linear.py reset_parameters (device='cuda:0')"),
        "version.cuda": (CUDA_VERSION, CUDA_VERSION,
                         "quantization.py _compute_fp8_block_scaling_support (float(torch.version.cuda) "
                         ">= 12.9 for Float8BlockScaling)"),
        "Tensor._make_wrapper_subclass": (_wrapper_subclass(torch.Tensor._make_wrapper_subclass), device_arg,
                                          "quantized_tensor.py QuantizedTensor.__new__ (device=torch.cuda."
                                          "current_device(), an int, when none is given: Megatron's native "
                                          "GTP _strip_padding, ops.GroupedLinear _quantize_weights_mxfp8)"),
        "tensor": (_factory(torch.tensor), device_arg,
                   "module/grouped_linear.py _GroupedLinear.forward (m_splits on the module's device)"),
        "empty_like": (_factory(torch.empty_like), device_arg,
                       "cpu_offload_v1.py bulk_reload_group (device=torch.cuda.current_device(), an int)"),
        # TE's CPU offloading (hook modes te_offload, te_offload_v1): streams and events order GPU
        # copies; CPU work is done when a call returns, so there is nothing to order, and the
        # copies (v1's; the default path copies only CUDA tensors) are exact on CPU
        "cuda.Stream": (CpuStream, "a stream whose work is complete when issued",
                        "cpu_offload.py OffloadSynchronizer.__init__, cpu_offload_v1.py "
                        "AsyncDoubleBufferGroupOffloadHandler.__init__"),
        "cuda.Event": (CpuEvent, "an event that is always reached",
                       "cpu_offload.py start_offload (every TE module under offloading), push_tensor"),
        "cuda.current_stream": (lambda device=None: DEFAULT_STREAM, "one stream whose work is complete",
                                "cpu_offload.py, cpu_offload_v1.py (waits on the offload stream)"),
        "cuda.stream": (stream_context, "a context that changes nothing",
                        "cpu_offload_v1.py bulk_offload_group, bulk_reload_group"),
    }


_APPLIED: list[Site] = []


def _owner(target: str) -> tuple[Any, str]:
    parts = target.split(".")
    obj: Any = torch
    for p in parts[:-1]:
        obj = getattr(obj, p)
    return obj, parts[-1]


def apply() -> list[Site]:
    """Answer every listed site (idempotent); returns the sites answered."""
    if _APPLIED:
        return list(_APPLIED)
    for target, (replacement, answer, needed_by) in _answers().items():
        owner, attr = _owner(target)
        setattr(owner, attr, replacement)
        _APPLIED.append(Site(target, answer, needed_by))
    return list(_APPLIED)
