"""Component ``browser``: placeholder, filled in by its feature branch."""

from __future__ import annotations

NAME = "browser"
SUMMARY = "(not yet available)"


def missing() -> str | None:
    return "component browser is not implemented yet"


def install() -> None:
    from harness.install import InstallError

    raise InstallError("component browser is not implemented yet")
