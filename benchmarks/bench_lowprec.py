"""Cost of a low-precision TE step on te-cpu against its non-quantized twin, and mmaemu's GEMM.

Run as a script (it imports ``harness.backends.te_cpu.backend``, which patches torch in this process):

    python benchmarks/bench_lowprec.py [--sizes 32,64,256] [--steps 20] [--out FILE]

For each size H, TE 2.20.2's ``Linear(H, H, bias=True)`` in bf16 on an ``H x H`` input:
forward + backward under each recipe te-cpu builds (``te.autocast``), and without one (the
twin), median wall time per step over ``--steps`` steps after two warm-up steps, one torch thread
(as a worker rank runs). Then the
per-tensor FP8 GEMM of the same size through te-cpu's quantized GEMM and through mmaemu
(``hopper`` profile, ``splitk=1``: mmaemu cannot decide cuBLAS's split for these shapes),
when mmaemu is installed. Results go to ``benchmarks/lowprec-<date>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import machine  # noqa: E402

RECIPES = ("delayed", "current", "mxfp8", "blockwise", "nvfp4")


def _median_ms(fn: Callable[[], None], steps: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench_steps(h: int, steps: int) -> dict[str, float]:
    import torch

    import harness.backends.te_cpu.backend  # noqa: F401  (applies the CPU layer)
    from harness.backends.te_cpu import device
    from transformer_engine.common import recipe as R
    te = sys.modules["transformer_engine.pytorch"]
    make = {"delayed": R.DelayedScaling, "current": R.Float8CurrentScaling, "mxfp8": R.MXFP8BlockScaling,
            "blockwise": R.Float8BlockScaling,
            "nvfp4": lambda: R.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True)}
    out: dict[str, float] = {}
    for name in ("none", *RECIPES):
        device.present(device.capability_for(name))
        torch.manual_seed(0)
        m = te.Linear(h, h, bias=True, params_dtype=torch.bfloat16, device="cpu")
        x = torch.randn(h, h, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(h, h, dtype=torch.bfloat16)

        def step() -> None:
            if name == "none":
                y = m(x)
            else:
                with te.autocast(enabled=True, recipe=make[name]()):
                    y = m(x)
            y.backward(dy)

        out[name] = _median_ms(step, steps)
    device.present(device.HOPPER)
    return out


def bench_gemm(h: int, steps: int) -> dict[str, Any]:
    import torch

    from harness.backends.te_cpu.quant import qgemm
    from harness.backends.te_cpu.quant.formats import E4M3
    g = torch.Generator().manual_seed(0)
    a8 = E4M3.encode(torch.randn(h, h, generator=g) * 40)
    b8 = E4M3.encode(torch.randn(h, h, generator=g) * 40)
    sa, sb = torch.tensor(1 / 64), torch.tensor(1 / 32)

    def ours() -> None:
        acc = qgemm.accumulate(qgemm.Operand(E4M3.decode(b8), sb), qgemm.Operand(E4M3.decode(a8), sa))
        qgemm.epilogue(acc, out_shape=[h, h], out_dtype=torch.bfloat16, out=None, alpha=1.0, beta=0.0, bias=None)

    res: dict[str, Any] = {"te_cpu_ms": _median_ms(ours, steps)}
    try:
        import mmaemu
    except ImportError:
        res["mmaemu"] = "not installed"
        return res
    x, w = a8.view(torch.float8_e4m3fn), b8.view(torch.float8_e4m3fn)

    def emu() -> Any:
        return mmaemu.scaled_mm(x, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=False,
                                profile="hopper", splitk=1)

    res["mmaemu_ms"] = _median_ms(emu, steps)
    ref = ((x.float() @ w.float().t()) * (sa * sb)).to(torch.bfloat16)
    res["mmaemu_outputs_differing_from_fp32_accumulation"] = int((emu() != ref).sum())
    res["outputs"] = h * h
    plan = mmaemu.explain(x, w.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=False, profile="hopper")
    validation = plan.validation  # "ok", or (error name, message): SplitKUnknownError for these shapes
    res["mmaemu_splitk_without_override"] = validation if isinstance(validation, str) else validation[0]
    return res


def main() -> int:
    import torch

    torch.set_num_threads(1)  # as a worker rank runs (harness/rank/worker.py: threads_per_rank, 1 by default)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="32,64,256")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=HERE / f"lowprec-{datetime.date.today().isoformat()}.json")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    doc: dict[str, Any] = {"machine": machine(), "steps": args.steps, "linear_step_ms": {}, "fp8_gemm": {}}
    for h in sizes:
        ms = bench_steps(h, args.steps)
        doc["linear_step_ms"][str(h)] = {**ms, **{f"{r}_ratio": round(ms[r] / ms["none"], 2) for r in RECIPES}}
        doc["fp8_gemm"][str(h)] = bench_gemm(h, args.steps)
        print(h, doc["linear_step_ms"][str(h)], doc["fp8_gemm"][str(h)], flush=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
