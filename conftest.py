import gc
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

# One intra-op thread for the tests' own torch work, set before anything imports torch. The
# suite keeps both cores busy (two xdist workers, their launches' ranks), and a 2-thread
# GEMM then waits for a descheduled helper thread: a 40x24 @ 24x16 product measured 14 ms
# of CPU instead of 6 us, the in-process mutant and check tests 41 CPU-s instead of 18
# beside one busy process. Ranks set their own count (``LaunchOptions.threads_per_rank``, 1).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Hypothesis: the same examples on every run (the project's seeds are deterministic: a failure
# names its example, and a rerun meets it again), and no wall-clock limit on an example or on
# drawing one - the suite shares two cores with its own sweeps, and a test never asserts a time.
from hypothesis import HealthCheck, settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("dw-harness", deadline=None, derandomize=True,
                                      suppress_health_check=[HealthCheck.too_slow])
_hypothesis_settings.load_profile("dw-harness")

# The harness's own plugin (``harness.pytest_plugin.plugin``) comes in through its ``pytest11``
# entry point, as it does for any pytest in an environment where the project is installed.
pytest_plugins = [
    "fixtures.process_group",
    "fixtures.hook_modes",
]

#: The modules whose fixtures run the longest chains of sweeps (the fault sweeps over ``ci``,
#: mostly waiting out hangs; TE on CPU, the gate's self-test, the other fault sweeps;
#: ``benchmarks/bench_gate.py`` measures them), in the order
#: the xdist workers should start them. Started last, the longest one ran alone at the end
#: while the other worker sat idle; started first, the short modules fill in around them. After
#: them the other modules of 14 s or more in a gate (``bench_gate.py``'s table by file), longest
#: first, so that the last ones to start are short: in timed suite runs test_te_cpu (34 s), and
#: once it went first test_warm (16 s), late in collection order, started last and ran alone.
FIRST = ("test_faults_ci", "test_ledger_te", "test_review_te", "test_selftest", "test_faults", "test_shard_merge",
         "test_te_tree", "test_matrix", "test_mutants", "test_report_browser", "test_te_cpu", "test_external_launch",
         "test_megatron_offload", "test_cli", "test_faults_pytest", "test_agent_server", "test_faults_packed",
         "test_sample", "test_warm")


@pytest.hookimpl(optionalhook=True)  # a pytest run without xdist (-p no:xdist) has no such hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` (the README's test command): one xdist worker per usable core, and one more.
    Why: a worker waits a good part of its time without the CPU - the fault sweeps wait out
    hangs and dead ranks, a launch waits for its ranks, the browser tests for Chromium - and
    with one worker per core a core then sat idle (the gate's ``vmstat`` showed 6 to 7% of the
    suite's core-seconds idle); a third worker on two cores fills those gaps. ``-n logical``
    and ``PYTEST_XDIST_AUTO_NUM_WORKERS`` keep xdist's meaning (None: xdist decides)."""
    if config.getoption("numprocesses", None) == "logical" or os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    from harness.install.bytecode import usable_cores

    return usable_cores() + 1


def _given(config: pytest.Config, *flags: str) -> bool:
    return any(a in flags or a.startswith(tuple(f"{f}=" for f in flags)) for a in config.invocation_params.args)


#: te-cpu's cache of Triton launches for this pytest run (``harness/backends/te_cpu/launch_memo.py``):
#: the same TE cells run in several of the suite's sweeps (the installed wheel's, each
#: patched tree's), and TE's bias-gradient kernel, interpreted on CPU, was most of their
#: time. The controller makes the folder before xdist starts its workers, which inherit it
#: with every sweep and rank they start; it goes with the run. The name is
#: ``launch_memo.CACHE_ENV``, spelled out: importing that module here would run
#: ``harness.backends.te_cpu.backend``'s package import (TE on CPU, torch patched) in pytest's own process.
_LAUNCH_CACHE = "DW_TE_CPU_LAUNCH_CACHE"
#: the float64 oracles of this pytest run (``harness/cell/oracle_store.py``, ``ENV`` spelled out
#: for the same reason): the same ``ci`` cells are judged by many of the suite's sweeps (the
#: reference's, the self-test's rounds, te-cpu's of the wheel and of each patched tree, the
#: fault sweeps), and their oracle was about half of a reference rank's time
_ORACLE_CACHE = "DW_ORACLE_CACHE"
#: the cell selections of this pytest run (``harness/vocabulary/selection_cache.py``, ``ENV``
#: spelled out as above): the plugin in each pytest process, each sweep's parent and each
#: self-test round select the same ``ci`` cells, a search of about 0.5 CPU-s each time
_SELECTION_CACHE = "DW_SELECTION_CACHE"
#: an agent server for this pytest run (``harness/rank/agent_server.py``, named by
#: ``harness.launcher.served.SERVER_ENV``, spelled out for the same reason): the suite's few
#: hundred launches fork their torchrun agents from one process that imported torch and TE's
#: dependencies once, instead of each importing them anew (1.5 to 4 CPU-s a launch). Started
#: by the controller, not awaited: a launch before it listens starts its agent as a new
#: process, as every launch does without a server. Not for ``--collect-only``: nothing launches.
_AGENT_SERVER = "DW_AGENT_SERVER"


def _start_agent_server(config: pytest.Config) -> None:
    folder = tempfile.mkdtemp(prefix="dw-agents-")
    path = os.path.join(folder, "agents.sock")
    root = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    server = subprocess.Popen([sys.executable, "-m", "harness.rank.agent_server", "--socket", path],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=root, env=env)
    os.environ[_AGENT_SERVER] = path

    def stop() -> None:
        server.stdin.close()  # the server ends when its stdin closes
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)

    config.add_cleanup(stop)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n``, ``harness.pytest_plugin.plugin`` has every test of a module run on one worker
    (``--dist loadscope``); the modules then go out in collection order (``FIRST`` leading),
    not xdist's order by number of tests. The controller makes the run's launch, oracle and selection caches."""
    for variable, prefix in ((_LAUNCH_CACHE, "dw-launches-"), (_ORACLE_CACHE, "dw-oracles-"),
                             (_SELECTION_CACHE, "dw-selections-")):
        if not hasattr(config, "workerinput") and variable not in os.environ:
            folder = tempfile.mkdtemp(prefix=prefix)
            os.environ[variable] = folder
            config.add_cleanup(lambda folder=folder: shutil.rmtree(folder, ignore_errors=True))
    if not hasattr(config, "workerinput") and _AGENT_SERVER not in os.environ and not config.option.collectonly:
        _start_agent_server(config)
    if getattr(config.option, "dist", "no") == "loadscope" and not _given(
            config, "--loadscope-reorder", "--no-loadscope-reorder"):
        config.option.loadscopereorder = False


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection built (the test modules, torch, the harness, every cell's parameters)
    lives as long as the pytest process: moved out of the cyclic collector's view, the full
    collections the in-process tests trigger scan only what the tests allocate. Measured on
    ``cases/test_matrix.py`` with ``cases/test_mutants.py`` in one process, two runs each,
    alternating: 66.5 and 71.0 user CPU-s with it, 71.7 and 75.5 without."""
    gc.collect()
    gc.freeze()


def _module(item: pytest.Item) -> str:
    return getattr(getattr(item, "module", None), "__name__", "").rpartition(".")[2]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``FIRST``'s modules go first, in that order; the rest keep pytest's order."""
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(_module(item), len(FIRST)))


#: the variables this file sets for the whole pytest run, which every test inherits
_SUITE_ENVIRONMENT = (_LAUNCH_CACHE, _ORACLE_CACHE, _SELECTION_CACHE, _AGENT_SERVER)


@pytest.fixture(scope="module")
def selections_made_here():
    """For the modules that test the matrix's generator: every selection of the module is made
    in its own process, none read back from the run's selection cache (``_SELECTION_CACHE``).
    Module-scoped, so that hypothesis's tests can use it."""
    saved = os.environ.pop(_SELECTION_CACHE, None)
    yield
    if saved is not None:
        os.environ[_SELECTION_CACHE] = saved


@pytest.fixture(autouse=True)
def _suite_environment_kept():
    """A test that leaves one of ``_SUITE_ENVIRONMENT`` changed fails, and the value comes back
    for the tests after it. Why: a test that set the agent server's variable to its own server
    and then deleted it (instead of ``monkeypatch``) left every later test of its worker
    without the suite's server - each of their launches then started its agent as a new process,
    30 to 70 CPU-s a suite run, and nothing failed."""
    before = {name: os.environ.get(name) for name in _SUITE_ENVIRONMENT}
    yield
    changed = {name: os.environ.get(name) for name in _SUITE_ENVIRONMENT if os.environ.get(name) != before[name]}
    for name in changed:
        if before[name] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before[name]
    if changed:
        pytest.fail(f"the test changed the suite's environment: {changed} (was "
                    f"{ {n: before[n] for n in changed} }); use monkeypatch", pytrace=False)
