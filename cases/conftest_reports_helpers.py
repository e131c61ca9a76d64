"""Synthetic but realistic run records for the report tests (built with ``harness.record``).

Not a conftest (no fixtures, nothing pytest loads on its own): the report tests import it by
path. Records look like what the sweep writes: realistic ids and axes, ~20 checks per rank
with assert_close-style messages, rank tracebacks that contain ``<script>``, ``&`` and quotes.
"""

from __future__ import annotations

import itertools
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the tests run from a checkout, installed or not
    sys.path.insert(0, str(ROOT))

from harness.record import Check, CellResult, LaunchRecord, RankResult, RunRecord  # noqa: E402

AXES: dict[str, list[Any]] = {
    "module": ["linear", "grouped_linear", "ops_grouped_linear"],
    "weight": ["distributed", "plain"],
    "hooks": ["off", "identity", "offload", "save_on_cpu", "checkpoint"],
    "fused": [True, False],
    "dtype": ["fp32", "bf16", "fp16"],
    "world_size": [1, 2, 4],
    "consumer": ["ddp", "autograd"],
    "microbatches": [1, 2],
    "num_gemms": [1, 4],
    "bias": [True, False],
    "input_grad": [True, False],
    "delay_wgrad": [False, True],
}

EVIL = '<script>alert("pwned")</script> & </script><!-- \'quoted\' -->'
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/work/main/harness/worker.py", line 212, in run_cell\n'
    "    out = module(inp, m_splits)\n"
    '  File "/work/main/harness/backends/reference.py", line 88, in backward\n'
    "    raise RuntimeError(msg)\n"
    "RuntimeError: weight was removed while fuse_wgrad_accumulation=True "
    f"(ctx.saved_tensors[0] is a plain Tensor) {EVIL}\n"
)


def cell_id(axes: dict[str, Any]) -> str:
    return "-".join([
        axes["module"], axes["weight"], f"hooks_{axes['hooks']}", "fused" if axes["fused"] else "unfused",
        axes["dtype"], f"ws{axes['world_size']}", axes["consumer"], f"mb{axes['microbatches']}",
        f"g{axes['num_gemms']}", "bias" if axes["bias"] else "nobias", "igrad" if axes["input_grad"] else "noigrad",
        "delay" if axes["delay_wgrad"] else "nodelay",
    ])


def repro_for(cid: str) -> str:
    return f"python -m harness repro {cid} --backend harness.reference"


def _tensor_check(name: str, ratio: float, rng: random.Random) -> Check:
    bound = 10 ** rng.uniform(-4, -1)
    ok = ratio <= 1.0
    numel = rng.choice([512, 4096, 16384])
    msg = None
    if not ok:
        bad = rng.randint(1, 40)
        msg = (f"Gradients are not close! Mismatched elements: {bad} / {numel} ({100 * bad / numel:.1f}%)\n"
               f"greatest abs diff {ratio * bound:.3g} at (2, 17) (up to {bound:.3g} allowed)\n"
               f"fp64 oracle at (2, 17): backend err {ratio * bound:.3g}, reference err {bound / 9:.3g}\n"
               f"The failure occurred for item [rank 0]['{name}']  <b>&amp;</b>")
    return Check(name=name, kind="tensor", ok=ok, message=msg, numel=numel, mismatched=0 if ok else 3,
                 max_abs=ratio * bound, max_rel=ratio * bound * 3.1, ratio=ratio, bound_at_worst=bound,
                 index=[2, 17])


def _rank_checks(axes: dict[str, Any], rng: random.Random, worst: float, fail: bool) -> list[Check]:
    """The checks a rank reports, named and shaped like the worker's (``harness/runner.py``)."""
    g_n, mb, ddp = axes["num_gemms"], axes["microbatches"], axes["consumer"] == "ddp"
    names = []
    for m in range(mb):
        names.append(f"mb{m}.output")
        if axes["input_grad"]:
            names.append(f"mb{m}.input_grad")
    names += [f"weight{g}.{'main_grad' if ddp else 'grad'}" for g in range(g_n)]
    if axes["bias"]:
        names += [f"bias{g}.{'main_grad' if ddp else 'grad'}" for g in range(g_n)]
    out = [_tensor_check(n, worst * 10 ** rng.uniform(-3, 0), rng) for n in names]
    out[-1 if not fail else rng.randrange(len(out))] = _tensor_check(names[-1], worst, rng)
    if ddp:
        out += [Check(f"weight{g}.grad_added_to_main_grad", "flag", True, expected=True, actual=True) for g in range(g_n)]
        if axes["bias"]:
            out += [Check(f"bias{g}.grad_added_to_main_grad", "flag", True, expected=False, actual=False)
                    for g in range(g_n)]
    out.append(Check("wgrad_hook_calls", "count", True, expected=0, actual=0))
    if axes["weight"] == "distributed":
        bad_bw = fail and rng.random() < 0.5
        out += [
            Check("leader.materialize_forward_calls", "count", True, expected=mb, actual=mb),
            Check("followers.materialize_forward_calls", "count", True, expected=0, actual=0),
            Check("leader.materialize_backward_calls", "count", not bad_bw, expected=mb, actual=2 * mb if bad_bw else mb,
                  message=f"leader.materialize_backward_calls: expected {mb}, got {2 * mb}" if bad_bw else None),
            Check("followers.materialize_backward_calls", "count", True, expected=0, actual=0),
            Check("leader.finalize_calls", "count", True, expected=mb, actual=mb),
            Check("followers.finalize_calls", "count", True, expected=0, actual=0),
        ]
        out += [Check(f"weight{g}.grad_buffer_calls", "count", True, expected=mb, actual=mb) for g in range(g_n)]
        out.append(Check("finalize_dtypes", "dtype", True, expected=["float32"], actual=["float32"]))
    return out


def make_cell(axes: dict[str, Any], status: str, rng: random.Random, n_ranks: int | None = None) -> CellResult:
    cid = cell_id(axes)
    n_ranks = axes["world_size"] if n_ranks is None else n_ranks
    expect = "error" if axes["delay_wgrad"] and axes["weight"] == "distributed" else "pass"
    ranks: list[RankResult] = []
    worst_ratio: float | None = None
    first_failure = None
    example = None  # the cell's default example; a shrunk failure records what it shrank to
    if status in ("pass", "fail"):
        worst_ratio = 10 ** rng.uniform(-3.5, -0.02) if status == "pass" else rng.uniform(1.2, 40)
        for r in range(n_ranks):
            w = worst_ratio if r == n_ranks - 1 else worst_ratio * rng.uniform(0.2, 0.95)
            checks = _rank_checks(axes, rng, w if status == "pass" or r == n_ranks - 1 else min(w, 0.9),
                                  fail=status == "fail" and r == n_ranks - 1)
            ranks.append(RankResult(r, "fail" if any(not c.ok for c in checks) else "pass", checks))
        if status == "fail":
            bad = next(c for c in ranks[-1].comparisons if not c.ok)
            first_failure = f"[rank {n_ranks - 1}] {bad.name}: " + (bad.message or "").splitlines()[0]
            example = {"m_splits": [[3, 0, 5, 8], [0, 16, 0, 0]], "in_features": 24, "out_features": 40,
                       "shrunk": True}
    elif status == "xfail":
        for r in range(n_ranks):
            err = {"type": "ValueError", "message": "delay_wgrad_compute=True is not supported with a DistributedWeight",
                   "traceback": "Traceback (most recent call last):\nValueError: delay_wgrad_compute ... & <ok>\n"}
            ranks.append(RankResult(r, "xfail", [Check("exception", "exception", True,
                                                       message=f"ValueError: {err['message']}")], err))
    elif status == "error":
        for r in range(n_ranks):
            err = {"type": "RuntimeError", "message": f"weight was removed {EVIL}", "traceback": TRACEBACK}
            ranks.append(RankResult(r, "error", [Check("exception", "exception", False,
                                                       message=f"RuntimeError: {err['message']}")], err))
        first_failure = f"[rank 0] RuntimeError: weight was removed while fuse_wgrad_accumulation=True {EVIL}"
    elif status == "timeout":
        ranks = [RankResult(r, "timeout", [], {"type": "Timeout", "message": "no event for 120 s",
                                               "traceback": f"rank {r} last event: backward_start\n"})
                 for r in range(n_ranks)]
        first_failure = "timeout: rank 1 sent no event for 120 s (last: backward_start)"
    elif status == "skipped":
        first_failure = "skipped: ops_grouped_linear needs num_gemms >= 2"
    return CellResult(id=cid, axes=dict(axes), expect=expect, status=status,
                      duration_s=round(rng.uniform(0.05, 4.0), 3), worst_ratio=worst_ratio,
                      first_failure=first_failure, repro=repro_for(cid), ranks=ranks,
                      example=example)


def all_axes() -> list[dict[str, Any]]:
    """Every valid combination (as ``harness.matrix``: autograd is unfused, linear has g1)."""
    names = list(AXES)
    out = []
    for vals in itertools.product(*AXES.values()):
        a = dict(zip(names, vals))
        if (a["consumer"] == "autograd" and a["fused"]) or (a["module"] == "linear" and a["num_gemms"] != 1):
            continue
        out.append(a)
    return out


def pick_status(axes: dict[str, Any], rng: random.Random, mix: dict[str, float]) -> str:
    if axes["delay_wgrad"] and axes["weight"] == "distributed":
        return "xfail" if rng.random() < 0.9 else "fail"
    x = rng.random()
    for s, p in mix.items():
        if x < p:
            return s
        x -= p
    return "pass"


DEFAULT_MIX = {"fail": 0.07, "error": 0.04, "timeout": 0.01, "skipped": 0.03}


def make_record(n_cells: int = 80, *, seed: int = 0, n_ranks: int | None = None,
                mix: dict[str, float] | None = None, status: str = "complete",
                force: dict[int, str] | None = None) -> dict[str, Any]:
    """A serialized record of ``n_cells`` cells spread over the whole matrix.

    ``force`` maps cell positions to statuses (so small records hold every status).
    """
    rng = random.Random(seed)
    space = all_axes()
    step = max(1, len(space) // n_cells)
    chosen = [space[(i * step + rng.randrange(step)) % len(space)] for i in range(n_cells)]
    force = force or {}
    cells = [make_cell(a, force.get(i) or pick_status(a, rng, mix or DEFAULT_MIX), rng, n_ranks)
             for i, a in enumerate(chosen)]
    rec = RunRecord(
        status=status, started="2025-06-11T08:00:00Z", finished=None if status == "incomplete" else "2025-06-11T08:42:17Z",
        duration_s=2537.4, command="dw-harness sweep --preset ci --backend reference --out runs/ci",
        argv=["dw-harness", "sweep", "--preset", "ci"], backend="harness.backends.reference",
        environment={"torch": "2.13.0+cpu", "python": "3.11.9", "platform": "Linux-6.1-x86_64",
                     "hostname": "ci-runner-7", "device": "cpu", "pg_backend": "gloo", "git_commit": "515e9b2"},
        selection={"preset": "ci", "filter": None}, tolerance={"bf16": {"u": 2 ** -8, "c": 4}},
        world_sizes=sorted({c.axes["world_size"] for c in cells}),
        launches=[LaunchRecord(world_size=w, cells=[c.id for c in cells if c.axes["world_size"] == w],
                               exit_code=0 if w != 4 else 1, duration_s=800.0, log_dir=f"runs/ci/logs/ws{w}",
                               note=None if w != 4 else "rank 1 timed out")
                  for w in sorted({c.axes["world_size"] for c in cells})],
        cells=cells,
    )
    return rec.serialize()


def make_big_record(n_cells: int = 10_000, *, seed: int = 1, n_ranks: int = 4, templates: int = 48) -> dict[str, Any]:
    """A large record, fast: ``templates`` cells per status are built with the dataclasses and
    serialized; the ``n_cells`` cells reuse their (read-only) rank data under their own ids, axes,
    ratios and repro lines. (Serializing 10k real cells takes tens of seconds - see Check.serialize.)
    """
    rng = random.Random(seed)
    space = all_axes()
    base = make_record(templates * 6, seed=seed, n_ranks=n_ranks,
                       force={i: s for i, s in enumerate(
                           [s for s in ("pass", "xfail", "fail", "error", "timeout", "skipped") for _ in range(templates)])})
    by_status: dict[str, list[dict[str, Any]]] = {}
    for c in base["cells"]:
        by_status.setdefault(c["status"], []).append(c)
    step = max(1, len(space) // n_cells)
    cells = []
    for i in range(n_cells):
        axes = space[(i * step + rng.randrange(step)) % len(space)]
        status = pick_status(axes, rng, DEFAULT_MIX)
        t = rng.choice(by_status[status])
        cid = cell_id(axes)
        ratio = t["worst_ratio"]
        if ratio is not None:
            ratio = ratio * rng.uniform(0.5, 1.0) if status == "pass" else ratio * rng.uniform(1.0, 2.0)
        cells.append({**t, "id": cid, "axes": dict(axes), "repro": repro_for(cid), "worst_ratio": ratio,
                      "duration_s": round(rng.uniform(0.05, 4.0), 3),
                      "expect": "error" if axes["delay_wgrad"] and axes["weight"] == "distributed" else "pass"})
    counts = {s: 0 for s in ("pass", "xfail", "fail", "error", "timeout", "skipped")}
    for c in cells:
        counts[c["status"]] += 1
    return {**base, "cells": cells, "counts": counts,
            "world_sizes": sorted({c["axes"]["world_size"] for c in cells}), "launches": []}


REALISTIC_MIX = {"pass": 0.97, "xfail": 0.02, "fail": 0.005, "error": 0.005}


def make_realistic_record(n_cells: int = 21_600, *, seed: int = 5, n_ranks: int = 4,
                          mix: dict[str, float] | None = None, templates: int = 24) -> dict[str, Any]:
    """A ``full``-sized, mostly passing record: the whole matrix in matrix order (21,600 cells),
    statuses drawn from ``mix`` (default 97% pass, 2% xfail, 0.5% fail, 0.5% error), ``n_ranks``
    ranks of ~30 checks each (rich templates: ddp, 2 microbatches, bias, input grads, a
    distributed weight). As ``make_big_record``, template rank data is shared between cells.
    """
    rng = random.Random(seed)
    mix = mix or REALISTIC_MIX
    space = all_axes()
    rich = [a for a in space if a["consumer"] == "ddp" and a["microbatches"] == 2 and a["bias"]
            and a["input_grad"] and a["weight"] == "distributed" and not a["delay_wgrad"]
            and a["num_gemms"] == 4]
    by_status: dict[str, list[dict[str, Any]]] = {}
    for s in mix:
        for k in range(templates):
            axes = rich[(k * 7919 + hash(s) % 97) % len(rich)]
            by_status.setdefault(s, []).append(make_cell(axes, s, rng, n_ranks).serialize())
    statuses, weights = list(mix), list(mix.values())
    cells = []
    for i in range(n_cells):
        axes = space[i % len(space)]
        status = rng.choices(statuses, weights)[0]
        t = rng.choice(by_status[status])
        cid = cell_id(axes)
        ratio = t["worst_ratio"]
        if ratio is not None:
            ratio = ratio * rng.uniform(0.3, 1.0) if status == "pass" else ratio * rng.uniform(1.0, 2.0)
        cells.append({**t, "id": cid, "axes": dict(axes), "repro": repro_for(cid), "worst_ratio": ratio,
                      "duration_s": round(rng.uniform(0.05, 4.0), 3),
                      "expect": "error" if status == "xfail" else "pass"})
    base = make_record(6, seed=seed)
    counts = {s: 0 for s in ("pass", "xfail", "fail", "error", "timeout", "skipped")}
    for c in cells:
        counts[c["status"]] += 1
    return {**base, "cells": cells, "counts": counts, "selection": {"preset": "full", "filter": None},
            "world_sizes": sorted({c["axes"]["world_size"] for c in cells}), "launches": []}


NO_BROWSER_HINT = (
    "Chromium and chromedriver are required for the report's browser tests "
    "(apt-get install chromium chromium-driver; or point DW_CHROMIUM and DW_CHROMEDRIVER at them; "
    "pip install selenium). Set DW_ALLOW_NO_BROWSER=1 to skip these tests instead.")


def require_browser() -> None:
    """Fail - not skip - when Chromium, chromedriver or selenium is missing, so CI cannot pass
    without having run the browser checks; ``DW_ALLOW_NO_BROWSER=1`` turns that into a skip."""
    import importlib.util
    import os

    import pytest

    from reports.browser import find_chromium

    missing = []
    if find_chromium() is None:
        missing.append("chromium/chromedriver not found")
    if importlib.util.find_spec("selenium") is None:
        missing.append("selenium not installed")
    if not missing:
        return
    msg = f"{'; '.join(missing)}. {NO_BROWSER_HINT}"
    if os.environ.get("DW_ALLOW_NO_BROWSER") == "1":
        pytest.skip(msg)
    pytest.fail(msg, pytrace=False)


if __name__ == "__main__":
    # python cases/conftest_reports_helpers.py OUT.html [realistic|10k-failing]
    # writes a synthetic report to measure, e.g. with: python -m reports.browser measure OUT.html
    import time

    from reports import render_html

    out = Path(sys.argv[1])
    kind = sys.argv[2] if len(sys.argv) > 2 else "realistic"
    rec = make_realistic_record() if kind == "realistic" else make_big_record(10_000, n_ranks=4)
    t = time.perf_counter()
    out.write_text(render_html(rec))
    print(f"{out}: {len(rec['cells']):,} cells, {out.stat().st_size / 1e6:.2f} MB, rendered in "
          f"{time.perf_counter() - t:.1f} s")
