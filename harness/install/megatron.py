"""Component ``megatron``: placeholder, filled in by its feature branch."""

from __future__ import annotations

NAME = "megatron"
SUMMARY = "(not yet available)"


def missing() -> str | None:
    return "component megatron is not implemented yet"


def install() -> None:
    from harness.install import InstallError

    raise InstallError("component megatron is not implemented yet")
