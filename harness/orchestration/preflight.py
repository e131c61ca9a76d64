"""What the parent checks before it launches anything: each failure is bad input (exit 2).

The one place where a run's backend and device are validated before torchrun starts (the
sweep, repro, selftest and the pytest plugin all call ``check_run``). The backend is probed
in a subprocess with the ranks' environment (``harness.orchestration.probe.probe_backend``), never
imported here: importing some backends applies a CPU layer to ``torch`` (``te-cpu``) that
the parent must never see. What cannot be seen from the parent - a rank that cannot import
something, a rendezvous that never completes - is the launcher's circuit breaker's job
(``harness.launcher.launch.LaunchFailure``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterable

from harness.vocabulary import hook_modes, modules, recipes, selection, weights
from harness.launcher import warm
from harness.vocabulary.backend_specs import (NATIVE_API, RECIPE_API, BackendInfo, real_te, split_tree, te_on_cpu_hint,
                                              with_tree)
from harness.orchestration.probe import probe_backend
from harness.te_tree import tree as te_tree
from harness.vocabulary.errors import BackendError, UsageError


def check_backend(spec: str, keep_warm: bool = False) -> BackendInfo:
    """Import and validate the backend in a subprocess; what it says about itself.

    ``keep_warm``: the subprocess is a warm agent (``harness.launcher.warm``) that this process's
    first launch of the backend takes over, where ranks are forked.

    Raises:
        BackendError: with a one-line reason (e.g. what to install).
    """
    if keep_warm and warm.supported():
        return warm.probe(spec)
    return probe_backend(spec)


def settle_device(info: BackendInfo, device: str) -> str:
    """The device a run uses: a backend that computes on one device only (``te-cpu``) turns
    ``auto`` into that device.

    Raises:
        UsageError: an explicit ``--device`` the backend cannot use.
    """
    if info.device is None or device == info.device:
        return device
    if device != "auto":
        raise UsageError(f"backend {info.spec!r} computes on {info.device} only: "
                         f"use --device {info.device} (or auto), not --device {device}")
    return info.device


def check_device(device: str, world_sizes: Iterable[int], facts: dict[str, Any]) -> None:
    """``--device cuda`` needs CUDA, and a CUDA run needs one GPU per rank.

    ``facts``: the ranks' torch as the backend probe saw it (``BackendInfo.torch``).

    Raises:
        UsageError: with a one-line reason.
    """
    sizes = sorted(set(world_sizes))
    cuda = facts["cuda_available"]
    if device == "cuda" and not cuda:
        built = f"built with CUDA {facts['cuda']}" if facts["cuda"] else "a CPU-only build"
        raise UsageError(f"--device cuda: CUDA is not available here (torch {facts['version']}, {built}); "
                         "use --device cpu or --device auto")
    if device in ("cuda", "auto") and cuda and sizes:
        gpus = facts["gpus"]
        if sizes[-1] > gpus:
            raise UsageError(f"world size {sizes[-1]} needs {sizes[-1]} GPUs (one per rank) but {gpus} "
                             "are visible; choose smaller world sizes or --device cpu")


#: what a GPU's driver puts under /dev on Linux: NVIDIA's nodes (nvidia0, nvidiactl, ...), the
#: GPU paravirtualization through which CUDA reaches a GPU under WSL 2 (dxg), AMD's ROCm (kfd)
GPU_NODES = ("nvidia*", "dxg", "kfd")


def gpu_absence(dev: Path = Path("/dev")) -> str | None:
    """Why CUDA cannot see a GPU on this machine, told without torch (None: it may see one).

    Why: the backend's probe imports torch and the backend in a subprocess (seconds, tens of
    seconds on a busy machine) before it can say that there is no GPU; the file system says
    it at once. Only certainties count: on Linux no GPU driver node at all, or
    ``CUDA_VISIBLE_DEVICES`` hiding every GPU; anywhere else the probe decides.
    """
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU"
    if not sys.platform.startswith("linux") or not dev.is_dir():
        return None
    if any(next(dev.glob(pattern), None) is not None for pattern in GPU_NODES):
        return None
    return f"this machine has no GPU device ({', '.join(f'{dev}/{p}' for p in GPU_NODES)})"


def check_gpu_backend(spec: str, device: str, absent: str | None) -> None:
    """Real TE needs a GPU, and so does ``--device cuda``: refused with the way out when
    ``absent`` (``gpu_absence`` before the probe, the probe's torch after it) says there is none.

    Raises:
        UsageError: naming why there is no GPU and what runs here instead.
    """
    if absent is None:
        return
    if real_te(spec):
        import importlib.util

        installed = importlib.util.find_spec("transformer_engine") is not None  # found, never imported
        raise UsageError(f"--backend {spec} is real TE, which runs on CUDA GPUs, and {absent}; "
                         f"{te_on_cpu_hint(installed)}")
    if device == "cuda":
        raise UsageError(f"--device cuda: CUDA is not available here ({absent}); use --device cpu or --device auto")


def check_modules(info: BackendInfo, selected: Iterable[str]) -> None:
    """Every selected module value's class exists in the backend (``LayerNormLinear`` is
    optional for a backend: one without it can still run the other modules' cells).

    Raises:
        UsageError: naming the missing class, the module values that need it and the way out.
    """
    if info.apis is None:
        return
    selected = set(selected)
    lacking = [kind for name, kind in modules.KINDS.items() if name in selected and kind.api not in info.apis]
    if lacking:
        apis = ", ".join(dict.fromkeys(k.api for k in lacking))
        keep = [n for n in modules.NAMES if n in selected and modules.KINDS[n].api in info.apis]
        hint = f"select --modules {','.join(keep)}" if keep else "choose another backend"
        raise UsageError(f"backend {info.spec!r} has no {apis}, which the selected module values "
                         f"{', '.join(k.name for k in lacking)} need: {hint}")


def check_recipes(info: BackendInfo, selected: Iterable[str]) -> None:
    """A backend that runs a selected low-precision recipe exposes TE's ``autocast``.

    Raises:
        UsageError: naming the recipes and the way out.
    """
    chosen = set(selected)
    quantized = [r for r in recipes.NAMES if r in chosen and r != "none"]  # in the axis's order
    if quantized and info.apis is not None and RECIPE_API not in info.apis:
        raise UsageError(f"backend {info.spec!r} has no {RECIPE_API}: it cannot run the recipes "
                         f"{', '.join(quantized)}; select --recipes none or another backend")


def check_native(info: BackendInfo, selected: Iterable[str]) -> None:
    """A backend that runs a selected native weight (``megatron_fp8``, ``gtp_mcore_fp8``) exposes TE's
    ``quantized_model_init``, under which the weights are born quantized.

    Raises:
        UsageError: naming the weights and the way out.
    """
    native = [w for w in weights.NAMES if w in set(selected) and weights.KINDS[w].native]
    if native and info.apis is not None and NATIVE_API not in info.apis:
        raise UsageError(f"backend {info.spec!r} has no {NATIVE_API}: it cannot build the native "
                         f"quantized weights of {', '.join(native)}; select --backend te-cpu (TE's own "
                         f"modules) or other weights")


def missing(info: BackendInfo) -> set[str]:
    """What this run lacks of ``selection.REQUIREMENTS`` (``selection.missing``)."""
    return selection.missing(info.apis)


def check_run(backend: str, device: str, world_sizes: Iterable[int],
              selected_modules: Iterable[str] = (), keep_warm: bool = False,
              selected_recipes: Iterable[str] = (), selected_weights: Iterable[str] = ()) -> tuple[BackendInfo, str]:
    """Everything the parent can check before a launch: the backend, its module classes,
    then the device (``keep_warm``: as for ``check_backend``).

    Returns:
        The backend's description and the device the run uses.
    """
    info = check_backend(backend, keep_warm)
    if not info.torch["cuda_available"]:
        check_gpu_backend(backend, "auto", f"CUDA is not available to torch {info.torch['version']} here")
    check_modules(info, selected_modules)
    check_recipes(info, selected_recipes)
    check_native(info, selected_weights)
    device = settle_device(info, device)
    check_device(device, world_sizes, info.torch)
    return info, device


def gpu_slots(device: str, facts: dict[str, Any]) -> int:
    """Ranks one launch may use on this node: its GPUs under CUDA, else 0 (no more than the
    largest world size selected: on CPU more ranks than that only share the same cores).
    ``facts`` as for :func:`check_device`."""
    return facts["gpus"] if device in ("auto", "cuda") and facts["cuda_available"] else 0


def attach_tree(spec: str, tree: str) -> str:
    """``spec`` judged on the TE tree at ``tree`` (``te-cpu@/abs/tree``), the form the run record,
    the repro lines and ``--resume`` carry.

    Raises:
        BackendError: the folder is not a TE tree, or ``spec`` already names one.
    """
    if split_tree(spec)[1] is not None:
        raise BackendError(f"--backend {spec!r} already names a TE tree; drop --te-tree {tree}")
    try:
        found = te_tree.inspect(tree)
    except te_tree.TreeError as exc:
        raise BackendError(f"--te-tree: {exc}") from exc
    return with_tree(spec, found.path)


def spec_with_tree(spec: str, tree: str | None) -> str:
    """The backend spec a run records: ``spec`` with the TE tree of ``--te-tree`` attached, or -
    when the option is absent - the tree ``DW_TE_TREE`` names in this environment, so the
    record, every repro line and ``--resume`` carry it (a repro line without it would judge
    the installed TE).

    Raises:
        BackendError: the folder is not a TE tree, or ``spec`` already names one.
    """
    tree = tree or (os.environ.get(te_tree.ENV) or None if split_tree(spec)[1] is None else None)
    return attach_tree(spec, tree) if tree else spec
