"""Loading a backend: an alias, an import path, ``path/to/file.py``, or ``module:attribute``,
each optionally followed by ``@TREE``: a TransformerEngine source tree to import TE from.

A backend is anything exposing ``Linear``, ``GroupedLinear`` and ``ops.GroupedLinear``
(CONTRACTS §1) - the reference, the pre-fix reference, a mutant, real
``transformer_engine.pytorch`` on a CUDA machine, or TE's real modules on CPU (``te-cpu``).

This module is what both worlds know of a backend without importing it (torch-free): the
spec's forms, the aliases, what the agent preloads for it, what a backend must expose and
``BackendInfo``, the description the parent receives. A rank imports the backend
(``harness.rank.loading``); the parent asks a short subprocess to describe it
(``harness.orchestration.probe``) - some backends patch ``torch`` when imported (``te-cpu``
answers ``torch.cuda`` for CPU), and the parent must never see that.

``SPEC@TREE`` (``te-cpu@/src/TransformerEngine``; ``--te-tree TREE`` writes it): before
``SPEC`` is imported, ``TREE`` is validated (``harness.te_tree.tree.inspect``), named in
``DW_TE_TREE`` and put first on ``sys.path``, so ``transformer_engine`` comes from the tree
(te-cpu also builds its extension stand-in for it). The tree travels inside the backend
string: the run record's ``backend``, the repro lines, ``--resume``, ``merge`` and ``diff``
carry it as they carry any backend.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from harness.vocabulary.errors import BackendError
from harness.vocabulary import weights

REQUIRED = ("Linear", "GroupedLinear", "ops.GroupedLinear")
#: what a backend exposes to run cells under a low-precision recipe: TE's ``autocast``
#: (``harness.cell.lowp``); listed in ``BackendInfo.apis`` when present
RECIPE_API = "autocast"
#: what a backend exposes to build native quantized weights (weight ``megatron_fp8``), listed
#: in ``BackendInfo.apis`` when present
NATIVE_API = weights.NATIVE_API
#: classes a backend may lack; cells of a module whose class is missing are refused before
#: any launch (``harness.orchestration.preflight.check_modules``)
#: short names for backends that live in this repository (``--backend te-cpu``)
ALIASES: dict[str, str] = {
    "reference": "harness.backends.reference",
    "prefix": "harness.backends.reference.prefix",
    "te-cpu": "harness.backends.te_cpu.backend",
    "te-cpu-tf32": "harness.backends.te_cpu.tf32",
}
@dataclass(frozen=True)
class Preload:
    """What torchrun's agent loads once for all the ranks of a backend, before it forks them
    (``harness.rank.worker.preload``): modules the backend's import loads whatever the rank,
    after the environment variables that import sets first (as ``os.environ.setdefault``)."""

    modules: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    #: the backend's own import is the same in every rank (it reads the launch's environment,
    #: never the rank's): imported once in the agent too (``harness.rank.worker.preload``)
    backend: bool = False


#: TE's import spends ~2.9 s of its ~3.7 s of CPU in ``torch._dynamo`` and ``onnxscript``; of the
#: rest, about 0.2 s goes to ``pydantic`` (its recipes), ``einops`` and the parts of
#: ``torch.distributed`` it loads (DTensor, distributed checkpointing) - what is left (about
#: 0.5 s) is TE's own modules, which the agent imports once for a CPU plan's ranks
#: (``Preload.backend``; ``benchmarks/bench_startup.py``).
#: Megatron-Core's import (its weight, its offloading, its expert layer: cells of a te-cpu run)
#: wraps its fused functions in ``torch.compile``, which imports ``torch._inductor.compile_fx``:
#: about 1.2 of its 1.45 CPU-s in each rank that imports it, 0.9 s once in the agent
_TE_DEPENDENCIES = ("torch._dynamo", "onnxscript", "pydantic", "einops", "torch.distributed._tensor",
                    "torch.distributed.checkpoint", "torch._inductor.compile_fx")
#: per backend module (``resolve``); the backend itself only where ``backend`` says its import
#: is the same in every rank (another backend's may depend on the rank). te-cpu sets ``TRITON_INTERPRET=1`` before TE is imported (``harness/backends/te_cpu/loader.py``):
#: ``torch._dynamo`` imports triton, whose standard library is made interpreted or compiled
#: when it is first imported, so the agent must set it first too.
RANK_PRELOAD: dict[str, Preload] = {
    "harness.backends.te_cpu.backend": Preload(_TE_DEPENDENCIES, (("TRITON_INTERPRET", "1"),), backend=True),
    "harness.backends.te_cpu.tf32": Preload(_TE_DEPENDENCIES, (("TRITON_INTERPRET", "1"),), backend=True),
    "transformer_engine.pytorch": Preload(_TE_DEPENDENCIES),
    # a backend elsewhere in te-cpu's package (a fault planted in TE's code, ``te_cpu.mutants``)
    # imports TE the same way (``preload_of``: the package's entry, without the backend's import)
    "harness.backends.te_cpu": Preload(_TE_DEPENDENCIES, (("TRITON_INTERPRET", "1"),)),
    # torch.utils.checkpoint imports torch._dynamo at its first call (2.4 CPU-s): a rank's first
    # checkpoint cell paid it, in every rank (a plan's agent imports it for its checkpoint cells
    # whatever the backend, ``hooks.FIRST_USE_IMPORTS``; this entry is the warm agent's, which
    # knows the backend before any plan)
    "harness.backends.reference": Preload(("torch._dynamo",)),
}


#: what every rank imports whatever its backend and cells, imported by torchrun's agent before
#: it forks them: ``Tensor.backward`` with a gradient imports torch.fx's symbolic shapes at a
#: rank's first backward (``torch.autograd._make_grads``; about 0.3 CPU-s a rank)
EVERY_RANK: tuple[str, ...] = ("torch.fx.experimental.symbolic_shapes",)


def preload_of(spec: str) -> tuple[str, Preload] | None:
    """What the agent preloads for ``spec``'s ranks and the key it is filed under: the
    backend's own entry of ``RANK_PRELOAD``, else the entry of the package its module lies in
    (the reference's mutants and the pre-fix backend, ``harness.backends.reference.*``), whose
    modules and environment only - never another module's import as the backend's
    (``Preload.backend``). None: nothing to preload."""
    target = resolve(spec)
    if target in RANK_PRELOAD:
        return target, RANK_PRELOAD[target]
    module = target.split(":")[0]
    for key in sorted(RANK_PRELOAD, key=len, reverse=True):
        if module.startswith(key + "."):
            return key, replace(RANK_PRELOAD[key], backend=False)
    return None
#: how fp32 GEMMs compute: IEEE fp32, or TF32 (TE on CUDA; CONTRACTS §5)
FP32_GEMM_MODES = ("ieee", "tf32")


def split_tree(spec: str) -> tuple[str, str | None]:
    """``("te-cpu", "/src/TE")`` for ``"te-cpu@/src/TE"``; ``(spec, None)`` without a tree.

    The part after an ``@`` is a tree when it starts with ``/``, ``.`` or ``~`` or is an
    existing folder; the first such ``@`` splits. So a ``.py`` path with an ``@`` in a folder
    name stays a file (``/x/a@b/m.py``), and a tree path may hold an ``@`` itself
    (``te-cpu@/src/te@d0067d0``).
    """
    start = 0
    while (at := spec.find("@", start)) != -1:
        base, tail = spec[:at], spec[at + 1:]
        if base and tail and (tail.startswith(("/", ".", "~")) or Path(tail).is_dir()):
            return base, tail
        start = at + 1
    return spec, None


def with_tree(spec: str, tree: str) -> str:
    """``spec`` with ``tree`` attached (``te-cpu@/abs/tree``); the tree path made absolute."""
    return f"{spec}@{Path(tree).expanduser().resolve()}"


def resolve(spec: str) -> str:
    """The import target of ``spec`` (an alias resolved, a ``@TREE`` dropped, anything else unchanged)."""
    base, _ = split_tree(spec)
    return ALIASES.get(base, base)


def real_te(spec: str) -> bool:
    """Whether ``spec`` names TransformerEngine's own package as the backend (real TE, which
    runs on CUDA GPUs only), not te-cpu or a backend of the user's that imports TE."""
    return resolve(spec).split(".")[0].split(":")[0] == "transformer_engine"


#: the way out for real TE on a machine that cannot run it, in every message that says so
TE_ON_CPU = "to run TE's own Python code on this machine, use --backend te-cpu"


def te_on_cpu_hint(te_installed: bool) -> str:
    """``TE_ON_CPU``, with the install step when TE's Python package is not there yet."""
    return TE_ON_CPU + ("" if te_installed else " after `python -m harness install te`")


#: the backends that import TransformerEngine, as a user can name them (for the one-line fix)
TE_BACKENDS = "--backend te-cpu (TE's own code on CPU) or --backend transformer_engine.pytorch (real TE on a GPU)"


#: the backends a user may mean, for a did-you-mean (the short names first)
KNOWN = (*ALIASES, "transformer_engine.pytorch", *ALIASES.values(), "harness.backends.reference.mutants:NAME")


def did_you_mean(spec: str) -> str | None:
    """The known backend name closest to a mistyped ``spec`` (None when nothing is close)."""
    import difflib

    near = difflib.get_close_matches(spec, KNOWN, n=1, cutoff=0.6)
    return near[0] if near and near[0] != spec else None


def unfound(spec: str) -> str | None:
    """The line a probe of ``spec`` would end with when no folder on ``sys.path`` holds its
    top-level package: found without importing anything (``importlib.util.find_spec`` of a
    top-level name reads folders only; the probe's process has the same working directory
    and environment), so a mistyped ``--backend`` is refused before a large selection and the
    probe, not after them. None when the package is there (whether it imports is the probe's
    to say), for a ``.py`` file (checked as a file) and for real TE (whose absence the probe
    explains with the way out)."""
    import importlib.util

    base = split_tree(spec)[0]
    if base.endswith(".py") or real_te(base):
        return None
    top = resolve(base).partition(":")[0].split(".")[0]
    if not top.isidentifier() or importlib.util.find_spec(top) is not None:
        return None
    return cannot_import(spec, f"ModuleNotFoundError: No module named {top!r}", did_you_mean(base))


def cannot_import(spec: str, error: str, near: str | None = None) -> str:
    """The one line for a backend that does not import: the probe's (``harness.rank.loading``)
    and :func:`unfound`'s; ``near``: the known name it may be a typo of."""
    return f"cannot import backend {spec!r}: {error}" + (f" - did you mean --backend {near}?" if near else "")


def has_api(backend: Any, name: str) -> bool:
    """Whether ``backend`` has the (possibly nested, ``ops.GroupedLinear``) class ``name``."""
    obj = backend
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return obj is not None


@dataclass(frozen=True)
class BackendInfo:
    """What the parent knows about a backend without importing it (see ``probe_backend``)."""

    spec: str  #: as the user wrote it (an alias stays an alias)
    module: str  #: the import target it resolved to
    origin: str | None  #: where the backend's code was imported from
    fp32_gemm: str = "ieee"  #: ``FP32_GEMM`` of the backend (CONTRACTS §5), "ieee" if undeclared
    version: str | None = None  #: the upstream version it runs (e.g. TE's), if any
    upstream: str | None = None  #: the upstream package, if any (e.g. ``transformer_engine``)
    upstream_origin: str | None = None  #: where the upstream package was imported from
    #: the only device the backend computes on (``"cpu"`` for te-cpu), None if any
    device: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: the module classes it has (``harness.vocabulary.modules`` ``api`` names), and ``RECIPE_API`` when it
    #: can run recipes; None: not probed
    apis: list[str] | None = None
    #: the ranks' torch as the probe saw it (``torch_facts``); None: not probed
    torch: dict[str, Any] | None = None

    def serialize(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BackendInfo":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})
