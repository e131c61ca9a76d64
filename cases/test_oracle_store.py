"""The oracles kept on disk (``harness/cell/oracle_store.py``, ``DW_ORACLE_CACHE``): what a
second process reads back is the oracle it would have computed, bit for bit; another
argument or another code is another file; a file cut short is computed again."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from harness.cell import oracle, oracle_store
from harness.cell.inputs import make_inputs
from harness.vocabulary.shape import Example


def _equal(a: object, b: object) -> bool:
    """Field by field, tensors bit for bit (NaNs included)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return type(a) is type(b) and _equal(vars(a), vars(b))
    return a == b


def _never() -> oracle.RankOracle:
    raise AssertionError("computed again: the kept oracle was not read")


@pytest.mark.parametrize("recipe, norm, groups", [("none", None, 1), ("delayed", None, 1), ("mxfp8", "LayerNorm", 1),
                                                  ("blockwise", None, 4), ("nvfp4", "RMSNorm", 1)])
def test_a_kept_oracle_is_the_computed_one_in_another_process(tmp_path: Path, recipe: str, norm: str | None,
                                                               groups: int) -> None:
    inputs = make_inputs(7, Example(32, 32, 32), "bf16", 2, 2, groups, True, norm=norm)
    writer = oracle.Memo(store=oracle_store.Store(tmp_path))
    fresh = oracle.compute(inputs, 1, recipe=recipe)
    kept = writer.compute(inputs, 1, recipe=recipe)
    # three files: the part every rank shares (the gradients of record) and each rank's own,
    # all computed in one pass: each rank's oracle bit for bit
    assert writer.store.written == 3 and _equal(kept, fresh)
    oracles, sums = oracle.world_oracles(inputs, recipe=recipe)
    assert all(_equal(o, oracle.compute(inputs, r, recipe=recipe)) for r, o in enumerate(oracles))
    assert _equal(sums.wgrad_sums, fresh.wgrad_sums)
    # a new memo (another rank process) on the same folder reads both back, computing nothing
    reader = oracle_store.Store(tmp_path)
    key = ("own", oracle.fingerprint(inputs), 1, (1.0, 1.0), recipe, False, oracle._code_of(oracle.compute))
    own = reader.get(key, _never)
    assert own.wgrad_sums == [] and _equal(own.outputs, fresh.outputs) and reader.read == 1
    again = oracle_store.Store(tmp_path)
    assert _equal(oracle.Memo(store=again).compute(inputs, 1, recipe=recipe), fresh)
    assert again.read == 2 and again.written == 0
    # another rank reads the part the first computed for it
    other = oracle_store.Store(tmp_path)
    assert _equal(oracle.Memo(store=other).compute(inputs, 0, recipe=recipe), oracle.compute(inputs, 0, recipe=recipe))
    assert other.read == 2 and other.written == 0


def test_other_arguments_or_other_code_are_other_files_and_a_cut_file_is_computed_again(tmp_path: Path) -> None:
    inputs = make_inputs(3, Example(16, 16, 16), "fp32", 2, 1, 1, False)
    store = oracle_store.Store(tmp_path)
    memo = oracle.Memo(store=store)
    memo.compute(inputs, 0)
    memo.compute(inputs, 1)  # another rank
    memo.compute(inputs, 0, recipe="current")  # another recipe
    memo.compute(make_inputs(4, Example(16, 16, 16), "fp32", 2, 1, 1, False), 0)  # other values
    # per inputs and arguments, the shared part and each of the two ranks' own, once
    assert store.written == 3 * 3 and len(list(tmp_path.glob("*.pkl"))) == 9
    key = ("own", oracle.fingerprint(inputs), 0, (1.0, 1.0), "none", False, oracle._code_of(oracle.compute))
    threads, before = torch.get_num_threads(), store._path(key)
    try:
        torch.set_num_threads(threads + 1)  # another thread count: another file
        assert store._path(key) != before and not store._path(key).exists()
    finally:
        torch.set_num_threads(threads)
    other_code = oracle_store.Store(tmp_path, code=b"another harness")
    assert other_code._path(key) != store._path(key)
    assert not other_code._path(key).exists()
    # a file cut short reads as absent: computed and replaced whole
    path = store._path(key)
    path.write_bytes(path.read_bytes()[:100])
    again = oracle_store.Store(tmp_path)
    assert _equal(again.get(key, lambda: oracle.compute(inputs, 0)), oracle.compute(inputs, 0))
    assert again.read == 0 and again.written == 1
    assert _equal(oracle_store.Store(tmp_path).get(key, _never), oracle.compute(inputs, 0))
    assert not list(tmp_path.glob("*.tmp"))


def test_the_code_digest_follows_every_source_file_of_the_oracles_packages(tmp_path: Path) -> None:
    root = tmp_path / "harness"
    for package in oracle_store.PACKAGES:
        (root / package).mkdir(parents=True)
        (root / package / "a.py").write_text("x = 1\n")
    before = oracle_store.code_digest(root)
    assert oracle_store.code_digest(root) == before
    (root / oracle_store.PACKAGES[-1] / "a.py").write_text("x = 2\n")
    assert oracle_store.code_digest(root) != before


def test_tensors_are_kept_as_their_own_elements_and_a_foreign_class_is_never_imported(tmp_path: Path) -> None:
    import pickle
    import sys

    store = oracle_store.Store(tmp_path)
    whole = torch.arange(1 << 16, dtype=torch.float64)
    kept = {"view": whole[10:20], "scalar": torch.tensor(2.5), "empty": torch.empty(0, 3, dtype=torch.bfloat16),
            "flags": torch.tensor([True, False]), "strided": whole[:64].reshape(8, 8).t()}
    got = store.get(("parts",), lambda: kept)
    assert _equal(got, kept)
    # the view's file holds its ten elements, not its storage's 65,536
    assert store._path(("parts",)).stat().st_size < 4096
    assert _equal(oracle_store.Store(tmp_path).get(("parts",), _never), kept)
    # a file that names a class outside the oracle's modules is not followed: computed again
    assert "xml.dom.minidom" not in sys.modules
    store._path(("foreign",)).write_bytes(b"\x80\x04\x8c\x0fxml.dom.minidom\x8c\x08Document\x93)\x81.")
    with pytest.raises(pickle.UnpicklingError):
        with open(store._path(("foreign",)), "rb") as fh:
            oracle_store._Unpickler(fh).load()
    assert store.get(("foreign",), lambda: 7) == 7 and "xml.dom.minidom" not in sys.modules
    # nor a builtin, nor torch's own loaders (torch.load of arbitrary pickles), nor a function of
    # the oracle's modules: only its classes and the two rebuilders
    for module, name in (("builtins", "eval"), ("torch.storage", "_load_from_bytes"), ("torch", "load"),
                         ("harness.cell.oracle", "compute"), ("harness.cell.oracle_store", "Store")):
        path = store._path((module, name))
        path.write_bytes(pickle.dumps(_Named(module, name), protocol=4))
        assert store.get((module, name), lambda: "computed") == "computed", (module, name)


class _Named:
    """Pickles as a call of ``module.name("1")`` (what a hostile file could hold)."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __reduce__(self):
        import importlib

        return getattr(importlib.import_module(self.module), self.name), ("1",)


def test_a_process_that_replaced_the_oracle_reads_none_of_the_kept_ones(tmp_path: Path, monkeypatch) -> None:
    """A planted harness bug (``fixtures/harness_bug.py`` replaces ``oracle.compute`` in its
    ranks) must still fail every cell: the kept oracles are keyed by the function's code too,
    which is the same in every process that did not replace it."""
    import subprocess
    import sys

    inputs = make_inputs(3, Example(16, 16, 16), "fp32", 2, 1, 1, False)
    oracle.Memo(store=oracle_store.Store(tmp_path)).compute(inputs, 0)

    def planted(*args, **kwargs):
        raise ZeroDivisionError("planted harness bug")

    monkeypatch.setattr(oracle, "compute", planted)
    planted_store = oracle_store.Store(tmp_path)
    with pytest.raises(ZeroDivisionError):
        oracle.Memo(store=planted_store).compute(inputs, 0)
    # nothing read or kept: the replaced function computes alone
    assert planted_store.read == planted_store.written == 0
    monkeypatch.undo()
    again = oracle_store.Store(tmp_path)
    assert _equal(oracle.Memo(store=again).compute(inputs, 0), oracle.compute(inputs, 0)) and again.read == 2
    # the function's digest is the same in another process (no addresses, no string hashes)
    code = "from harness.cell import oracle; print(oracle._code_of(oracle.compute))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == oracle._code_of(oracle.compute)


def test_a_backend_that_changed_the_oracles_modules_shares_no_oracle(monkeypatch, tmp_path: Path) -> None:
    """``runner.share_oracles`` compares the oracle's modules with their state at import: a
    replaced function (the planted bug's ``oracle.compute``), a helper's changed default or a
    table changed in place turns the folder off for the process, naming what changed."""
    from harness.cell import quantized, runner
    from harness.vocabulary import recipes

    store = oracle_store.Store(tmp_path)
    assert runner.share_oracles(store) is None and runner._ORACLES.store is store
    for change in (lambda m: m.setattr(oracle, "wgrad_terms", lambda *a, **k: []),
                   lambda m: m.setattr(oracle.gemm_inputs, "__defaults__", ("mxfp8", (1.0, 1.0), False, None, False)),
                   lambda m: m.setitem(vars(quantized), "SCALE_U", 0.0),
                   lambda m: m.setitem(recipes.KINDS, "none", recipes.KINDS["mxfp8"])):
        with monkeypatch.context() as m:
            change(m)
            why = runner.share_oracles(store)
            assert why is not None and why.startswith("oracles not shared: the backend changed harness.")
            assert runner._ORACLES.store is None
    assert runner.share_oracles(store) is None and runner._ORACLES.store is store
    runner.share_oracles(None)


_RACE = """
import sys, time
from pathlib import Path
from harness.cell import oracle_store
folder = Path(sys.argv[1])
def make():
    with open(folder / "computed", "a") as fh:
        fh.write("x\\n")
    time.sleep(0.5)
    return {"value": 42}
store = oracle_store.Store(folder, code=b"race")
print(store.get(("k",), make), store.waited)
"""


def test_one_process_computes_a_value_the_others_wait_for(tmp_path: Path) -> None:
    """Ranks meet the same cell together: the first claims its shared oracle, the others read
    the file it writes instead of computing it too."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", _RACE, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert (tmp_path / "computed").read_text() == "x\n", "more than one process computed the value"
    assert sorted(o[-1] for o in outs) == ["0", "1", "1"]
    assert not list(tmp_path.glob("*.claim")) and not list(tmp_path.glob("*.tmp"))


def test_a_claim_whose_process_ended_is_not_waited_for(tmp_path: Path, monkeypatch) -> None:
    """A claimer killed before it wrote its value leaves its claim: the next process computes
    the value itself (not after ``CLAIM_WAIT_S``), and so does one whose claimer's pid now
    names another process."""
    import subprocess
    import sys

    monkeypatch.setattr(oracle_store, "CLAIM_WAIT_S", 3600.0)
    store = oracle_store.Store(tmp_path, code=b"stale")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for n, held in enumerate((f"{ended.stdout.strip()} 1", f"{os.getpid()} 1")):
        claim = store._path(("k", n)).with_suffix(".claim")
        claim.write_text(held)
        assert store.get(("k", n), lambda: n) == n and store.waited == 0
    # a live claimer: its value is read once written, nothing computed
    import threading

    claim = store._path(("live",)).with_suffix(".claim")
    assert store._claim(claim)
    writer = threading.Timer(0.3, lambda: (store._write(store._path(("live",)), "theirs"), claim.unlink()))
    writer.start()
    assert oracle_store.Store(tmp_path, code=b"stale").get(("live",), _never) == "theirs"
    writer.join()
