"""Component ``te``: TransformerEngine's real PyTorch code, for the ``te-cpu`` backend.

What is installed (into the running interpreter's environment, with pip):

- ``transformer-engine==2.20.2``, the pure wheel (py3-none-any, ~1.2 MB), with ``--no-deps``:
  its declared extras would pull ``transformer-engine-cu12`` (729 MB of CUDA binaries) and
  the ``transformer-engine-torch`` sdist (which needs CUDA to build) - ``harness.backends.te_cpu.backend``
  stands in for both on CPU.
- TE's import-time dependencies: ``pydantic``, ``onnx``, ``onnxscript``, ``einops`` (TE's
  own ``install_requires`` for PyTorch, less ``nvdlfw-inspect`` and
  ``nvidia-cudnn-frontend``, which TE imports only on debug and attention paths), and
  ``triton``: TE imports its Triton kernels at import time, and ``ops.GroupedLinear`` runs
  one (``compute_grouped_dbias``) for its bias gradient; ``harness.backends.te_cpu.backend`` runs it in
  Triton's CPU interpreter (``TRITON_INTERPRET=1``). A triton >= 3.8 already installed (e.g.
  the one a CUDA build of torch pins) is kept; otherwise 3.8.0 is installed: 3.6.0's
  interpreter fails on that kernel with numpy 2 (measurements in docs/te-cpu.md).

``missing()`` never imports TE or torch: it reads package metadata and import specs only.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from harness.install.pip import pip

NAME = "te"
SUMMARY = "TransformerEngine 2.20.2's PyTorch modules on CPU (backend te-cpu)"

TE_REQUIREMENT = "transformer-engine==2.20.2"
TE_VERSION = "2.20.2"
#: import name -> pip requirement, for TE's import-time dependencies
DEPENDENCIES: dict[str, str] = {
    "pydantic": "pydantic>=2",
    "onnx": "onnx",
    "onnxscript": "onnxscript",
    "einops": "einops",
    "triton": "triton==3.8.0",
}
#: the oldest triton whose interpreter runs TE 2.20.2's Triton kernel on CPU (with numpy 2)
TRITON_MIN = (3, 8)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing() -> str | None:
    """None when te-cpu can import TE here, else one line saying what is missing."""
    te = _version("transformer_engine")
    if te is None:
        return f"{TE_REQUIREMENT} is not installed"
    if te != TE_VERSION:
        return f"transformer-engine {te} is installed, te-cpu needs {TE_VERSION}"
    absent = [mod for mod in DEPENDENCIES if importlib.util.find_spec(mod) is None]
    if absent:
        return f"TransformerEngine's import-time dependencies are missing: {', '.join(absent)}"
    triton = _version("triton") or "0"
    if _release(triton) < TRITON_MIN:
        return (f"triton {triton} is installed, te-cpu runs TE's Triton kernels with triton >= "
                f"{'.'.join(map(str, TRITON_MIN))}")
    return None


def _release(version: str) -> tuple[int, ...]:
    """``"3.8.0+git"`` -> ``(3, 8, 0)`` (the numeric release part only)."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def install() -> None:
    """pip-install TE's pure wheel without its CUDA dependencies, then whichever import-time
    dependencies are missing (an installed triton >= 3.8 is kept)."""
    if _version("transformer_engine") != TE_VERSION:
        pip("install", "--no-deps", TE_REQUIREMENT)
    needed = [req for mod, req in DEPENDENCIES.items() if importlib.util.find_spec(mod) is None]
    if _release(_version("triton") or "0") < TRITON_MIN and DEPENDENCIES["triton"] not in needed:
        needed.append(DEPENDENCIES["triton"])
    if needed:
        pip("install", *needed)
