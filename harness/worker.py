"""What runs inside every rank of a launch: all of one world size's cells, in order.

Started by torchrun (the launcher's, or a user's own ``torchrun --nnodes ... -m
harness.worker --plan PLAN``). The ranks rebuild the cells from their ids, agree on a
digest of the list, then run cell after cell; after each cell they exchange their results
over a gloo control group and rank 0 appends the merged verdict to ``cells.jsonl`` at once,
so a crash loses at most the cell in flight.

Each rank also appends its own result to ``ranks/<launch>.rank<N>.jsonl`` *before* the
exchange: when one rank fails while its peers sit in a collective it will never join, the
launcher sees that report, asks every rank for a stack dump (SIGUSR1, via faulthandler),
ends the launch and records the cell with every rank's traceback.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness import matrix
from harness.backends import load_backend
from harness.inputs import Example
from harness.record import CellResult, RankResult
from harness.runner import RankContext, error_info, run_cell
from harness.verdict import merge


def _redirect_output(log_path: Path) -> Any:
    """Send this rank's stdout/stderr and faulthandler dumps (crash, SIGUSR1) to its log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    f = open(log_path, "a", buffering=1)
    os.dup2(f.fileno(), 1)
    os.dup2(f.fileno(), 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    faulthandler.enable(file=f)
    return f


def _device(requested: str, local_rank: int) -> tuple[torch.device, str]:
    if requested in ("auto", "cuda") and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    if requested == "cuda":
        raise RuntimeError("--device cuda requested but CUDA is not available")
    return torch.device("cpu"), "gloo"


def _append_line(path: Path, record: dict[str, Any], durable: bool = False) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        if durable:
            os.fsync(f.fileno())


def _run_guarded(backend: Any, cell: matrix.Cell, ctx: RankContext, example: Example | None) -> RankResult:
    try:
        return run_cell(backend, cell, ctx, example)
    except Exception as exc:  # a bug in the harness itself, still a recorded result
        return RankResult(ctx.rank, "error", [], {**error_info(exc), "type": f"HarnessBug({type(exc).__name__})"})


def run(plan: dict[str, Any]) -> int:
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    run_dir = Path(plan["run_dir"])
    log = _redirect_output(run_dir / "logs" / plan["launch"] / f"rank{rank}.log")
    own = run_dir / "ranks" / f"{plan['launch']}.rank{rank}.jsonl"
    own.parent.mkdir(exist_ok=True)
    tag = f"[rank{rank}]"
    torch.set_num_threads(int(plan.get("threads_per_rank", 1)))
    device, pg_backend = _device(plan.get("device", "auto"), local_rank)
    timeout = datetime.timedelta(seconds=float(plan.get("collective_timeout", 120)))
    dist.init_process_group(pg_backend, timeout=timeout)
    # Always a group of its own, also under gloo: a rank that failed mid-cell exchanges its
    # result here while its peers still sit in the cell's collectives on the world group;
    # sharing one group would pair those mismatched collectives (garbage data or an abort).
    control = dist.new_group(backend="gloo", timeout=timeout)
    # Registered after the process group exists, so nothing installed later replaces it:
    # SIGTERM (torchrun ending a failed launch, or the launcher ending a hung one) leaves
    # every thread's stack in this rank's log before the rank dies; SIGUSR1 on demand.
    faulthandler.register(signal.SIGTERM, file=log, all_threads=True, chain=True)
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)
    store = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    print(f"{tag} up: world={world} device={device} pg={pg_backend} store={store}", flush=True)

    tasks = [(t["backend"], matrix.Cell.from_id(t["cell"])) for t in plan["tasks"]]
    examples = [int(t.get("examples", plan.get("examples", 0))) for t in plan["tasks"]]
    digests: list[Any] = [None] * world
    dist.all_gather_object(digests, matrix.ids_digest([c for _, c in tasks]), group=control)
    if len(set(digests)) != 1:
        print(f"{tag} ranks disagree on the cells: digests {digests}", flush=True)
        return 3
    backends = {spec: load_backend(spec) for spec in dict.fromkeys(b for b, _ in tasks)}
    example = Example.from_dict(plan["example"]) if plan.get("example") else None
    ctx = RankContext(rank, world, device, None)
    out = run_dir / "cells.jsonl"
    for i, (spec, cell) in enumerate(tasks):
        backend = backends[spec]
        print(f"{tag} {time.time():.3f} start {i + 1}/{len(tasks)} {cell.id} [{spec}]", flush=True)
        t0 = time.perf_counter()

        def run_agreed(ex: Example | None) -> CellResult:
            """Run on this rank, then fold every rank's result (all ranks get the verdict)."""
            result = _run_guarded(backend, cell, ctx, ex)
            if device.type == "cuda" and result.status != "error":
                torch.cuda.synchronize()
            _append_line(own, {"i": i, "backend": spec, "cell": cell.id, "t": time.time(),
                               "result": result.serialize()})
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, result.serialize(), group=control)
            return merge(cell, [RankResult.from_dict(g) for g in gathered], time.perf_counter() - t0,
                         spec, ex.serialize() if ex is not None and plan.get("example") is None
                         else plan.get("example"))

        merged = run_agreed(example)
        if merged and examples[i] > 0:
            from harness.examples import search

            ratios = [merged.worst_ratio]

            def run_example(ex: Example) -> CellResult:
                res = run_agreed(ex)
                ratios.append(res.worst_ratio)
                return res

            shrunk = search(cell, examples[i], run_example)
            if shrunk is not None:
                merged = shrunk
            else:
                # the margin that matters is the worst over every example that ran
                merged.worst_ratio = max((r for r in ratios if r is not None), default=None)
        merged.duration_s = round(time.perf_counter() - t0, 4)
        print(f"{tag} {time.time():.3f} done {cell.id} {merged.status} {merged.duration_s:.3f}s", flush=True)
        if rank == 0:
            merged_d = merged.serialize()
            merged_d["launch"] = plan["launch"]
            merged_d["backend"] = spec
            _append_line(out, merged_d, durable=True)
    dist.barrier(group=control)
    dist.destroy_process_group()
    return 0


def external_plan(args: argparse.Namespace, world_size: int) -> dict[str, Any]:
    """A plan built on every rank from a selection, for users who run torchrun themselves.

    Every rank derives the same cells (those of the selection at this world size) and the
    ranks compare a digest of the ids before running anything.
    """
    from harness.commands import _options

    cells = [c for c in matrix.select(args.preset, _options.overrides(args), args.filter_expr)
             if c.world_size == world_size]
    if not cells:
        raise matrix.MatrixError(f"the selection has no cell at world size {world_size}")
    run_dir = Path(args.out).resolve()
    return {"run_dir": str(run_dir), "launch": f"external-ws{world_size}",
            "tasks": [{"backend": args.backend, "cell": c.id} for c in cells],
            "device": args.device, "examples": args.examples, "collective_timeout": args.collective_timeout}


def finish_external(plan: dict[str, Any], argv: list[str]) -> None:
    """Rank 0 of an external launch folds ``cells.jsonl`` into a run record and reports."""
    from harness import compare
    from harness.record import RunRecord, read_cell_lines
    from harness.sweep import _now, environment

    run_dir = Path(plan["run_dir"])
    cells = read_cell_lines(run_dir / "cells.jsonl")
    record = RunRecord(status="complete" if len(cells) == len(plan["tasks"]) else "incomplete",
                       started=plan.get("started", _now()), finished=_now(), duration_s=0.0,
                       command="python -m torch.distributed.run ... -m harness.worker " + " ".join(argv),
                       argv=argv, backend=plan["tasks"][0]["backend"], environment=environment(plan["device"]),
                       selection={"external": True}, tolerance=compare.policy(),
                       world_sizes=[int(os.environ.get("WORLD_SIZE", 1))], cells=cells)
    record.write(run_dir / "results.json")
    try:
        from reports import write_all

        write_all(record.serialize(), run_dir)
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="harness.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", help="launch plan JSON written by the launcher; without it the "
                        "worker builds its plan from the selection options (external torchrun)")
    from harness.commands import _options

    _options.add_selection(parser)  # the same selection options as sweep and list
    parser.add_argument("--backend", default="harness.reference")
    parser.add_argument("--out", default="runs/external")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--examples", type=int, default=0)
    parser.add_argument("--collective-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.plan:
        return run(json.loads(Path(args.plan).read_text()))
    try:
        plan = external_plan(args, int(os.environ.get("WORLD_SIZE", 1)))
        load_backend(args.backend)
    except ValueError as exc:
        print(f"harness.worker: error: {exc}", file=sys.stderr)
        return 2
    plan["started"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    Path(plan["run_dir"]).mkdir(parents=True, exist_ok=True)
    code = run(plan)
    if code == 0 and int(os.environ.get("RANK", 0)) == 0:
        finish_external(plan, argv)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
