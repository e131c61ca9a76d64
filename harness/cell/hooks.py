"""The hook modes' installers (``harness.vocabulary.hook_modes``), as a cell's step uses them.

A step builds its mode's :class:`Installer` once (``installer``), before its first microbatch,
as a user builds TE's offload context or Megatron's manager once; every microbatch's forward
goes through it (``Installer.microbatch``, then ``Installer.layer`` for each layer: one for a
module, ``layers`` for Megatron's expert layer, then ``Installer.end_forward``); the step ends
each iteration with ``Installer.end_iteration`` and closes it with ``Installer.close``.

Every mode but ``off`` makes autograd hand backward a plain tensor in place of a saved
DistributedWeight - the condition under which TE's pre-fix backward lost the distributed path.
``checkpoint`` also recomputes the forward during backward, which is why a backend
materializes twice per step there. What the installed hooks saw is counted by :class:`Packs`,
whoever installed them, and recorded with the cell: a hooked cell whose hooks never packed a
tensor is red (an installer that silently installs nothing proves nothing).

The installers of TE and Megatron are their own code, called as their users call it; nothing
here changes what they do. On a CPU (te-cpu) they copy nothing: TE's default path and
Megatron's manager offload only CUDA tensors, and every tensor here is a CPU tensor - their
hooks, state machines and bookkeeping run, their copies do not (TE's v1 copies what TE
marks, whatever the device, and reloads it: exact on CPU). docs/megatron.md says what moves.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils.checkpoint import checkpoint

from harness.vocabulary import hook_modes
from harness.vocabulary.hook_modes import forward_executions  # noqa: F401 (re-exported for the runner and twin)

__all__ = ["Installer", "Packs", "installer", "forward_executions", "MEGATRON_OFFLOAD"]

#: Megatron-Core's fine-grained activation offloading module
MEGATRON_OFFLOAD = "megatron.core.pipeline_parallel.fine_grained_activation_offload"


class Packs:
    """The pack calls of every saved-tensor hook installed while :meth:`observing` (whoever
    installs them: torch's ``saved_tensors_hooks`` and its subclasses, TE's v1 handler and
    Megatron's manager all push their pair through ``torch._C._autograd``'s
    ``_push_saved_tensors_default_hooks``, which this wraps): how many, and how many received
    a DistributedWeight. Observation only: the wrapped pack hook returns exactly what the
    installer's returns."""

    def __init__(self) -> None:
        self.packs = 0
        self.weight_packs = 0

    def _counted(self, pack: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def counted(t: Any) -> Any:
            self.packs += 1
            if getattr(t, "is_distributed_weight", False):
                self.weight_packs += 1
            return pack(t)
        return counted

    @contextlib.contextmanager
    def observing(self) -> Iterator["Packs"]:
        autograd = torch._C._autograd
        push = autograd._push_saved_tensors_default_hooks

        def counted_push(pack: Callable[[Any], Any], unpack: Callable[[Any], Any]) -> None:
            push(self._counted(pack), unpack)

        autograd._push_saved_tensors_default_hooks = counted_push
        try:
            yield self
        finally:
            autograd._push_saved_tensors_default_hooks = push

    def serialize(self, mode: str) -> dict[str, Any]:
        """What a rank result records of a hooked cell (``RankResult.hooks``)."""
        return {"mode": mode, "installer": hook_modes.KINDS[mode].installer, "packs": self.packs,
                "weight_packs": self.weight_packs}


class Installer:
    """A step's hooks (``off``: none). ``layer(fn, x)`` runs one layer's forward under them."""

    def microbatch(self) -> None:
        """Before each microbatch's forward."""

    def layer(self, fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
        return fn(x)

    def end_forward(self, out: torch.Tensor) -> torch.Tensor:
        """After the last layer of a microbatch's forward."""
        return out

    def end_iteration(self) -> None:
        """After every microbatch of an iteration ran its backward."""

    def close(self) -> None:
        """After the step (also when it raised)."""


class _Hooks(Installer):
    """A saved-tensors hook pair installed around each layer's forward (torch's or the harness's)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make

    def layer(self, fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
        with self.make():
            return fn(x)


class _Offloaded:
    """A packed activation: a copy moved off the compute device, and where it came from."""

    __slots__ = ("tensor", "device")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.device = tensor.device
        # On CPU the "host copy" is still a real copy, so aliasing bugs cannot hide.
        self.tensor = tensor.detach().to("cpu", copy=True)


def _offload_pack(t: torch.Tensor) -> Any:
    """Megatron-style fine-grained offloading: parameters pass through, activations move."""
    if isinstance(t, torch.nn.Parameter):
        return t
    return _Offloaded(t)


def _offload_unpack(packed: Any) -> torch.Tensor:
    if isinstance(packed, _Offloaded):
        return packed.tensor.to(packed.device)
    return packed


#: what a hook mode's first use imports in a rank, whatever the backend: the agent imports it
#: once before it forks the ranks (``harness.rank.worker.preload``). ``torch.utils.checkpoint``
#: imports ``torch._dynamo`` at its first call (2.4 CPU-s a rank), and with it the symbolic
#: shapes a rank's first backward imports otherwise.
FIRST_USE_IMPORTS: dict[str, tuple[str, ...]] = {"checkpoint": ("torch._dynamo",)}


class _Checkpoint(Installer):
    def layer(self, fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
        return checkpoint(fn, x, use_reentrant=False)


#: TE's CPU offloading module (its ``NVTE_CPU_OFFLOAD_V1`` constant chooses the v1 path)
TE_OFFLOAD = "transformer_engine.pytorch.cpu_offload"


def _te_installer(backend: Any) -> Callable[..., Any]:
    """The backend's ``get_cpu_offload_context`` (TE's own, which TE exports)."""
    get = getattr(backend, hook_modes.OFFLOAD_API, None)
    if get is None:
        raise RuntimeError(f"the backend has no {hook_modes.OFFLOAD_API}: TE's CPU offloading cannot run "
                           f"around its modules (the preflight refuses such a cell)")
    return get


class _TeOffload(Installer):
    """TE's CPU offloading as a TE user installs it: ``ctx, sync = get_cpu_offload_context(...)``
    once, then per layer ``with ctx: y = layer(x)`` and ``y = sync(y)``.

    Default implementation: ``layers`` of ``layers + 1`` model layers offloaded, the last an
    identity view (TE's own single-layer test does the same: TE starts a layer's offload at the
    next layer's forward and requires one layer it never offloads). v1 (``NVTE_CPU_OFFLOAD_V1``,
    which TE reads once at import into ``cpu_offload.NVTE_CPU_OFFLOAD_V1``, then reads from there
    at every call): the constant is set for the step and restored after it, so TE's modules see
    the v1 path exactly as under the environment variable; ``layers`` of ``layers``."""

    def __init__(self, backend: Any, layers: int, v1: bool) -> None:
        get = _te_installer(backend)
        self.module = importlib.import_module(TE_OFFLOAD)
        self.v1 = v1
        self._was = self.module.NVTE_CPU_OFFLOAD_V1
        self.module.NVTE_CPU_OFFLOAD_V1 = v1
        if v1:
            self.ctx, self.sync = get(enabled=True, num_layers=layers, model_layers=layers)
        else:
            import warnings

            with warnings.catch_warnings():  # "num_layers == model_layers - 1 is not recommended"
                warnings.simplefilter("ignore", UserWarning)
                self.ctx, self.sync = get(enabled=True, num_layers=layers, model_layers=layers + 1)

    def layer(self, fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
        with self.ctx:
            out = fn(x)
        first, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, None)
        first = self.sync(first)
        return (first, *rest) if rest is not None else first

    def end_forward(self, out: torch.Tensor) -> torch.Tensor:
        if self.v1:
            return out
        with self.ctx:  # the model's last layer, never offloaded: an exact identity
            tail = out.view_as(out)
        return self.sync(tail)

    def close(self) -> None:
        self.module.NVTE_CPU_OFFLOAD_V1 = self._was


#: the offload group a module's forward is, as Megatron names the groups of its layers
#: (``TransformerConfig.offload_modules``): a grouped linear is an expert's fc1, a normalized
#: linear the attention's QKV projection, a linear its output projection
_GROUP_OF = {"grouped": "expert_fc1", "normalized": "qkv_linear", "linear": "attn_proj"}


def megatron_offload() -> Any:
    """Megatron-Core's fine-grained activation offloading module (imports ``megatron.core``,
    which needs TransformerEngine loaded: the rank did, for a backend that is TE)."""
    from harness.cell import megatron_shims

    megatron_shims.apply()
    return importlib.import_module(MEGATRON_OFFLOAD)


class _McoreOffload(Installer):
    """Megatron-Core's fine-grained activation offloading, driven as ``GPTModel.forward`` and
    the schedules drive it: a fresh manager per step (a process starts with none);
    ``init_chunk_handler`` before each microbatch's forward with the config's defaults, and
    ``mark_not_offload`` of every parameter on the first (``GPTModel.disable_param_offloading``);
    ``reset()`` after each iteration's microbatches, on every rank. Around a module's forward
    the offload group Megatron's layer puts around it (``FineGrainedActivationOffloadingInterface``
    as a context, then ``group_offload`` of its output); Megatron's expert layer (``inside``)
    opens its own groups (``expert_fc1``, ``moe_act``), as its config asks."""

    def __init__(self, params: Iterable[torch.nn.Parameter], group: str, inside: bool) -> None:
        self.fgo = megatron_offload()
        self.off = self.fgo.FineGrainedActivationOffloadingInterface
        self.off.reset_instance()
        from megatron.core.transformer.transformer_config import TransformerConfig

        fields = TransformerConfig.__dataclass_fields__
        self.defaults = {name: fields[name].default for name in (
            "min_offloaded_tensor_size", "delta_offload_bytes_across_pp_ranks", "activation_offload_fraction",
            "fine_grained_offloading_max_inflight_offloads", "virtual_pipeline_model_parallel_size")}
        self.params = list(params)
        self.group = group
        self.inside = inside
        self._first = True

    def microbatch(self) -> None:
        d = self.defaults
        self.off.init_chunk_handler(
            pp_rank=0, vp_size=d["virtual_pipeline_model_parallel_size"], vp_stage=None,
            min_offloaded_tensor_size=d["min_offloaded_tensor_size"],
            delta_offload_bytes_across_pp_ranks=d["delta_offload_bytes_across_pp_ranks"],
            activation_offload_fraction=d["activation_offload_fraction"],
            max_inflight_offloads=d["fine_grained_offloading_max_inflight_offloads"])
        if self._first:
            for p in self.params:
                self.off.mark_not_offload(p)
            self._first = False

    def layer(self, fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Any:
        if self.inside:
            return fn(x)
        manager = self.off(True, x, self.group)
        with manager as x_in:
            out = fn(x_in)
        return manager.group_offload(out, forced_released_tensors=[x_in], delay_offload=False)

    def end_iteration(self) -> None:
        self.off.reset()

    def close(self) -> None:
        self.off.reset_instance()


def installer(mode: str, backend: Any = None, *, layers: int = 1, params: Iterable[torch.nn.Parameter] = (),
              group: str = "grouped", megatron_inside: bool = False) -> Installer:
    """The installer of ``mode`` for one step.

    Args:
        mode: a hook mode (``harness.vocabulary.hook_modes``).
        backend: the loaded backend (TE's installers come from it).
        layers: the layers of the chunk each microbatch runs (a module: 1).
        params: the module's parameters (Megatron marks them not to offload).
        group: what the module is to Megatron's offloading (``"grouped"``, ``"normalized"``,
            ``"linear"``: the offload group Megatron's layer puts around such a module).
        megatron_inside: the module is Megatron's expert layer, which opens its own offload
            groups when its config asks.

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in hook_modes.KINDS:
        raise ValueError(f"unknown hook mode {mode!r} (choose from {', '.join(hook_modes.NAMES)})")
    if mode == "off":
        return Installer()
    if mode == "identity":
        return _Hooks(lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    if mode == "offload":
        return _Hooks(lambda: torch.autograd.graph.saved_tensors_hooks(_offload_pack, _offload_unpack))
    if mode == "save_on_cpu":
        return _Hooks(lambda: torch.autograd.graph.save_on_cpu(pin_memory=False))
    if mode == "checkpoint":
        return _Checkpoint()
    if mode in ("te_offload", "te_offload_v1"):
        return _TeOffload(backend, layers, v1=mode == "te_offload_v1")
    return _McoreOffload(params, _GROUP_OF[group], megatron_inside)


def run_forward(mode: str, fn: Callable[[torch.Tensor], torch.Tensor], inp: torch.Tensor,
                backend: Any = None) -> torch.Tensor:
    """``fn(inp)`` under ``mode``'s hooks, as one microbatch of a one-layer step (a test's helper;
    a cell keeps one installer for its whole step)."""
    hooks = installer(mode, backend)
    try:
        hooks.microbatch()
        return hooks.end_forward(hooks.layer(fn, inp))
    finally:
        hooks.close()
