"""A real two-rank gloo run: distributed-weight steps end to end against unsharded math.

The in-process tests run the GTP weight at world size 1, where its collectives are
copies. This launches ``python -m torch.distributed.run --standalone --nproc-per-node 2``
on a script written to ``tmp_path``; each rank builds the reference ``GroupedLinear``
(and one ``Linear`` and one ``ops.GroupedLinear``), injects GTP weights over the gloo
world, gives them DDP-style ``main_grad`` shards, runs forward/backward on its own inputs
and checks against a float64 computation without any sharding (mean over ranks of the
per-rank weight gradients, cut to the rank's shard; padding rows keep their start). Each
rank writes its results as JSON to a file in the test's temporary directory (two ranks'
stdout lines can interleave) and the script exits non-zero on any mismatch.

Covered at ws=2: divisible rows (6) and tail padding (5 rows: rank 1 holds 2 real rows
and 1 padding row); fused, unfused with ``main_grad`` and unfused without; fp32 and bf16;
no hooks, identity hooks, ``save_on_cpu`` and checkpoint; the padding-only world (1 row
over 2 ranks) that ``inject_gtp`` must refuse; and, as a negative control, the pre-fix
``Linear`` under ``save_on_cpu``, whose plain backward branch multiplies by the shard and
fails.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from fixtures.process_group import run_torchrun

WORLD_SIZE = 2
TIMEOUT_S = 120.0

SCRIPT = textwrap.dedent(r'''
    """Per-rank script of cases/test_multiprocess.py (written to a temporary file)."""
    import json
    import os
    import sys
    import traceback
    from pathlib import Path

    import torch
    import torch.distributed as dist

    import harness.backends.reference as reference
    import harness.backends.reference.prefix as prefix
    from harness.cell import compare
    from harness.cell.gtp import inject_gtp
    from harness.cell.oracle import Reference
    from fixtures.hook_modes import forward_executions, forward_under
    from fixtures.modules import build, caller, load_full, weight_names, bias_names
    from fixtures.tensors import DTYPES, grouped_linear_f64, seeded

    IN_F = 4
    # (name, kind, out_features, fused, main_grad, dtype, hook mode)
    CONFIGS = [
        ("grouped-even-fused-fp32", "grouped_linear", 6, True, True, "fp32", "off"),
        ("grouped-pad-fused-bf16", "grouped_linear", 5, True, True, "bf16", "off"),
        ("grouped-pad-unfused-nomaingrad-fp32", "grouped_linear", 5, False, False, "fp32", "off"),
        ("grouped-even-unfused-maingrad-bf16-save_on_cpu", "grouped_linear", 6, False, True, "bf16", "save_on_cpu"),
        ("grouped-pad-fused-fp32-checkpoint", "grouped_linear", 5, True, True, "fp32", "checkpoint"),
        ("linear-pad-fused-fp32-save_on_cpu", "linear", 5, True, True, "fp32", "save_on_cpu"),
        ("ops-pad-fused-fp32-identity", "ops_grouped_linear", 5, True, True, "fp32", "identity"),
    ]
    SPLITS = {  # per rank; zero-row groups and different row counts per rank
        "grouped_linear": [[2, 0, 3], [1, 4, 1]],
        "ops_grouped_linear": [[0, 3, 2], [4, 0, 2]],
        "linear": [[5], [6]],
    }


    def rank_inputs(kind, r, out_f, dtype):
        splits = SPLITS[kind][r]
        rows = sum(splits)
        return splits, seeded((rows, IN_F), dtype, 1000 + r), seeded((rows, out_f), dtype, 2000 + r)


    def check(checks, name, actual, ref, dtype_name):
        c = compare.compare_tensor(name, actual, ref, dtype_name)
        checks.append({"name": name, "ok": c.ok, "ratio": c.ratio, "message": c.message})


    def flag(checks, name, ok, message=""):
        checks.append({"name": name, "ok": bool(ok), "ratio": None, "message": None if ok else message})


    def run_config(rank, ws, cfg):
        name, kind, out_f, fused, has_main_grad, dtype_name, mode = cfg
        dtype = DTYPES[dtype_name]
        n = len(SPLITS[kind][0])
        W = [seeded((out_f, IN_F), dtype, 10 + i, 0.5) for i in range(n)]
        B = [seeded((out_f,), dtype, 20 + i, 0.5) for i in range(n)]
        module = build(reference, kind, n, IN_F, out_f, bias=True, dtype=dtype, fused=fused, delay=False)
        load_full(module, W, B)
        gtp = inject_gtp(module)
        s, padded = gtp.rows_per_rank, gtp.padded_rows
        starts = {}
        for wname in weight_names(module):
            p = getattr(module, wname)
            if has_main_grad:
                g = torch.Generator().manual_seed(300 + rank)  # sharded: a per-rank start
                p.main_grad = torch.randn(tuple(p.shape), generator=g, dtype=torch.float32)
                p.grad_added_to_main_grad = False
                starts[wname] = p.main_grad.clone()
        splits, x, dy = rank_inputs(kind, rank, out_f, dtype)
        xin = x.clone().requires_grad_()
        out = forward_under(mode, caller(module, kind, splits), xin)
        out.backward(dy)

        checks = []
        local = grouped_linear_f64(x, W, B, splits, dy)
        check(checks, "output", out.detach(), local.y, dtype_name)
        check(checks, "input_grad", xin.grad, local.dx, dtype_name)
        for i, bname in enumerate(bias_names(module)):
            check(checks, f"{bname}.grad", getattr(module, bname).grad, local.db[i], dtype_name)

        # Unsharded float64 weight gradient: mean over ranks of dY_r^T X_r, then this
        # rank's rows of the zero-padded result.
        per_rank = [grouped_linear_f64(x_, W, B, sp, dy_) for sp, x_, dy_ in
                    (rank_inputs(kind, r, out_f, dtype) for r in range(ws))]
        reduction = max(sum(SPLITS[kind][r]) for r in range(ws))
        for i, wname in enumerate(weight_names(module)):
            p = getattr(module, wname)
            value = sum(m.dw[i].value for m in per_rank) / ws
            mag = sum(m.dw[i].magnitude for m in per_rank) / ws
            pad = padded - out_f
            value = torch.nn.functional.pad(value, (0, 0, 0, pad))[rank * s:(rank + 1) * s]
            mag = torch.nn.functional.pad(mag, (0, 0, 0, pad))[rank * s:(rank + 1) * s]
            # roundings as harness.cell.oracle counts them for 1 microbatch: GEMM, 1/N scale,
            # one per rank in the reduction, the final add
            roundings = 1 + ws + 2
            if has_main_grad:
                start = starts[wname].to(torch.float64)
                ref = Reference(value + start, mag + start.abs(), reduction, roundings)
                check(checks, f"{wname}.main_grad", p.main_grad, ref, "fp32")
                real = max(0, min(s, out_f - rank * s))
                flag(checks, f"{wname}.padding_rows_keep_start",
                     torch.equal(p.main_grad[real:], starts[wname][real:]), "padding rows changed")
                flag(checks, f"{wname}.grad_added_to_main_grad", p.grad_added_to_main_grad is True,
                     f"flag is {p.grad_added_to_main_grad}")
                flag(checks, f"{wname}.dummy_grad", p.grad is not None and p.grad.shape == p.shape
                     and not p.grad.any(), "autograd did not get a zero dummy of the shard shape")
            else:
                ref = Reference(value, mag, reduction, roundings)
                ok_shape = p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == dtype
                flag(checks, f"{wname}.grad_shape_dtype", ok_shape, f"grad is {p.grad!r}")
                check(checks, f"{wname}.grad", p.grad, ref, dtype_name)
        counts = {k: gtp.log.count(k) for k in ("materialize_forward", "materialize_backward", "finalize")}
        want = {"materialize_forward": forward_executions(mode), "materialize_backward": 1, "finalize": 1}
        flag(checks, "protocol_counts", counts == want and gtp.log.count("finalize", 0) == 1,
             f"counts {counts}, expected {want}")
        want_dtype = "float32" if has_main_grad else str(dtype).replace("torch.", "")
        flag(checks, "finalize_dtypes", gtp.log.finalize_dtypes() == [want_dtype] * n,
             f"finalize dtypes {gtp.log.finalize_dtypes()}")
        return {"config": name, "padded_rows": padded, "rows_per_rank": s, "checks": checks}


    def padding_only(ws):
        module = build(reference, "grouped_linear", 2, IN_F, 1, bias=False, dtype=torch.float32,
                       fused=True, delay=False)
        try:
            inject_gtp(module)
        except ValueError as exc:
            return {"raised": "ValueError", "message": str(exc)}
        return {"raised": None, "message": ""}


    def prefix_control():
        """Pre-fix Linear under save_on_cpu at ws=2: the plain branch uses the shard."""
        module = build(prefix, "linear", 1, IN_F, 6, bias=False, dtype=torch.float32, fused=False, delay=False)
        load_full(module, [seeded((6, IN_F), torch.float32, 10)], [])
        gtp = inject_gtp(module)
        x = seeded((5, IN_F), torch.float32, 1000).requires_grad_()
        try:
            forward_under("save_on_cpu", module, x).sum().backward()
        except Exception as exc:
            return {"raised": type(exc).__name__, "message": str(exc).splitlines()[0],
                    "finalize": gtp.log.count("finalize")}
        return {"raised": None, "message": "", "finalize": gtp.log.count("finalize")}


    def emit(record):
        """One JSON file per rank (stdout lines of two ranks can interleave)."""
        out = Path(sys.argv[1]) / f"rank{record['rank']}.json"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, out)
        print(f"rank {record['rank']} ok={record['ok']}", flush=True)


    def main():
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        rank, ws = dist.get_rank(), dist.get_world_size()
        record = {"rank": rank, "world_size": ws, "configs": [], "error": None}
        try:
            for cfg in CONFIGS:
                record["configs"].append(run_config(rank, ws, cfg))
            record["padding_only"] = padding_only(ws)
            record["prefix_control"] = prefix_control()
        except Exception:
            # Report and leave at once: the other rank may be inside a collective that
            # this one will never join; torchrun tears it down when this rank exits.
            record["error"] = traceback.format_exc()
            record["ok"] = False
            emit(record)
            sys.exit(1)
        ok = all(c["ok"] for r in record["configs"] for c in r["checks"])
        ok = ok and record["padding_only"]["raised"] == "ValueError"
        record["ok"] = ok
        emit(record)
        dist.barrier()
        # leave without tearing gloo down (as the harness's ranks do): under load its
        # transport threads sometimes abort the exit ("terminate called without an active
        # exception") after every record was written
        sys.stdout.flush()
        os._exit(0 if ok else 1)


    if __name__ == "__main__":
        main()
''')


def _failed_checks(rec: dict) -> list:
    return [(c["config"], [k for k in c["checks"] if not k["ok"]]) for c in rec.get("configs", [])
            if any(not k["ok"] for k in c["checks"])]


def test_two_rank_gloo_end_to_end(tmp_path: Path):
    """One 2-rank gloo launch (torchrun startup dominates the cost, so everything shares it).

    Asserts, on both ranks:

    1. every config's outputs, input grads, bias grads, ``main_grad`` shards (padding rows
       untouched), ``.grad`` shards, flags, protocol counts and finalize dtypes match the
       unsharded float64 math, and the launch exits 0;
    2. 5 rows over 2 ranks pad to 6 (3 rows each: rank 1 holds 2 real rows + 1 padding),
       6 rows need no padding;
    3. one output row over 2 ranks (rank 1 would hold only padding) is refused by
       ``inject_gtp`` with ValueError on every rank, before any collective;
    4. negative control: the pre-fix ``Linear`` under ``save_on_cpu`` takes the plain
       backward branch, multiplies the full upstream gradient by its 3-row shard and fails
       with a RuntimeError; finalize never runs.

    Why: only a real multi-rank run exercises the all-gather / reduce-scatter, the 1/N
    pre-scale and the tail padding that ws=1 turns into copies; the control shows the run
    can tell the fix from the regression (at ws=1 the pre-fix Linear's numbers are right).
    """
    script = tmp_path / "gtp_two_ranks.py"
    script.write_text(SCRIPT)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = run_torchrun(script, WORLD_SIZE, timeout_s=TIMEOUT_S, args=(str(out_dir),))
    by_rank = {}
    for f in sorted(out_dir.glob("rank*.json")):
        rec = json.loads(f.read_text())
        by_rank[rec["rank"]] = rec
    context = f"rc={result.returncode}\nstdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    assert sorted(by_rank) == [0, 1], context

    for rank, rec in by_rank.items():
        # 1. numerics and protocol
        assert rec["error"] is None, f"rank {rank} raised:\n{rec['error']}"
        assert rec["world_size"] == WORLD_SIZE
        assert not _failed_checks(rec), f"rank {rank}: {_failed_checks(rec)}"
        assert len(rec["configs"]) == 7
        for cfg in rec["configs"]:
            # output, input grad, >= one bias and one weight check, counts, dtypes
            assert len(cfg["checks"]) >= 6, cfg
        # 2. padding layout
        layouts = {c["config"]: (c["padded_rows"], c["rows_per_rank"]) for c in rec["configs"]}
        assert layouts["grouped-pad-fused-bf16"] == (6, 3)
        assert layouts["grouped-even-fused-fp32"] == (6, 3)
        assert layouts["linear-pad-fused-fp32-save_on_cpu"] == (6, 3)
        # 3. padding-only world
        assert rec["padding_only"]["raised"] == "ValueError"
        assert "rank 1 would hold only padding" in rec["padding_only"]["message"]
        # 4. pre-fix control
        ctl = rec["prefix_control"]
        assert ctl["raised"] == "RuntimeError", ctl
        assert "cannot be multiplied" in ctl["message"], ctl
        assert ctl["finalize"] == 0
    assert result.returncode == 0, context
