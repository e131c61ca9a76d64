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
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness import matrix
from harness.backends import load_backend
from harness.inputs import Example
from harness.record import CellResult, RankResult
from harness.runner import RankContext, run_cell
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
        return RankResult(ctx.rank, "error", [], {
            "type": f"HarnessBug({type(exc).__name__})", "message": str(exc).splitlines()[0] if str(exc) else "",
            "traceback": traceback.format_exc()})


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
    print(f"{tag} up: world={world} device={device} pg={pg_backend}", flush=True)

    tasks = [(t["backend"], matrix.Cell.from_id(t["cell"])) for t in plan["tasks"]]
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
        if merged and int(plan.get("examples", 0)) > 0:
            from harness.examples import search

            shrunk = search(cell, int(plan["examples"]), run_agreed)
            if shrunk is not None:
                merged = shrunk
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="launch plan JSON written by the launcher")
    args = parser.parse_args(argv)
    return run(json.loads(Path(args.plan).read_text()))


if __name__ == "__main__":
    raise SystemExit(main())
