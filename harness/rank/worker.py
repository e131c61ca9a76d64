"""What runs inside every rank of a launch: all of the launch's cells, in order.

Started by torchrun with ``-m harness.rank.worker --plan PLAN`` (a ``harness.vocabulary.plan.LaunchPlan``:
the launcher's, or the one ``harness.rank.external`` builds under a user's own torchrun); the
harness's own launches fork the ranks from torchrun's agent instead (``forked``,
``harness.rank.agent``). The ranks rebuild the cells from their ids, agree on a digest of the list, load the backends, build the process groups of the
plan's lanes (``harness.vocabulary.packing``: disjoint sub-groups running cells of smaller world sizes
side by side), say they are ready, then run the cells of each of their lanes in order; after
each cell a lane's ranks exchange their results over the lane's gloo control group and the
lane's first rank appends the merged verdict to the run's result stream (``harness.records.stream``)
at once, so a crash loses at most the cells in flight.

Each rank also appends to its own report file ``ranks/<launch>.rank<N>.jsonl``: ``ready``
(with its process id) once it can run cells (or ``startup_error`` with the traceback when it cannot: the launcher
then knows the launch never started and names the cause), and its own result of every
cell *before* the exchange: when one rank fails while its peers sit in a collective it will
never join, the launcher sees that report, ends the launch and records the cell with every
rank's traceback.

A leaf: it imports the standard library, torch and the cell-level modules only; it knows
nothing of the CLI, the reports or the orchestrator (import-linter checks that).
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import gc
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterable, TextIO

import torch
import torch.distributed as dist

from harness.vocabulary import hook_modes, matrix, modules, weights
from harness.te_tree import tree as te_tree
from harness.vocabulary.backend_specs import EVERY_RANK, preload_of, split_tree
from harness.rank.exchange import all_gather_objects
from harness.rank.loading import foreign_te_modules, load_backend
from harness.vocabulary.shape import Example
from harness.vocabulary.plan import Lane
from harness.vocabulary.plan import LaunchPlan
from harness.records.record import CellResult, RankResult, kind_ratios
from harness.cell import faults, hooks, megatron_gtp, mlp, twin
from harness.cell.faults import peer_lost
from harness.cell import oracle_store
from harness.cell.runner import RankContext, error_info, run_cell, share_oracles
from harness.vocabulary.status import HARNESS_ERROR
from harness.records.stream import ResultStream
from harness.records.fold import merge


def _redirect_output(log_path: Path) -> TextIO:
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


def _place(device: torch.device, local_rank: int) -> None:
    """On the CPU, when this machine's ranks outnumber the cores this process may use (four
    ranks on two cores), bind the rank - and the threads it starts afterwards, gloo's among
    them - to one core, local rank ``i`` to the ``i``-th core modulo their number. Left free,
    the scheduler moves ranks that wake each other in every collective from core to core: a
    reference ``ci`` sweep on two cores spends a third of its CPU time in the kernel then, and
    15-20% longer (docs/performance.md). With a core to spare per rank, or on a GPU, nothing changes."""
    if device.type != "cpu" or not hasattr(os, "sched_setaffinity"):  # Linux only
        return
    cores = sorted(os.sched_getaffinity(0))
    if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > len(cores):
        os.sched_setaffinity(0, {cores[local_rank % len(cores)]})


def _cores() -> str:
    """The cores this rank may run on (for its log), or ``?`` where the OS does not say."""
    return ",".join(map(str, sorted(os.sched_getaffinity(0)))) if hasattr(os, "sched_getaffinity") else "?"


class RankReport:
    """This rank's own report file: one JSON line per event, flushed at once."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path

    def append(self, event: str, **fields: Any) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
            f.flush()


def _run_guarded(backend: Any, cell: matrix.Cell, ctx: RankContext, example: Example | None,
                 tree: te_tree.Tree | None = None) -> RankResult:
    known = len(sys.modules)
    try:
        result = run_cell(backend, cell, ctx, example)
    except Exception as exc:  # run_cell itself broke: a harness bug (or a peer's), still a recorded result
        return RankResult(ctx.rank, HARNESS_ERROR, [], error_info(exc), by_peer=peer_lost(exc))
    if tree is not None and len(sys.modules) != known:
        _prove_tree_origin(result, tree)
    return result


def _prove_tree_origin(result: RankResult, tree: te_tree.Tree) -> None:
    """A cell of a tree run judged the tree only if every TransformerEngine module it
    imported came from the tree (the backend's load proved it for what it imported then);
    otherwise its verdict is about other code: no verdict on the tree (a harness error)."""
    foreign = foreign_te_modules(tree)
    if foreign:
        name, file = foreign[0]
        why = (f"the cell imported {name} from {file}, not from the TE tree {tree.path}: "
               "its verdict would not be about the tree")
        result.status, result.error = HARNESS_ERROR, {"type": "TreeOrigin", "message": why, "traceback": why,
                                                      "phase": "tree origin"}


def _lane_groups(lanes: list[Lane], rank: int, world: int, control: Any, timeout: datetime.timedelta,
                 pg_backend: str) -> dict[tuple[int, ...], tuple[Any, Any]]:
    """(compute group, gloo control group) of each lane this rank is in, in plan order.

    A lane of every rank uses the world. Only a lane's members create its groups (a barrier
    among them, not the world: a dozen world-wide barriers cost a second here). A lane of
    one rank under gloo uses one group for both: with no peer, no collective can pair up
    with a stranded one.
    """
    groups: dict[tuple[int, ...], tuple[Any, Any]] = {}
    for lane in lanes:
        if lane.ranks in groups or rank not in lane.ranks:
            continue
        if len(lane.ranks) == world:
            groups[lane.ranks] = (None, control)
            continue
        ranks = list(lane.ranks)
        compute = dist.new_group(ranks, timeout=timeout, backend=pg_backend, use_local_synchronization=True)
        if len(ranks) == 1 and pg_backend == "gloo":
            groups[lane.ranks] = (compute, compute)
        else:
            groups[lane.ranks] = (compute, dist.new_group(ranks, timeout=timeout, backend="gloo",
                                                          use_local_synchronization=True))
    return groups


def _start(plan: LaunchPlan, rank: int, world: int, local_rank: int, log: TextIO,
           tag: str) -> tuple[torch.device, dict[tuple[int, ...], tuple[Any, Any]],
                              list[tuple[str, matrix.Cell]], tuple[dict[str, Any], dict[str, te_tree.Tree]]]:
    """Process group, lane groups, stack dumps, agreed cells, loaded backends."""
    torch.set_num_threads(plan.threads_per_rank)
    device, pg_backend = _device(plan.device, local_rank)
    _place(device, local_rank)
    timeout = datetime.timedelta(seconds=plan.collective_timeout)
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
    print(f"{tag} {time.time():.3f} up: world={world} device={device} pg={pg_backend} store={store} "
          f"cores={_cores()}", flush=True)
    tasks = [(t.backend, matrix.Cell.from_id(t.cell)) for t in plan.tasks]
    digests = all_gather_objects(matrix.ids_digest([c for _, c in tasks]), control, world)
    if len(set(digests)) != 1:
        raise RuntimeError(f"the ranks disagree on the cells to run: digests {digests}")
    backends = {spec: load_backend(spec) for spec in dict.fromkeys(b for b, _ in tasks)}
    if (why := share_oracles(oracle_store.from_env())) is not None:
        print(f"{tag} {why}", flush=True)
    _te_platform(c for _, c in tasks)
    # the trees whose TE every cell must keep importing from (load_backend proved the load's)
    trees = {spec: te_tree.inspect(path) for spec in backends if (path := split_tree(spec)[1]) is not None}
    # What the imports built lives as long as the rank: moved out of the collector's view,
    # a full collection (the live-gather check runs one per suspect step) scans only what
    # the cells allocate - 0.3 s a collection with TE and triton loaded, a few ms after.
    gc.freeze()
    groups = _lane_groups(plan.lanes_for(world), rank, world, control, timeout, pg_backend)
    return device, groups, tasks, (backends, trees)


def _te_platform(cells: Iterable[matrix.Cell]) -> None:
    """A weight whose own code runs TE's (``weights.WeightKind.imports_te``: Megatron's GTP
    module, a native shard) needs TransformerEngine whatever the backend, and without a GPU TE
    runs only on te-cpu's layer: applied here, at the top of the rank's world, so that the cell
    code below never imports a backend. Where TE cannot be imported, each such cell says so
    (``MegatronUnavailable``) and the import's reason is in this rank's log."""
    if _needs_te_layer(cells):
        try:
            import harness.backends.te_cpu.backend  # noqa: F401  (applies TE's CPU layer and imports TE)
        except ImportError as exc:
            print(f"te-cpu's layer for a weight that imports TE: {type(exc).__name__}: {exc}", flush=True)


def _needs_te_layer(cells: Iterable[matrix.Cell]) -> bool:
    """Whether ``_te_platform`` imports te-cpu for ``cells`` in this process."""
    return (torch.cuda.device_count() == 0 and "transformer_engine.pytorch" not in sys.modules
            and any(weights.KINDS[c.weight].imports_te for c in cells))


def run(plan: LaunchPlan) -> int:
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    run_dir = plan.run_dir
    launch = plan.launch
    log = _redirect_output(run_dir / "logs" / launch / f"rank{rank}.log")
    report = RankReport(run_dir / "ranks" / f"{launch}.rank{rank}.jsonl")
    tag = f"[rank{rank}]"
    stream = ResultStream(run_dir)
    # verdicts of this launch start after here: no cell starts before every rank is up
    since = stream.size()
    try:
        device, groups, tasks, backends = _start(plan, rank, world, local_rank, log, tag)
    except BaseException as exc:  # the launch cannot start: say why, for the launcher's breaker
        report.append("startup_error", error=error_info(exc))
        raise
    # whose code this rank runs, for the launcher to read if it must end the launch under it
    faults.use_board(faults.PhaseBoard(run_dir / "ranks" / f"{launch}.rank{rank}.phase"))
    report.append("ready", pid=os.getpid())  # the launcher watches its CPU time: working, or hung
    for lane in plan.lanes_for(world):
        if rank in lane.ranks:
            _run_lane(plan, lane, groups[lane.ranks], tasks, backends, device, rank, report, stream, tag)
    if plan.exit_when_done:
        # every verdict of this rank's lanes is fsync'ed in the stream; tearing the process
        # group down takes seconds and proves nothing, and peers in other lanes may still run
        log.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        if _FORKED:
            return 0  # torchrun's agent waits for the return value; the process ends with os._exit
        os._exit(0)
    _await_verdicts(stream, plan, since)
    dist.destroy_process_group()
    return 0


def _await_verdicts(stream: ResultStream, plan: LaunchPlan, offset: int, poll_s: float = 0.2) -> None:
    """Wait until every task of the plan has a verdict of this launch in the stream: under a
    user's own launcher (``harness.rank.external``) rank 0 folds the record once the other lanes
    are done. (A lane that dies takes the whole launch with it, so this cannot wait forever
    on a dead peer.)"""
    wanted = {(t.backend, t.cell) for t in plan.tasks}
    seen: set[tuple[str, str]] = set()
    while not wanted <= seen:
        verdicts, offset = stream.read_since(offset)
        seen.update(v.key for v in verdicts if v.launch == plan.launch)
        if not wanted <= seen:
            time.sleep(poll_s)


def _run_lane(plan: LaunchPlan, lane: Lane, groups: tuple[Any, Any], tasks: list[tuple[str, matrix.Cell]],
              backends: tuple[dict[str, Any], dict[str, te_tree.Tree]], device: torch.device, rank: int,
              report: RankReport, stream: ResultStream, tag: str) -> None:
    """This rank's part of one lane: its cells in order, each merged over the lane's ranks
    and appended to the stream by the lane's first rank."""
    group, control = groups
    size = len(lane.ranks)
    examples = [plan.examples_of(t) for t in plan.tasks]
    example = Example.from_dict(plan.example) if plan.example else None
    ctx = RankContext(lane.ranks.index(rank), size, device, group, twin.Twins())
    modules = len(sys.modules)
    loaded, trees = backends
    for i in lane.tasks:
        spec, cell = tasks[i]
        backend = loaded[spec]
        print(f"{tag} {time.time():.3f} start {i + 1}/{len(tasks)} {cell.id} [{spec}] lane {list(lane.ranks)}",
              flush=True)
        t0 = time.perf_counter()

        def run_agreed(ex: Example | None) -> CellResult:
            """Run on this rank, then fold every lane rank's result (all of them get the verdict)."""
            result = _run_guarded(backend, cell, ctx, ex, trees.get(spec))
            if device.type == "cuda" and result.status not in ("error", HARNESS_ERROR):
                torch.cuda.synchronize()
            mine = result.serialize()  # once: written to this rank's report, then sent to the lane
            report.append("result", i=i, backend=spec, cell=cell.id, result=mine)
            gathered = all_gather_objects(mine, control, size)
            return merge(cell, [RankResult.from_dict(g) for g in gathered], time.perf_counter() - t0,
                         spec, ex.serialize() if ex is not None and plan.example is None else plan.example)

        merged = run_agreed(example)
        if merged and examples[i] > 0:
            from harness.cell.shape_search import search

            ratios = [merged.worst_ratio]
            by_kind = kind_ratios(merged.ranks)

            def run_example(ex: Example) -> CellResult:
                res = run_agreed(ex)
                ratios.append(res.worst_ratio)
                for kind, ratio in kind_ratios(res.ranks).items():
                    by_kind[kind] = max(by_kind.get(kind, 0.0), ratio)
                return res

            shrunk = search(cell, examples[i], run_example)
            if shrunk is not None:
                merged = shrunk
            else:
                # the margin that matters is the worst over every example that ran
                merged.worst_ratio = max((r for r in ratios if r is not None), default=None)
                merged.example_ratios = by_kind
        merged.duration_s = round(time.perf_counter() - t0, 4)
        modules = _refreeze_after_imports(modules)
        print(f"{tag} {time.time():.3f} done {cell.id} {merged.status} {merged.duration_s:.3f}s", flush=True)
        if ctx.rank == 0:
            stream.append(merged, spec, plan.launch)


def _refreeze_after_imports(known: int) -> int:
    """After a cell that imported modules (torch loads parts of itself lazily: DTensor's op
    strategies, sympy, ...), collect once and freeze again: what the imports built lives as
    long as the rank, and left in the collector's view it made every live-gather check's
    full collection scan it (measured: 38k objects -> 129k after the first grouped cells,
    0.06 s a collection on an idle core, 0.4 s on a loaded one). Collecting first keeps the
    cells' cyclic garbage collectable. Returns the module count now."""
    if len(sys.modules) != known:
        gc.collect()
        gc.freeze()
    return len(sys.modules)


def preload(argv: list[str]) -> bool:
    """In torchrun's agent, before it forks the ranks of ``argv``'s plan: import what each
    plan backend's import would load anyway whatever the rank, after the environment that
    import sets first (``harness.vocabulary.backend_specs.RANK_PRELOAD``), once instead of once per rank. A
    module that fails to import here is left to the ranks, which then fail or not as they
    would have.

    A backend whose own import is the same in every rank (``Preload.backend``: te-cpu, whose
    import reads the launch's environment only) is imported here too, after the launch's
    environment is in place, on a plan for the CPU only (te-cpu answers ``torch.cuda`` as a GPU
    would: a rank of an ``auto`` plan must choose its device before it imports te-cpu, as it
    does): each rank then skips TE's import (about 0.6 CPU-s). On such a plan, te-cpu's layer
    for a weight whose code runs TE's (``_te_platform``) and the Megatron-Core modules the cells
    import at their first use (``_megatron_imports``) come here too, once for all ranks (not
    te-cpu's layer where a backend of the plan runs a TE tree not loaded here). Returns False
    when a backend's or te-cpu's layer's import failed here: whatever it did before failing is
    in this process, so the ranks must start as new processes (``harness.rank.agent``), which
    import them themselves and fail as they would have. A Megatron module that fails to import
    is left to the ranks, as a preloaded module is."""
    plan = LaunchPlan.read(Path(argv[argv.index("--plan") + 1]))
    specs = list(dict.fromkeys(t.backend for t in plan.tasks))
    cells = _plan_cells(plan)
    preload_backends(specs, sorted({c.hooks for c in cells}))
    if plan.device != "cpu":  # te-cpu answers torch.cuda: a rank must choose its device first
        return True
    for spec in specs:
        entry = preload_of(spec)
        if entry is not None and entry[1].backend:
            try:
                load_backend(spec)
            except BaseException:  # noqa: BLE001 (the ranks import it anew and say why)
                return False
    # the rank's ``_te_platform``, once for all ranks - except where a backend of the plan
    # runs a TE tree this process did not load (a fault planted in TE's code on a tree): its
    # ranks must import TE from the tree, which loading that backend sets up first
    if _needs_te_layer(cells) and not any(split_tree(spec)[1] for spec in specs):
        try:
            import harness.backends.te_cpu.backend  # noqa: F401
        except BaseException:  # noqa: BLE001 (half applied here: the ranks start anew, import it and say why)
            return False
    _import_quietly(_megatron_imports(cells))
    return True


def _plan_cells(plan: LaunchPlan) -> list[matrix.Cell]:
    """The plan's cells (an id that names no cell is left to the rank, which says why)."""
    cells = []
    for task in plan.tasks:
        try:
            cells.append(matrix.Cell.from_id(task.cell))
        except matrix.MatrixError:
            pass
    return cells


def _megatron_imports(cells: Iterable[matrix.Cell]) -> list[str]:
    """Megatron-Core's modules the cells import at their first use, in every rank alike (about
    1 CPU-s a rank): its fine-grained offloading (``hooks.MEGATRON_OFFLOAD``), its GTP weight
    (``megatron_gtp.FIRST_USE_IMPORTS``), its expert layer (``mlp.MEGATRON_IMPORTS``). Only where
    TransformerEngine is loaded already (a TE backend, or te-cpu's layer for a weight that runs
    TE's code): Megatron imports TE, which must come from that layer. Imported only: the
    stand-ins Megatron's code needs at run time (``megatron_shims``) are still applied by the
    cell code that runs it, as in a rank that imported the modules itself."""
    if "transformer_engine.pytorch" not in sys.modules or weights.megatron_missing() is not None:
        return []
    names: list[str] = []
    for c in cells:
        if hook_modes.KINDS[c.hooks].installer == "megatron":
            names.append(hooks.MEGATRON_OFFLOAD)
        if weights.KINDS[c.weight].implementer == "megatron":
            names.extend(megatron_gtp.FIRST_USE_IMPORTS)
        if c.module in modules.LAYERS:
            names.extend((*megatron_gtp.FIRST_USE_IMPORTS, *mlp.MEGATRON_IMPORTS))
    return list(dict.fromkeys(names))


def preload_backends(specs: Iterable[str], hook_modes: Iterable[str] = ()) -> None:
    """``preload`` for the backends ``specs`` (the warm agent and the agent server know them
    before any plan) and the cells' ``hook_modes`` (``hooks.FIRST_USE_IMPORTS``), after the
    environment the backends' preload sets."""
    preloads = [p[1] for spec in dict.fromkeys(specs) if (p := preload_of(spec)) is not None]
    for p in preloads:
        for name, value in p.env:
            os.environ.setdefault(name, value)
    _import_quietly([*EVERY_RANK, *(m for mode in hook_modes for m in hooks.FIRST_USE_IMPORTS.get(mode, ())),
                     *(m for p in preloads for m in p.modules)])


def _import_quietly(names: Iterable[str]) -> None:
    """Import each module once; one that fails is left to the ranks, which import it
    themselves and say why."""
    for name in dict.fromkeys(names):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001
            pass


_FORKED = False
#: how long a forked rank that fails stays before it exits (five of torchrun's 0.1 s polls)
FAILED_EXIT_DELAY_S = 0.5


def restore_signal_defaults() -> None:
    """In a rank forked from torchrun's agent: the handlers a fresh Python process has for
    SIGINT, SIGTERM, SIGHUP and SIGQUIT (the agent's raise an exception, which in a rank would
    surface inside a cell)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def forked(*argv: str) -> int:
    """A rank forked from torchrun's agent (``harness.rank.agent``): ``main`` in a process that
    inherited the agent's imports, signal handlers and thread count.

    - The agent's handlers for SIGTERM, SIGINT, SIGHUP and SIGQUIT raise an exception in the
      agent; here they would raise inside a cell, so the defaults a fresh Python process has
      come back.
    - A non-zero code becomes the exit status (a function entrypoint's return value is not one).
    - A rank that fails exits ``FAILED_EXIT_DELAY_S`` later. torchrun's agent names only the
      first failed rank it finds among the function entrypoints that ended, in rank order:
      a peer that fails *because* a rank was killed (its collective broke) would otherwise
      often end within the same poll and be named instead of the killed rank, whose signal
      is what the launcher blames (``harness.launcher.forensics.torchrun_failure``).
    """
    global _FORKED
    _FORKED = True
    restore_signal_defaults()
    try:
        code = main(list(argv))
    except BaseException:
        time.sleep(FAILED_EXIT_DELAY_S)
        raise
    if code:
        time.sleep(FAILED_EXIT_DELAY_S)
        sys.exit(code)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness.rank.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="launch plan JSON (written by the launcher or by "
                        "harness.rank.external; under your own torchrun use -m harness.rank.external)")
    args = parser.parse_args(argv)
    return run(LaunchPlan.read(Path(args.plan)))


if __name__ == "__main__":
    raise SystemExit(main())
