"""Backend ``te-cpu``: TransformerEngine's real PyTorch modules, running on CPU.

Importing this package *applies the CPU layer* to the running process - the
``torch.cuda`` surface TE touches (:mod:`.cuda_surface`), a CPU module standing in for the
compiled ``transformer_engine_torch`` extension (:mod:`.extension`, GEMM numerics in
:mod:`harness.backends.te_cpu.gemm`) - and then imports the installed ``transformer_engine.pytorch``
(:mod:`.loader`) - or, with ``--backend te-cpu@TREE`` (``DW_TE_TREE``), the one of a TE
source tree (:mod:`harness.te_tree.tree`), whose version, commit and path ``describe()`` reports
(``te_tree``). Only worker ranks and the backend probe (``harness.orchestration.probe.probe_backend``,
a subprocess) import it; the parent process, pytest and other backends never do.

The backend exposes TE's own classes: ``Linear``, ``GroupedLinear``, ``LayerNormLinear`` and
``ops`` (with ``ops.GroupedLinear``), nothing wrapped. ``FP32_GEMM`` says how fp32 GEMMs compute:
``"ieee"`` by default, ``"tf32"`` when ``DW_TE_CPU_FP32=tf32`` is set at import (the
``te-cpu-tf32`` backend, :mod:`harness.backends.te_cpu.tf32`, does that) - TE's fp32 GEMMs are TF32
on CUDA, and the run's fp32 tolerance follows this value (CONTRACTS §5).
``path_evidence()`` says which extension kernels TE called since ``reset_path_evidence()``:
the proof of which TE code path a cell ran; ``DW_TE_CPU_EVIDENCE=off`` at import leaves both
out, so the path is judged from TE's own record of its choice alone, as on a GPU
(``harness.cell.te_path``). ``DW_TE_CPU_CUBLASLT`` (``12.9.1`` or ``120901``) is the cuBLASLt
version te-cpu answers in the cells of a grouped-tensor path (default: the grouped GEMM's
minimum): one below TE's threshold makes that path unavailable, as TE sees it on such a
machine (:func:`use_path`).
"""

from __future__ import annotations

import os
from typing import Any

from harness.backends.te_cpu import cuda_surface, device, evidence, extension, loader

FP32_ENV = "DW_TE_CPU_FP32"
FP32_GEMM: str = os.environ.get(FP32_ENV, "ieee") or "ieee"
extension.set_fp32_mode(FP32_GEMM)  # raises on an unknown mode, before anything is patched
CUBLASLT_ENV, EVIDENCE_ENV = "DW_TE_CPU_CUBLASLT", "DW_TE_CPU_EVIDENCE"


def _version(text: str) -> int:
    """``"12.9.1"`` or ``"120901"`` as TE's integer cuBLASLt version (120901).

    Raises:
        ValueError: neither form (before anything is patched).
    """
    parts = text.strip().split(".")
    try:
        if len(parts) == 1:
            version = int(parts[0])
        elif len(parts) == 3:
            major, minor, patch = (int(p) for p in parts)
            if not (0 <= minor < 100 and 0 <= patch < 100):
                raise ValueError(text)
            version = major * 10000 + minor * 100 + patch
        else:
            raise ValueError(text)
    except ValueError:
        raise ValueError(f"{CUBLASLT_ENV}={text!r} is no cuBLASLt version (e.g. 12.9.1 or 120901)") from None
    if version <= 0:
        raise ValueError(f"{CUBLASLT_ENV}={text!r} is no cuBLASLt version (e.g. 12.9.1 or 120901)")
    return version


#: what ``get_cublasLt_version`` answers in a grouped-tensor cell (``use_path``), when
#: ``DW_TE_CPU_CUBLASLT`` sets it; None: the grouped GEMM's minimum on the device presented
GROUPED_CUBLASLT: int | None = _version(os.environ[CUBLASLT_ENV]) if os.environ.get(CUBLASLT_ENV) else None
if os.environ.get(EVIDENCE_ENV, "on") not in ("on", "off"):
    raise ValueError(f"{EVIDENCE_ENV}={os.environ[EVIDENCE_ENV]!r}: choose on or off")
#: the kernel counts are the cells' path evidence (off: TE's recorded choice alone judges)
KERNEL_EVIDENCE: bool = os.environ.get(EVIDENCE_ENV, "on") == "on"

#: the TE source tree followed instead of the installed TE (``--backend te-cpu@TREE``), or None
TE_TREE = loader.tree()
loader.check_version()  # a missing or unsupported TE (or a bad tree) fails before anything is patched
CUDA_SITES = cuda_surface.apply()
_te = loader.import_te()

Linear = _te.Linear
GroupedLinear = _te.GroupedLinear
LayerNormLinear = _te.LayerNormLinear
ops = _te.ops
#: TE's own ``autocast``: a cell with a recipe runs its forward under it (``harness.cell.lowp``)
autocast = _te.autocast
#: TE's own ``quantized_model_init``: a native-weight cell builds its module under it
quantized_model_init = _te.quantized_model_init
#: TE's own CPU offloading installer (hook modes ``te_offload``, ``te_offload_v1``)
get_cpu_offload_context = _te.get_cpu_offload_context
TE_VERSION: str = TE_TREE.version if TE_TREE is not None else loader.installed_version() or "unknown"
TE_ORIGIN: str = loader.origin(_te)


def use_path(path: str) -> None:
    """Make TE choose ``path`` from here on: TE picks its grouped-tensor paths by the cuBLASLt
    version (asked at every forward; the backward follows its forward), so the answer is
    ``GROUPED_CUBLASLT`` (the grouped GEMM's minimum unless ``DW_TE_CPU_CUBLASLT`` says
    otherwise) for ``"grouped_tensor"`` and 12.9.1 otherwise. The runner calls it before each
    cell; the answer holds over the cell's whole step."""
    grouped = path == "grouped_tensor"
    extension.set_cublaslt_version((GROUPED_CUBLASLT or extension.grouped_gemm_cublaslt_version()) if grouped
                                   else extension.CUBLASLT_VERSION)


def harness_reads() -> Any:
    """``with backend.harness_reads(): ...``: what the harness calls inside to read TE's state
    (its path choice's inputs, ``harness.cell.te_path``) is not counted as TE's kernel calls."""
    return evidence.paused()


def use_recipe(recipe: str) -> None:
    """Present the device ``recipe`` needs (``harness.backends.te_cpu.device.RECIPE_CAPABILITY``: sm_90
    for ``none`` and the FP8 recipes, sm_100 for ``mxfp8`` and ``nvfp4``) from here on; call it
    before :func:`use_path`, whose grouped-GEMM threshold follows the device."""
    device.present(device.capability_for(recipe))
    extension.present_recipe(recipe)


def recipe_device(recipe: str) -> str:
    """The compute capability presented while ``recipe`` runs, as ``sm_90`` (the run record's
    ``RankResult.recipe``, read by ``harness.cell.lowp.describe``)."""
    return device.name(device.capability_for(recipe))


def device_tensor(t: Any) -> Any:
    """``t`` (a CPU tensor) as TE sees a tensor in CUDA memory: the grouped-tensor path
    insists that ``m_splits`` be there (``module/grouped_linear.py``: "requires CUDA
    m_splits"); TE's code then hands it to the CPU kernels unchanged."""
    return cuda_surface.on_device(t)


if KERNEL_EVIDENCE:  # off: the backend reports no kernels, as real TE on a GPU

    def reset_path_evidence() -> None:
        """Forget the kernels called so far (the runner calls it before each cell)."""
        evidence.reset()

    def path_evidence() -> dict[str, int]:
        """The extension kernels TE called since the last reset, with their call counts: which
        TE code path a cell really ran (``harness.vocabulary.modules.ModuleKind.evidence``)."""
        return evidence.calls()


def _dotted(version: int) -> str:
    """TE's integer cuBLASLt version (130400) as ``13.4.0``."""
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


def describe() -> dict[str, Any]:
    """What a run record shows about this backend (see ``harness.vocabulary.backend_specs.BackendInfo``)."""
    return {
        "upstream": "transformer_engine",
        "version": TE_VERSION,
        "origin": TE_ORIGIN,
        # computes on CPU tensors: ranks must use gloo on CPU, whatever GPUs the host has
        "device_only": "cpu",
        "te_sees": f"{cuda_surface.DEVICE_NAME}, sm_{''.join(map(str, cuda_surface.COMPUTE_CAPABILITY))}",
        "cuda_sites_answered": len(CUDA_SITES),
        # the device each recipe runs on (use_recipe): Blackwell where TE requires it
        "te_sees_by_recipe": {r: device.name(c) for r, c in device.RECIPE_CAPABILITY.items()},
        # what grouped-tensor cells are told (DW_TE_CPU_CUBLASLT), and whether kernels are evidence
        "grouped_cublaslt": _dotted(GROUPED_CUBLASLT or extension.grouped_gemm_cublaslt_version()),
        "kernel_evidence": KERNEL_EVIDENCE,
        # the source tree TE was imported from (path, commit, dirty, version, kind), None: the wheel
        "te_tree": TE_TREE.serialize() if TE_TREE is not None else None,
        # TE's compiled extension is this package's CPU layer, never a build (harness.records.provenance)
        "compiled": {"kind": "te-cpu", "path": None},
    }


__all__ = ["Linear", "GroupedLinear", "LayerNormLinear", "ops", "use_path", "use_recipe", "recipe_device", "autocast", "get_cpu_offload_context",
           "device_tensor",
           "harness_reads", "FP32_GEMM", "GROUPED_CUBLASLT", "KERNEL_EVIDENCE", "TE_VERSION", "TE_ORIGIN",
           "TE_TREE", "describe", *(("path_evidence", "reset_path_evidence") if KERNEL_EVIDENCE else ())]
