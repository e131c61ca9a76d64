"""``patch-te OUT [--from TREE]``: a patched TransformerEngine source tree in one step.

Without ``--from``: the installed wheel's ``transformer_engine/`` package (found through its
metadata or import spec, never imported) is copied into ``OUT/transformer_engine`` (no
``__pycache__``), ``OUT/build_tools/VERSION.txt`` gets the wheel's version (OUT is laid out
like TE's repository and sdist, so ``harness.te_tree.tree.inspect`` reads it), ``git init``, one
commit "transformer-engine X as installed", then the fix
(``harness/te_tree/patches/transformer_engine-2.20.2-dw-fix.patch``, or ``--patch FILE``; ``harness.te_tree.patch``) is
applied and committed as "dw-harness: hook-safe DistributedWeight fix".

With ``--from TREE`` (a TE checkout, e.g. TE main): only ``transformer_engine/`` and
``build_tools/VERSION.txt`` of TREE are copied, the same way, and the patch is applied
with ``git apply --reject``: every hunk that does not apply is reported (file and hunk
header) and its ``.rej`` file left next to the file, untracked; what applied is committed.

Exit codes: 0 every hunk applied; 1 some did not; 2 bad input (OUT exists and is not
empty, TREE is not a TE tree, no patch file, no git, no installed TE), nothing written.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from harness.te_tree.patch import PATCH, make
from harness.vocabulary import errors as exitcodes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("patch-te", help="make a patched TE source tree (installed wheel or --from TREE) "
                                        "to sweep with --te-tree")
    p.add_argument("out", type=Path, metavar="OUT", help="folder to create (must not exist, or be empty)")
    p.add_argument("--from", dest="source", metavar="TREE",
                   help="a TE checkout to patch instead of the installed wheel (e.g. TE main)")
    p.add_argument("--patch", type=Path, metavar="FILE", default=None,
                   help=f"the patch to apply (default: the shipped {PATCH.name})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    outcome, commit = make(args.out, args.source, args.patch, say=print)
    out = args.out.expanduser().resolve()
    patch = (args.patch or PATCH).expanduser()
    applied = len(outcome.hunks) - len(outcome.rejected)
    print(f"patch-te: applied {applied}/{len(outcome.hunks)} hunk(s) of {patch}")
    for hunk in outcome.rejected:
        why = f"  ({outcome.why[hunk.file]})" if hunk.file in outcome.why else ""
        print(f"patch-te: REJECTED {hunk.file}: {hunk.header}{why}")
    if outcome.rejected:
        print(f"patch-te: {len(outcome.rejected)} hunk(s) did not apply; see the .rej files in {out}", file=sys.stderr)
    print(f"patch-te: {out} is at commit {commit}")
    print(f"next: python -m harness sweep --backend te-cpu --te-tree {shlex.quote(str(out))} --preset ci")
    return exitcodes.MISMATCH if outcome.rejected else exitcodes.OK
