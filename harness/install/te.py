"""Component ``te``: placeholder, filled in by its feature branch."""

from __future__ import annotations

NAME = "te"
SUMMARY = "(not yet available)"


def missing() -> str | None:
    return "component te is not implemented yet"


def install() -> None:
    from harness.install import InstallError

    raise InstallError("component te is not implemented yet")
