"""Optional upstream components the harness can install for its user: ``python -m harness install``.

The main job (a sweep against the reference backend) needs none of them. The test suite and
the upstream backends do: real TransformerEngine on CPU (``te``), Megatron-Core's real GTP
weight (``megatron``) and a headless browser for the report's browser test (``browser``).
Each component is one module in this package exposing:

- ``NAME`` and ``SUMMARY`` (one line each);
- ``missing() -> str | None``: None when the component is usable in this interpreter,
  else one line saying what is missing;
- ``install() -> None``: install it into the running interpreter's environment (raises
  ``InstallError`` with one line on failure).

Components never import torch or the upstream package itself in this process: checking
and installing must not patch anything (the CPU layers are applied inside worker ranks).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from harness.vocabulary.errors import InstallError

#: install order (later components may build on earlier ones)
COMPONENTS: tuple[str, ...] = ("te", "megatron", "browser")


def component(name: str) -> ModuleType:
    """The component module ``name``.

    Raises:
        ValueError: an unknown component.
    """
    if name not in COMPONENTS:
        raise ValueError(f"unknown component {name!r} (choose from {', '.join(COMPONENTS)})")
    return importlib.import_module(f"harness.install.{name}")
