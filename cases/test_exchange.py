"""The ranks' exchange of objects (``harness.rank.exchange``) over a real 3-rank gloo group:
every rank gets what ``torch.distributed.all_gather_object`` gives, in one collective while
every payload fits the slot and in two when one does not (on one rank, or on all)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from fixtures.process_group import run_torchrun

SCRIPT = textwrap.dedent(r'''
    import json
    import pickle

    import torch.distributed as dist

    from harness.rank import exchange


    def main():
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        calls = []
        real = exchange.ALL_GATHER
        exchange.ALL_GATHER = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
        # what each rank sends, per case: sizes on both sides of the slot, an empty payload, and
        # payloads that fill the slot exactly (its length header included) or pass it by a byte
        room = exchange.SLOT - 8
        exact = next(b"x" * n for n in range(room, 0, -1) if len(pickle.dumps(b"x" * n, protocol=exchange.PROTOCOL)) == room)
        cases = {
            "small": lambda r: {"rank": r, "checks": [f"c{i}" for i in range(r * 7)]},
            "exact": lambda r: exact,
            "a-byte-over": lambda r: exact + b"x" * (r == 2),
            "one-large": lambda r: "y" * (40_000 if r == 1 else 5),
            "all-large": lambda r: [r] * (20_000 + 3_000 * r),
            "none": lambda r: None,
        }
        out = {}
        for name, make in cases.items():
            calls.clear()
            got = exchange.all_gather_objects(make(rank), dist.group.WORLD, size)
            want = [None] * size
            dist.all_gather_object(want, make(rank))
            out[name] = {"equal": got == want == [make(r) for r in range(size)], "collectives": len(calls)}
        if rank == 0:
            print(json.dumps(out))
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
''')


def test_exchange_equals_all_gather_object_in_one_collective_when_it_fits(tmp_path: Path):
    script = tmp_path / "exchange_ranks.py"
    script.write_text(SCRIPT)
    result = run_torchrun(script, 3, forked=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    (out,) = result.records
    assert all(case["equal"] for case in out.values()), out
    assert {name: case["collectives"] for name, case in out.items()} == {
        "small": 1, "exact": 1, "a-byte-over": 2, "one-large": 2, "all-large": 2, "none": 1}, out
