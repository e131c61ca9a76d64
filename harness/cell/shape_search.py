"""Extra shape/split examples per cell, drawn and shrunk by hypothesis, in lockstep.

Every rank runs the same hypothesis search: the draws are derandomized (a fixed seed per
cell) and each example's verdict is agreed over the control group before hypothesis sees
it, so all ranks draw, fail and shrink identically and their collectives stay matched.
"""

from __future__ import annotations

from typing import Callable

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from harness.vocabulary.shape import DRAWN_MAX, Example
from harness.vocabulary.matrix import Cell
from harness.records.record import CellResult
from harness.vocabulary.weights import shardable


def strategy(cell: Cell) -> st.SearchStrategy[Example]:
    """Small shapes (including one-row and empty inputs) the cell's world size can shard."""
    outs = [o for o in range(1, DRAWN_MAX.out_features + 1) if shardable(cell.weight, o, cell.world_size, cell.recipe)]
    return st.builds(
        Example,
        in_features=st.integers(1, DRAWN_MAX.in_features),
        out_features=st.sampled_from(outs),
        rows=st.integers(0, DRAWN_MAX.rows),
        salt=st.integers(0, 2**16),
    )


def search(cell: Cell, examples: int, run: Callable[[Example], CellResult]) -> CellResult | None:
    """Run ``examples`` drawn examples; return the shrunk failing result, or None.

    ``run`` must return the *merged* (all-rank) verdict of one example.
    """
    failures: list[CellResult] = []

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              phases=(Phase.generate, Phase.shrink), print_blob=False)
    @given(strategy(cell))
    def probe(example: Example) -> None:
        res = run(example)
        if not res:
            failures.append(res)
            raise AssertionError(res.first_failure)

    try:
        probe()
    except AssertionError:
        # hypothesis replays the minimal failing example last
        last = failures[-1]
        if last.example is not None:
            last.example = {**last.example, "shrunk": True}
        return last
    return None
