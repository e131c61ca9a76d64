"""The command line: bad input is exit 2 with one line and nothing launched; list, help, -k.

Bad input runs ``harness.cli.main`` in-process with the launcher booby-trapped (a launch
would turn into exit 3) and checks that no ``logs/`` folder appears; two cases also go
through a real ``python -m harness`` process. ``list`` is compared with
``harness.vocabulary.matrix.select``; ``pytest -k <cell id>`` runs pytest's own collection.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.vocabulary import matrix, recipes, shape
from harness.records import recordfile
from harness.launcher import launch

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--modules", "linear", "--world-sizes", "2", "--dtypes", "bf16"]
REPRO_CELL = next(c.id for c in matrix.select("ci") if c.module == "linear" and c.world_size == 2)


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(self):
        raise AssertionError(f"bad input must not launch anything (launch {self.name})")

    monkeypatch.setattr(launch._Launch, "start", refuse)


@pytest.fixture
def bad_backend(tmp_path):
    path = tmp_path / "broken_backend.py"
    path.write_text("import no_such_dependency_for_dw_harness  # noqa\n")
    return path


def _bad_inputs(tmp_path: Path, bad_backend: Path) -> dict[str, tuple[list[str], str]]:
    """case -> (argv after the command, a phrase the error line must contain)."""
    (tmp_path / "file").write_text("a regular file, so file/out cannot be a folder")
    no_layernorm = tmp_path / "no_layernorm_backend.py"
    no_layernorm.write_text("from harness.backends.reference import GroupedLinear, Linear, ops  # noqa: F401\n")
    return {
        "unknown axis value": (["sweep", "--dtypes", "fp64"], "Unknown value 'fp64' for axis dtype"),
        "malformed filter": (["sweep", "--filter", "module =="], "Malformed filter 'module =='"),
        "unknown name in filter": (["sweep", "--filter", 'modul == "linear"'], "Unknown name 'modul'"),
        "backend import fails": (["sweep", *SMALL, "--backend", str(bad_backend)],
                                 "No module named 'no_such_dependency_for_dw_harness'"),
        "backend module missing": (["sweep", *SMALL, "--backend", "no_such_pkg.backend"],
                                   "cannot import backend 'no_such_pkg.backend'"),
        "backend file missing": (["sweep", *SMALL, "--backend", str(tmp_path / "nope.py")], "does not exist"),
        "real TE does not import": (["sweep", *SMALL, "--backend", "transformer_engine.no_such_module_for_dw_harness"],
                                    "to run TE's own Python code on this machine, use --backend te-cpu"),
        "world size too large": (["sweep", "--world-sizes", "64"], "world size 64"),
        "output not writable": (["sweep", *SMALL, "--out", str(tmp_path / "file" / "out")], "not writable"),
        "empty selection": (["sweep", "--filter", "world_size > 100"], "the selection is empty"),
        "unknown preset": (["sweep", "--preset", "nope"], "Unknown preset 'nope'"),
        "repro malformed cell id": (["repro", "linear-distributed-bf16"], "Malformed cell id"),
        "resume without a record": (["sweep", "--resume", str(tmp_path / "no-run")], "cannot resume"),
        "list unknown value": (["list", "--hooks", "sometimes"], "Unknown value 'sometimes' for axis hooks"),
        "cell timeout zero": (["sweep", *SMALL, "--cell-timeout", "0"], "--cell-timeout must be > 0 seconds"),
        "cell timeout negative": (["sweep", *SMALL, "--cell-timeout", "-5"], "--cell-timeout must be > 0 seconds"),
        "repro cell timeout zero": (["repro", REPRO_CELL, "--cell-timeout", "0"], "--cell-timeout must be > 0"),
        "repro unknown example key": (["repro", REPRO_CELL, "--example", "rowz=3"], "unknown key(s) 'rowz'"),
        "repro malformed example": (["repro", REPRO_CELL, "--example", "rows"], "malformed --example 'rows'"),
        "selftest world size too large": (["selftest", "--world-sizes", "16"], "world size 16"),
        "selftest cell timeout zero": (["selftest", *SMALL, "--cell-timeout", "0"], "--cell-timeout must be > 0"),
        "rerun-failed without resume": (["sweep", *SMALL, "--rerun-failed"], "--rerun-failed needs --resume"),
        "backend lacks a selected module's class": (
            ["sweep", "--preset", "smoke", "--backend", str(no_layernorm)],
            "has no LayerNormLinear, which the selected module values layernorm_linear, rmsnorm_linear "
            "need: select --modules linear,grouped_linear,ops_grouped_linear,grouped_linear_tensor,"
            "ops_grouped_linear_tensor"),
        # ci selects the judged recipes by default: a backend without autocast is told the way out
        "backend without autocast under a recipe": (
            ["sweep", "--preset", "ci", "--modules", "linear", "--backend", str(no_layernorm)],
            "has no autocast: it cannot run the recipes delayed, current, mxfp8, blockwise, nvfp4; select --recipes none "
            "or another backend"),
        # native quantized shards are built by TE's quantized_model_init, which the reference lacks
        "reference backend with a native weight": (
            ["sweep", "--preset", "ci", "--weights", "megatron_fp8"],
            "backend 'harness.backends.reference' has no quantized_model_init: it cannot build the native quantized "
            "weights of megatron_fp8; select --backend te-cpu (TE's own modules) or other weights"),
    }


CASES = ["unknown axis value", "malformed filter", "unknown name in filter", "backend import fails",
         "backend module missing", "backend file missing", "real TE does not import", "world size too large", "output not writable",
         "empty selection", "unknown preset", "repro malformed cell id", "resume without a record",
         "list unknown value", "cell timeout zero", "cell timeout negative", "repro cell timeout zero",
         "repro unknown example key", "repro malformed example", "selftest world size too large",
         "selftest cell timeout zero", "rerun-failed without resume", "backend lacks a selected module's class",
         "backend without autocast under a recipe", "reference backend with a native weight"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exits_2_with_one_line_and_launches_nothing(case, tmp_path, bad_backend, no_launch, capsys):
    argv, phrase = _bad_inputs(tmp_path, bad_backend)[case]
    out_dir = tmp_path / "out"
    if argv[0] != "list" and "--out" not in argv and "--resume" not in argv:
        argv = [*argv, "--out", str(out_dir)]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dw-harness: error: "), err
    assert phrase in lines[0], lines[0]
    assert not (out_dir / "logs").exists() and not list(tmp_path.glob("**/logs"))


@pytest.mark.parametrize("case", ["unknown axis value", "backend import fails"])
def test_bad_input_through_a_real_process(case, tmp_path, bad_backend):
    argv, phrase = _bad_inputs(tmp_path, bad_backend)[case]
    proc = subprocess.run([sys.executable, "-m", "harness", *argv, "--out", str(tmp_path / "out")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and phrase in proc.stderr
    assert proc.stderr.startswith("dw-harness: error: ")
    assert not (tmp_path / "out").exists()


#: runs the CLI like ``python -m harness`` and says on its last stderr line whether torch was imported
_TORCH_PROBE = ("import atexit, runpy, sys; atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, "
                "file=sys.stderr)); sys.argv = ['harness', *sys.argv[1:]]; runpy.run_module('harness', "
                "run_name='__main__', alter_sys=True)")


def test_the_cli_process_never_imports_torch(tmp_path):
    """Only the ranks and the backend probe import torch (seconds a command): the probe says
    which torch the ranks get, and the run record carries what it said."""
    import torch

    cell = matrix.select("ci", {"module": ("linear",), "weight": ("plain",), "world_size": (1,), "hooks": ("off",)})[0]
    for argv in (["sweep", "--cells", cell.id, "--out", str(tmp_path / "run"), "--quiet"],
                 ["report", str(tmp_path / "run")], ["list", "--preset", "smoke"]):
        proc = subprocess.run([sys.executable, "-c", _TORCH_PROBE, *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, (argv, proc.stderr[-3000:])
        assert proc.stderr.strip().splitlines()[-1] == "torch imported: False", (argv, proc.stderr[-3000:])
    record = recordfile.read(tmp_path / "run")
    assert record["environment"]["torch"] == torch.__version__
    assert record["environment"]["backend_info"]["torch"]["version"] == torch.__version__


def test_list_json_matches_select(capsys):
    assert cli.main(["list", "--json", "--preset", "ci", "--world-sizes", "1,2"]) == 0
    listed = json.loads(capsys.readouterr().out)
    cells = matrix.select("ci", {"world_size": (1, 2)})
    assert [d["id"] for d in listed] == [c.id for c in cells]
    for d, c in zip(listed, cells):
        assert d["expect"] == c.expect
        axes = {k: v for k, v in d.items() if k not in ("id", "expect", "dims", "operand_blocks", "spans_blocks")}
        assert axes == c.serialize() and matrix.Cell.from_dict(axes) == c
        # the shapes the cell runs with, and the block rule's verdict on them (harness.vocabulary.shape)
        assert set(d["dims"]) == {"in_features", "out_features", "rows", "group_rows_min"}
        assert d["spans_blocks"] == shape.spans(c.recipe, d["dims"]["in_features"], d["dims"]["out_features"],
                                                d["dims"]["group_rows_min"])
        assert (d["operand_blocks"] == {}) == (not recipes.KINDS[c.recipe].blocked)


def test_list_prints_ids_and_counts(capsys):
    assert cli.main(["list", *SMALL]) == 0
    out = capsys.readouterr().out
    cells = matrix.select("ci", {"module": ("linear",), "world_size": (2,), "dtype": ("bf16",)})
    for c in cells:
        assert c.id in out
    errors = sum(c.expect == "error" for c in cells)
    assert f"{len(cells)} cells ({errors} expected to raise)" in out
    assert f"module: linear={len(cells)}" in out and f"world_size: 2={len(cells)}" in out


@pytest.mark.parametrize("argv", [["--help"], ["sweep", "--help"], ["list", "--help"], ["repro", "--help"]])
def test_help_exits_0(argv, capsys):
    assert cli.main(argv) == 0
    assert "usage: dw-harness" in capsys.readouterr().out


def test_help_names_exit_codes_axis_values_and_the_real_default_folder(capsys):
    from harness.vocabulary.errors import COMMAND_EXITS

    for name, codes in COMMAND_EXITS.items():
        assert cli.main([*name.split(), "--help"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert f"exit codes: {codes}" in out, name
    cli.main(["sweep", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "restrict axis hooks to these values: off, identity, offload, save_on_cpu, checkpoint" in out
    assert "restrict axis fused to these values: on, off" in out and "(default: runs/run-<timestamp>)" in out


def test_repro_of_a_two_rank_error_prints_the_traceback_once(tmp_path):
    cell = "linear-distributed-hooks_identity-fused-bf16-ws2-ddp-mb2-g1-bias-igrad-nodelay"
    proc = subprocess.run([sys.executable, "-m", "harness", "repro", cell, "--backend", "prefix", "--out",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert out.count("Traceback (most recent call last)") == 1 and "traceback (ranks 0, 1):" in out, out
    # per rank once as what it raised, once at the traceback's end
    assert out.count("mat1 and mat2 shapes cannot be multiplied") == 3, out
    assert "expected=None actual=None" not in out


def test_cells_selects_by_id_or_substring(capsys):
    one = "grouped_linear-distributed-hooks_identity-fused-bf16-ws4-ddp-mb2-g4-bias-igrad-nodelay"
    assert cli.main(["list", "--cells", one]) == 0
    listed = [ln for ln in capsys.readouterr().out.splitlines() if ln.count("-") > 8]
    assert listed == [one]  # a whole id is that cell, not ops_grouped_linear's namesake
    assert cli.main(["list", "--cells", "hooks_save_on_cpu,hooks_checkpoint", "--modules", "linear"]) == 0
    listed = [ln.split()[0] for ln in capsys.readouterr().out.splitlines() if ln.count("-") > 8]
    assert listed and all(("hooks_save_on_cpu" in i or "hooks_checkpoint" in i) and i.startswith("linear-")
                          for i in listed)
    want = [c.id for c in matrix.select("ci", {"module": ("linear",)}, '"hooks_checkpoint" in id')]
    assert want and set(want) < set(listed)


def test_no_command_prints_the_help(capsys):
    """Nothing asked: the help, every command with its one-line summary (exit 2: nothing was done)."""
    assert cli.main([]) == 2
    out = capsys.readouterr().out
    assert "usage: dw-harness [OPTIONS] COMMAND ..." in out and "sweep     run the matrix under torchrun" in out


def _collected(keyword: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "cases/test_cells.py", "--collect-only", "-q",
                           "-p", "no:randomly", "-k", keyword], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def _id_inside_another() -> tuple[str, str]:
    """A ci cell id that is a substring of another ci cell id (``grouped_linear-...`` inside
    ``ops_grouped_linear-...``): plain substring matching would select both."""
    ids = [c.id for c in matrix.select("ci")]
    return next((a, b) for a in ids for b in ids if a != b and a in b)


def test_k_with_a_full_cell_id_selects_exactly_that_test():
    cell = next(c for c in matrix.select("ci") if c.module == "linear" and c.world_size == 2)
    assert _collected(cell.id) == [f"cases/test_cells.py::test_cell[{cell.id}]"]


def test_k_with_a_cell_id_inside_another_id_selects_exactly_that_test():
    inner, outer = _id_inside_another()
    assert _collected(inner) == [f"cases/test_cells.py::test_cell[{inner}]"], (inner, outer)


def test_k_expression_with_bracketed_test_name_is_exact():
    inner, outer = _id_inside_another()
    assert _collected(f"test_cell[{inner}]") == [f"cases/test_cells.py::test_cell[{inner}]"]
    assert sorted(_collected(f"test_cell[{inner}] or test_cell[{outer}]")) == sorted(
        f"cases/test_cells.py::test_cell[{c}]" for c in (inner, outer))


def test_pytest_collects_one_test_per_selected_cell():
    """Without -k every cell of the selection is a test (a narrowing bug once dropped them all)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "cases/test_cells.py", "--collect-only", "-q",
                           "--world-sizes", "1,2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    ids = [line for line in proc.stdout.splitlines() if "::test_cell[" in line]
    assert ids == [f"cases/test_cells.py::test_cell[{c.id}]" for c in matrix.select("ci", {"world_size": (1, 2)})]


def test_list_into_a_closed_pipe_is_no_internal_error():
    """``list ... | head``: the reader closing the pipe early is not a harness bug (exit 0,
    nothing on stderr), not the "internal error" of exit 3."""
    proc = subprocess.Popen([sys.executable, "-m", "harness", "list", "--preset", "full"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "internal error" not in err and "Traceback" not in err, err
