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

#: what any cell may take beyond its predicted work without using the CPU: a GPU's or a
#: collective's set-up, a loaded machine's scheduling. The slowest reference cell of a CPU
#: ``ci`` sweep on this project's 2-core machine under a load of 10 took 6.6 s (the first of
#: its launch: imports); a lazy import of torch's under the suite's load, 15.8 s - using the
#: CPU all along, which counts as progress (``BUSY_SHARE``).
HANG_FLOOR_S = 10.0
#: how many times its predicted work a cell may take. The model is fitted for ratios, not
#: seconds: over the reference's and te-cpu's ``ci`` sweeps a cell took 0.4-0.6 times its
#: prediction (median) and at most 11 times (a launch's first cells aside).
HANG_FACTOR = 50.0
#: how many times its bound a lane may go without a result while one of its ranks keeps using
#: the CPU (working, however slowly, on a loaded machine): past that it is a rank that spins
HANG_CAP_FACTOR = 10.0
#: the share of a core above which a rank counts as working: one waiting in a collective or
#: asleep used 0.3% here, one working on a 2-core machine under a load of 10 about 20%
BUSY_SHARE = 0.05


def run_seconds(cell: Cell, example: Example | None = None) -> float:
    """Predicted seconds of one run of ``cell`` on each of its ranks, with ``example``'s shapes
    (None: the default ones the weights were fitted on): ``cell_cost`` spread over its ranks,
    scaled by the example's GEMM work (``shape.size_factor``); Megatron's layer runs
    ``layers`` layers for ``iterations`` iterations, which the packing weights, alike for all
    such cells, leave out."""
    kind = modules.KINDS[cell.module]
    scale = shape.size_factor(example) if example is not None else 1.0
    return cell_cost(cell) / cell.world_size * cell.layers * kind.iterations * scale


def hang_bound(cell: Cell, example: Example | None = None) -> float:
    """Seconds without progress (nothing reported, no rank using the CPU) after which one run
    of ``cell`` with ``example``'s shapes has hung: ``HANG_FLOOR_S + HANG_FACTOR *
    run_seconds``. A ``ci`` cell gets 12-30 s."""
    return HANG_FLOOR_S + HANG_FACTOR * run_seconds(cell, example)
