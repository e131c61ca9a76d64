"""Judging a TransformerEngine *source tree* with ``te-cpu`` (``--te-tree`` / ``SPEC@TREE``).

``harness.te_tree.tree`` validates a tree and says what it is (git commit, dirty, version);
``patch-te`` makes a patched tree from the installed wheel (or another tree); a sweep with
``--te-tree`` imports TE from the tree in every rank, records the tree in the run record,
and a tree that does not import is bad input (exit 2, nothing launched, no run folder).

Needs ``python -m harness install te`` (as ``cases/test_te_cpu.py``). One sweep (four cells,
one launch) serves several tests; importing ``harness.backends.te_cpu.backend`` patches ``torch``, so this
process never does: the layer runs in subprocesses only.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.te_tree import tree as te_tree
from harness.vocabulary.backend_specs import resolve, split_tree, with_tree
from harness.commands import _inputs
from harness.vocabulary.errors import UsageError
from harness.install import te as te_component
from harness.records.fold import repro_command

ROOT = Path(__file__).resolve().parents[1]
LINEAR = Path("transformer_engine", "pytorch", "module", "linear.py")
TINY_PATCH = """\
diff --git a/transformer_engine/pytorch/module/linear.py b/transformer_engine/pytorch/module/linear.py
--- a/transformer_engine/pytorch/module/linear.py
+++ b/transformer_engine/pytorch/module/linear.py
@@ -1,3 +1,4 @@
+# dw-harness test: a tiny patch
 # Copyright (c) 2022-2026, NVIDIA CORPORATION & AFFILIATES. All rights reserved.
 #
 # See LICENSE for license information.
"""
#: one hunk that applies (to pytorch/__init__.py), one whose context is not there (in
#: linear.py), and one for a file the tree lacks
PARTIAL_PATCH = """\
diff --git a/transformer_engine/pytorch/__init__.py b/transformer_engine/pytorch/__init__.py
--- a/transformer_engine/pytorch/__init__.py
+++ b/transformer_engine/pytorch/__init__.py
@@ -1,3 +1,4 @@
+# dw-harness test: a partial patch
 # Copyright (c) 2022-2026, NVIDIA CORPORATION & AFFILIATES. All rights reserved.
 #
 # See LICENSE for license information.
diff --git a/transformer_engine/pytorch/module/linear.py b/transformer_engine/pytorch/module/linear.py
--- a/transformer_engine/pytorch/module/linear.py
+++ b/transformer_engine/pytorch/module/linear.py
@@ -40,3 +40,4 @@ NO SUCH CONTEXT
 no such line one
 no such line two
+# never applies
 no such line three
diff --git a/transformer_engine/pytorch/no_such_file.py b/transformer_engine/pytorch/no_such_file.py
--- a/transformer_engine/pytorch/no_such_file.py
+++ b/transformer_engine/pytorch/no_such_file.py
@@ -1,2 +1,3 @@
 a
+b
 c
"""


def _harness(*args: str, cwd: Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def _mini_tree(root: Path, version: str | None = "9.1.0.dev0") -> Path:
    (root / "transformer_engine" / "pytorch").mkdir(parents=True)
    (root / "transformer_engine" / "__init__.py").write_text("")
    (root / "transformer_engine" / "pytorch" / "__init__.py").write_text("X = 1\n")
    if version is not None:
        (root / "build_tools").mkdir()
        (root / "build_tools" / "VERSION.txt").write_text(version + "\n")
    return root


# ---- harness.te_tree.tree -------------------------------------------------------------------------
def test_inspect_git_tree_commit_and_dirty_flag(tmp_path: Path) -> None:
    tree = _mini_tree(tmp_path / "te")
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "one")
    head = _git(tree, "rev-parse", "HEAD").strip()
    found = te_tree.inspect(tree)
    assert (found.kind, found.commit, found.dirty, found.version, found.path) == (
        "git", head, False, "9.1.0.dev0", str(tree.resolve()))
    # untracked bytecode (importing the tree writes it) and ignored files do not make a tree dirty
    (tree / "transformer_engine" / "pytorch" / "__pycache__").mkdir()
    (tree / "transformer_engine" / "pytorch" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"x")
    (tree / ".git" / "info" / "exclude").write_text("*.log\n")
    (tree / "build.log").write_text("ignored")
    assert te_tree.inspect(tree).dirty is False and te_tree.inspect(tree).state is None
    # an untracked module is part of the code under review: dirty, and its content is in the digest
    (tree / "transformer_engine" / "pytorch" / "extra.py").write_text("Y = 1\n")
    first = te_tree.inspect(tree)
    assert first.dirty is True and first.state
    (tree / "transformer_engine" / "pytorch" / "extra.py").write_text("Y = 2\n")
    assert te_tree.inspect(tree).state not in (None, first.state)
    (tree / "transformer_engine" / "pytorch" / "extra.py").unlink()
    (tree / "transformer_engine" / "pytorch" / "__init__.py").write_text("X = 2\n")
    found = te_tree.inspect(str(tree))
    assert found.serialize() == {"path": str(tree.resolve()), "commit": head, "dirty": True, "version": "9.1.0.dev0",
                                 "kind": "git", "subdir": None, "state": found.state}


def test_a_tree_inside_a_larger_repository_records_its_commit_and_path(tmp_path: Path) -> None:
    repo = tmp_path / "monorepo"
    tree = _mini_tree(repo / "third_party" / "te")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one")
    found = te_tree.inspect(tree)
    assert (found.kind, found.commit, found.subdir, found.dirty) == (
        "git", _git(repo, "rev-parse", "HEAD").strip(), "third_party/te", False)
    assert "in its repository's third_party/te/ at " in te_tree.describe(found.serialize())
    # a change elsewhere in the repository is not a change of the tree
    (repo / "README").write_text("elsewhere")
    assert te_tree.inspect(tree).dirty is False
    (tree / "transformer_engine" / "pytorch" / "__init__.py").write_text("X = 3\n")
    assert te_tree.inspect(tree).dirty is True


def test_a_plain_folder_is_identified_by_its_content(tmp_path: Path) -> None:
    tree = _mini_tree(tmp_path / "sdist")
    before = te_tree.inspect(tree)
    assert before.kind == "folder" and before.state and te_tree.inspect(tree).state == before.state
    (tree / "transformer_engine" / "pytorch" / "__init__.py").write_text("X = 9\n")
    assert te_tree.inspect(tree).state != before.state


def test_inspect_plain_folder_and_version_sources(tmp_path: Path) -> None:
    tree = _mini_tree(tmp_path / "sdist", version=None)
    found = te_tree.inspect(tree)
    assert (found.kind, found.commit, found.dirty, found.version) == ("folder", None, None, "unknown")
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: transformer_engine\nVersion: 2.21.0\n")
    assert te_tree.inspect(tree).version == "2.21.0"
    (tree / "transformer_engine" / "VERSION.txt").write_text("2.21.1\n")
    assert te_tree.inspect(tree).version == "2.21.1"
    (tree / "build_tools").mkdir()
    (tree / "build_tools" / "VERSION.txt").write_text("2.22.0.dev0\n")
    assert te_tree.inspect(tree).version == "2.22.0.dev0"
    assert found.contains(tree / LINEAR) and not found.contains(tmp_path / "elsewhere.py")


@pytest.mark.parametrize("make", ["missing", "empty", "package_itself"])
def test_inspect_bad_folder_is_one_line_saying_what_was_expected(tmp_path: Path, make: str) -> None:
    path = tmp_path / "nope"
    if make == "empty":
        path.mkdir()
    elif make == "package_itself":
        path = _mini_tree(tmp_path / "t") / "transformer_engine"
    with pytest.raises(te_tree.TreeError) as info:
        te_tree.inspect(path)
    msg = str(info.value)
    assert "\n" not in msg and te_tree.EXPECTED in msg, msg
    assert "a TE source tree (git checkout or unpacked sdist) containing transformer_engine/pytorch" in msg
    if make == "package_itself":
        assert "give its parent" in msg


def test_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(te_tree.ENV, raising=False)
    assert te_tree.from_env() is None
    monkeypatch.setenv(te_tree.ENV, str(_mini_tree(tmp_path / "t")))
    assert te_tree.from_env().version == "9.1.0.dev0"
    monkeypatch.setenv(te_tree.ENV, str(tmp_path))
    with pytest.raises(te_tree.TreeError):
        te_tree.from_env()


# ---- the backend spec ------------------------------------------------------------------------
def test_spec_splits_a_trailing_tree_only(tmp_path: Path) -> None:
    assert split_tree("te-cpu@/src/TE") == ("te-cpu", "/src/TE")
    assert split_tree("te-cpu@./TE") == ("te-cpu", "./TE")
    assert split_tree("harness.backends.reference.mutants:shared-grad-buffer") == (
        "harness.backends.reference.mutants:shared-grad-buffer", None)
    assert split_tree("/tmp/a@b/backend.py") == ("/tmp/a@b/backend.py", None)
    assert split_tree("/x/a@b/c.py@/src/TE") == ("/x/a@b/c.py", "/src/TE")
    assert split_tree("te-cpu@/src/te@d0067d0") == ("te-cpu", "/src/te@d0067d0")  # an @ in the tree's path
    assert resolve("te-cpu@/src/TE") == "harness.backends.te_cpu.backend" and resolve("te-cpu") == "harness.backends.te_cpu.backend"
    tree = _mini_tree(tmp_path / "te tree with spaces")
    spec = with_tree("te-cpu", str(tree))
    assert spec == f"te-cpu@{tree.resolve()}" and split_tree(spec) == ("te-cpu", str(tree.resolve()))
    # a repro line quotes the spec: it splits back into the same --backend
    line = repro_command("linear-plain-hooks_off-unfused-bf16-ws1-ddp-mb1-g1-nobias-igrad-nodelay", spec)
    argv = shlex.split(line)
    assert argv[argv.index("--backend") + 1] == spec


def test_te_tree_option_folds_into_the_backend(tmp_path: Path) -> None:
    tree = _mini_tree(tmp_path / "te")
    args = argparse.Namespace(backend="te-cpu", te_tree=str(tree), resume=None)
    assert _inputs.backend_spec(args) == f"te-cpu@{tree.resolve()}" == args.backend
    assert _inputs.backend_spec(argparse.Namespace(backend="te-cpu", te_tree=None)) == "te-cpu"
    for bad in (argparse.Namespace(backend="te-cpu", te_tree=str(tmp_path / "nope"), resume=None),
                argparse.Namespace(backend="te-cpu", te_tree=str(tree), resume=tmp_path),
                argparse.Namespace(backend=f"te-cpu@{tree}", te_tree=str(tree), resume=None)):
        with pytest.raises(UsageError):
            _inputs.backend_spec(bad)


def test_pytest_plugin_has_te_tree(tmp_path: Path) -> None:
    from harness.pytest_plugin import plugin

    tree = _mini_tree(tmp_path / "te")

    def config(backend: str | None, tree_opt: str | None) -> SimpleNamespace:
        opts = {"harness_backend": backend, "harness_te_tree": tree_opt}
        return SimpleNamespace(getoption=lambda name: opts[name])

    assert plugin.pytest_harness_make_backend(config("te-cpu", str(tree))) == f"te-cpu@{tree.resolve()}"
    assert plugin.pytest_harness_make_backend(config(None, None)) == "harness.backends.reference"
    with pytest.raises(pytest.UsageError, match="expected a TE source tree"):
        plugin.pytest_harness_make_backend(config("te-cpu", str(tmp_path / "nope")))


# ---- the extension stand-in follows a tree's headers and bindings ------------------------------
def test_referenced_names_are_parsed_from_the_files_that_import_the_extension(tmp_path: Path) -> None:
    """The names a tree takes from the extension: ``<alias>.<name>`` under any alias (an
    import anywhere in the file, even after the use), ``from ... import`` names; not
    ``torch.ops.tex.<op>``, not another module's ``tex`` in a file that never imports the
    extension, not a file that does not parse; only ``pytorch/``, ``debug/``, ``common/``."""
    from harness.te_tree.scan import referenced_names

    te = tmp_path / "transformer_engine"
    files = {
        "pytorch/a.py": "def f():\n    return tex.late_use(torch.ops.tex.not_this)\n"
                        "import transformer_engine_torch as tex\nx = tex.gemm\n",
        "pytorch/sub/b.py": "from transformer_engine_torch import DType, quantize as q\nimport transformer_engine_torch\n"
                            "transformer_engine_torch.full_name()\n",
        "pytorch/c.py": "from .cpp_extensions import tex\ntex.not_imported_here()\n",
        "pytorch/broken.py": "import transformer_engine_torch as tex\ntex.in_a_broken_file(\n",
        "debug/d.py": "import transformer_engine_torch as T\nT.debug_name\n",
        "common/e.py": "import transformer_engine_torch as tex\ntex.common_name\n",
        "jax/f.py": "import transformer_engine_torch as tex\ntex.not_scanned\n",
    }
    for rel, text in files.items():
        (te / rel).parent.mkdir(parents=True, exist_ok=True)
        (te / rel).write_text(text)
    assert referenced_names(te) == {"late_use", "gemm", "DType", "quantize", "full_name", "debug_name",
                                    "common_name"}
    # kept in a memo folder: read back while the sources are the same, parsed again once one changed
    memo = tmp_path / "memo"
    memo.mkdir()
    assert referenced_names(te, memo) == referenced_names(te)
    kept = list(memo.glob("te-tree-names-*.json"))
    assert len(kept) == 1
    kept[0].write_text('["only_from_the_memo"]')
    assert referenced_names(te, memo) == {"only_from_the_memo"}
    (te / "debug/d.py").write_text("import transformer_engine_torch as T\nT.another_name\n")
    assert "another_name" in referenced_names(te, memo) and len(list(memo.glob("te-tree-names-*.json"))) == 2
    (te / "pytorch/unrelated.py").write_text("x = 1\n")  # no import of the extension: the same key
    assert referenced_names(te, memo) == referenced_names(te) and len(list(memo.glob("*.json"))) == 2


def test_extension_enums_follow_the_tree(tmp_path: Path) -> None:
    """Bound members with the header's values; an enum without a binding keeps te-cpu's
    members (values from the header); an enum the tree neither declares nor binds stays
    built-in; a tree without headers (made from the wheel) gets the built-in enums. The
    tree's enums are the built module's own (the harness's stay built-in), and the kernels
    read TE's dtype values through the stand-in registered in the process."""
    te = tmp_path / "tree" / "transformer_engine"
    inc = te / "common" / "include" / "transformer_engine"
    inc.mkdir(parents=True)
    (te / "common" / "util").mkdir()
    (te / "pytorch" / "csrc" / "extensions").mkdir(parents=True)
    (inc / "transformer_engine.h").write_text(textwrap.dedent("""\
        #pragma once
        /*! \\enum NVTEScalingMode */
        enum NVTEScalingMode {
          NVTE_DELAYED_TENSOR_SCALING = 0,  // per tensor
          NVTE_NEW_SCALING = 7,
          NVTE_INVALID_SCALING = 200
        };
        namespace transformer_engine {
        enum class DType { kByte = 0, kInt16 = 1, kInt32 = 2, kInt64, kFloat32, kFloat16, kBFloat16,
                           kFloat8E4M3, kFloat8E5M2, kFloat8E8M0, kFloat4E2M1, kFloat4Next, kNumTypes };
        }
        typedef enum { NVTE_TOY_A = 0, NVTE_TOY_B = 1 << 3 } NVTEToy;
        """))
    (te / "common" / "util" / "pybind_helper.h").write_text(textwrap.dedent("""\
        #define NVTE_DECLARE_COMMON_PYBIND11_HANDLES(m)                              \\
          pybind11::enum_<transformer_engine::DType>(m, "DType", pybind11::module_local()) \\
              .value("kByte", transformer_engine::DType::kByte)                  \\
              .value("kFloat32", transformer_engine::DType::kFloat32)            \\
              .value("kBFloat16", transformer_engine::DType::kBFloat16)          \\
              .value("kFloat4Next", transformer_engine::DType::kFloat4Next);     \\
          pybind11::enum_<NVTEToy>(m, "NVTEToy", pybind11::module_local())       \\
              .value("A", NVTE_TOY_A)                                            \\
              .value("B", NVTE_TOY_B);
        """))
    (te / "pytorch" / "__init__.py").write_text("import transformer_engine_torch as tex\nT = tex.NVTEToy.B\n")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import json, sys, torch
        from pathlib import Path
        from harness.backends.te_cpu import extension
        te = Path({str(te)!r})
        mod = extension.build(te)
        out = {{name: {{m.name: int(m) for m in getattr(mod, name)}}
               for name in ("DType", "NVTEScalingMode", "NVTEToy", "CommOverlapType")}}
        out["builtin_kept"] = mod.DType is not extension.DType and "kInt32" in extension.DType.__members__
        sys.modules[extension.MODULE_NAME] = mod  # as te-cpu's loader registers it: the kernels follow it
        x, w = torch.ones(2, 4), torch.ones(4)
        out["torch_bf16"] = str(mod.rmsnorm_fwd(x, w, 1e-5, None, None, mod.DType.kBFloat16, 0, False)[0].dtype)
        try:
            mod.rmsnorm_fwd(x, w, 1e-5, None, None, mod.DType.kFloat4Next, 0, False)
        except extension.MissingCpuKernel as exc:
            out["tree_value"] = str(exc)
        try:
            mod.DType.kFloat99
        except extension.MissingExtensionAttribute as exc:
            out["missing_member"] = exc.qualname
        out["probe_default"] = getattr(mod, "no_such_kernel", "default")
        out["stubbed"] = hasattr(mod, "fused_attn_fwd")
        wheel = extension.build(None)
        out["wheel_dtype"] = {{m.name: int(m) for m in wheel.DType}}
        print(json.dumps(out))
        """)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["DType"] == {"kByte": 0, "kFloat32": 4, "kBFloat16": 6, "kFloat4Next": 11}
    assert out["NVTEScalingMode"]["NVTE_INVALID_SCALING"] == 200 and "NVTE_NEW_SCALING" not in out["NVTEScalingMode"]
    assert out["NVTEScalingMode"]["NVTE_MXFP8_1D_SCALING"] == 1  # te-cpu's member, kept
    assert out["NVTEToy"] == {"A": 0, "B": 8}  # referenced by the tree, bound and declared there
    assert out["CommOverlapType"] == {"RS": 0, "AG": 1}
    # the tree's enums live on the module built for it; the kernels read TE's values through it
    assert out["builtin_kept"] and out["torch_bf16"] == "torch.bfloat16"
    assert out["tree_value"] == "TE dtype kFloat4Next has no CPU kernel output"  # 11: the tree's member
    assert out["missing_member"] == "transformer_engine_torch.DType.kFloat99"
    assert out["probe_default"] == "default" and out["stubbed"] is False  # the tree never names it
    assert out["wheel_dtype"] == {"kByte": 0, "kInt32": 2, "kFloat32": 4, "kFloat16": 5, "kBFloat16": 6,
                                  "kFloat8E4M3": 7, "kFloat8E5M2": 8, "kFloat4E2M1": 10}


# ---- patch-te and a sweep of its tree --------------------------------------------------------
@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``patch-te`` of the installed wheel with a tiny patch, into a folder with a space."""
    why = te_component.missing()
    if why is not None:
        pytest.fail(f"te-cpu needs TransformerEngine: {why}: run `python -m harness install te`", pytrace=False)
    base = tmp_path_factory.mktemp("patch-te")
    patch = base / "tiny.patch"
    patch.write_text(TINY_PATCH)
    out = base / "te tree"
    proc = _harness("patch-te", str(out), "--patch", str(patch))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    head = _git(out, "rev-parse", "HEAD").strip()
    assert f"is at commit {head}" in proc.stdout
    assert f"next: python -m harness sweep --backend te-cpu --te-tree {shlex.quote(str(out.resolve()))} --preset ci" \
        in proc.stdout
    return out.resolve()


def test_patch_te_round_trip(patched: Path, tmp_path: Path) -> None:
    log = _git(patched, "log", "--format=%s").splitlines()
    assert log == ["dw-harness: hook-safe DistributedWeight fix",
                   f"transformer-engine {te_component.TE_VERSION} as installed"]
    found = te_tree.inspect(patched)
    assert (found.kind, found.version, found.dirty) == ("git", te_component.TE_VERSION, False)
    assert (patched / LINEAR).read_text().startswith("# dw-harness test: a tiny patch\n")
    tracked = _git(patched, "ls-files").splitlines()
    assert LINEAR.as_posix() in tracked and not [f for f in tracked if "__pycache__" in f or f.endswith(".pyc")]
    assert (patched / "build_tools" / "VERSION.txt").read_text().strip() == te_component.TE_VERSION
    # OUT exists and is not empty: bad input, nothing touched
    again = _harness("patch-te", str(patched), "--patch", str(tmp_path / "x.patch"))
    assert again.returncode == 2 and "not empty" in again.stderr
    assert te_tree.inspect(patched).commit == found.commit


def test_patch_te_from_a_tree_reports_rejected_hunks(patched: Path, tmp_path: Path) -> None:
    patch = tmp_path / "partial.patch"
    patch.write_text(PARTIAL_PATCH)
    out = tmp_path / "from"
    proc = _harness("patch-te", str(out), "--from", str(patched), "--patch", str(patch))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rejected = [ln for ln in proc.stdout.splitlines() if "REJECTED" in ln]
    assert rejected == [
        "patch-te: REJECTED transformer_engine/pytorch/module/linear.py: @@ -40,3 +40,4 @@ NO SUCH CONTEXT",
        "patch-te: REJECTED transformer_engine/pytorch/no_such_file.py: @@ -1,2 +1,3 @@  "
        "(No such file or directory)"], proc.stdout
    assert "applied 1/3 hunk(s)" in proc.stdout
    # only transformer_engine/ and build_tools/VERSION.txt were copied; what applied is committed
    assert sorted(p.name for p in out.iterdir()) == [".git", ".gitignore", "build_tools", "transformer_engine"]
    assert (out / "transformer_engine" / "pytorch" / "__init__.py").read_text().startswith(
        "# dw-harness test: a partial patch\n")
    assert (out / LINEAR).read_text() == (patched / LINEAR).read_text()
    found = te_tree.inspect(out)
    assert found.dirty is False and found.version == te_component.TE_VERSION
    assert len(_git(out, "log", "--format=%s").splitlines()) == 2 and (out / f"{LINEAR}.rej").is_file()
    bad = _harness("patch-te", str(tmp_path / "other"), "--from", str(tmp_path), "--patch", str(patch))
    assert bad.returncode == 2 and not (tmp_path / "other").exists(), bad.stderr


@pytest.fixture(scope="module")
def tree_sweep(patched: Path,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, subprocess.CompletedProcess]:
    """One te-cpu sweep of four cells (one launch) on the patch-te tree (a shard 1/1, so
    ``merge`` takes it)."""
    run = tmp_path_factory.mktemp("tree-sweep") / "run"
    proc = _harness("sweep", "--backend", "te-cpu", "--te-tree", str(patched), "--preset", "smoke",
                    "--modules", "linear,grouped_linear", "--shard", "1/1", "--quiet", "--out", str(run))
    with gzip.open(run / "results.json.gz", "rt") as fh:
        record = json.load(fh)
    return run, record, proc


def test_sweep_records_the_tree(tree_sweep: tuple[Path, dict, subprocess.CompletedProcess], patched: Path) -> None:
    run, record, proc = tree_sweep
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    spec = f"te-cpu@{patched}"
    assert record["backend"] == spec and len(record["cells"]) == 4
    # a tree is a change under review even without --fixes: nothing required, nothing stale
    assert record["ledger"]["required"] == [] and record["ledger"]["stale"] == []
    info = record["environment"]["backend_info"]
    assert info["spec"] == spec and info["module"] == "harness.backends.te_cpu.backend"
    assert info["version"] == te_component.TE_VERSION
    assert info["upstream_origin"] == str(patched / "transformer_engine")
    tree = info["extra"]["te_tree"]
    assert tree == {"path": str(patched), "commit": _git(patched, "rev-parse", "HEAD").strip(), "dirty": False,
                    "version": te_component.TE_VERSION, "kind": "git", "subdir": None, "state": None}
    # the compiled part is named: te-cpu's CPU layer, never a build from elsewhere
    assert info["extra"]["compiled"] == {"kind": "te-cpu", "path": None}
    assert "compiled part: te-cpu's CPU layer" in proc.stdout
    for cell in record["cells"]:
        argv = shlex.split(cell["repro"])
        assert argv[argv.index("--backend") + 1] == spec, cell["repro"]
    assert f"backend {spec}" in proc.stdout


def test_sweep_imports_te_from_the_tree(patched: Path) -> None:
    """In a rank-like process: TE's modules come from the tree (its patched linear.py)."""
    code = textwrap.dedent("""
        import json, sys
        from harness.rank.loading import load_backend
        backend = load_backend(sys.argv[1])
        te = sys.modules["transformer_engine.pytorch"]
        import transformer_engine.pytorch.module.linear as linear
        print(json.dumps({"origin": backend.TE_ORIGIN, "te": te.__file__, "linear": linear.__file__,
                          "tree": backend.describe()["te_tree"]["path"]}))
    """)
    proc = subprocess.run([sys.executable, "-c", code, f"te-cpu@{patched}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["origin"] == str(patched / "transformer_engine") and out["tree"] == str(patched)
    assert Path(out["linear"]) == patched / LINEAR and Path(out["te"]).is_relative_to(patched)


def test_resume_merge_and_diff_carry_the_tree(tree_sweep: tuple[Path, dict, subprocess.CompletedProcess],
                                              tmp_path: Path) -> None:
    run, record, _ = tree_sweep
    merged = tmp_path / "merged"
    proc = _harness("merge", str(run), "--out", str(merged))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with gzip.open(merged / "results.json.gz", "rt") as fh:
        assert json.load(fh)["backend"] == record["backend"]
    proc = _harness("diff", str(run), str(merged))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # a resumed run takes the recorded backend, tree included (nothing is left to run here)
    proc = _harness("sweep", "--resume", str(run), "--quiet")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"backend {record['backend']}" in proc.stdout


def test_resume_after_a_commit_in_the_tree_is_refused_naming_both(patched: Path, tmp_path: Path) -> None:
    """A record names one commit: a resumed run against a tree that moved on would judge other
    code under it. Refused before anything runs (exit 2), naming both commits."""
    tree = tmp_path / "tree"
    shutil.copytree(patched, tree)  # the repository with patch-te's byte-compiled modules: none recompiles
    run = tmp_path / "run"
    cell = "linear-plain-hooks_off-unfused-bf16-ws1-ddp-mb1-g1-nobias-igrad-nodelay"
    proc = _harness("sweep", "--backend", "te-cpu", "--te-tree", str(tree), "--preset", "full", "--cells", cell,
                    "--quiet", "--out", str(run))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    before = _git(tree, "rev-parse", "HEAD").strip()
    (tree / "NOTES").write_text("a later commit\n")
    _git(tree, "add", "NOTES")
    _git(tree, "commit", "-qm", "later")
    after = _git(tree, "rev-parse", "HEAD").strip()
    proc = _harness("sweep", "--resume", str(run), "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"commit {before[:12]}" in proc.stderr and f"commit {after[:12]}" in proc.stderr, proc.stderr
    assert "judged other code than now" in proc.stderr


def test_tree_that_does_not_import_is_bad_input(patched: Path, tmp_path: Path) -> None:
    """A SyntaxError planted in module/linear.py: exit 2 and one line naming the file, before
    anything is launched - no run folder (default or --out) is made."""
    broken = tmp_path / "broken"
    shutil.copytree(patched, broken)  # with the byte-compiled modules patch-te made: only linear.py recompiles
    with (broken / LINEAR).open("a") as fh:
        fh.write("\ndef planted(:\n")
    work = tmp_path / "cwd"
    work.mkdir()
    for out in ([], ["--out", str(tmp_path / "run")]):
        proc = _harness("sweep", "--backend", "te-cpu", "--te-tree", str(broken), "--preset", "smoke", *out, cwd=work)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = _lines(proc.stderr)
        assert len(lines) == 1 and "SyntaxError" in lines[0] and str(broken / LINEAR) in lines[0], lines
        assert list(work.iterdir()) == [] and not (tmp_path / "run").exists()


def test_bad_tree_option_is_bad_input(tmp_path: Path) -> None:
    proc = _harness("sweep", "--backend", "te-cpu", "--te-tree", str(tmp_path / "nope"), "--preset", "smoke",
                    "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and not (tmp_path / "run").exists()
    lines = _lines(proc.stderr)
    assert len(lines) == 1 and "expected a TE source tree" in lines[0], lines
    proc = _harness("repro", "linear-plain-hooks_off-unfused-bf16-ws1-ddp-mb1-g1-nobias-igrad-nodelay",
                    "--backend", "te-cpu", "--te-tree", str(tmp_path))
    assert proc.returncode == 2 and len(_lines(proc.stderr)) == 1, proc.stderr
