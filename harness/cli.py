"""``python -m harness`` / ``dw-harness``: list, sweep, merge, repro, report, diff, selftest, install.

``main`` takes argv and returns the exit code; every command lives in its own module under
``harness/commands`` and maps its outcome to ``harness.vocabulary.errors``. Before a command
runs, its options' paths are checked (``harness.commands._inputs``); what argparse refuses is
one line too, with the command's usage and a did-you-mean.
"""

from __future__ import annotations

import argparse
import difflib
import os
import signal
import sys
import textwrap
import threading
import traceback
from typing import Any, NoReturn

from harness.commands import _inputs
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


class ParseError(Exception):
    """A command line argparse cannot parse, with the parser of the (sub)command it reached:
    ``main`` prints it as one line, with that command's usage."""

    def __init__(self, parser: "Parser", message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class Parser(argparse.ArgumentParser):
    """argparse's parser, with its errors raised rather than printed (``main`` prints one
    line with the usage of the command the error belongs to, not the top level's) and a
    did-you-mean for an unknown choice (a command, a ledger verb, ``--device``...).

    Why: argparse reports an unknown option of a subcommand (``sweep --presett``) from the
    top-level parser, with the top-level usage, and suggests no near name.
    """

    def error(self, message: str) -> NoReturn:
        raise ParseError(self, message)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's check of a choice (its own method, overridden): the same refusal, with
        the nearest choice and without argparse's quotes around each one."""
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            near = difflib.get_close_matches(str(value), choices, n=1)
            what = (f"{action.metavar.lower()} {value!r}" if isinstance(action, argparse._SubParsersAction)
                    else f"value {value!r} for {'/'.join(action.option_strings) or action.dest}")
            hint = f" - did you mean {near[0]}?" if near else ""
            raise argparse.ArgumentError(None, f"unknown {what}{hint} (choose from {', '.join(choices)})")


def usage(parser: argparse.ArgumentParser) -> str:
    """The one-line usage of a (sub)command: its name, ``[OPTIONS]`` and its positionals
    (``dw-harness merge [OPTIONS] RUN_DIR [RUN_DIR ...]``); ``--help`` lists the options, in
    groups, so the usage does not list them again."""
    words = [parser.prog, "[OPTIONS]"]
    for action in parser._actions:
        if action.option_strings or action.help == argparse.SUPPRESS:
            continue
        name = action.metavar or action.dest.upper()
        words.append({"?": f"[{name}]", "*": f"[{name} ...]", "+": f"{name} [{name} ...]",
                      argparse.PARSER: f"{name} ..."}.get(action.nargs, name))
    return " ".join(words)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of ``parser`` (its ``COMMAND``s, or a command's ``VERB``s)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _prepare(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)command its one-line usage, its groups of options before argparse's
    own, and record, in the namespace it fills, which parser it is (``command_parser``): the
    innermost one wins, so ``main`` can name it for the arguments argparse left unrecognized."""
    parser.usage = usage(parser)
    parser.set_defaults(command_parser=parser)
    # argparse lists its own group ("options": -h, and any option a command left ungrouped)
    # before the command's groups; the command's groups come first, in the order it made them
    general = parser._optionals
    parser._action_groups = [g for g in parser._action_groups if g is not general] + [general]
    for child in _subparsers(parser).values():
        _prepare(child)


def build_parser() -> argparse.ArgumentParser:
    from harness.commands import diff_cmd as diff, install_cmd as install, ledger_cmd, list_cmd, merge_cmd as merge, patch_te_cmd as patch_te, repro_cmd as repro, report_cmd as report, selftest_cmd as selftest, sweep_cmd as sweep

    parser = Parser(prog="dw-harness", description="Verification harness for "
                    "distributed-weight autograd (TE Linear/GroupedLinear + GTP).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for mod in (list_cmd, sweep, merge, repro, report, diff, selftest, ledger_cmd, install, patch_te):
        mod.add_parser(sub)
    _prepare(parser)
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


def _unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """argparse's "unrecognized arguments", with the nearest option of ``parser`` for each
    unknown one (``--presett`` -> ``--preset``; ``--presett=smoke`` too)."""
    options = [o for action in parser._actions for o in action.option_strings]
    hints = []
    for arg in extra:
        if arg.startswith("-"):
            near = difflib.get_close_matches(arg.split("=", 1)[0], options, n=1)
            if near:
                hints.append(f"did you mean {near[0]}?")
    return f"unrecognized arguments: {' '.join(extra)}" + (f" - {' '.join(hints)}" if hints else "")


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The parsed command line.

    Raises:
        ParseError: anything argparse refuses, with the parser of the command it reached.
        SystemExit: ``--help`` (code 0).
    """
    args, extra = parser.parse_known_args(argv)
    if extra:
        raise ParseError(args.command_parser, _unrecognized(args.command_parser, extra))
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:  # nothing asked: show what can be asked (exit 2: nothing was done)
        parser.print_help()
        return exitcodes.BAD_INPUT
    try:
        args = parse(parser, argv)
    except ParseError as exc:  # one line: the error, a did-you-mean, the command's usage
        print(f"dw-harness: error: {exc.message} (usage: {exc.parser.usage}; "
              f"{exc.parser.prog} --help lists every option)", file=sys.stderr)
        return exitcodes.BAD_INPUT
    except SystemExit as exc:  # argparse: --help is 0
        return int(exc.code or 0)
    args.argv = argv
    previous = _sigterm_interrupts()
    try:
        _inputs.check(args)  # every path and file the command names, before anything slow
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
