"""The float64 oracles a rank computed, kept in a folder that every rank process naming it shares.

Why: a rank keeps its latest oracles in memory (``oracle.Memo``), but the same cells are judged
in many processes - each launch's ranks, each sweep of a test suite (the reference's ``ci``,
the self-test's clean run, its mutants' later rounds and the sensitivity search's launches,
te-cpu's sweeps of the wheel and of a patched tree, the fault sweeps). The oracle is a function
of the cell's inputs and the rank, not of the backend, and it was the larger part of a reference
rank's time (the self-test's ranks: about half of their samples). With ``DW_ORACLE_CACHE``
naming a folder, an oracle any rank computed is read back instead of computed again (a rank's
worker asks for it: ``runner.share_oracles``; a process that runs cells itself, as a test that
patches the oracle does, keeps its own memory only).

What keys it: everything ``oracle.Memo.compute`` keys on (the inputs' fingerprint - every
value they hold -, the rank, the weight's tags, the recipe, the first-microbatch flag) and the
code that computes it: the bytes of every source file of ``harness/cell/`` and
``harness/vocabulary/`` (the oracle's modules and everything they import from the harness, and
more), torch's and Python's versions. A changed harness is a new key, never a stale value.

A value is written whole to a file of its own and renamed into place, so a reader sees a
complete file or none; a file that does not read back (cut short, another format) is computed
again and replaced. Unset, nothing is kept on disk (a user's sweep keeps each rank's memory only);
the test suite sets it for its own run (``conftest.py``).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import platform
import tempfile
from pathlib import Path
from typing import Callable, TypeVar

import torch

#: the environment variable that names the folder
ENV = "DW_ORACLE_CACHE"
#: the packages whose source keys a kept oracle (the oracle's modules and their imports)
PACKAGES = ("cell", "vocabulary")
T = TypeVar("T")


#: the modules a kept oracle's classes may come from: a file naming anything else (a class
#: of another package, or a reducer a package installed for tensors - Megatron-Core's) reads
#: as absent, so reading one never imports anything
_MODULES = ("harness", "torch", "builtins", "collections", "copyreg", "_codecs")


def _tensor(dtype: str, shape: tuple[int, ...], data: bytes, requires_grad: bool) -> torch.Tensor:
    """A tensor from :class:`_Pickler`'s parts."""
    kind = getattr(torch, dtype)
    if not data:
        return torch.empty(shape, dtype=kind).requires_grad_(requires_grad)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(kind).reshape(shape).requires_grad_(requires_grad)


class _Pickler(pickle.Pickler):
    """Pickles a plain tensor as its dtype, shape and the bytes of its elements: not torch's
    reduction, which keeps a view's whole storage (an oracle's per-rank slices of the whole
    world's tensors), nor one another package installed (Megatron-Core's, which a reader
    could only follow by importing Megatron)."""

    def reducer_override(self, obj: object) -> object:
        if type(obj) is torch.Tensor:
            t = obj.detach().contiguous()
            data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            return _tensor, (str(t.dtype).removeprefix("torch."), tuple(t.shape), data, obj.requires_grad)
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if module.partition(".")[0] not in _MODULES:
            raise pickle.UnpicklingError(f"{module}.{name} is not among the modules an oracle is made of")
        return super().find_class(module, name)


def code_digest(root: Path = Path(__file__).resolve().parents[1]) -> bytes:
    """A digest of the code an oracle is computed by: the bytes of every ``.py`` file of
    ``PACKAGES`` under ``root`` (the ``harness`` package), torch's and Python's versions."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{torch.__version__}|{platform.python_version()}".encode())
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode() + b"\0")
            h.update(path.read_bytes())
    return h.digest()


class Store:
    """Oracles kept as files in ``folder``, keyed by their arguments and ``code`` (the digest
    of the code that computes them: :func:`code_digest`)."""

    def __init__(self, folder: Path, code: bytes | None = None) -> None:
        self.folder = Path(folder)
        self.code = code if code is not None else code_digest()
        self.read = 0
        self.written = 0

    def _path(self, key: tuple) -> Path:
        name = hashlib.blake2b(self.code + repr(key).encode(), digest_size=20).hexdigest()
        return self.folder / f"{name}.pkl"

    def get(self, key: tuple, make: Callable[[], T]) -> T:
        """The value kept under ``key``, or ``make()``'s, kept."""
        path = self._path(key)
        try:
            with open(path, "rb") as fh:
                value = _Unpickler(fh).load()
            self.read += 1
            return value
        except Exception:  # absent, cut short or unreadable: computed, and written whole
            pass
        value = make()
        self._write(path, value)
        return value

    def _write(self, path: Path, value: object) -> None:
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=path.stem, suffix=".tmp")
        except OSError:  # the folder is gone or not writable: nothing kept, nothing lost
            return
        try:
            with os.fdopen(fd, "wb") as fh:
                _Pickler(fh, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
            os.replace(tmp, path)
            self.written += 1
        except Exception:
            Path(tmp).unlink(missing_ok=True)


def from_env() -> Store | None:
    """The store ``DW_ORACLE_CACHE`` names (None: unset or empty)."""
    folder = os.environ.get(ENV)
    return Store(Path(folder)) if folder else None
