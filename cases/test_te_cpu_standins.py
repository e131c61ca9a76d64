"""te-cpu's stand-in for TE 2.20.2's bias-gradient Triton kernel (``harness/backends/te_cpu/kernel_standins.py``)
is byte for byte what Triton's interpreter computes with TE's kernel.

One child process runs TE's own ``compute_grouped_dbias`` on each input twice: with every
launch interpreted (``DW_TE_CPU_INTERPRET=1``) and with the stand-in. The inputs reach every
branch of the kernel's tiling: empty groups, groups of 1, 127, 128 and 129 rows, groups of
several tiles per row split (600 and 1,100 rows: 5 and 9 tiles over 4 splits, so some programs
get no tile), 1 to 300 columns (one to three column blocks, the last one partial), bf16, fp16
and fp32 gradients with values over a wide exponent range, exact cancellations, signed zeros
and infinities, and a ``dbias`` accumulated into (holding -0.0 and values). A kernel file with
other bytes (a TE tree that changes it) is always interpreted.
"""

from __future__ import annotations

import torch

from fixtures.te_script import run_te_script

_SCRIPT = '''
import os, torch
import harness.backends.te_cpu.backend  # noqa: F401 (TE on CPU, triton's interpreter, the stand-in)
from harness.backends.te_cpu import kernel_standins as standins
from transformer_engine.pytorch.triton.grouped_dbias_dscales import compute_grouped_dbias

g = torch.Generator().manual_seed(11)
cases = []
for sizes, hidden in (([0, 1, 127, 128], 30), ([129, 0, 3], 128), ([600, 2], 129), ([1100], 7),
                      ([5, 0, 0, 9], 300), ([1], 1), ([0, 0], 5)):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        rows = sum(sizes)
        mant = torch.randn(rows, hidden, generator=g)
        scale = torch.exp2(torch.randint(-12, 12, (rows, hidden), generator=g).float())
        dy = (mant * scale)
        if rows >= 4:
            dy[1] = -dy[0]              # an exact cancellation
            dy[2, : hidden // 2] = -0.0  # signed zeros
            dy[3, 0] = float("inf") if hidden > 1 else 0.0
        dy = dy.to(dtype)
        offsets = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int64)
        start = torch.randn(len(sizes), hidden, generator=g)
        start[:, 0] = -0.0
        cases.append((dy, offsets, len(sizes), start))

out = {{"interpreted": [], "stood_in": []}}
for name, flag in (("interpreted", "1"), ("stood_in", "0")):
    os.environ[standins.INTERPRET_ENV] = flag
    for dy, offsets, groups, start in cases:
        out[name].append(compute_grouped_dbias(dy, offsets, groups))
        out[name].append(compute_grouped_dbias(dy, offsets, groups, dbias=start.clone()))
    out[name + "_counts"] = (standins.launches().stood_in, standins.launches().interpreted)
torch.save(out, os.environ["DW_TE_SCRIPT_OUT"])
'''


def test_the_standin_is_the_interpreted_kernel_byte_for_byte(tmp_path_factory) -> None:
    out = run_te_script(tmp_path_factory, "te_standins", _SCRIPT, timeout=600)
    n = len(out["interpreted"])
    assert n == 42 and len(out["stood_in"]) == n
    # the interpreter ran every launch of the first pass, the stand-in every launch of the second
    assert out["interpreted_counts"] == (0, n) and out["stood_in_counts"] == (n, n)
    for i, (a, b) in enumerate(zip(out["interpreted"], out["stood_in"])):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape, i
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (i, (a.view(torch.int32) != b.view(torch.int32)).sum())
    # the inputs reached what the comparison is about: infinities, signed zeros, cancellations
    every = torch.cat([t.flatten() for t in out["stood_in"]])
    assert torch.isinf(every).any() and (every == 0).any()


def test_other_kernel_bytes_are_interpreted(tmp_path) -> None:
    """The stand-in answers only for the exact file TE 2.20.2 ships."""
    from fixtures.te_script import load_kernels

    standins = load_kernels("kernel_standins")
    kernel = tmp_path / "grouped_dbias_dscales.py"
    kernel.write_text("def _grouped_dbias_kernel(dy_ptr):\n    pass\n")
    namespace: dict = {}
    exec(compile(kernel.read_text(), str(kernel), "exec"), namespace)

    class Launch:  # what the interpreter's launch holds: the Python function and its arguments' names
        fn = namespace["_grouped_dbias_kernel"]
        arg_names = ["dy_ptr", "dbias_ptr", "offsets_ptr", "scales_ptr", "bias_ptr", "dscales_ptr", "hidden"]

    dy, dbias, offsets = torch.zeros(4, 3), torch.zeros(1, 3), torch.tensor([0, 4])
    args = (dy, dbias, offsets, dy, dy, dy, 3)
    kw = {"HAS_SCALES": False, "N_ROW_SPLITS": 4, "BLOCK_M": 128, "BLOCK_H": 128}
    assert standins._standin(Launch, args, kw, (1, 4, 1)) is None
    standins.KNOWN = standins._file_digest(str(kernel))  # the same launch from a file it knows
    assert standins._standin(Launch, args, kw, (1, 4, 1)) is not None
    assert standins._standin(Launch, args, {**kw, "HAS_SCALES": True}, (1, 4, 1)) is None
    assert standins._standin(Launch, (dy.t(), *args[1:]), kw, (1, 4, 1)) is None  # strides it does not assume
