"""Triton's interpreter runs a kernel launch once per distinct input, not once per call.

Why: TE's bias-gradient kernel (``ops.GroupedLinear`` and GroupedLinear's grouped-tensor
path) runs in Triton's CPU interpreter at about 10 ms a program, and a hooked cell runs it
twice on the same numbers: once in the cell and once in its hook-free twin, which must
match it bit for bit. The twin's launches were half of such a cell's time. (TE 2.20.2's own
copy of that kernel now takes a proven stand-in before it gets here,
``harness/backends/te_cpu/kernel_standins.py``; what reaches the interpreter - and this memory - is
any other kernel, e.g. a TE tree's changed copy, and every launch under
``DW_TE_CPU_INTERPRET=1``.)

How: a launch's effect is a function of what it is given - the kernel, the grid, the
scalar and constexpr arguments, and every byte each tensor argument spans (the kernel
reads and writes through those pointers only, within those tensors). The first launch with
given inputs runs in the interpreter as before, and those bytes after it are kept; a later
launch with byte-identical inputs gets those bytes written back instead of a second
interpretation, which computes exactly the same bytes (the interpreter runs the programs
one after another: its atomics and reductions are deterministic). A launch whose grid is a
callable, or with an argument of another type, always runs. ``launches()`` counts both, for
the tests that compare a remembered launch with a fresh one.

Across processes: with ``DW_TE_CPU_LAUNCH_CACHE`` naming a folder, a launch's bytes are also
kept there (one file per launch, written whole and renamed into place), and a launch any
process ran before is written back from it. The same cells run in several sweeps (the
unpatched wheel and a patched tree, the sweeps of one test suite): each such launch is
interpreted once. On disk, the key also holds what can differ between processes: the bytes
of the source file of the kernel and of every ``@jit`` helper it reaches outside triton (a
TE tree that changes the kernel is a new key), and the versions of triton and numpy (the
interpreter's arithmetic). The suite sets it for its own run (``conftest.py``).
"""

from __future__ import annotations

import hashlib
import os
import sys
import types
from collections import OrderedDict
from pathlib import Path
from dataclasses import dataclass
from typing import Any

import torch

_INSTALLED = "_dw_launch_memo"
#: the folder that keeps launches across processes (unset: this process's memory only)
CACHE_ENV = "DW_TE_CPU_LAUNCH_CACHE"
#: launches remembered per process (each holds its tensors' storages: small on te-cpu)
CAPACITY = 256
_SCALARS = (bool, int, float, str, type(None))


@dataclass
class Counts:
    run: int = 0
    remembered: int = 0
    #: of ``remembered``, those read from the cache folder (another process ran them)
    from_disk: int = 0


_COUNTS = Counts()


def launches() -> Counts:
    """How many launches ran in the interpreter and how many were written back from memory."""
    return _COUNTS


def install() -> bool:
    """Wrap the interpreter's kernel launch; False (nothing changed) on a triton without it."""
    from harness.backends.te_cpu import interpreter  # here: importing the package applies the CPU layer

    return interpreter.wrap_launch(_INSTALLED, _remembering)


def _remembering(run: Any) -> Any:
    """``run`` with the launch memory around it."""
    memory: OrderedDict[str, list[torch.Tensor]] = OrderedDict()

    def remembered_run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        storages = None if warmup or callable(grid) else _storages(args, kwargs)
        if storages is None:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        key = _key(self.fn, grid, args, kwargs, storages)
        after = memory.get(key)
        if after is not None:
            memory.move_to_end(key)
        else:
            after = _read(key, storages)
            if after is not None:
                _COUNTS.from_disk += 1
                keep(key, after)
        if after is not None:
            for raw, kept in zip(storages.values(), after):
                raw.copy_(kept)
            _COUNTS.remembered += 1
            return None
        out = run(self, *args, grid=grid, warmup=warmup, **kwargs)
        _COUNTS.run += 1
        after = [raw.clone() for raw in storages.values()]
        keep(key, after)
        _write(key, after)
        return out

    def keep(key: str, after: list[torch.Tensor]) -> None:
        memory[key] = after
        if len(memory) > CAPACITY:
            memory.popitem(last=False)

    return remembered_run


def _storages(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[int, torch.Tensor] | None:
    """Per distinct CPU storage the tensor arguments point into (by address, in order of
    first use), the bytes those arguments span in it - from the lowest byte any of them
    reaches to the highest - as a view; None when an argument is neither a CPU tensor nor a
    plain scalar (that launch is not remembered).

    Only the spans: a tensor may be a view of a larger storage whose other bytes are
    unused (TE's group offsets are 5 of 17 allocated int64) or belong to other tensors. A
    kernel reads and writes through the pointers it is given within the tensors it is
    given; the spans are that memory, and what the memo keys on and writes back."""
    spans: dict[int, tuple[torch.UntypedStorage, int, int]] = {}
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if a.device.type != "cpu":
                return None
            storage = a.untyped_storage()
            size = a.element_size()
            lo = a.storage_offset() * size
            hi = lo + (1 + sum((n - 1) * st for n, st in zip(a.shape, a.stride()) if n > 0)) * size \
                if a.numel() else lo
            ptr = storage.data_ptr()
            if ptr in spans:
                _, lo0, hi0 = spans[ptr]
                lo, hi = min(lo, lo0), max(hi, hi0)
            spans[ptr] = (storage, lo, hi)
        elif not isinstance(a, _SCALARS) and type(a).__name__ != "constexpr":
            return None
    return {ptr: torch.empty(0, dtype=torch.uint8).set_(storage)[lo:hi] for ptr, (storage, lo, hi) in spans.items()}


def folder() -> Path | None:
    """The folder ``DW_TE_CPU_LAUNCH_CACHE`` names (None: unset or empty): shared between processes."""
    named = os.environ.get(CACHE_ENV)
    return Path(named) if named else None


def _cache_path(key: str) -> Path | None:
    kept = folder()
    return kept / key[:2] / f"{key}.pt" if kept is not None else None


def _read(key: str, storages: dict[int, torch.Tensor]) -> list[torch.Tensor] | None:
    """The bytes another process's launch left, if the cache folder has them (None: run it)."""
    path = _cache_path(key)
    if path is None or not path.is_file():
        return None
    kept = torch.load(path, weights_only=True)
    sizes = [raw.numel() for raw in storages.values()]
    if [t.numel() for t in kept] != sizes:  # a foreign or truncated file: run the launch
        return None
    return kept


def _write(key: str, kept: list[torch.Tensor]) -> None:
    """Keep a launch's bytes for other processes: written to a private name, renamed into place."""
    path = _cache_path(key)
    if path is None or path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    torch.save(kept, partial)
    os.replace(partial, path)


_CODE_IDS: dict[int, str] = {}


def _code_identity(fn: Any) -> str:
    """What makes a kernel's code this code in any process: the bytes of the source file of
    the kernel, of each ``@jit`` helper it reaches outside triton (by the names its code and
    its helpers' code use, helper by helper), and of each module it reaches a helper through
    (``module.helper``); and the versions of triton and numpy that interpret it."""
    found = _CODE_IDS.get(id(fn))
    if found is not None:
        return found
    sources: dict[str, bytes] = {}  # file -> its bytes, in the order reached
    visited: set[int] = set()
    stack = [fn]
    while stack:
        f = stack.pop()
        f = getattr(f, "fn", f)  # a JITFunction holds the Python function
        code = getattr(f, "__code__", None)
        if code is None or id(f) in visited:
            continue
        visited.add(id(f))
        sources.setdefault(code.co_filename, _file_bytes(code.co_filename, code.co_code))
        scope = getattr(f, "__globals__", {})
        for name in code.co_names:
            ref = scope.get(name)
            if isinstance(ref, types.ModuleType):
                path = getattr(ref, "__file__", None)
                if path and not ref.__name__.startswith(("triton", "numpy", "torch")):
                    sources.setdefault(path, _file_bytes(path, b""))
            elif callable(getattr(ref, "fn", None)) and not (getattr(ref, "__module__", "") or "").startswith("triton"):
                stack.append(ref)
    h = hashlib.sha256()
    for name in ("triton", "numpy"):
        h.update(f"{name}={getattr(sys.modules.get(name), '__version__', None)};".encode())
    for data in sources.values():
        h.update(hashlib.sha256(data).digest())
    found = h.hexdigest()
    _CODE_IDS[id(fn)] = found
    return found


def _file_bytes(path: str, otherwise: bytes) -> bytes:
    """A source file's bytes; ``otherwise`` (the code's bytecode) when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError:
        return otherwise


def _key(fn: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any], storages: dict[int, torch.Tensor]) -> str:
    h = hashlib.sha256()
    code = getattr(fn, "__code__", None)
    h.update(repr((getattr(fn, "__module__", None), getattr(fn, "__qualname__", None),
                   code.co_code if code is not None else None, tuple(grid))).encode())
    h.update(_code_identity(fn).encode())
    order = {ptr: i for i, ptr in enumerate(storages)}
    for a in (*args, *sorted(kwargs.items())):
        h.update(_describe(a, order).encode())
    for raw in storages.values():
        h.update(f"{raw.storage_offset()}+{raw.numel()}:".encode())
        h.update(raw.numpy().tobytes())
    return h.hexdigest()


def _describe(a: Any, order: dict[int, int]) -> str:
    """An argument in the key: a tensor by which storage it points into and where (that
    storage's bytes go in separately; addresses do not), anything else by type and value."""
    if isinstance(a, tuple):  # a keyword argument
        return f"{a[0]}={_describe(a[1], order)}"
    if isinstance(a, torch.Tensor):
        return (f"T({order[a.untyped_storage().data_ptr()]},{a.storage_offset()},{tuple(a.shape)},"
                f"{tuple(a.stride())},{a.dtype})")
    return f"{type(a).__name__}({getattr(a, 'value', a)!r})"
