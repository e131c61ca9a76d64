"""Loading a backend inside a rank (or the backend probe's subprocess, which is one in all
but name): import the spec (an alias, an import path, a ``.py`` file, ``module:attribute``),
with its ``@TREE`` put first on ``sys.path``; check every TE module came from the tree;
describe what was loaded (``BackendInfo``). ``python -m harness.rank.loading --probe SPEC``
is the probe the parent runs (``harness.orchestration.probe``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Mapping

from harness.vocabulary import modules
from harness.vocabulary.hook_modes import OFFLOAD_API
from harness.vocabulary.backend_specs import (ALIASES, FP32_GEMM_MODES, NATIVE_API, RECIPE_API, REQUIRED,
                                              TE_BACKENDS, BackendError, BackendInfo, cannot_import, did_you_mean,
                                              has_api, real_te, resolve, split_tree, te_on_cpu_hint)


def use_tree(tree_path: str) -> Any:
    """Make this process import TransformerEngine from ``tree_path``: validated, named in
    ``DW_TE_TREE``, first on ``sys.path``. Returns the ``harness.te_tree.tree.Tree``.

    Raises:
        BackendError: the folder is not a TE tree, or another ``transformer_engine`` was
            already imported in this process.
    """
    from harness.te_tree import tree as te_tree

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
            from harness.te_tree import tree as te_tree

            _check_tree_origin(spec, te_tree.inspect(tree))
    except BackendError:
        raise
    except Exception as exc:  # any import-time failure is bad input, reported in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        near = did_you_mean(split_tree(spec)[0]) if isinstance(exc, ModuleNotFoundError) else None
        if near:
            raise BackendError(cannot_import(spec, f"{type(exc).__name__}: {first}", near)) from exc
        if real_te(spec):
            # the way out first: TE's own text (a meta package's install advice, a missing CUDA
            # library) is about a GPU install, which is not what this machine needs
            missing = isinstance(exc, ModuleNotFoundError) and exc.name == "transformer_engine"
            said = re.split(r"(?<=[.!])\s", first, maxsplit=1)[0]
            raise BackendError(cannot_import(spec, f"real TE needs its CUDA build and a GPU; "
                                             f"{te_on_cpu_hint(not missing)} (TE said: {type(exc).__name__}: {said})")) from exc
        raise BackendError(cannot_import(spec, f"{type(exc).__name__}: {first}")) from exc
    missing = [name for name in REQUIRED if not has_api(backend, name)]
    if missing:
        raise BackendError(f"backend {spec!r} lacks {', '.join(missing)} (CONTRACTS §1)")
    return backend


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
        from harness.te_tree import tree as te_tree

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
                       extra=facts, apis=[a for a in (*modules.APIS, RECIPE_API, NATIVE_API, OFFLOAD_API) if has_api(backend, a)],
                       torch=torch_facts())


def compiled_origin(tree: Mapping[str, Any] | None) -> dict[str, Any]:
    """Where this process's ``transformer_engine_torch`` (TE's compiled extension) came from:
    the tree's own build, another install (the tree's C++ never runs), or the installed TE's
    (``harness.records.provenance``); ``path`` is its file."""
    from harness.records import provenance

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


def probe_outcome(spec: str) -> dict[str, Any]:
    """What a probe process reports: ``{"info": BackendInfo}`` or ``{"error": one line}`` (this
    process imports the backend: ``probe_backend``'s subprocess, a warm agent's child)."""
    try:
        return {"info": describe(spec, load_backend(spec)).serialize()}
    except BackendError as exc:
        return {"error": str(exc)}


def _probe_main(argv: list[str] | None = None) -> int:
    """``python -m harness.rank.loading --probe SPEC``: import, validate, print BackendInfo JSON."""
    parser = argparse.ArgumentParser(prog="harness.rank.loading")
    parser.add_argument("--probe", required=True, metavar="SPEC")
    args = parser.parse_args(argv)
    outcome = probe_outcome(args.probe)
    if "error" in outcome:
        print(f"harness.rank.loading: error: {outcome['error']}", file=sys.stderr)
        return 2
    print(json.dumps(outcome["info"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(_probe_main())
