"""``install [COMPONENT ...]``: set up the optional upstream components (see harness.install),
then compile the checkout's own modules (``harness.install.bytecode``)."""

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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = args.components or list(COMPONENTS)
    try:
        mods = [component(n) for n in names]
    except ValueError as exc:
        raise exitcodes.UsageError(str(exc)) from exc
    missing = 0
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
        try:
            mod.install()
        except InstallError as exc:
            raise exitcodes.UsageError(f"cannot install {mod.NAME}: {exc}") from exc
        after = mod.missing()
        if after is not None:
            raise exitcodes.UsageError(f"{mod.NAME} still unusable after install: {after}")
        print(f"{mod.NAME}: ok")
    if not args.check:  # the checkout's own modules, compiled once (harness/install/bytecode.py)
        failed = bytecode.compile_checkout(Path(harness_root()))
        print(f"bytecode: {'ok' if not failed else 'not written for ' + ', '.join(failed) + ' (compiled as imported)'}")
    return exitcodes.MISMATCH if missing else exitcodes.OK
