"""The command line of the harness's torchrun (``python -m harness.loopback``, whose agent
listens on loopback only and forks the ranks: it is an entry point of its own, since its
process becomes the ranks' parent). The launcher needs only this; it never imports the agent.
"""

from __future__ import annotations

import sys


def command(*torchrun_args: str) -> list[str]:
    """The command line that runs torchrun with ``torchrun_args`` on loopback only.

    ``torchrun_args`` are torchrun's options and the training script (``-m harness.worker
    ...``), without any rendezvous option: the launcher owns those.
    """
    return [sys.executable, "-m", "harness.loopback", *torchrun_args]
