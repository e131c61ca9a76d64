"""The one way the components call pip: in the running interpreter, quiet, and without
compiling what it installs (``harness.install.bytecode`` compiles the environment on every
core once the components are in)."""

from __future__ import annotations

import subprocess
import sys

from harness.vocabulary.errors import InstallError


def pip(*args: str) -> None:
    """Run ``python -m pip ARGS``; an ``install`` gets ``--quiet --no-compile``.

    Raises:
        InstallError: pip failed (its last error line).
    """
    if args and args[0] == "install":
        args = ("install", "--quiet", "--no-compile", *args[1:])
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines
        raise InstallError(f"`pip {' '.join(args)}` failed: {errors[-1] if errors else proc.returncode}")
