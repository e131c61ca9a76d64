"""Megatron-Core's real ``GTPShardedParam`` as a cell's distributed weight (``weight=megatron``).

Loading (:func:`load`): the GTP module is
``megatron/core/tensor_parallel/generalized_tensor_parallelism.py`` of the installed
megatron-core 0.19.2 (``python -m harness install megatron``), imported with its package as
Megatron's own code imports it (``import megatron.core``: Megatron's expert layer and its
offloading manager, which cells also run, need the rest of the package). Megatron imports
TransformerEngine at import time (``megatron/core/utils.py``; without TE its GTP module sets
``HAVE_TE = False`` and GTP is unusable): without a GPU TE runs on te-cpu's layer, which the
rank applies first (``harness.rank.worker``), then :mod:`harness.cell.megatron_shims`. Both
patch ``torch`` process-wide: only worker ranks (and the differential test's ranks) call
:func:`load`.

Injecting (:func:`inject`): as Megatron wires TE modules - the weights are cut to this
rank's padded shard (``gtp_remat_shard_dim0``'s layout) in place, so each keeps the
attributes TE gave it as though TE had built it shard-sized, then
``attach_gtp_to_presharded_module`` turns them into ``GTPShardedParam``s (re-registered: the
weights move behind the module's other parameters; a grouped module's leader gets the
``weight_list``) and ``tag_gtp_params_with_names`` names them. The protocol calls are
observed, not changed: each member's four protocol methods are shadowed by instance
attributes that log the call and delegate to the class's own method.
"""

from __future__ import annotations

import importlib
import sys
import types
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from harness.cell.faults import MegatronUnavailable
from harness.vocabulary import weights
from harness.cell.gtp import CallLog, live_referents, weight_names
from harness.cell.gtp_native import native_shard, quantized

__all__ = ["MegatronUnavailable", "MegatronGroup", "load", "inject", "inject_native", "reset_state", "GTP_MODULE"]

GTP_MODULE = "megatron.core.tensor_parallel.generalized_tensor_parallelism"
#: what :func:`load` imports at a rank's first Megatron cell (torchrun's agent imports them for
#: its ranks once, ``harness.rank.worker.preload``)
FIRST_USE_IMPORTS: tuple[str, ...] = ("megatron.core", GTP_MODULE)
INSTALL_HINT = "run `python -m harness install megatron`"


def load() -> types.ModuleType:
    """Megatron's GTP module, ready on this process (CPU layers applied when needed).

    Raises:
        MegatronUnavailable: megatron-core 0.19.2 or TE is missing, or GTP reports no TE.
    """
    if torch.cuda.device_count() == 0:  # no real GPU: TE runs on te-cpu's layer, applied by the rank
        if "transformer_engine.pytorch" not in sys.modules:
            raise MegatronUnavailable("TransformerEngine is not loaded in this process: without a GPU a rank "
                                      "applies te-cpu's layer before its first Megatron cell (harness.rank.worker); "
                                      "a script imports harness.backends.te_cpu.backend first")
        from harness.cell import megatron_shims

        # every time (idempotent): Megatron may have been imported by other code of the rank first
        megatron_shims.apply()
    gtp = sys.modules.get(GTP_MODULE)  # imported before: by an earlier cell, or the agent for its ranks
    if gtp is None:
        why = weights.megatron_missing()
        if why is not None:
            raise MegatronUnavailable(f"{why}: {INSTALL_HINT}")
        for name in FIRST_USE_IMPORTS:
            importlib.import_module(name)
        gtp = sys.modules[GTP_MODULE]
    if not gtp.HAVE_TE:
        raise MegatronUnavailable("Megatron's GTP module found no usable TransformerEngine "
                                  "(HAVE_TE=False)")
    return gtp


def reset_state(pad_for_alignment: int = weights.MEGATRON_PAD) -> None:
    """Start a new model: Megatron's ``reset_gtp_state()`` (prefetch chains, buffer parity)
    plus the process-global registries a fresh process would have empty - the buffer cache,
    the wgrad pool, the in-flight set and the parameter list (which would keep every earlier
    cell's weights alive) - and Megatron's row alignment for the cell's recipe (what
    ``configure_gtp_remat_from_recipe`` sets before a model is built: 32 under MXFP8, else 16)."""
    gtp = load()
    gtp.update_gtp_config(pad_for_alignment=pad_for_alignment)
    gtp.reset_gtp_state()
    gtp._GTP_CACHE = None
    gtp._GTP_PARAMS.clear()
    gtp._wgrad_buf_pool.clear()
    gtp._inflight_comm_params.clear()


class MegatronGroup:
    """A module's ``GTPShardedParam`` group as the runner's checks read it."""

    def __init__(self, members: list[torch.Tensor], padded_rows: int, rows_per_rank: int) -> None:
        self.members = members
        self.padded_rows = padded_rows
        self.rows_per_rank = rows_per_rank
        self.log = CallLog()
        self._forward_gathers: list[weakref.ref] = []
        for i, m in enumerate(members):
            self._observe(i, m)

    def _observe(self, index: int, member: torch.Tensor) -> None:
        cls = type(member)

        def spy(name: str, record: Callable[..., None]) -> None:
            method = getattr(cls, name).__get__(member, cls)

            def call(*args: Any, **kwargs: Any) -> Any:
                record(*args, **kwargs)
                entry = self.log.calls[-1] if self.log.calls else {}  # this call's, for materializations
                out = method(*args, **kwargs)
                if name.startswith("materialize_group"):
                    tensors = out if isinstance(out, (list, tuple)) else [out]
                    entry["quantized"] = all(quantized(t) for t in tensors)
                    if name == "materialize_group_for_forward":
                        self._forward_gathers.extend(weakref.ref(t) for t in tensors)
                if name == "grad_buffer":
                    self.log.add("grad_buffer", index, dtype=str(out.dtype).replace("torch.", ""))
                return out

            setattr(member, name, call)

        def finalize(wgrads: Any, **kwargs: Any) -> None:  # wgrads= by keyword, as the protocol names it
            # logged before the call: Megatron scales the wgrads in place
            grads = list(wgrads) if isinstance(wgrads, (list, tuple)) else [wgrads]
            self.log.add("finalize", index, dtypes=[str(g.dtype).replace("torch.", "") for g in grads],
                         shapes=[list(g.shape) for g in grads])

        spy("materialize_group_for_forward", lambda *a, **k: self.log.add("materialize_forward", index))
        spy("materialize_group_for_backward", lambda *a, **k: self.log.add("materialize_backward", index))
        spy("finalize_group_grads", finalize)
        spy("grad_buffer", lambda *a, **k: None)

    def live_forward_gathers(self, floor: int = 0) -> int:
        """How many tensors handed out by forward-materialize are still alive
        (:func:`harness.cell.gtp.live_referents`: exact above ``floor``)."""
        return live_referents(self._forward_gathers, floor)


@contextmanager
def _declared_weight_names(module: torch.nn.Module, names: list[str]) -> Iterator[None]:
    """``attach_gtp_to_presharded_module`` reads ``module.weight_names`` when a module
    declares them (else ``num_gemms``, which ``ops.GroupedLinear`` lacks): declare them for
    the call only."""
    had = "weight_names" in module.__dict__
    old = module.__dict__.get("weight_names")
    module.__dict__["weight_names"] = list(names)
    try:
        yield
    finally:
        if had:
            module.__dict__["weight_names"] = old
        else:
            del module.__dict__["weight_names"]


def inject_native(module: torch.nn.Module, group: Any, values: list[torch.Tensor]) -> MegatronGroup:
    """``inject`` for a module built under ``quantized_model_init`` (weight ``megatron_fp8``):
    each rank's shard is quantized on its own from ``values`` (the full weights in high
    precision, padded as Megatron pads), then ``attach_gtp_to_presharded_module`` reclasses
    the quantized shards in place (``_gtp_reclass_native_fp8_shard``) - Megatron's native-FP8
    GTP path, whose all-gather moves the quantized data and scales.

    Raises:
        ValueError: the module has no weights, or they are not native quantized weights.
    """
    gtp = load()
    names = weight_names(module)
    if not names:
        raise ValueError(f"{type(module).__name__} has no weight parameters to shard")
    rows = values[0].shape[0]
    shard_rows, pad_length = gtp.gtp_remat_shard_dim0(rows, group)
    rank = group.rank()
    for name, value in zip(names, values):
        shard = _rank_rows(value, pad_length, rank, shard_rows)
        module._parameters[name] = native_shard(getattr(module, name), shard)  # keeps its place
    return _attach(gtp, module, group, names, shard_rows, pad_length)


def _rank_rows(full: torch.Tensor, pad_length: int, rank: int, shard_rows: int) -> torch.Tensor:
    """``rank``'s rows of ``full`` padded at the tail as Megatron pads (a copy)."""
    padded = torch.nn.functional.pad(full.detach(), (0, 0, 0, pad_length))
    return padded[rank * shard_rows:(rank + 1) * shard_rows].clone()


def _attach(gtp: types.ModuleType, module: torch.nn.Module, group: Any, names: list[str],
            shard_rows: int, pad_length: int) -> MegatronGroup:
    with _declared_weight_names(module, names):
        gtp.attach_gtp_to_presharded_module(module, group, pad_length, is_grouped=names != ["weight"])
    gtp.tag_gtp_params_with_names(module)  # _debug_name, as Megatron's set-up tags a built model
    members = [getattr(module, n) for n in names]
    return MegatronGroup(members, shard_rows * group.size(), shard_rows)


def inject(module: torch.nn.Module, group: Any) -> MegatronGroup:
    """Replace ``module``'s weights by Megatron ``GTPShardedParam`` shards over ``group``.

    Every rank must hold the same full weights. A module with ``weight0..`` is a routed
    expert group (``is_grouped=True``, whose materializations are lists even for one).

    Raises:
        ValueError: the module has no weight parameters.
    """
    gtp = load()
    names = weight_names(module)
    if not names:
        raise ValueError(f"{type(module).__name__} has no weight parameters to shard")
    full = [getattr(module, n) for n in names]
    rows = full[0].shape[0]
    shard_rows, pad_length = gtp.gtp_remat_shard_dim0(rows, group)
    rank = group.rank()
    for w in full:
        # the module's own parameter keeps its place and the attributes TE gave it (the
        # tensor-parallel ones Megatron copies): as if TE had built it shard-sized
        w.data = _rank_rows(w, pad_length, rank, shard_rows)
    return _attach(gtp, module, group, names, shard_rows, pad_length)
