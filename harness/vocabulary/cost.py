"""How long a cell is expected to take, in rank-seconds: what packing and sharding balance.

Only ratios matter (which lane or shard is lighter), so the model is small and read from
what a cell does: every microbatch runs a forward and a backward of ``num_gemms`` GEMMs
(a checkpoint hook runs the forward twice), and a cell of world size k occupies k ranks.
The weights were fitted by eye to the per-cell ``duration_s`` of a CPU ``ci`` sweep; a
wrong weight costs balance, never correctness.
"""

from __future__ import annotations

from harness.vocabulary.matrix import Cell

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
