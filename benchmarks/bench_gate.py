"""Where the CI gate's time goes (``.ci/run``): stage by stage, test file by test file.

Why: the gate takes ~28 min on the project's 2-core machine, and a change that speeds it up
(or slows it down) should be shown per stage, per test file and per kind of test, beside the
machine's load - not guessed from one total.

    python benchmarks/bench_gate.py --run [--clone-of REV | --with-changes] [--out DIR] [--name NAME]
    python benchmarks/bench_gate.py --from before=/tmp/cici-art --log before=/tmp/cici.log \\
                                    --from after=/tmp/new-art [--json OUT] [--top 25]

``--run`` clones this repository (its HEAD, or commit ``REV``; ``--with-changes`` adds the
working tree's uncommitted changes and untracked files) into a temporary folder and runs
``CI=true DW_ARTIFACT_DIR=<out> bash .ci/run`` there, its whole output in ``<out>/ci.log``,
timed by the wall clock, with the machine's load (1-min load average before, after and
sampled during the run, and the number of CPUs) so that a busy machine shows, and the CPU time
(user + system) of every process of the gate: the work done, which a busy machine does not
stretch. It saves
``<out>/gate-times.json`` and prints the tables. ``--from NAME=DIR`` (repeatable) only reads
an artifact folder a gate run left: its ``ci.log`` (or ``--log NAME=FILE``), its
``gate-times.json`` when there is one, the JUnit files (``junit-suite.xml``,
``junit-prefix.xml``) and the run records of ``megatron/`` and ``selftest/``. Both can be
combined: ``--run --from before=DIR`` puts the new run beside an old one.

The tables (pipe tables: a README can quote them verbatim), one column per named run:

- the stages, from the ``=== <title> (<N>s)`` lines ``.ci/run`` prints: a stage lasts until
  the next one starts, the last until ``=== done in Ns``; the test command's stage is split
  into the install and pytest's own wall time (pytest's summary line);
- the test suite from ``junit-suite.xml``: the slowest tests, the time per test file and per
  kind of test (``CATEGORIES``: a table by file, made by reading ``cases/*.py``; a test
  decorated with hypothesis's ``@given`` in an in-process file counts as "hypothesis"). A
  test's JUnit time includes its setup, so a session fixture (the TE sweeps of
  ``fixtures/te_runs.py``, the sweeps of ``test_reports_real.py``) is charged to the first
  test that uses it. Under xdist the tests of the workers overlap, so the sum of the test
  times exceeds the wall time; sum / workers is the lower bound of the wall time with perfect
  balance;
- the Megatron sweep and the self-test: launches, launch seconds, cells, and the share of the
  stage spent in launches (the rest: Python start-up, planning, judging, reports). The
  self-test's record has no ``launches``; they are then read from the run folder's
  ``plans/<launch>.json`` (written as a launch starts) and the last write to its
  ``logs/<launch>/`` and ``ranks/<launch>.*`` files (within ~1 s of the recorded durations,
  checked on the Megatron sweep).

Nothing here imports torch (``harness.records.recordfile`` is plain gzip + JSON).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from _common import ROOT

# the run folders are read with harness.records (no torch), whatever Python runs this script: a
# Python without the project installed once lost a 20-minute gate run at its analysis
sys.path.insert(0, str(ROOT))

#: kind of test per file of ``cases/`` (read from the files: what their tests run), first match
#: wins in this order: browser > TE on CPU > torchrun > subprocess > in-process.
CATEGORIES: dict[str, str] = {
    # headless Chromium + Selenium on rendered reports
    "test_report_browser": "browser",
    # TransformerEngine's real code on CPU: te-cpu sweeps (fixtures/te_runs.py, --te-tree) or
    # TE layers in a `python -c` subprocess (fixtures/te_script.py)
    "test_ledger_te": "te-cpu",
    "test_megatron_te": "te-cpu",
    "test_review_te": "te-cpu",
    "test_te_cpu": "te-cpu",
    "test_te_cpu_grouped": "te-cpu",
    "test_te_cpu_norm": "te-cpu",
    "test_te_tree": "te-cpu",
    "test_recipes_te": "te-cpu",
    "test_te_cpu_quant_modules": "te-cpu",
    "test_te_cpu_quant_references": "te-cpu",
    "test_te_cpu_standins": "te-cpu",
    "test_doc_examples": "te-cpu",      # the documents' examples, and figures from fixtures/te_runs.py's sweeps
    "test_sweep_figures": "te-cpu",     # the documents' sweep figures, judged on fixtures/te_runs.py's sweeps
    # `python -m harness sweep|selftest`, `pytest cases/test_cells.py` or run_torchrun in a subprocess
    "test_cells": "torchrun",             # the pytest plugin: one torchrun launch per world size
    "test_earned_green": "torchrun",
    "test_sample": "torchrun",
    "test_external_launch": "torchrun",
    "test_faults": "torchrun",
    "test_faults_packed": "torchrun",
    "test_faults_pytest": "torchrun",
    "test_faults_ci": "torchrun",
    "test_launch_failures": "torchrun",
    "test_ledger_sweep": "torchrun",
    "test_loopback": "torchrun",
    "test_megatron_differential": "torchrun",
    "test_megatron_native_differential": "te-cpu",
    "test_megatron_seed": "torchrun",
    "test_multiprocess": "torchrun",
    "test_reports_real": "torchrun",
    "test_selftest": "torchrun",
    "test_shard_merge": "torchrun",
    "test_vocabulary": "torchrun",
    "test_warm": "torchrun",            # warm probes; sweeps that take (or leave) a warm agent
    "test_agent_server": "torchrun",    # launches whose torchrun agents the agent server forks
    "test_exchange": "torchrun",        # the ranks' exchange over a 3-rank gloo group
    "test_oracle_store": "subprocess",  # the store shared by processes racing for one value
    # a Python subprocess that launches nothing (bad input, --collect-only, import-linter, pip wheel)
    "test_cli": "subprocess",
    "test_docs": "subprocess",
    "test_fault_attribution": "subprocess",   # a busy and an idle process for the CPU sampling
    "test_layers": "subprocess",
    "test_megatron_install": "subprocess",
    "test_inputs": "subprocess",          # bad input refused before anything launches
    "test_megatron_offload": "subprocess",  # the page's plain PyTorch + Megatron reproduction
    "test_packaging": "subprocess",
    # in this process (world size 1, synthetic records, fakes)
    **{f: "in-process" for f in (
        "test_attach", "test_checks", "test_cpu_gemm", "test_failure_classes", "test_gtp", "test_streamed_record", "test_selection_cache",
        "test_hooks_regression", "test_ledger", "test_matrix", "test_mutants", "test_path_evidence",
        "test_phases", "test_record_file", "test_reference", "test_reports", "test_sensitivity",
        "test_stream", "test_predict", "test_quantized_oracle", "test_te_cpu_quant_kernels", "test_placement")},
}
CATEGORY_LABELS: dict[str, str] = {
    "torchrun": "launches torchrun (sweep/selftest/pytest subprocess)",
    "te-cpu": "TE on CPU (te-cpu sweeps, TE scripts)",
    "browser": "browser (headless Chromium)",
    "hypothesis": "hypothesis (@given), in-process",
    "subprocess": "Python subprocess, no torchrun",
    "in-process": "in-process",
    "unmapped": "not in CATEGORIES (add it)",
}
#: short names of the stages, by the start of their title in .ci/run
STAGE_NAMES: list[tuple[str, str]] = [
    ("the README's test command", "test command (install + suite)"),
    ("import layers", "import layers"),
    ("pre-fix backend through pytest (", "pre-fix gate + Megatron sweep, side by side"),
    ("pre-fix backend", "pre-fix gate (pytest)"),
    ("Megatron-Core", "Megatron sweep"),
    ("self-test", "self-test"),
]
INSTALL_ROW, PYTEST_ROW = "  of which install", "  of which pytest"
STAGE_RE = re.compile(r"^=== (.*) \((\d+)s\)\s*$")
PYTEST_WALL_RE = re.compile(r"\b(?:passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)\b"
                            r"[^\n]* in ([\d.]+)s\b")
WORKERS_RE = re.compile(r"created: (\d+)/\d+ workers|^(\d+) workers \[", re.M)


# ---- the data ----------------------------------------------------------------------------------

@dataclass
class Stage:
    title: str
    name: str
    start_s: int
    duration_s: int | None            # None: the log ends before the next stage


@dataclass
class Test:
    file: str
    name: str
    time_s: float
    outcome: str                      # passed | failed | error | skipped
    category: str

    @property
    def id(self) -> str:
        return f"{self.file}::{self.name}"


@dataclass
class PytestRun:
    tests: list[Test]
    wall_s: float | None              # pytest's own summary line ("... in 991.91s")
    workers: int

    @property
    def sum_s(self) -> float:
        return sum(t.time_s for t in self.tests)

    def count(self, outcome: str) -> int:
        return sum(t.outcome == outcome for t in self.tests)


@dataclass
class Launches:
    source: str                       # "record" or "file times" (the record has none)
    widths: list[int]
    seconds: list[float]
    cells: int
    tasks: int | None                 # backend x cell pairs (self-test), from plans/
    record_s: float | None
    stage_s: int | None

    @property
    def total_s(self) -> float:
        return sum(self.seconds)


@dataclass
class Run:
    name: str
    art: str
    log: str | None
    meta: dict[str, Any]              # gate-times.json's "meta" (wall clock, load), if any
    stages: list[Stage] = field(default_factory=list)
    total_s: int | None = None
    suite_install_s: float | None = None
    suite: PytestRun | None = None
    prefix: PytestRun | None = None
    megatron: Launches | None = None
    selftest: Launches | None = None

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)


# ---- reading a gate's log and artifacts -------------------------------------------------------

def stage_name(title: str) -> str:
    for prefix, name in STAGE_NAMES:
        if title.startswith(prefix):
            return name
    return title if len(title) <= 40 else title[:39] + "…"


def parse_stages(text: str) -> tuple[list[Stage], int | None]:
    """The stages of a ``.ci/run`` log and its total (the ``=== done in Ns`` line's offset)."""
    marks = [(m.group(1), int(m.group(2))) for m in map(STAGE_RE.match, text.splitlines()) if m]
    total = next((off for title, off in marks if title.startswith("done in")), None)
    marks = [(t, off) for t, off in marks if not t.startswith("done in")]
    ends = [off for _, off in marks[1:]] + [total]
    return [Stage(t, stage_name(t), off, None if end is None else end - off)
            for (t, off), end in zip(marks, ends)], total


def stage_text(text: str, title: str) -> str:
    """The log lines of the stage called ``title``."""
    out, inside = [], False
    for line in text.splitlines():
        m = STAGE_RE.match(line)
        if m:
            inside = m.group(1) == title
        elif inside:
            out.append(line)
    return "\n".join(out)


def pytest_wall(text: str) -> float | None:
    found = PYTEST_WALL_RE.findall(text)
    return float(found[-1]) if found else None


def pytest_workers(text: str, default: int) -> int:
    m = WORKERS_RE.search(text)
    return int(m.group(1) or m.group(2)) if m else default


def given_tests(cases: Path) -> set[tuple[str, str]]:
    """(file, function) of every test decorated with hypothesis's ``@given`` in ``cases``."""
    found = set()
    for path in sorted(cases.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    "given" in ast.unparse(d).split("(")[0] for d in node.decorator_list):
                found.add((path.stem, node.name))
    return found


def category(file: str, name: str, given: set[tuple[str, str]]) -> str:
    kind = CATEGORIES.get(file, "unmapped")
    if kind == "in-process" and (file, name.split("[")[0]) in given:
        return "hypothesis"
    return kind


def file_of(classname: str) -> str:
    """``cases.test_x`` / ``cases.test_x.TestY`` -> ``test_x``."""
    parts = classname.split(".")
    return next((p for p in parts if p.startswith("test_")), parts[-1])


def read_junit(path: Path, given: set[tuple[str, str]]) -> list[Test]:
    """The tests of a JUnit file (none, with a warning, when it is cut short: a killed gate)."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        print(f"warning: {path}: {e}", file=sys.stderr)
        return []
    tests = []
    for case in root.iter("testcase"):
        tags = {c.tag for c in case}
        outcome = next((o for o in ("error", "failure", "skipped") if o in tags), "passed")
        file = file_of(case.get("classname", ""))
        name = case.get("name", "")
        tests.append(Test(file, name, float(case.get("time") or 0), outcome.replace("failure", "failed"),
                          category(file, name, given)))
    return tests


def launches_from_files(run_dir: Path) -> tuple[list[int], list[float], int]:
    """Widths, seconds and tasks of the launches of a run folder, from its files' times."""
    widths, seconds, tasks = [], [], 0
    for plan in sorted((run_dir / "plans").glob("*.json")):
        launch = plan.stem                                   # ws4-0
        outputs = [*(run_dir / "logs" / launch).glob("*"), *(run_dir / "ranks").glob(f"{launch}.*")]
        if not outputs:
            continue
        widths.append(int(re.match(r"ws(\d+)", launch).group(1)))
        seconds.append(max(p.stat().st_mtime for p in outputs) - plan.stat().st_mtime)
        tasks += len(json.loads(plan.read_text()).get("tasks", []))
    return widths, seconds, tasks


def read_launches(run_dir: Path, stage_s: int | None) -> Launches | None:
    from harness.records import recordfile                           # plain gzip + JSON, no torch

    try:
        record = recordfile.read(run_dir)
    except (OSError, ValueError):
        return None
    launches = record.get("launches") or []
    widths, seconds, tasks = launches_from_files(run_dir)
    source = "file times"
    if launches:
        source = "record"
        widths = [la["world_size"] for la in launches]
        seconds = [float(la.get("duration_s") or 0) for la in launches]
    return Launches(source, widths, seconds, len(record.get("cells", [])), tasks or None,
                    record.get("duration_s"), stage_s)


def read_run(name: str, art: Path, log: Path | None, cases: Path, default_workers: int) -> Run:
    """Everything the tables need from one gate run's artifact folder (and its log)."""
    if log is None and (art / "ci.log").exists():
        log = art / "ci.log"
    saved = art / "gate-times.json"
    meta = json.loads(saved.read_text()).get("meta", {}) if saved.exists() else {}
    run = Run(name, str(art), str(log) if log else None, meta)
    text = log.read_text(errors="replace") if log else ""
    run.stages, run.total_s = parse_stages(text)
    if run.total_s is None and meta.get("wall_s") and run.stages:   # a failed gate: no "done" line
        last = run.stages[-1]
        last.duration_s = int(meta["wall_s"]) - last.start_s
    given = given_tests(cases)
    suite_stage = run.stage(STAGE_NAMES[0][1])
    suite_log = stage_text(text, suite_stage.title) if suite_stage else ""
    if (art / "junit-suite.xml").exists():
        wall = pytest_wall(suite_log) or _junit_time(art / "junit-suite.xml")
        run.suite = PytestRun(read_junit(art / "junit-suite.xml", given), wall,
                              pytest_workers(suite_log, default_workers))
        if suite_stage and suite_stage.duration_s is not None and wall is not None:
            run.suite_install_s = suite_stage.duration_s - wall
    if (art / "junit-prefix.xml").exists():
        prefix_log = art / "prefix-pytest.log"
        ptext = prefix_log.read_text(errors="replace") if prefix_log.exists() else ""
        run.prefix = PytestRun(read_junit(art / "junit-prefix.xml", given),
                               pytest_wall(ptext) or _junit_time(art / "junit-prefix.xml"),
                               # no "workers" line: one process (.ci/run runs it with -n 0)
                               pytest_workers(ptext, 1 if ptext else default_workers))
    for attr, folder, stage in (("megatron", "megatron", "Megatron sweep"), ("selftest", "selftest", "self-test")):
        found = run.stage(stage)
        setattr(run, attr, read_launches(art / folder, found.duration_s if found else None))
    return run


def _junit_time(path: Path) -> float | None:
    try:
        suite = next(ET.parse(path).getroot().iter("testsuite"), None)
    except ET.ParseError:
        return None
    return float(suite.get("time")) if suite is not None and suite.get("time") else None


# ---- running the gate ------------------------------------------------------------------------

class LoadSampler:
    """The 1-min load average every ``every_s`` seconds, in a thread, while the gate runs."""

    def __init__(self, every_s: float = 15.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every_s,), daemon=True)

    def _loop(self, every_s: float) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(every_s)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def clone(rev: str | None, with_changes: bool, dest: Path) -> str:
    """A clone of this repository at ``rev`` (HEAD by default) in ``dest``; its commit."""
    git = ["git", "-c", "advice.detachedHead=false"]
    subprocess.run([*git, "clone", "-q", str(ROOT), str(dest)], check=True)
    if rev:
        if subprocess.run([*git, "-C", str(dest), "checkout", "-q", rev], capture_output=True).returncode:
            subprocess.run([*git, "-C", str(dest), "fetch", "-q", str(ROOT), rev], check=True)
            subprocess.run([*git, "-C", str(dest), "checkout", "-q", "FETCH_HEAD"], check=True)
    if with_changes:
        diff = subprocess.run(["git", "-C", str(ROOT), "diff", "HEAD", "--binary"], capture_output=True,
                              check=True).stdout
        if diff:
            subprocess.run(["git", "-C", str(dest), "apply", "--binary", "-"], input=diff, check=True)
        untracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--others", "--exclude-standard", "-z"],
                                   capture_output=True, check=True, text=True).stdout.split("\0")
        for rel in filter(None, untracked):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return subprocess.run(["git", "-C", str(dest), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def gate_env(art: Path) -> dict[str, str]:
    """This environment less any active virtual environment (the gate makes its own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTEST_ADDOPTS")}
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                      if not p.startswith(venv))
    return {**env, "CI": "true", "DW_ARTIFACT_DIR": str(art)}


def run_gate(tree: Path, art: Path) -> tuple[int, float, dict[str, Any]]:
    """Run ``.ci/run`` in ``tree``: exit code, wall seconds, the machine's load around it.

    The output goes to ``art/ci.log``; its stage lines are echoed to stderr as they come."""
    art.mkdir(parents=True, exist_ok=True)
    load = {"cpus": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
            "loadavg_before": list(os.getloadavg())}
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with LoadSampler() as sampler, open(art / "ci.log", "w") as log:
        proc = subprocess.Popen(["bash", ".ci/run"], cwd=tree, env=gate_env(art), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        for line in proc.stdout:
            log.write(line)
            if STAGE_RE.match(line):
                print(f"[{time.perf_counter() - start:7.0f}s] {line.rstrip()[:150]}", file=sys.stderr, flush=True)
        rc = proc.wait()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # every process of the gate that its parent waited for (ranks, torchrun, pytest workers):
    # the work done, which a busy machine stretches in wall time but not in CPU time
    load["cpu_s"] = round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1)
    load["loadavg_after"] = list(os.getloadavg())
    load["load1_sampled_max"] = max(sampler.samples, default=None)
    load["load1_sampled_mean"] = sum(sampler.samples) / len(sampler.samples) if sampler.samples else None
    return rc, wall, load


def run_and_save(args: argparse.Namespace) -> Path:
    art = Path(args.out or tempfile.mkdtemp(prefix="bench-gate-art-")).resolve()
    tree = Path(tempfile.mkdtemp(prefix="bench-gate-tree-")) / "repo"
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    try:
        commit = clone(args.clone_of, args.with_changes, tree)
        print(f"gate of {commit[:12]}{' + working-tree changes' if args.with_changes else ''} in {tree}, "
              f"artifacts in {art}", file=sys.stderr)
        rc, wall, load = run_gate(tree, art)
    finally:
        if not args.keep_tree:
            shutil.rmtree(tree.parent, ignore_errors=True)
    meta = {"started": started, "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "commit": commit,
            "clone_of": args.clone_of, "with_changes": args.with_changes, "exit_code": rc, "wall_s": round(wall, 1),
            "python": platform.python_version(), "platform": platform.platform(), **load}
    (art / "gate-times.json").write_text(json.dumps({"meta": meta}, indent=1) + "\n")
    run = read_run(args.name, art, None, ROOT / "cases", args.workers)
    (art / "gate-times.json").write_text(json.dumps({"meta": meta, "analysis": run_json(run, args.top)}, indent=1)
                                         + "\n")
    return art


# ---- the tables ------------------------------------------------------------------------------

def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A pipe table (Markdown) with padded columns: readable as plain text too."""
    cells = [[str(v) for v in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    right = [i > 0 for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(v.rjust(w) if a else v.ljust(w) for v, w, a in zip(r, widths, right)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if a else ("-" * (w + 2)) for w, a in zip(widths, right)) + "|"
    return "\n".join([line(cells[0]), rule, *map(line, cells[1:])])


def s(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def mmss(v: float | None) -> str:
    return "-" if v is None else f"{int(v) // 60}:{int(v) % 60:02d}"


def pct(part: float | None, whole: float | None) -> str:
    return "-" if part is None or not whole else f"{100 * part / whole:.0f}%"


def machine_table(runs: list[Run]) -> str:
    def load(r: Run, key: str) -> str:
        v = r.meta.get(key)
        return "-" if v is None else (f"{v[0]:.2f}" if isinstance(v, (list, tuple)) else f"{v:.2f}")

    rows = [["gate exit code"] + [str(r.meta.get("exit_code", "-")) for r in runs],
            ["wall clock, measured (s)"] + [s(r.meta.get("wall_s")) for r in runs],
            ["CPU time of its processes, user + system (s)"] + [s(r.meta.get("cpu_s")) for r in runs],
            ["CPUs (usable)"] + [f"{r.meta['cpus']} ({r.meta['cpus_usable']})" if "cpus" in r.meta else "-"
                                 for r in runs],
            ["1-min load before"] + [load(r, "loadavg_before") for r in runs],
            ["1-min load during (mean / max)"] + [f"{load(r, 'load1_sampled_mean')} / {load(r, 'load1_sampled_max')}"
                                                  if "load1_sampled_max" in r.meta else "-" for r in runs],
            ["1-min load after"] + [load(r, "loadavg_after") for r in runs]]
    return table(["machine", *(r.name for r in runs)], rows)


def stage_table(runs: list[Run]) -> str:
    names = list(dict.fromkeys(st.name for r in runs for st in r.stages))
    rows = []
    for name in names:
        found = [r.stage(name) for r in runs]
        rows.append([name] + [f"{s(st.duration_s, 0)} ({pct(st.duration_s, r.total_s)})" if st else "-"
                              for st, r in zip(found, runs)])
        if name == STAGE_NAMES[0][1]:
            rows.append([INSTALL_ROW] + [s(r.suite_install_s, 0) for r in runs])
            rows.append([PYTEST_ROW] + [s(r.suite.wall_s if r.suite else None, 0) for r in runs])
    rows.append(["total"] + [f"{s(r.total_s, 0)} ({mmss(r.total_s)})" for r in runs])
    return table(["stage: s (share of total)", *(r.name for r in runs)], rows)


def pytest_table(runs: list[Run]) -> str:
    rows = []
    for label, attr in (("suite", "suite"), ("pre-fix gate", "prefix")):
        got = [getattr(r, attr) for r in runs]
        if not any(got):
            continue
        rows += [[f"{label}: tests (passed/failed/skipped)"] + [
                     f"{len(p.tests)} ({p.count('passed')}/{p.count('failed') + p.count('error')}/{p.count('skipped')})"
                     if p else "-" for p in got],
                 [f"{label}: pytest wall (s)"] + [s(p.wall_s) if p else "-" for p in got],
                 [f"{label}: sum of test times (s)"] + [s(p.sum_s) if p else "-" for p in got],
                 [f"{label}: sum / workers = lower bound (s)"] + [
                     f"{s(p.sum_s / p.workers)} (/{p.workers})" if p else "-" for p in got],
                 [f"{label}: wall / lower bound"] + [s(p.wall_s / (p.sum_s / p.workers), 2)
                                                     if p and p.wall_s and p.sum_s else "-" for p in got]]
    return table(["pytest runs", *(r.name for r in runs)], rows)


def slowest_table(runs: list[Run], top: int) -> str:
    times = [{t.id: t.time_s for t in r.suite.tests} if r.suite else {} for r in runs]
    ids = {i for tm in times for i in sorted(tm, key=tm.get, reverse=True)[:top]}
    ids = sorted(ids, key=lambda i: max(tm.get(i, 0) for tm in times), reverse=True)
    rows = [[_short(i, 90)] + [s(tm.get(i)) for tm in times] for i in ids]
    return table([f"the {top} slowest tests of each run (s, JUnit time incl. setup)", *(r.name for r in runs)], rows)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _group(runs: list[Run], key: Callable[[Test], str]) -> tuple[list[str], list[dict[str, tuple[int, float]]]]:
    sums: list[dict[str, tuple[int, float]]] = []
    for r in runs:
        d: dict[str, tuple[int, float]] = {}
        for t in (r.suite.tests if r.suite else []):
            n, tot = d.get(key(t), (0, 0.0))
            d[key(t)] = (n + 1, tot + t.time_s)
        sums.append(d)
    keys = sorted({k for d in sums for k in d}, key=lambda k: max(d.get(k, (0, 0.0))[1] for d in sums), reverse=True)
    return keys, sums


def grouped_table(runs: list[Run], title: str, key: Callable[[Test], str],
                  label: Callable[[str], str] = str) -> str:
    keys, sums = _group(runs, key)
    totals = [sum(v[1] for v in d.values()) for d in sums]
    rows = [[label(k)] + [f"{s(d[k][1])} ({pct(d[k][1], tot)}, {d[k][0]})" if k in d else "-"
                          for d, tot in zip(sums, totals)] for k in keys]
    rows.append(["sum of test times"] + [f"{s(tot)} (100%, {sum(v[0] for v in d.values())})"
                                         for d, tot in zip(sums, totals)])
    return table([f"{title}: s (share, tests)", *(r.name for r in runs)], rows)


def launch_table(runs: list[Run], attr: str, title: str) -> str:
    got: list[Launches | None] = [getattr(r, attr) for r in runs]

    def col(fn: Callable[[Launches], str]) -> list[str]:
        return [fn(la) if la else "-" for la in got]

    rows = [["launches (world sizes)"] + col(lambda la: f"{len(la.widths)} ({_widths(la.widths)})"),
            ["launch seconds, total"] + col(lambda la: s(la.total_s)),
            ["mean per launch (s)"] + col(lambda la: s(la.total_s / len(la.seconds)) if la.seconds else "-"),
            ["longest launch (s)"] + col(lambda la: s(max(la.seconds, default=None))),
            ["cells"] + col(lambda la: str(la.cells)),
            ["tasks (backend x cell)"] + col(lambda la: str(la.tasks or "-")),
            ["run record duration (s)"] + col(lambda la: s(la.record_s)),
            ["stage (s, from the log)"] + col(lambda la: s(la.stage_s, 0)),
            ["share of the stage in launches"] + col(lambda la: pct(la.total_s, la.stage_s)),
            ["launch times from"] + col(lambda la: la.source)]
    return table([title, *(r.name for r in runs)], rows)


def _widths(widths: list[int]) -> str:
    return ", ".join(f"ws{w} x{widths.count(w)}" for w in sorted(set(widths)))


def report(runs: list[Run], top: int) -> str:
    parts = [machine_table(runs), stage_table(runs)]
    if any(r.suite or r.prefix for r in runs):
        parts.append(pytest_table(runs))
    if any(r.suite for r in runs):
        parts += [grouped_table(runs, "test suite by kind", lambda t: t.category, lambda k: CATEGORY_LABELS[k]),
                  grouped_table(runs, "test suite by file", lambda t: t.file),
                  slowest_table(runs, top)]
    parts += [launch_table(runs, "megatron", "Megatron sweep"), launch_table(runs, "selftest", "self-test")]
    notes = [
        "Stage seconds come from the `=== ... (Ns)` lines (1 s resolution); 'of which pytest' is pytest's own "
        "summary time, 'install' the rest of the stage (venv, pip, `harness install`).",
        "With xdist the workers' tests overlap: the sum of test times exceeds pytest's wall time, and "
        "sum / workers is the wall time's lower bound (perfect balance, no start-up).",
        "A test's JUnit time includes its fixtures' setup: a shared fixture's sweeps count in the first test using "
        "it, and a test that waits for another worker's `run_once` (FileLock) counts its wait.",
    ]
    if any(la and la.source == "file times" for r in runs for la in (r.megatron, r.selftest)):
        notes.append("'file times': the run record has no launches; each is read from plans/<launch>.json's time "
                     "to the last write of its logs/ranks files.")
    unmapped = sorted({t.file for r in runs if r.suite for t in r.suite.tests if t.category == "unmapped"})
    if unmapped:
        notes.append(f"files missing from CATEGORIES: {', '.join(unmapped)}")
    if not all(r.meta for r in runs):
        notes.append("machine: '-' where the run was read from artifacts without a gate-times.json "
                     "(not measured then).")
    return "\n\n".join(parts) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def run_json(run: Run, top: int) -> dict[str, Any]:
    doc = asdict(run)
    for key in ("suite", "prefix"):
        p: PytestRun | None = getattr(run, key)
        if p:
            doc[key].update(sum_s=p.sum_s, lower_bound_s=p.sum_s / p.workers,
                            slowest=[[t.id, t.time_s] for t in sorted(p.tests, key=lambda t: -t.time_s)[:top]])
    for key in ("megatron", "selftest"):
        la: Launches | None = getattr(run, key)
        if la:
            doc[key]["total_s"] = la.total_s
    return doc


# ---- the command line ------------------------------------------------------------------------

def _pairs(values: Iterable[str], what: str) -> dict[str, Path]:
    out = {}
    for v in values:
        name, sep, path = v.partition("=")
        if not sep:
            name, path = Path(v).name, v
        if not Path(path).exists():
            raise SystemExit(f"{what} {v}: {path} does not exist")
        out[name] = Path(path)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n\n".join(__doc__.split("\n\n")[1:4]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="store_true", help="run .ci/run in a fresh clone and time it")
    p.add_argument("--clone-of", metavar="REV", help="with --run: the commit to clone (default HEAD)")
    p.add_argument("--with-changes", action="store_true",
                   help="with --run: add this checkout's uncommitted changes and untracked files to the clone")
    p.add_argument("--out", metavar="DIR", help="with --run: the artifact folder (default: a new temporary one)")
    p.add_argument("--name", default="run", help="with --run: its column's name (default: run)")
    p.add_argument("--keep-tree", action="store_true", help="with --run: keep the clone")
    p.add_argument("--from", dest="from_", action="append", default=[], metavar="NAME=DIR",
                   help="read an existing artifact folder (repeatable; the name heads its column)")
    p.add_argument("--log", action="append", default=[], metavar="NAME=FILE",
                   help="the .ci/run output of --from NAME when it is not DIR/ci.log")
    p.add_argument("--cases", type=Path, default=ROOT / "cases", help="where to find @given tests (default: cases/)")
    p.add_argument("--workers", type=int, default=2, help="xdist workers when the log does not say (default: 2)")
    p.add_argument("--top", type=int, default=25, help="how many slowest tests (default: 25)")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write everything as JSON")
    args = p.parse_args()
    if not args.run and not args.from_:
        p.error("nothing to do: give --run and/or --from NAME=DIR")
    if (args.clone_of or args.with_changes or args.out) and not args.run:
        p.error("--clone-of, --with-changes and --out go with --run")
    if args.clone_of and args.with_changes:
        p.error("--with-changes applies this checkout's changes to its HEAD: not with --clone-of")
    if args.out and Path(args.out).is_dir() and any(Path(args.out).iterdir()):
        # .ci/run writes into it as CI's fresh artifact folder: an earlier gate's files there
        # (the self-test's run folder refuses to be overwritten) would fail this gate
        p.error(f"--out {args.out} is not empty: give a new folder")
    sources, logs = _pairs(args.from_, "--from"), _pairs(args.log, "--log")
    if set(logs) - set(sources):
        p.error(f"--log for a name no --from has: {', '.join(sorted(set(logs) - set(sources)))}")
    runs = [read_run(name, art, logs.get(name), args.cases, args.workers) for name, art in sources.items()]
    rc = 0
    if args.run:
        art = run_and_save(args)
        runs.append(read_run(args.name, art, None, args.cases, args.workers))
        rc = 1 if runs[-1].meta.get("exit_code") else 0
        print(f"gate artifacts, log and gate-times.json: {art}\n")
    print(report(runs, args.top))
    if args.json:
        args.json.write_text(json.dumps({"categories": CATEGORIES, "runs": [run_json(r, args.top) for r in runs]},
                                        indent=1) + "\n")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
