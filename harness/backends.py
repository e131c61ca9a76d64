"""Loading a backend: an alias, an import path, ``path/to/file.py``, or ``module:attribute``,
each optionally followed by ``@TREE``: a TransformerEngine source tree to import TE from.

A backend is anything exposing ``Linear``, ``GroupedLinear`` and ``ops.GroupedLinear``
(CONTRACTS §1) - the reference, the pre-fix reference, a mutant, real
``transformer_engine.pytorch`` on a CUDA machine, or TE's real modules on CPU (``te-cpu``).

``load_backend`` imports in the calling process: only worker ranks call it. The parent
process validates a backend with ``probe_backend``, which imports it in a short subprocess
with the ranks' environment - some backends patch ``torch`` when imported (``te-cpu``
answers ``torch.cuda`` for CPU), and the parent must never see that.

``SPEC@TREE`` (``te-cpu@/src/TransformerEngine``; ``--te-tree TREE`` writes it): before
``SPEC`` is imported, ``TREE`` is validated (``harness.te_tree.inspect``), named in
``DW_TE_TREE`` and put first on ``sys.path``, so ``transformer_engine`` comes from the tree
(te-cpu also builds its extension stand-in for it). The tree travels inside the backend
string: the run record's ``backend``, the repro lines, ``--resume``, ``merge`` and ``diff``
carry it as they carry any backend.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from harness import modules, weights

REQUIRED = ("Linear", "GroupedLinear", "ops.GroupedLinear")
#: what a backend exposes to run cells under a low-precision recipe: TE's ``autocast``
#: (``harness.rank.lowp``); listed in ``BackendInfo.apis`` when present
RECIPE_API = "autocast"
#: what a backend exposes to build native quantized weights (weight ``megatron_fp8``), listed
#: in ``BackendInfo.apis`` when present
NATIVE_API = weights.NATIVE_API
#: classes a backend may lack; cells of a module whose class is missing are refused before
#: any launch (``harness.preflight.check_modules``)
#: short names for backends that live in this repository (``--backend te-cpu``)
ALIASES: dict[str, str] = {
    "reference": "harness.reference",
    "prefix": "harness.reference.prefix",
    "te-cpu": "harness.te_cpu",
    "te-cpu-tf32": "harness.te_cpu_tf32",
}
@dataclass(frozen=True)
class Preload:
    """What torchrun's agent loads once for all the ranks of a backend, before it forks them
    (``harness.worker.preload``): modules the backend's import loads whatever the rank,
    after the environment variables that import sets first (as ``os.environ.setdefault``)."""

    modules: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


#: TE's import spends ~2.9 s of its ~3.7 s of CPU in ``torch._dynamo`` and ``onnxscript``
_TE_DEPENDENCIES = ("torch._dynamo", "onnxscript")
#: per backend module (``resolve``); never the backend itself, whose import may depend on the
#: rank. te-cpu sets ``TRITON_INTERPRET=1`` before TE is imported (``harness/te_cpu/loader.py``):
#: ``torch._dynamo`` imports triton, whose standard library is made interpreted or compiled
#: when it is first imported, so the agent must set it first too.
RANK_PRELOAD: dict[str, Preload] = {
    "harness.te_cpu": Preload(_TE_DEPENDENCIES, (("TRITON_INTERPRET", "1"),)),
    "harness.te_cpu_tf32": Preload(_TE_DEPENDENCIES, (("TRITON_INTERPRET", "1"),)),
    "transformer_engine.pytorch": Preload(_TE_DEPENDENCIES),
}
#: how fp32 GEMMs compute: IEEE fp32, or TF32 (TE on CUDA; CONTRACTS §5)
FP32_GEMM_MODES = ("ieee", "tf32")


class BackendError(ValueError):
    """The backend cannot be used (bad spec, import failure, missing names)."""


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


def attach_tree(spec: str, tree: str) -> str:
    """``spec`` judged on the TE tree at ``tree`` (``te-cpu@/abs/tree``), the form the run record,
    the repro lines and ``--resume`` carry.

    Raises:
        BackendError: the folder is not a TE tree, or ``spec`` already names one.
    """
    from harness import te_tree

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
    from harness import te_tree

    tree = tree or (os.environ.get(te_tree.ENV) or None if split_tree(spec)[1] is None else None)
    return attach_tree(spec, tree) if tree else spec


def resolve(spec: str) -> str:
    """The import target of ``spec`` (an alias resolved, a ``@TREE`` dropped, anything else unchanged)."""
    base, _ = split_tree(spec)
    return ALIASES.get(base, base)


def use_tree(tree_path: str) -> Any:
    """Make this process import TransformerEngine from ``tree_path``: validated, named in
    ``DW_TE_TREE``, first on ``sys.path``. Returns the ``harness.te_tree.Tree``.

    Raises:
        BackendError: the folder is not a TE tree, or another ``transformer_engine`` was
            already imported in this process.
    """
    from harness import te_tree

    try:
        tree = te_tree.inspect(tree_path)
    except te_tree.TreeError as exc:
        raise BackendError(str(exc)) from exc
    loaded = sys.modules.get("transformer_engine")
    if loaded is not None and not tree.contains(getattr(loaded, "__file__", None)):
        raise BackendError(f"transformer_engine was already imported from {getattr(loaded, '__file__', None)} in "
                           f"this process, not from the tree {tree.path}")
    os.environ[te_tree.ENV] = tree.path
    if sys.path[:1] != [tree.path]:
        sys.path.insert(0, tree.path)
    importlib.invalidate_caches()
    return tree


#: the backends that import TransformerEngine, as a user can name them (for the one-line fix)
TE_BACKENDS = "--backend te-cpu (TE's own code on CPU) or --backend transformer_engine.pytorch (real TE on a GPU)"


def _check_tree_origin(spec: str, tree: Any) -> None:
    """The backend imported TransformerEngine, and every module of it came from the tree.

    A backend that never imports TE would run its own code and call the tree judged: its
    "fixed here" would be hollow (``--te-tree`` with the reference backend)."""
    if "transformer_engine" not in sys.modules:
        raise BackendError(f"backend {split_tree(spec)[0]!r} does not import TransformerEngine, so the TE tree "
                           f"{tree.path} would never run: use {TE_BACKENDS}")
    foreign = foreign_te_modules(tree)
    if foreign:
        name, file = foreign[0]
        raise BackendError(f"backend {spec!r} imported {name} from {file}, not the tree's ({tree.package})"
                           + (f" (and {len(foreign) - 1} more module(s))" if len(foreign) > 1 else ""))


def foreign_te_modules(tree: Any) -> list[tuple[str, str]]:
    """``(name, file)`` of each imported ``transformer_engine`` module whose source is not in
    ``tree`` (namespace packages and modules without a file are skipped; the compiled
    extension ``transformer_engine_torch`` is ``compiled_origin``'s business)."""
    out = []
    for name, mod in list(sys.modules.items()):
        if name != "transformer_engine" and not name.startswith("transformer_engine."):
            continue
        file = getattr(mod, "__file__", None)
        if file and not tree.contains(file):
            out.append((name, file))
    return sorted(out)


def _import_target(spec: str) -> Any:
    spec, tree = split_tree(spec)
    if tree is not None:
        use_tree(tree)
    spec = ALIASES.get(spec, spec)
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            raise BackendError(f"backend file {spec!r} does not exist")
        name = f"_dw_backend_{abs(hash(str(path.resolve())))}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
        return module
    modname, _, attr = spec.partition(":")
    module = importlib.import_module(modname)
    if not attr:
        return module
    getter = getattr(module, "get", None)
    if callable(getter):
        return getter(attr)
    return getattr(module, attr)


def load_backend(spec: str) -> Any:
    """Import and validate a backend.

    Raises:
        BackendError: with a one-line reason (including the import error) on failure.
    """
    try:
        backend = _import_target(spec)
        tree = split_tree(spec)[1]
        if tree is not None:
            from harness import te_tree

            _check_tree_origin(spec, te_tree.inspect(tree))
    except BackendError:
        raise
    except Exception as exc:  # any import-time failure is bad input, reported in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        hint = ""
        near = did_you_mean(split_tree(spec)[0]) if isinstance(exc, ModuleNotFoundError) else None
        if near:
            hint = f" - did you mean --backend {near}?"
        elif resolve(spec).startswith("transformer_engine"):
            hint = (" (real TE needs its CUDA build and a GPU; to run TE's own Python code on this machine, "
                    "use --backend te-cpu after `python -m harness install te`)")
        raise BackendError(f"cannot import backend {spec!r}: {type(exc).__name__}: {first}{hint}") from exc
    missing = [name for name in REQUIRED if not has_api(backend, name)]
    if missing:
        raise BackendError(f"backend {spec!r} lacks {', '.join(missing)} (CONTRACTS §1)")
    return backend


#: the backends a user may mean, for a did-you-mean (the short names first)
KNOWN = (*ALIASES, "transformer_engine.pytorch", *ALIASES.values(), "harness.reference.mutants:NAME")


def did_you_mean(spec: str) -> str | None:
    """The known backend name closest to a mistyped ``spec`` (None when nothing is close)."""
    import difflib

    near = difflib.get_close_matches(spec, KNOWN, n=1, cutoff=0.6)
    return near[0] if near and near[0] != spec else None


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
    #: the module classes it has (``harness.modules`` ``api`` names), and ``RECIPE_API`` when it
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


def torch_facts() -> dict[str, Any]:
    """The torch of this process: version, CUDA build, whether CUDA runs and on how many GPUs.

    The backend probe records them (``BackendInfo.torch``) for the parent,
    which then never imports torch itself (seconds for every command)."""
    import torch

    cuda = torch.cuda.is_available()
    return {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": cuda,
            "gpus": torch.cuda.device_count() if cuda else 0,
            "gpu_name": torch.cuda.get_device_name(0) if cuda else None}


def describe(spec: str, backend: Any) -> BackendInfo:
    """``BackendInfo`` of an imported backend (called inside the probe subprocess).

    A backend may declare ``FP32_GEMM`` and a ``describe() -> dict`` with ``version``,
    ``upstream``, ``origin`` (of the upstream package) and ``device``.

    Raises:
        BackendError: ``FP32_GEMM`` is not one of ``FP32_GEMM_MODES``.
    """
    fp32 = getattr(backend, "FP32_GEMM", "ieee")
    if fp32 not in FP32_GEMM_MODES:
        raise BackendError(f"backend {spec!r} declares FP32_GEMM={fp32!r} "
                           f"(choose from {', '.join(FP32_GEMM_MODES)})")
    facts = dict(backend.describe()) if callable(getattr(backend, "describe", None)) else {}
    origin = getattr(backend, "__file__", None) or getattr(sys.modules.get(getattr(backend, "__module__", "")),
                                                           "__file__", None)
    tree = split_tree(spec)[1]
    if tree is not None and "te_tree" not in facts:  # a backend that does not say it: the spec does
        from harness import te_tree

        facts["te_tree"] = te_tree.inspect(tree).serialize()
    if "transformer_engine" in sys.modules:
        facts.setdefault("compiled", compiled_origin(facts.get("te_tree")))
        if facts.get("upstream") is None:  # real TE says nothing of itself: its tree or package does
            tree_version = (facts.get("te_tree") or {}).get("version")
            facts["upstream"] = "transformer_engine"
            te_file = getattr(sys.modules["transformer_engine"], "__file__", None)
            facts.setdefault("origin", str(Path(te_file).resolve().parent) if te_file else None)
            facts["version"] = tree_version if tree_version not in (None, "unknown") else te_version()
    return BackendInfo(spec=spec, module=resolve(spec), origin=origin, fp32_gemm=fp32,
                       version=facts.pop("version", None), upstream=facts.pop("upstream", None),
                       upstream_origin=facts.pop("origin", None), device=facts.pop("device_only", None),
                       extra=facts, apis=[a for a in (*modules.APIS, RECIPE_API, NATIVE_API) if has_api(backend, a)],
                       torch=torch_facts())


def compiled_origin(tree: Mapping[str, Any] | None) -> dict[str, Any]:
    """Where this process's ``transformer_engine_torch`` (TE's compiled extension) came from:
    the tree's own build, another install (the tree's C++ never runs), or the installed TE's
    (``harness.provenance``); ``path`` is its file."""
    from harness import provenance

    ext = sys.modules.get("transformer_engine_torch")
    path = getattr(ext, "__file__", None) if ext is not None else None
    if tree is None:
        return {"kind": provenance.COMPILED_INSTALLED, "path": path}
    inside = path is not None and Path(path).resolve().is_relative_to(Path(tree["path"]).resolve())
    return {"kind": provenance.COMPILED_TREE if inside else provenance.COMPILED_OTHER, "path": path}


def te_version() -> str | None:
    """The version of the imported TransformerEngine: its ``__version__``, else the installed
    distribution's (the wheel names it ``transformer_engine`` or ``transformer-engine-torch``)."""
    te = sys.modules.get("transformer_engine")
    version = getattr(te, "__version__", None)
    if version:
        return str(version)
    import importlib.metadata

    for dist in ("transformer_engine", "transformer-engine", "transformer_engine_torch"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def probe_backend(spec: str, env: Mapping[str, str] | None = None, timeout: float = 300.0) -> BackendInfo:
    """Import and validate ``spec`` in a subprocess with the ranks' environment.

    Args:
        spec: as ``--backend`` takes it.
        env: the environment the ranks will get (default: this process's).
        timeout: seconds the import may take.

    Returns:
        What the backend says about itself; the parent's ``torch`` is never touched.

    Raises:
        BackendError: the backend cannot be imported or lacks a name (one line, e.g. what
            to install).
    """
    cmd = [sys.executable, "-m", "harness.backends", "--probe", spec]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ if env is None else env), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise BackendError(f"importing backend {spec!r} took longer than {timeout:g}s") from exc
    if proc.returncode == 0:
        try:
            return BackendInfo.from_dict(json.loads(proc.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError, TypeError) as exc:
            raise BackendError(f"probing backend {spec!r} printed no backend description") from exc
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    why = lines[-1] if lines else f"the probe exited with code {proc.returncode}"
    raise BackendError(why.removeprefix("harness.backends: error: "))


def probe_outcome(spec: str) -> dict[str, Any]:
    """What a probe process reports: ``{"info": BackendInfo}`` or ``{"error": one line}`` (this
    process imports the backend: ``probe_backend``'s subprocess, a warm agent's child)."""
    try:
        return {"info": describe(spec, load_backend(spec)).serialize()}
    except BackendError as exc:
        return {"error": str(exc)}


def _probe_main(argv: list[str] | None = None) -> int:
    """``python -m harness.backends --probe SPEC``: import, validate, print BackendInfo JSON."""
    parser = argparse.ArgumentParser(prog="harness.backends")
    parser.add_argument("--probe", required=True, metavar="SPEC")
    args = parser.parse_args(argv)
    outcome = probe_outcome(args.probe)
    if "error" in outcome:
        print(f"harness.backends: error: {outcome['error']}", file=sys.stderr)
        return 2
    print(json.dumps(outcome["info"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(_probe_main())
