"""``python -m harness`` / ``dw-harness``: list, sweep, merge, repro, report, diff, selftest, install.

``main`` takes argv and returns the exit code; every command lives in its own module under
``harness/commands`` and maps its outcome to ``harness.vocabulary.errors``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
import threading
import traceback
from typing import Any

from harness.vocabulary import errors as exitcodes
from harness.vocabulary.backend_specs import BackendError
from harness.launcher.launch import LaunchFailure
from harness.vocabulary.matrix import MatrixError


#: a few command lines per command, for its ``--help`` (docs/cli.md has more)
COMMAND_EXAMPLES: dict[str, tuple[str, ...]] = {
    "list": ("python -m harness list --preset smoke",
             "python -m harness list --modules linear --hooks offload,checkpoint --world-sizes 2",
             "python -m harness list --filter 'module == \"grouped_linear\" and not fused' --json"),
    "sweep": ("python -m harness sweep --preset smoke",
              "python -m harness sweep --backend te-cpu --preset ci",
              "python -m harness sweep --backend te-cpu --te-tree ../TransformerEngine --fixes hooks-strip-distributed-weight",
              "python -m harness sweep --cells hooks_checkpoint --modules linear --world-sizes 2",
              "python -m harness sweep --resume runs/run-20261203-101500-000000"),
    "repro": ("python -m harness repro linear-distributed-hooks_identity-fused-bf16-ws2-ddp-mb2-g1-bias-igrad-nodelay "
              "--backend prefix",),
    "merge": ("python -m harness merge runs/shard-1 runs/shard-2 --out runs/ci",),
    "diff": ("python -m harness diff runs/base runs/new --html diff.html",),
}


def build_parser() -> argparse.ArgumentParser:
    from harness.commands import diff_cmd as diff, install_cmd as install, ledger_cmd, list_cmd, merge_cmd as merge, patch_te_cmd as patch_te, repro_cmd as repro, report_cmd as report, selftest_cmd as selftest, sweep_cmd as sweep

    parser = argparse.ArgumentParser(prog="dw-harness", description="Verification harness for "
                                     "distributed-weight autograd (TE Linear/GroupedLinear + GTP).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for mod in (list_cmd, sweep, merge, repro, report, diff, selftest, ledger_cmd, install, patch_te):
        mod.add_parser(sub)
    for name, p in sub.choices.items():
        codes = exitcodes.COMMAND_EXITS.get(name)
        examples = COMMAND_EXAMPLES.get(name)
        parts = [p.epilog] if p.epilog else []
        if examples:
            parts.append("examples:\n" + "\n".join(f"  {e}" for e in examples))
        if codes:
            parts.append("exit codes:\n" + textwrap.fill(codes, 88, initial_indent="  ", subsequent_indent="  "))
        if parts:
            p.epilog = "\n\n".join(parts)
            p.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("exit codes: 0 as expected; 1 a cell (or check) missed its expectation; 2 bad input, "
                     "nothing launched; 3 the harness itself failed; 130 interrupted. "
                     "`dw-harness COMMAND --help` says what each means for that command.")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, bad usage is 2
        return int(exc.code or 0)
    args.argv = argv
    previous = _sigterm_interrupts()
    try:
        return int(args.func(args))
    except (MatrixError, BackendError, exitcodes.UsageError) as exc:
        print(f"dw-harness: error: {exc}", file=sys.stderr)
        return exitcodes.BAD_INPUT
    except LaunchFailure as exc:
        print(f"dw-harness: error: {exc}", file=sys.stderr)
        return exitcodes.HARNESS_BUG
    except BrokenPipeError:
        # the reader went away (``list ... | head``): nothing is wrong with the run; stop
        # quietly, and keep Python's exit-time flush from raising again on the closed pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exitcodes.OK
    except KeyboardInterrupt:
        print("dw-harness: interrupted; the run record written so far is marked incomplete", file=sys.stderr)
        return exitcodes.INTERRUPTED
    except Exception:
        traceback.print_exc()
        print("dw-harness: internal error (a harness bug, not a verdict on the backend); "
              "please report it with the traceback above", file=sys.stderr)
        return exitcodes.HARNESS_BUG
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _sigterm_interrupts() -> Any:
    """SIGTERM (a CI cancel, ``kill``) ends a command as Ctrl-C does: the launch's process
    tree is ended (its ranks run in a session of their own and would outlive a plain
    SIGTERM death) and the record is written, marked incomplete. Returns the handler to
    restore (None off the main thread, where no handler can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupt)


if __name__ == "__main__":
    raise SystemExit(main())
