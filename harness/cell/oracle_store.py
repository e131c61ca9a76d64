"""The float64 oracles a rank computed, kept in a folder that every rank process naming it shares.

Why: a rank keeps its latest oracles in memory (``oracle.Memo``), but the same cells are judged
in many processes - each launch's ranks, each sweep of a test suite (the reference's ``ci``,
the self-test's clean run, its mutants' later rounds and the sensitivity search's launches,
te-cpu's sweeps of the wheel and of a patched tree, the fault sweeps). The oracle is a function
of the cell's inputs and the rank, not of the backend, and it was the larger part of a reference
rank's time (the self-test's ranks: about half of their samples). With ``DW_ORACLE_CACHE``
naming a folder, an oracle any rank computed is read back instead of computed again (a rank's
worker asks for it once its backends are loaded: ``runner.share_oracles``; a process that runs
cells itself, as a test that patches the oracle does, keeps its own memory only, and so does a
rank whose backend changed the oracle's modules since they were imported - a planted harness
bug - which its log says).

What keys it: everything ``oracle.Memo.compute`` keys on (the inputs' fingerprint - every
value they hold -, the rank, the weight's tags, the recipe, the first-microbatch flag), torch's
thread count (a float64 GEMM's summation order may follow it) and the code that computes it:
the bytes of every source file of ``harness/cell/`` and ``harness/vocabulary/`` (the oracle's
modules and everything they import from the harness, and more), torch's and Python's versions. A changed harness is a new key, never a stale value.

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
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Callable, TypeVar

import torch

#: the environment variable that names the folder
ENV = "DW_ORACLE_CACHE"
#: the packages whose source keys a kept oracle (the oracle's modules and their imports)
PACKAGES = ("cell", "vocabulary")
T = TypeVar("T")


#: the modules whose classes a kept oracle is made of: a file naming anything else - another
#: module's class or function, a reducer a package installed for tensors (Megatron-Core's), a
#: builtin - reads as absent; nothing is imported to read one
_CLASSES_FROM = ("harness.cell.oracle", "harness.cell.quantized", "harness.cell.inputs", "harness.cell.predict")


def _tensor(dtype: str, shape: tuple[int, ...], data: bytes, requires_grad: bool) -> torch.Tensor:
    """A tensor from :class:`_Pickler`'s parts."""
    kind = _dtype(dtype)
    if not data:
        return torch.empty(shape, dtype=kind).requires_grad_(requires_grad)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(kind).reshape(shape).requires_grad_(requires_grad)


def _dtype(name: str) -> torch.dtype:
    """torch's dtype of this name (and nothing else of torch's)."""
    kind = getattr(torch, name, None)
    if not isinstance(kind, torch.dtype):
        raise pickle.UnpicklingError(f"torch.{name} is no dtype")
    return kind


class _Pickler(pickle.Pickler):
    """Pickles a plain tensor as its dtype, shape and the bytes of its elements: not torch's
    reduction, which keeps a view's whole storage (an oracle's per-rank slices of the whole
    world's tensors), nor one another package installed (Megatron-Core's, which a reader
    could only follow by importing Megatron); a dtype by its name."""

    def reducer_override(self, obj: object) -> object:
        if type(obj) is torch.Tensor:
            t = obj.detach().contiguous()
            data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            return _tensor, (str(t.dtype).removeprefix("torch."), tuple(t.shape), data, obj.requires_grad)
        if isinstance(obj, torch.dtype):
            return _dtype, (str(obj).removeprefix("torch."),)
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    """Follows :class:`_Pickler`'s two rebuilders and the classes the oracle's own modules
    define - modules a rank has imported already - and nothing else."""

    def find_class(self, module: str, name: str) -> object:
        if module == __name__ and name in ("_tensor", "_dtype"):
            return globals()[name]
        found = getattr(sys.modules.get(module), name, None) if module in _CLASSES_FROM else None
        if isinstance(found, type) and found.__module__ == module:
            return found
        raise pickle.UnpicklingError(f"{module}.{name} is not among what an oracle is made of")


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


#: how long a process waits for a value another one claimed before computing it itself
CLAIM_WAIT_S = 120.0
_ABSENT = object()


def _identity(pid: int) -> str:
    """``pid`` and its process's start time (``/proc``; Linux): a pid used again by a later
    process is another identity. Empty when the process is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return ""
    return "" if fields[0] in ("Z", "X") else f"{pid} {fields[19]}"


def _claimer_alive(claim: Path) -> bool:
    """Whether the process a claim file names still runs (not ended, not a zombie, its pid not
    another process's since)."""
    try:
        held = claim.read_text()
        pid = int(held.split()[0])
    except (OSError, ValueError, IndexError):  # gone (its value written, or it failed)
        return False
    if os.path.isdir("/proc"):
        return _identity(pid) == held
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class Store:
    """Oracles kept as files in ``folder``, keyed by their arguments and ``code`` (the digest
    of the code that computes them: :func:`code_digest`)."""

    def __init__(self, folder: Path, code: bytes | None = None) -> None:
        self.folder = Path(folder)
        self.code = code if code is not None else code_digest()
        self.read = 0
        self.written = 0
        #: values read after waiting for another process's claim
        self.waited = 0

    def _path(self, key: tuple) -> Path:
        # torch's thread count too: a float64 GEMM's summation order may follow it
        name = hashlib.blake2b(self.code + repr((key, torch.get_num_threads())).encode(), digest_size=20).hexdigest()
        return self.folder / f"{name}.pkl"

    def get(self, key: tuple, make: Callable[[], T]) -> T:
        """The value kept under ``key``, or ``make()``'s, kept.

        One process computes a value at a time: the first to miss it claims it (a claim file
        naming its pid) and the others wait for its file instead of computing it too - the
        ranks of a launch, which meet the same cell together, and sweeps running side by side
        over the same cells. A waiter computes it itself once the claim is gone without a
        file, its process has ended, or ``CLAIM_WAIT_S`` passed (a claimer that is slow, not
        one that hangs: the oracle's code waits on nothing)."""
        path = self._path(key)
        found = self._read(path)
        if found is not _ABSENT:
            return found
        claim: Path | None = path.with_suffix(".claim")
        if not self._claim(claim):
            found = self._wait(path, claim)
            if found is not _ABSENT:
                self.waited += 1
                return found
            claim = None  # another process's: not ours to remove
        try:
            value = make()
            self._write(path, value)
        finally:
            if claim is not None:
                claim.unlink(missing_ok=True)
        return value

    def put(self, key: tuple, value: object) -> None:
        """Keep ``value`` under ``key`` (a value computed beside the one asked for)."""
        self._write(self._path(key), value)

    def _read(self, path: Path) -> object:
        try:
            with open(path, "rb") as fh:
                value = _Unpickler(fh).load()
        except Exception:  # absent, cut short or unreadable: computed, and written whole
            return _ABSENT
        self.read += 1
        return value

    def _claim(self, claim: Path) -> bool:
        """Whether this process now holds ``claim`` (created whole, with its pid, or not at all)."""
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=claim.stem, suffix=".tmp")
        except OSError:  # the folder is gone or not writable: compute, keep nothing
            return True
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(_identity(os.getpid()) if os.path.isdir("/proc") else str(os.getpid()))
            os.link(tmp, claim)  # fails if another process holds it
            return True
        except FileExistsError:
            return False
        except OSError:
            return True
        finally:
            Path(tmp).unlink(missing_ok=True)

    def _wait(self, path: Path, claim: Path) -> object:
        """The value another process claimed, once its file is there (``_ABSENT``: the claim
        ended without one, its process is gone, or ``CLAIM_WAIT_S`` passed)."""
        deadline = time.monotonic() + CLAIM_WAIT_S
        pause = 0.002
        while time.monotonic() < deadline:
            found = self._read(path)
            if found is not _ABSENT or not _claimer_alive(claim):
                return found if found is not _ABSENT else self._read(path)
            time.sleep(pause)
            pause = min(pause * 1.5, 0.05)
        return _ABSENT

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


#: the modules an oracle is computed by, whose state :func:`state` describes
WATCHED = ("harness.cell.oracle", "harness.cell.quantized", "harness.cell.inputs", "harness.cell.predict",
           "harness.vocabulary.recipes", "harness.vocabulary.shape")


def _described(value: object, depth: int = 0) -> object:
    if isinstance(value, types.FunctionType):
        cells = []
        for cell in value.__closure__ or ():
            try:
                cells.append(id(cell.cell_contents))
            except ValueError:  # an empty cell
                cells.append(None)
        return id(value), id(value.__code__), repr(value.__defaults__), repr(value.__kwdefaults__), tuple(cells)
    if isinstance(value, type) and depth == 0:  # its methods; not the dunder data pickling caches
        return id(value), tuple((k, _described(v, 1)) for k, v in vars(value).items()
                                if not k.startswith("__") or isinstance(v, types.FunctionType))
    if isinstance(value, (dict, list, set, frozenset, tuple)):
        return id(value), repr(value)
    return id(value)


def state() -> dict[str, object]:
    """What the oracle's modules (:data:`WATCHED`) hold in this process now, name by name: each
    object by identity, a function's code, defaults and closure, a class's attributes, a
    container's contents. Compared with itself later in the same process only (identities
    differ between processes): a backend that replaced or changed any of it since
    (``fixtures/harness_bug.py`` replaces ``oracle.compute``) computes oracles the kept ones
    are not, and must neither read nor keep them (``runner.share_oracles``)."""
    return {f"{m}.{name}": _described(value) for m in WATCHED if m in sys.modules
            for name, value in vars(sys.modules[m]).items() if not name.startswith("__")}


def changed(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """The names whose state differs between two :func:`state` of one process."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def from_env() -> Store | None:
    """The store ``DW_ORACLE_CACHE`` names (None: unset or empty)."""
    folder = os.environ.get(ENV)
    return Store(Path(folder)) if folder else None
