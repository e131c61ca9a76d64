"""``install [COMPONENT ...]``: set up the optional upstream components (see harness.install),
then compile the environment's packages and the checkout's own modules
(``harness.install.bytecode``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.vocabulary import errors as exitcodes
from harness.vocabulary.plan import harness_root
from harness.install import COMPONENTS, InstallError, bytecode, component


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("install", help="install optional components: " + ", ".join(COMPONENTS))
    p.add_argument("components", nargs="*", metavar="COMPONENT",
                   help=f"any of {', '.join(COMPONENTS)} (default: all)")
    p.add_argument("--check", action="store_true", help="only report what is missing (exit 1 if any)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="processes compiling the environment and the checkout (default: one per usable core)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise exitcodes.UsageError(f"--jobs must be at least 1, got {args.jobs}")
    names = args.components or list(COMPONENTS)
    try:
        mods = [component(n) for n in names]
    except ValueError as exc:
        raise exitcodes.UsageError(str(exc)) from exc
    missing = 0
    jobs = args.jobs or bytecode.usable_cores()
    ahead: bytecode.CompileAhead | None = None  # the environment compiled while pip installs on one core
    try:
        for mod in mods:
            why = mod.missing()
            if why is None:
                print(f"{mod.NAME}: ok")
                continue
            if args.check:
                print(f"{mod.NAME}: missing: {why}")
                missing += 1
                continue
            print(f"{mod.NAME}: installing ({why})", flush=True)
            if ahead is None and jobs > 1:
                ahead = bytecode.CompileAhead(bytecode.environment_folders(), jobs - 1)
            try:
                mod.install()
            except InstallError as exc:
                raise exitcodes.UsageError(f"cannot install {mod.NAME}: {exc}") from exc
            after = mod.missing()
            if after is not None:
                raise exitcodes.UsageError(f"{mod.NAME} still unusable after install: {after}")
            print(f"{mod.NAME}: ok")
    finally:
        if ahead is not None:
            ahead.stop()
    if not args.check:  # the environment and the checkout, compiled on every core (harness/install/bytecode.py)
        compiled = bytecode.compile_all(Path(harness_root()), bytecode.environment_folders(), args.jobs,
                                        fresh_since=ahead.started if ahead is not None else None)
        print(f"bytecode: {compiled.summary()}")
    return exitcodes.MISMATCH if missing else exitcodes.OK
