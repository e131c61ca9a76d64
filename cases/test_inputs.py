"""Bad input is refused before anything slow: exit 2, one line, nothing of the user's touched.

Each case runs ``python -m harness`` as a real process, in a working folder of its own, with
a backend whose import leaves a mark (``MARKED``): the backend's probe is the first slow step
of a command, so a refusal that leaves no mark came before it. (The project's tests assert no
wall-clock limit; what the probe costs is why the order matters: docs/decisions.md.) Every
command that takes the option gets the same check (``harness.commands._inputs``), so each
rule is tried on each command that takes its option.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.orchestration import preflight
from harness.vocabulary import matrix

ROOT = Path(__file__).resolve().parents[1]
CELL = next(c.id for c in matrix.select("ci") if c.module == "linear" and c.world_size == 2 and c.recipe == "none")
#: a backend (the reference's classes) that writes ``<its name>.imported`` beside itself when imported
MARKED = ("import pathlib\n"
          "pathlib.Path(__file__).with_suffix('.imported').write_text('imported')\n"
          "from harness.backends.reference import GroupedLinear, LayerNormLinear, Linear, ops  # noqa: F401\n")
#: a ledger file with entries
SHIPPED_TE = ROOT / "harness" / "judging" / "ledgers" / "transformer_engine-2.20.toml"
LEDGER_HEAD = '[ledger]\npackage = "harness"\nversions = ">=0"\n'


def _harness(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("DW_TE_TREE", None)
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env, stdin=subprocess.DEVNULL)


class Place:
    """A working folder, a marked backend, and the user's own files to keep."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = root / "work"
        self.work.mkdir()
        self.backend = root / "marked_backend.py"
        self.backend.write_text(MARKED)
        self.mark = self.backend.with_suffix(".imported")
        self.mine = root / "mine"  # a folder of the user's: not a run
        self.mine.mkdir()
        (self.mine / "summary.md").write_text("my own notes\n")
        self.file = root / "a-file"
        self.file.write_text("not a folder\n")
        self.empty_ledger = root / "empty.toml"
        self.empty_ledger.write_text("")
        self.headless_ledger = root / "head-only.toml"
        self.headless_ledger.write_text(LEDGER_HEAD)
        self.broken_ledger = root / "broken.toml"
        self.broken_ledger.write_text(LEDGER_HEAD + "[[entry]\n")

    def snapshot(self) -> dict[str, bytes]:
        """Every file of the place but the working folder, with its bytes."""
        return {str(p.relative_to(self.root)): p.read_bytes() for p in sorted(self.root.rglob("*"))
                if p.is_file() and self.work not in p.parents}

    def refused(self, *argv: str, says: str | tuple[str, ...]) -> str:
        """Run ``argv``: exit 2, one line on stderr saying ``says``, the backend never imported,
        nothing written (the working folder stays empty, the user's files keep their bytes)."""
        before = self.snapshot()
        proc = _harness(*argv, cwd=self.work)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2, (argv, proc.stdout[-2000:], proc.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith("dw-harness: error: "), (argv, proc.stderr)
        for phrase in (says,) if isinstance(says, str) else says:
            assert phrase in lines[0], (argv, lines[0])
        assert not self.mark.exists(), f"{argv}: the backend was probed before the refusal"
        assert list(self.work.iterdir()) == [], (argv, list(self.work.iterdir()))
        assert self.snapshot() == before, argv
        return lines[0]


@pytest.fixture
def place(tmp_path: Path) -> Place:
    return Place(tmp_path)


def test_the_mark_shows_a_probe(place: Place) -> None:
    """The control: a command that probes the backend leaves the mark (so its absence below
    means the refusal came first)."""
    proc = _harness("list", "--preset", "smoke", "--modules", "linear", "--backend", str(place.backend),
                    "--ledger", "none", cwd=place.work)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert place.mark.exists()


def test_out_into_a_folder_of_other_files(place: Place) -> None:
    """The user's folder is no run: refused unless --force, on every command that writes a run folder."""
    says = ("holds no run but other files (summary.md)", "--force")
    place.refused("sweep", "--preset", "smoke", "--backend", str(place.backend), "--out", str(place.mine), says=says)
    place.refused("repro", CELL, "--backend", str(place.backend), "--out", str(place.mine), says=says)
    place.refused("selftest", "--preset", "smoke", "--out", str(place.mine), says=says)
    place.refused("merge", str(place.root / "no-shard"), "--out", str(place.mine), says=says)


def test_force_without_out(place: Place) -> None:
    says = "--force replaces what --out DIR holds: without --out it does nothing"
    place.refused("sweep", "--preset", "smoke", "--backend", str(place.backend), "--force", says=says)
    place.refused("repro", CELL, "--backend", str(place.backend), "--force", says=says)
    place.refused("selftest", "--preset", "smoke", "--force", says=says)
    place.refused("merge", str(place.root / "no-shard"), "--force", says=says)


def test_out_beside_resume(place: Place) -> None:
    place.refused("sweep", "--resume", str(place.root / "run"), "--out", str(place.root / "elsewhere"),
                  says="--out cannot be combined with --resume")


def test_out_onto_a_file_or_under_one(place: Place) -> None:
    place.refused("sweep", "--preset", "smoke", "--backend", str(place.backend), "--out", str(place.file),
                  says="is a file, not a folder")
    place.refused("repro", CELL, "--backend", str(place.backend), "--out", str(place.file / "run"),
                  says=("is not writable", "is a file, not a folder"))
    place.refused("selftest", "--out", str(place.file), says="is a file, not a folder")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into a read-only folder")
def test_out_into_a_read_only_folder(place: Place) -> None:
    locked = place.root / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        place.refused("sweep", "--preset", "smoke", "--backend", str(place.backend), "--out", str(locked / "run"),
                      says="read-only for this user")
        place.refused("sweep", "--preset", "smoke", "--backend", str(place.backend), "--out", str(locked),
                      says="read-only for this user")
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize("which, says", [("empty_ledger", "is empty"), ("headless_ledger", "has no entries")])
def test_an_empty_ledger(place: Place, which: str, says: str) -> None:
    ledger = str(getattr(place, which))
    place.refused("ledger", "check", ledger, says=says)
    place.refused("ledger", "list", ledger, says=says)
    place.refused("sweep", "--preset", "smoke", "--backend", str(place.backend), "--ledger", ledger, says=says)
    place.refused("repro", CELL, "--backend", str(place.backend), "--ledger", ledger, says=says)
    place.refused("list", "--preset", "smoke", "--backend", str(place.backend), "--ledger", ledger, says=says)


def test_a_missing_or_malformed_ledger(place: Place) -> None:
    place.refused("sweep", "--preset", "smoke", "--backend", str(place.backend), "--ledger",
                  str(place.root / "nope.toml"), says="cannot read ledger")
    place.refused("sweep", "--preset", "smoke", "--backend", str(place.backend), "--ledger",
                  str(place.broken_ledger), says="is not valid TOML")
    place.refused("repro", CELL, "--backend", str(place.backend), "--ledger", "nonee",
                  says=("cannot read ledger 'nonee'", "did you mean --ledger none?"))
    place.refused("list", "--preset", "smoke", "--ledger", str(place.broken_ledger),
                  says="--ledger needs --backend")
    # --fixes against a ledger file: each pattern names an entry of it (the shipped TE ledger)
    place.refused("sweep", "--preset", "full", "--backend", str(place.backend), "--ledger", str(SHIPPED_TE),
                  "--fixes", "hooks-strip-distributed-weigth",
                  says="names no entry of ledger transformer_engine-2.20 - did you mean hooks-strip-distributed-weight?")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_te_tree_whose_changed_file_does_not_compile(place: Place) -> None:
    """A reviewer's typo in a tree under review: named (file and line) before TE is imported."""
    tree = place.root / "te"
    module = tree / "transformer_engine" / "pytorch" / "module.py"
    module.parent.mkdir(parents=True)
    (tree / "transformer_engine" / "__init__.py").write_text("")
    (module.parent / "__init__.py").write_text("")
    module.write_text("X = 1\n")
    _git(tree, "init", "-q")
    _git(tree, "add", ".")
    _git(tree, "commit", "-qm", "tree")
    module.write_text("X = 1\ndef planted(:\n")
    says = ("SyntaxError", f"{module}, line 2")
    place.refused("sweep", "--preset", "smoke", "--backend", str(place.backend), "--te-tree", str(tree), says=says)
    place.refused("repro", CELL, "--backend", f"{place.backend}@{tree}", says=says)
    place.refused("list", "--preset", "smoke", "--backend", str(place.backend), "--te-tree", str(tree), says=says)
    place.refused("sweep", "--preset", "smoke", "--backend", str(place.backend), "--te-tree", str(place.root / "nope"),
                  says="expected a TE source tree")


def test_an_empty_selection_names_the_rule(place: Place) -> None:
    place.refused("sweep", "--preset", "smoke", "--weights", "gtp_mcore_fp8", "--backend", str(place.backend),
                  says=("the selection is empty: --weights gtp_mcore_fp8 with recipe none (preset smoke's; "
                        "--recipes names others)", "requires a recipe in delayed, current, mxfp8"))
    place.refused("list", "--weights", "megatron", "--world-sizes", "1",
                  says="--weights megatron with --world-sizes 1: weight='megatron'")
    place.refused("sweep", "--filter", "world_size > 100", "--backend", str(place.backend),
                  says="the filter 'world_size > 100' (--filter and --cells) matches none of the")


def test_typos_get_the_commands_usage_and_a_did_you_mean(place: Place) -> None:
    place.refused("sweep", "--presett", "smoke", says=("did you mean --preset?", "usage: dw-harness sweep [OPTIONS]"))
    place.refused("sweep", "--presett=smoke", says="did you mean --preset?")
    place.refused("swep", "--preset", "smoke", says=("unknown command 'swep' - did you mean sweep?",
                                                     "usage: dw-harness [OPTIONS] COMMAND ..."))
    place.refused("ledger", "chek", "x.toml", says=("unknown verb 'chek' - did you mean check?",
                                                    "usage: dw-harness ledger [OPTIONS] VERB ..."))
    place.refused("sweep", "--device", "gpu", says="unknown value 'gpu' for --device")
    # a backend no folder holds: said before the selection (here the whole of ``full``) and the probe
    place.refused("sweep", "--preset", "full", "--backend", "te_cpu",
                  says="No module named 'te_cpu' - did you mean --backend te-cpu?")
    place.refused("repro", says=("CELL_ID", "usage: dw-harness repro [OPTIONS] CELL_ID"))
    place.refused("merge", "--out", str(place.root / "m"),
                  says="usage: dw-harness merge [OPTIONS] RUN_DIR [RUN_DIR ...]")


def test_no_command_prints_the_help(place: Place) -> None:
    proc = _harness(cwd=place.work)
    assert proc.returncode == 2 and proc.stderr == ""
    assert proc.stdout.startswith("usage: dw-harness [OPTIONS] COMMAND ...")
    for command in ("list", "sweep", "merge", "repro", "report", "diff", "selftest", "ledger", "install", "patch-te"):
        assert f"\n    {command} " in proc.stdout, command


@pytest.mark.skipif(preflight.gpu_absence() is None, reason="this machine may have a GPU")
def test_a_gpu_only_backend_on_a_cpu_machine(place: Place) -> None:
    says = ("--backend transformer_engine.pytorch is real TE, which runs on CUDA GPUs",
            "to run TE's own Python code on this machine, use --backend te-cpu")
    place.refused("sweep", "--preset", "smoke", "--backend", "transformer_engine.pytorch", says=says)
    place.refused("repro", CELL, "--backend", "transformer_engine.pytorch", says=says)
    place.refused("sweep", "--preset", "smoke", "--backend", str(place.backend), "--device", "cuda",
                  says="--device cuda: CUDA is not available here")


def test_output_files_and_folders_of_the_readers(place: Place) -> None:
    """``diff --html``, ``ledger report --out`` and ``report --to`` name what they write:
    a folder where a file goes (or the reverse) is refused before any record is read."""
    run = str(place.root / "run")
    place.refused("diff", run, run, "--html", str(place.mine), says="--html")
    place.refused("ledger", "report", "entry", "--run", run, "--out", str(place.mine), says="is a folder, not a file")
    place.refused("report", run, "--to", str(place.file), says="--to")


def test_help_is_grouped_and_states_each_list_once(place: Place) -> None:
    out = _harness("sweep", "--help", cwd=place.work).stdout
    groups = [line for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert groups[:4] == ["selection:", "backend and judging:", "run control:", "options:"], groups
    modules = "linear, grouped_linear, ops_grouped_linear, layernorm_linear, rmsnorm_linear"
    recipes_help = out[out.index("--recipes"):out.index("--first-microbatch")]
    assert " ".join(recipes_help.split()).count(modules) == 1, recipes_help
    for option in ("--resume", "--fixes", "--packing", "--out", "--backend"):
        assert out.index("--preset") < out.index(f"  {option}"), option


# ---- the checks themselves, where a real process cannot show them on this machine ------------
def test_a_read_only_folder_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user without write permission sees (this suite may run as root, who writes anywhere)."""
    from harness.commands import _inputs

    monkeypatch.setattr(_inputs.os, "access", lambda path, mode: False)
    assert _inputs.unwritable(tmp_path) == "it is read-only for this user"
    assert _inputs.unwritable(tmp_path / "run" / "sub") == f"{str(tmp_path)!r} is read-only for this user"
    with pytest.raises(_inputs.UsageError, match="is not writable: it is read-only for this user"):
        _inputs.out_folder(tmp_path, force=False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the device nodes are Linux's")
def test_no_gpu_is_told_only_where_certain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "null").write_text("")
    assert "no GPU device" in preflight.gpu_absence(dev)
    for node in ("nvidia0", "dxg", "kfd"):
        (dev / node).write_text("")
        assert preflight.gpu_absence(dev) is None, node
        (dev / node).unlink()
    (dev / "nvidia0").write_text("")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "hides every GPU" in preflight.gpu_absence(dev)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert preflight.gpu_absence(dev) is None


@pytest.mark.parametrize("overrides, filter_expr, says", [
    ({"weight": ("gtp_mcore_fp8",)}, None, "recipe none (preset smoke's; --recipes names others)"),
    ({"module": ("mcore_grouped_mlp",), "consumer": ("autograd",)}, None, "requires consumer='ddp'"),
    ({"microbatches": (1,), "first_mb": (True,)}, None, "requires microbatches >= 2"),
    ({"dtype": ("fp16",), "recipe": ("nvfp4",)}, None, "FP4 GEMM does not support FP16 output"),
    ({"module": ("linear",)}, 'module == "grouped_linear"', "matches none of the 2 cell(s) of preset smoke, --modules linear"),
])
def test_an_empty_selection_is_explained(overrides: dict, filter_expr: str | None, says: str) -> None:
    assert matrix.select("smoke", overrides, filter_expr) == []
    assert says in matrix.why_empty("smoke", overrides, filter_expr)


def test_a_rule_that_empties_only_with_others_is_named() -> None:
    """No single rule's pair of domains is empty, yet the rules together leave nothing: the rule
    that removed an axis's last value is named."""
    overrides = {"module": ("mcore_grouped_mlp",), "weight": ("distributed", "megatron"), "world_size": (1,)}
    assert matrix.select("ci", overrides) == []
    said = matrix.why_empty("ci", overrides)
    assert "(megatron by world_size 1 ruled out first): Megatron's expert layer" in said, said
