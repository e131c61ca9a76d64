"""Objects exchanged by a lane's ranks over their gloo control group, in one collective.

Why not ``torch.distributed.all_gather_object``: it takes two collectives per call (every
rank's size, then the data padded to the largest), and the ranks exchange their result after
every cell. A gloo collective costs far more than its bytes on a loaded machine - each one is
a hand-off between the caller's thread, the group's worker thread and gloo's socket loop,
mostly the kernel's time (``python benchmarks/bench_exchange.py`` measures both ways side by
side; docs/performance.md has the figures). Here every rank sends a fixed-size slot - its
payload's length and the payload - and only when a payload does not fit does a second
collective carry the rest, sized by the largest. A rank's result is a few KiB, so the second
one is rare.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

import torch

from harness.cell.gtp import ALL_GATHER  # under whichever name this torch has it

#: bytes each rank sends in the first (often only) collective: the length header and the start
#: of the payload
SLOT = 16 * 1024
_HEADER = struct.Struct("<q")
#: the pickle protocol of every payload (every rank runs the same Python)
PROTOCOL = pickle.HIGHEST_PROTOCOL


def all_gather_objects(obj: Any, group: Any, size: int) -> list[Any]:
    """Every rank's ``obj`` of ``group`` (``size`` ranks), in rank order (each picklable)."""
    data = pickle.dumps(obj, protocol=PROTOCOL)
    first = SLOT - _HEADER.size
    slot = torch.zeros(SLOT, dtype=torch.uint8)
    head = _HEADER.pack(len(data)) + data[:first]
    slot[:len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    slots = torch.empty(size * SLOT, dtype=torch.uint8)
    ALL_GATHER(slots, slot, group=group)
    raw = slots.numpy().tobytes()
    lengths = [_HEADER.unpack_from(raw, i * SLOT)[0] for i in range(size)]
    parts = [raw[i * SLOT + _HEADER.size:i * SLOT + _HEADER.size + min(n, first)] for i, n in enumerate(lengths)]
    longest = max(lengths) - first
    if longest > 0:  # some payload did not fit: the rest of each, padded to the longest rest
        rest = torch.zeros(longest, dtype=torch.uint8)
        if len(data) > first:
            rest[:len(data) - first] = torch.frombuffer(bytearray(data[first:]), dtype=torch.uint8)
        rests = torch.empty(size * longest, dtype=torch.uint8)
        ALL_GATHER(rests, rest, group=group)
        tail = rests.numpy().tobytes()
        parts = [p + tail[i * longest:i * longest + max(n - first, 0)] for i, (p, n) in enumerate(zip(parts, lengths))]
    return [pickle.loads(p) for p in parts]
