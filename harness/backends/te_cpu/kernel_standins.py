"""TE 2.20.2's bias-gradient Triton kernel in torch, byte for byte what Triton's interpreter makes of it.

Why: ``ops.GroupedLinear`` (and GroupedLinear's grouped-tensor path) computes its bias
gradient with TE's Triton kernel ``_grouped_dbias_kernel``. te-cpu runs Triton kernels in
Triton's CPU interpreter, which executes the launch's programs (groups x 4 row splits x column
blocks) one after another at about 3 ms each: about half of a passing low-precision
``ops.GroupedLinear`` cell's time, a third of a ``te-cpu`` ``ci`` sweep's.

What: a launch of that kernel *from the file whose bytes TE 2.20.2 ships* (``KNOWN``: the
sha256 of ``transformer_engine/common/triton/grouped_dbias_dscales.py``) without per-token
scales (``HAS_SCALES=False``, the only form TE's modules launch) runs here instead, doing the
interpreter's arithmetic: each program sums its tiles of ``BLOCK_M`` rows in fp32 row after row
(numpy's sum along a tile's rows; masked rows are zeros), adds the tile sums in order to a zero
accumulator and adds that to ``dbias`` (the atomic add), programs in grid order. Anything else
runs in the interpreter: other file bytes (a TE tree that changes the kernel), the scaled form,
strides the kernel does not assume, or ``DW_TE_CPU_INTERPRET=1`` (every launch interpreted).
``cases/test_te_cpu_standins.py`` runs both on the same inputs - group sizes around the tile
and split boundaries, every dtype, signed zeros, infinities, an accumulating ``dbias`` - and
requires identical bytes.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

_INSTALLED = "_dw_kernel_standins"
#: set to 1: every Triton launch runs in the interpreter (the proof test's other side)
INTERPRET_ENV = "DW_TE_CPU_INTERPRET"
#: sha256 of TE 2.20.2's ``transformer_engine/common/triton/grouped_dbias_dscales.py``
KNOWN = "e3ac4bb49104f02141d01d199a0ff88e17fd9d606992db4d732433020baf7a76"


@dataclass
class Counts:
    stood_in: int = 0
    interpreted: int = 0


_COUNTS = Counts()
_FILE_DIGESTS: dict[str, str] = {}


def launches() -> Counts:
    """How many launches the stand-in ran and how many it left to the interpreter."""
    return _COUNTS


def install() -> bool:
    """Wrap the interpreter's kernel launch; False (nothing changed) on a triton without it."""
    from harness.backends.te_cpu import interpreter  # here: importing the package applies the CPU layer

    return interpreter.wrap_launch(_INSTALLED, _standing_in)


def _standing_in(run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` with the stand-ins in front of it."""
    def standin_run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        standin = None if warmup else _standin(self, args, kwargs, grid)
        if standin is None:
            _COUNTS.interpreted += not warmup
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        standin()
        _COUNTS.stood_in += 1
        return None

    return standin_run


def _file_digest(path: str) -> str:
    found = _FILE_DIGESTS.get(path)
    if found is None:
        try:
            found = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            found = ""
        _FILE_DIGESTS[path] = found
    return found


def _standin(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], grid: Any) -> Callable[[], None] | None:
    """The stand-in for this launch, or None when the interpreter must run it."""
    if os.environ.get(INTERPRET_ENV) == "1":
        return None
    py = getattr(fn, "fn", None)
    code = getattr(py, "__code__", None)
    if code is None or py.__name__ != "_grouped_dbias_kernel" or _file_digest(code.co_filename) != KNOWN:
        return None
    a = {**dict(zip(fn.arg_names, args)), **kwargs}
    const = {k: getattr(a.get(k), "value", a.get(k)) for k in ("HAS_SCALES", "N_ROW_SPLITS", "BLOCK_M", "BLOCK_H")}
    dy, dbias, offsets, hidden = a.get("dy_ptr"), a.get("dbias_ptr"), a.get("offsets_ptr"), a.get("hidden")
    if const["HAS_SCALES"] is not False or callable(grid) or not isinstance(hidden, int) or hidden < 1:
        return None
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in (dy, dbias, offsets)):
        return None
    n_splits, block_m, block_h = const["N_ROW_SPLITS"], const["BLOCK_M"], const["BLOCK_H"]
    groups = dbias.shape[0] if dbias.dim() == 2 else -1
    if (not all(isinstance(v, int) and v >= 1 for v in (n_splits, block_m, block_h))
            or tuple(grid) != (groups, n_splits, -(-hidden // block_h))
            or dbias.dtype != torch.float32 or dbias.shape != (groups, hidden) or dbias.stride() != (hidden, 1)
            or dy.dtype not in (torch.float32, torch.bfloat16, torch.float16) or dy.dim() != 2
            or dy.shape[1] != hidden or dy.stride() != (hidden, 1)
            or offsets.dtype != torch.int64 or offsets.dim() != 1 or offsets.numel() < groups + 1
            or offsets.stride(0) != 1):
        return None
    bounds = offsets[:groups + 1].tolist()
    if any(b < a or a < 0 or b > dy.shape[0] for a, b in zip(bounds, bounds[1:])):
        return None  # rows the kernel would read outside dy, or a negative group: the interpreter's call
    return lambda: _grouped_dbias(dy, dbias, bounds, n_splits, block_m)


def _grouped_dbias(dy: torch.Tensor, dbias: torch.Tensor, bounds: list[int], n_splits: int, block_m: int) -> None:
    """``dbias[g] += sum of dy's rows of group g`` as the kernel's programs compute it under the
    interpreter (module docstring)."""
    hidden = dy.shape[1]
    # every program's tiles: (group, split) -> the row ranges of its tiles, in order
    programs: list[tuple[int, list[int]]] = []
    tiles: list[tuple[int, int]] = []
    for g, (r0, r1) in enumerate(zip(bounds, bounds[1:])):
        total = -(-(r1 - r0) // block_m)
        per_split = -(-total // n_splits)
        for split in range(n_splits):
            mine = []
            for t in range(per_split):
                start = r0 + (split * per_split + t) * block_m
                mine.append(len(tiles))
                tiles.append((start, max(0, min(r1, start + block_m) - start)))
            programs.append((g, mine))
    sums = torch.zeros(len(tiles), hidden, dtype=torch.float32)
    if tiles:
        block = torch.zeros(len(tiles), block_m, hidden, dtype=torch.float32)
        for i, (start, rows) in enumerate(tiles):
            block[i, :rows] = dy[start:start + rows].float()
        sums = block[:, 0].clone()
        for r in range(1, block_m):  # row after row, as numpy sums a tile along its rows
            sums = sums + block[:, r]
    for g, mine in programs:
        acc = torch.zeros(hidden, dtype=torch.float32)
        for i in mine:
            acc = acc + sums[i]
        dbias[g] = dbias[g] + acc
