"""How long a cell is expected to take, in rank-seconds: what packing and sharding balance.

Only ratios matter (which lane or shard is lighter), so the model is small and read from
what a cell does: every microbatch runs a forward and a backward of ``num_gemms`` GEMMs
(a checkpoint hook runs the forward twice), and a cell of world size k occupies k ranks.
The weights were fitted by eye to the per-cell ``duration_s`` of a CPU ``ci`` sweep; a
wrong weight costs balance, never correctness.
"""

from __future__ import annotations

from harness.vocabulary import modules, shape
from harness.vocabulary.matrix import Cell
from harness.vocabulary.shape import Example

#: fixed cost of a cell (build, inject, oracle, checks, the result exchange), seconds
BASE_S = 0.02
#: one GEMM of one microbatch's forward + backward, seconds
GEMM_S = 0.004


def cell_cost(cell: Cell) -> float:
    """Expected rank-seconds of ``cell`` (its duration times the ranks it occupies)."""
    gemms = cell.num_gemms if "grouped" in cell.module else 1
    forwards = 2 if cell.hooks == "checkpoint" else 1
    work = cell.microbatches * gemms * (forwards + 2)
    return cell.world_size * (BASE_S + GEMM_S * work)


# ---- how long a cell may take before it has hung (docs/runner-faults.md#how-long-a-cell-may-take)

#: what any cell may go without a result while none of its ranks uses the CPU (a working rank
#: is progress: ``BUSY_SHARE``): a GPU's or a collective's set-up, a loaded machine's scheduling.
#: Five of the launcher's CPU samples (one a second) in a row, every rank idle.
HANG_FLOOR_S = 5.0
#: how many times its predicted work a cell may take on top of the floor. The model is fitted
#: for ratios, not seconds (``benchmarks/bench_faults.py`` measures how far a cell's time
#: strays from it); the work itself uses the CPU, which is progress, so this covers what the
#: CPU samples cannot see.
HANG_FACTOR = 20.0
#: how many times its bound a lane may go without a result while one of its ranks keeps using
#: the CPU (working, however slowly, on a loaded machine): past that it is a rank that spins
HANG_CAP_FACTOR = 10.0
#: where the launcher cannot read the ranks' CPU time (no ``/proc``) the bound must cover the
#: cell's whole run, a launch's first imports and a loaded machine included: this many times more
BLIND_FACTOR = 6.0
#: the share of a core above which a rank counts as working (``benchmarks/bench_faults.py``
#: measures an idle rank's and a working one's)
BUSY_SHARE = 0.05


def run_seconds(cell: Cell, example: Example | None = None) -> float:
    """Predicted seconds of one run of ``cell`` on each of its ranks, with ``example``'s shapes
    (None: the default ones the weights were fitted on) as the cell fits them (``shape.fitted``:
    a recipe's alignment, the ``blocks`` shape's spans): ``cell_cost`` spread over its ranks,
    scaled by the GEMM work of those shapes (``shape.size_factor``); Megatron's layer runs
    ``layers`` layers for ``iterations`` iterations, which the packing weights, alike for all
    such cells, leave out."""
    kind = modules.KINDS[cell.module]
    fit = shape.fitted(example or Example(), cell.module, cell.bias, cell.recipe, cell.num_gemms, cell.shape)
    return cell_cost(cell) / cell.world_size * cell.layers * kind.iterations * shape.size_factor(fit)


def hang_bound(cell: Cell, example: Example | None = None, sees_cpu: bool = True) -> float:
    """Seconds without progress (nothing reported, no rank using the CPU) after which one run
    of ``cell`` with ``example``'s shapes has hung: ``HANG_FLOOR_S + HANG_FACTOR *
    run_seconds``, ``BLIND_FACTOR`` times that where the launcher cannot see the ranks' CPU
    time (``sees_cpu`` False)."""
    bound = HANG_FLOOR_S + HANG_FACTOR * run_seconds(cell, example)
    return bound if sees_cpu else BLIND_FACTOR * bound
