"""Component ``browser``: headless Chromium + ChromeDriver for the report's browser tests.

The tests drive the system's Chromium through Selenium with the system's chromedriver
(``harness_reports.browser.find_chromium``), never a downloaded browser. On Debian/Ubuntu as
root this installs ``chromium`` and ``chromium-driver`` with apt-get; elsewhere it says in
one line what to install (or point ``DW_CHROMIUM`` / ``DW_CHROMEDRIVER`` at them).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

NAME = "browser"
SUMMARY = "headless Chromium + ChromeDriver (Debian: apt-get install chromium chromium-driver) and selenium"

APT_PACKAGES = ("chromium", "chromium-driver")
_NEEDS = ("Chromium and ChromeDriver are needed: apt-get install chromium chromium-driver (Debian, as root), "
          "or point DW_CHROMIUM and DW_CHROMEDRIVER at a Chromium and its matching chromedriver")


def missing() -> str | None:
    from harness_reports.browser import find_chromium

    problems = []
    if find_chromium() is None:
        problems.append("chromium/chromedriver not found")
    if importlib.util.find_spec("selenium") is None:
        problems.append("selenium not installed (pip install -e '.[test]')")
    return "; ".join(problems) or None


def _run(cmd: list[str]) -> None:
    from harness.install import InstallError

    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
        raise InstallError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {last[0]}")


def install() -> None:
    from harness.install import InstallError
    from harness_reports.browser import find_chromium

    if importlib.util.find_spec("selenium") is None:
        raise InstallError("selenium is not installed: pip install -e '.[test]'")
    if find_chromium() is not None:
        return
    if shutil.which("apt-get") is None:
        raise InstallError(f"no apt-get on this machine. {_NEEDS}")
    if os.geteuid() != 0:
        raise InstallError(f"installing system packages needs root. {_NEEDS}")
    _run(["apt-get", "update", "-qq"])
    _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *APT_PACKAGES])
