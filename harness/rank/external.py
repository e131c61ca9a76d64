"""The worker under a user's own launcher (multi-node): ``torchrun ... -m harness.rank.external``.

Every rank builds the same plan from the selection options: the cells of the selection (or
of its ``--shard K/N``) whose world size divides this launch's, packed onto sub-groups
(``harness.vocabulary.packing``; ``--packing off``: only the cells of exactly this world size). The
ranks compare a digest of the cell ids, run them as the launcher's ranks would
(``harness.rank.worker.run``), and rank 0 folds the run's result stream into the run record and
renders the reports. Put ``--out`` on a filesystem every node shares.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.judging import assemble, gate
from harness.vocabulary import matrix, selection
from harness.records import runinfo
from harness.vocabulary import packing
from harness.judging import ledger as ledgers
from harness.vocabulary.backend_specs import BackendError, BackendInfo
from harness.rank.loading import describe, load_backend
from harness.vocabulary.errors import BAD_INPUT, UsageError
from harness.vocabulary.plan import LaunchPlan, PlanTask
from harness.records.record import RunRecord
from harness.records.stream import ResultStream


def build_plan(args: argparse.Namespace, world_size: int, info: BackendInfo) -> LaunchPlan:
    """The plan every rank derives on its own from the same options; the cells ``info``'s
    backend cannot run are left out, as a sweep leaves them out (``selection.leave_out``).

    Raises:
        MatrixError: no cell of the selection fits this world size.
        UsageError: a bad ``--shard``, a weight that is not installed, or a named value the
            backend cannot run.
    """
    cells, sel = selection.select(args)
    cells, sel = selection.leave_out(cells, sel, selection.missing(info.apis))
    fits = (lambda k: world_size % k == 0) if args.packing == "on" else (lambda k: k == world_size)
    cells = [c for c in cells if fits(c.world_size)]
    if not cells:
        raise matrix.MatrixError(f"the selection has no cell at world size {world_size}")
    return LaunchPlan(Path(args.out).resolve(), f"external-ws{world_size}",
                      [PlanTask(args.backend, c.id) for c in cells], packing.pack(cells, world_size),
                      device=args.device, examples=args.examples, collective_timeout=args.collective_timeout,
                      selection={**sel, "examples": args.examples})


def finish(plan: LaunchPlan, argv: list[str], started: str, info: BackendInfo,
           ledger: ledgers.Ledger | None) -> RunRecord:
    """Rank 0: the run record from the result stream, judged under ``ledger`` as a sweep's
    (``harness.judging.assemble``), and the reports."""
    from harness_reports import write_all

    run_dir = plan.run_dir
    backend = plan.tasks[0].backend
    latest = ResultStream(run_dir).latest(backend)
    wanted = [matrix.Cell.from_id(t.cell) for t in plan.tasks]
    cells = [latest[c.id] if c.id in latest else assemble.unrun(c, "not run: the launch ended before this cell")
             for c in wanted]
    record = assemble.start(backend=backend, argv=argv, selection={**(plan.selection or {}), "external": True},
                            device=plan.device, backend_info=info.serialize(),
                            world_sizes=[c.world_size for c in wanted], started=started,
                            command="python -m torch.distributed.run ... -m harness.rank.external " + " ".join(argv))
    assemble.judge(record, cells, ledger)
    record.status = "complete" if all(c.id in latest for c in wanted) else "incomplete"
    record.finished = runinfo.now()
    record.write(run_dir)
    write_all(record.serialize(), run_dir)
    return record


def main(argv: list[str] | None = None) -> int:
    from harness.rank import worker

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="harness.rank.external", description=__doc__.splitlines()[0])
    selection.add_selection(parser)  # the same selection options as sweep and list
    parser.add_argument("--backend", default="harness.backends.reference")
    parser.add_argument("--out", default="runs/external")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--examples", type=int, default=0)
    parser.add_argument("--collective-timeout", type=float, default=300.0)
    parser.add_argument("--ledger", default="auto", metavar="auto|none|FILE",
                        help="known-defects ledger, as sweep's (default: auto)")
    parser.add_argument("--packing", choices=("on", "off"), default="on",
                        help="on: also the cells of every world size dividing this launch's, on sub-groups")
    args = parser.parse_args(argv)
    started = runinfo.now()
    try:
        info = describe(args.backend, load_backend(args.backend))
        plan = build_plan(args, int(os.environ.get("WORLD_SIZE", 1)), info)
        ledger = ledgers.choose(args.ledger, info.upstream, info.version)
    except (matrix.MatrixError, BackendError, UsageError, ledgers.LedgerError) as exc:
        print(f"harness.rank.external: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    code = worker.run(plan)
    if code == 0 and int(os.environ.get("RANK", 0)) == 0:
        return gate.exit_code(finish(plan, argv, started, info, ledger).serialize())
    return code


if __name__ == "__main__":
    raise SystemExit(main())
