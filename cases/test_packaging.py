"""What ``pip install .`` installs: ``harness`` and ``harness_reports`` (from ``reports/``) with their data.

Builds the wheel (no dependencies, no venv: seconds) and reads its file list; the
installed layout is what the wheel holds. Also checks that the pyproject's explicit package
list names every package folder under ``harness/`` (a new subpackage must be added there).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_package_list_names_every_package_folder():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "harness").rglob("__init__.py")
               if "__pycache__" not in p.parts}
    assert set(config["packages"]) == on_disk | {"harness_reports"}
    assert config["package-dir"]["harness_reports"] == "reports"


def test_wheel_installs_the_two_packages(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("dw_harness-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"harness", "harness_reports"}, top
    for needed in ("harness_reports/__init__.py", "harness_reports/assets/report.css",
                   "harness_reports/assets/report.js", "harness/rank/worker.py", "harness/records/stream.py",
                   "harness/judging/ledgers/transformer_engine-2.20.toml",
                   "harness/te_tree/patches/transformer_engine-2.20.2-dw-fix.patch"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("fixtures/", "cases/", "reports/", "benchmarks/"))]
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[pytest11]" in text and "dw_harness = harness.pytest_plugin.plugin" in text, text


def test_install_compiles_the_environment_and_the_checkout_on_every_core(tmp_path):
    """``python -m harness install`` compiles the checkout's modules and the environment's
    packages (``harness.install.bytecode``): an editable install leaves the checkout
    uncompiled, under ``PYTHONDONTWRITEBYTECODE`` every process compiled it again, and the
    README's pip installs with ``--no-compile``. A checkout folder with a file that does not
    compile is named and an environment's such file counted, neither an error (their modules
    are compiled as they are imported, as before); a second pass finds everything current."""
    from harness.install import bytecode

    for name in ("harness", "reports"):
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "sub" / "mod.py").write_text("VALUE = 1\n")
    env = tmp_path / "site-packages"
    for i in range(80):  # more than one pool chunk
        (env / f"pkg{i % 3}").mkdir(parents=True, exist_ok=True)
        (env / f"pkg{i % 3}" / f"m{i}.py").write_text(f"VALUE = {i}\n")
    assert bytecode.compile_all(tmp_path, [env], workers=2) == bytecode.Compiled((), 0)
    for name in ("harness", "reports"):
        assert list((tmp_path / name / "sub" / "__pycache__").glob("mod.*.pyc"))
    assert len(list(env.rglob("__pycache__/m*.pyc"))) == 80
    (tmp_path / "fixtures").mkdir()
    (tmp_path / "fixtures" / "broken.py").write_text("def (:\n")
    (env / "pkg0" / "py312.py").write_text("def f[T](a): pass\n")
    compiled = bytecode.compile_all(tmp_path, [env], workers=2)
    assert compiled == bytecode.Compiled(("fixtures",), 1)
    assert compiled.summary() == ("ok: not written for fixtures (compiled as imported); 1 file(s) of the "
                                  "environment not compiled: they do not compile under this Python, or "
                                  "their folder is read-only (left as source)")
    assert bytecode.Compiled((), 0).summary() == "ok"


def test_compiling_ahead_then_the_final_pass_leaves_every_file_current(tmp_path):
    """What ``install`` compiles while pip runs (``bytecode.CompileAhead``) is kept; a file pip
    rewrote meanwhile is compiled again by the final pass even where its compiled file looks
    current (the pass beside pip may have read it half-written: same time, same size); one
    removed meanwhile is no error."""
    import importlib.util
    import os

    from harness.install import bytecode

    env = tmp_path / "site-packages"
    (env / "pkg").mkdir(parents=True)
    for i in range(200):
        (env / "pkg" / f"m{i}.py").write_text(f"VALUE = {i}\n")
    ahead = bytecode.CompileAhead([env], 1)
    ahead.stop()
    assert bytecode.compile_all(tmp_path, [env], workers=2) == bytecode.Compiled((), 0)
    rewritten = env / "pkg" / "m0.py"
    stamp = rewritten.stat().st_mtime_ns
    rewritten.write_text("VALUE = 7\n")  # as long as "VALUE = 0\n"
    os.utime(rewritten, ns=(stamp, stamp))  # the compiled file still looks current
    (env / "pkg" / "m1.py").unlink()

    def value() -> object:
        spec = importlib.util.spec_from_file_location("m0", rewritten)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.VALUE

    assert bytecode.compile_all(tmp_path, [env], workers=2) == bytecode.Compiled((), 0)
    assert value() == 0  # stale: the timestamp check alone cannot see the rewrite
    assert bytecode.compile_all(tmp_path, [env], workers=2, fresh_since=stamp / 1e9) == bytecode.Compiled((), 0)
    assert value() == 7
    for i in [0, *range(2, 200)]:
        assert Path(importlib.util.cache_from_source(str(env / "pkg" / f"m{i}.py"))).is_file()
