"""Sub-group packing: the cells of every world size k <= W share one launch of W ranks.

A launch of width W runs its cells on disjoint sub-groups ("lanes") of k consecutive ranks,
W // k of them at a time. Lanes come in phases of decreasing k (W first, then W/2, ...), so
when k divides W the ranks of a lane always come out of the previous phase together: no
rank waits in a collective for a peer still busy elsewhere. Within the launch a rank only
ever talks to its lane's peers (its own process groups), so a fault stays in its lane.

Cells go to lanes by longest-processing-time first over the ranks' expected finish times
(``harness.vocabulary.cost``), across phases - a cell together with the cells that differ from it
in their hook mode alone, which share one hooks-off twin (``harness.cell.twin.Twins``: a rank
keeps a twin for the lane's later cells). Each lane keeps its cells in selection order, but
that a hooks-off cell runs before the hooked cells that take it as their twin.
"""

from __future__ import annotations

from typing import Sequence

from harness.vocabulary import hook_modes
from harness.vocabulary.cost import cell_cost
from harness.vocabulary.plan import Lane
from harness.vocabulary.matrix import Cell


def launch_groups(cells: Sequence[Cell], packing: bool = True, slots: int = 0) -> list[tuple[int, list[int]]]:
    """Which cells share a launch, and its width: ``[(W, [cell index, ...]), ...]``.

    Without packing: one launch per world size, ascending (W = k). With packing: the largest
    world size left sets W (raised to the largest multiple of it within ``slots``, e.g. the
    GPUs of the node) and takes every cell whose world size divides W; repeat. A cell whose
    hook installer runs collectives over every rank of the job (``HookMode.spans_world``)
    shares a launch only where its world is the launch's (its lane is then every rank);
    otherwise it runs in a launch of its own world size with the other such cells.
    """
    sizes = sorted({c.world_size for c in cells})
    if not packing:
        return [(k, [i for i, c in enumerate(cells) if c.world_size == k]) for k in sizes]
    out = []
    solo: dict[int, list[int]] = {}
    while sizes:
        top = sizes[-1]
        width = max(top, slots // top * top)
        members = [k for k in sizes if width % k == 0]
        group = []
        for i, c in enumerate(cells):
            if c.world_size in members:
                if c.world_size != width and hook_modes.KINDS[c.hooks].spans_world:
                    solo.setdefault(c.world_size, []).append(i)
                else:
                    group.append(i)
        if group:
            out.append((width, group))
        sizes = [k for k in sizes if k not in members]
    return out + [(k, solo[k]) for k in sorted(solo, reverse=True)]


def pack(cells: Sequence[Cell], width: int, backends: Sequence[str] | None = None) -> list[Lane]:
    """Assign ``cells`` (world sizes dividing ``width``) to lanes of one launch of ``width`` ranks.
    ``backends``: each cell's backend, when they differ (a twin is one backend's: cells of
    different backends never share one, and are not held together).

    Returns the non-empty lanes in run order: phases by decreasing world size, lanes of a
    phase by their first rank.

    Raises:
        ValueError: a cell's world size does not divide ``width``.
    """
    bad = sorted({c.world_size for c in cells if width % c.world_size})
    if bad:
        raise ValueError(f"world sizes {bad} do not divide the launch width {width}")
    finish = [0.0] * width  # each rank's expected busy time so far
    lanes: list[Lane] = []
    for k in sorted({c.world_size for c in cells}, reverse=True):
        phase = [Lane(tuple(range(j, j + k))) for j in range(0, width, k)]
        ends = [max(finish[r] for r in lane.ranks) for lane in phase]
        twins: dict[tuple[str, str], list[int]] = {}  # (backend, twin id) -> its cells, in order
        for i, c in enumerate(cells):
            if c.world_size == k:
                twins.setdefault((backends[i] if backends else "", c.twin_id), []).append(i)
        cost = {t: sum(cell_cost(cells[i]) for i in members) for t, members in twins.items()}
        for t in sorted(twins, key=lambda t: (-cost[t], twins[t][0])):
            j = min(range(len(phase)), key=lambda j: (ends[j], j))
            phase[j].tasks.extend(twins[t])
            ends[j] += cost[t] / k
        first = {i: members[0] for members in twins.values() for i in members}
        for lane, end in zip(phase, ends):
            lane.tasks.sort(key=lambda i: (first[i], cells[i].hooks != "off", i))
            for r in lane.ranks:
                finish[r] = end
        lanes.extend(lane for lane in phase if lane.tasks)
    return lanes
