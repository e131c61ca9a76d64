"""pytest wiring: one test per cell, executed in batches (one launch per world size).

``pytest cases/`` collects a test per matrix cell (id = cell id, so ``-k`` and JUnit
names match the CLI). The first cell of a world size that a pytest process runs launches
every collected cell of that world size at once; the rest read their verdicts from that
launch's result stream. Under pytest-xdist the plugin switches xdist's default ``--dist load``
to ``loadscope``: every test of a module on one worker, so a module's fixtures run once
(``loadgroup``'s groups do not reach xdist's scheduler under pytest 9: its node ids drop the
group suffix). The batches (``harness.pytest_plugin.batches``) are shared through a file lock anyway, so
each is launched exactly once whatever the scheduling.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import pytest

from harness.launcher.launch import CELL_TIMEOUT_HELP
from harness.vocabulary import matrix, selection, weights
from harness.vocabulary.errors import UsageError
from harness.vocabulary.status import HARNESS_ERROR, PATH_NOT_TAKEN, label

if TYPE_CHECKING:  # imported when the first cell needs it: the launcher stays out of other pytest runs
    from harness.pytest_plugin.batches import BatchRunner

T = TypeVar("T")


class HarnessSpec:
    """Hookspecs other plugins can implement."""

    @pytest.hookspec(firstresult=True)
    def pytest_harness_make_backend(self, config: pytest.Config) -> str | None:
        """Return the backend spec (import path, ``module:attr`` or ``.py`` file) to test."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(HarnessSpec)


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("harness", "dw-harness: distributed-weight autograd matrix")
    g.addoption("--backend", dest="harness_backend", default=None,
                help="backend under test (default: harness.backends.reference)")
    g.addoption("--te-tree", dest="harness_te_tree", default=None, metavar="PATH",
                help="import TransformerEngine from this source tree instead of the installed one "
                     "(the same as --backend SPEC@PATH)")
    g.addoption("--preset", dest="harness_preset", default="ci", help="cell preset (ci, full, smoke, seed)")
    for opt, axis in matrix.AXIS_OPTIONS.items():
        g.addoption(opt, dest=f"harness_axis_{axis}", default=None, metavar="V[,V...]",
                    help=f"restrict axis {axis} to these values: {matrix.values_help(axis)}")
    g.addoption("--cell-filter", "--filter", dest="harness_filter", default=None,
                help="boolean expression over axes (as sweep --filter)")
    g.addoption("--cells", dest="harness_cells", default=None, metavar="ID|TEXT[,...]",
                help="only these cells: a whole cell id selects that cell, other text the cells whose id "
                     "contains it (as sweep --cells)")
    g.addoption("--harness-out", "--out", dest="harness_out", default=None,
                help="folder for the launches' run folders (default: pytest's basetemp)")
    g.addoption("--cell-timeout", dest="harness_cell_timeout", type=float, default=None, help=CELL_TIMEOUT_HELP)
    g.addoption("--examples", dest="harness_examples", type=int, default=0,
                help="hypothesis-drawn extra shape/split examples per cell (failures are shrunk)")
    g.addoption("--harness-device", "--device", dest="harness_device", default="auto", choices=("auto", "cpu", "cuda"),
                help="auto: CUDA + NCCL when present, else CPU + gloo")
    g.addoption("--ledger", dest="harness_ledger", default="auto", metavar="auto|none|FILE",
                help="known-defects ledger: a cell whose failures it explains is an xfail naming "
                     "the entries (default auto: the one shipped for the backend's upstream version)")


@pytest.hookimpl(trylast=True)
def pytest_harness_make_backend(config: pytest.Config) -> str:
    backend = config.getoption("harness_backend") or "harness.backends.reference"
    from harness.orchestration.preflight import spec_with_tree
    from harness.vocabulary.errors import BackendError

    try:
        return spec_with_tree(backend, config.getoption("harness_te_tree"))
    except BackendError as exc:
        raise pytest.UsageError(str(exc)) from exc


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cell(id): a matrix cell run under torchrun")
    if getattr(config.option, "dist", "no") == "load" and getattr(config.option, "numprocesses", None):
        config.option.dist = "loadscope"
        config.stash[_CELL_SCOPES] = True


#: set when the plugin chose the scheduling (``--dist`` not given): cells are then scoped by world size
_CELL_SCOPES = pytest.StashKey[bool]()
_CELL_WORLD_SIZE = re.compile(r"::test_cell\[[^\]]*-ws(\d+)-")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's ``loadscope`` with one change: a cell test's scope is its world size, not its
    module, so the workers launch different world sizes' batches side by side (one module
    scope ran every batch on one worker, one after the other). Every other test keeps its
    module's scope."""
    if not config.stash.get(_CELL_SCOPES, False):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class CellScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            cell = _CELL_WORLD_SIZE.search(nodeid)
            module = super()._split_scope(nodeid)
            return f"{module}::ws{cell.group(1)}" if cell else module

    return CellScopes(config, log)


def selected_cells(config: pytest.Config) -> list[matrix.Cell]:
    try:
        overrides = selection.overrides_from(lambda axis: config.getoption(f"harness_axis_{axis}"))
        expr = selection.with_cells(config.getoption("harness_filter"), config.getoption("harness_cells"))
        cells = matrix.select(config.getoption("harness_preset"), overrides, expr)
    except (matrix.MatrixError, UsageError) as exc:
        raise pytest.UsageError(str(exc)) from exc
    why = weights.unavailable({c.weight for c in cells})
    if why is not None:
        raise pytest.UsageError(why)
    return cells


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" in metafunc.fixturenames:
        metafunc.parametrize("cell", [pytest.param(c, id=c.id) for c in selected_cells(metafunc.config)])


def stale_entries(batches: BatchRunner, session: pytest.Session) -> list[str]:
    """The stale-entry lines of this pytest run's ledger over every collected cell (each
    entry that selects collected cells and reproduces in none: "delete it")."""
    return _verdict(lambda: batches.stale_entries(_collected(session)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``-k <cell id>`` selects that cell only.

    pytest's ``-k`` matches substrings, and ``grouped_linear-...`` is inside
    ``ops_grouped_linear-...``. When the whole ``-k`` is one cell id (a pasted id), narrow
    to the cell with exactly that id; in a larger expression write ``test_cell[<id>]``.
    """
    keyword = (config.getoption("keyword", "") or "").strip()
    if not keyword:
        return
    try:
        wanted = matrix.Cell.from_id(keyword).id
    except matrix.MatrixError:
        return
    drop = [it for it in items if (c := _cell_of(it)) is not None and c.id != wanted]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [it for it in items if it not in drop]


def _cell_of(item: pytest.Item) -> matrix.Cell | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("cell") if callspec else None


def _collected(session: pytest.Session) -> list[matrix.Cell]:
    """Every cell this pytest run collected (the batches launch them by world size)."""
    return [c for it in session.items if (c := _cell_of(it)) is not None]


def _verdict(get: Callable[[], T]) -> T:
    """``get()``, a cell whose batch ended without its verdict failing its test."""
    from harness.pytest_plugin.batches import NoVerdict

    try:
        return get()
    except NoVerdict as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def harness_batches(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> BatchRunner:
    from harness.judging import ledger as ledgers
    from harness.pytest_plugin.batches import BatchRunner

    config = request.config
    out = config.getoption("harness_out")
    # one folder per pytest run, shared by its xdist workers (never reused across runs)
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or time.strftime("%Y%m%d-%H%M%S")
    if out:
        root = Path(out) / f"pytest-{run_id}"
    else:
        base = tmp_path_factory.getbasetemp()
        root = base.parent / f"harness-{run_id}" if "PYTEST_XDIST_TESTRUNUID" in os.environ else base / "harness"
    backend = config.hook.pytest_harness_make_backend(config=config)
    cell_timeout = config.getoption("harness_cell_timeout")
    if cell_timeout is not None and not cell_timeout > 0:
        raise pytest.UsageError(f"--cell-timeout must be > 0 seconds, got {cell_timeout:g}")
    try:
        return BatchRunner(root, backend, selected_cells(config), cell_timeout=cell_timeout,
                           device=config.getoption("harness_device"), examples=config.getoption("harness_examples"),
                           ledger_choice=config.getoption("harness_ledger"))
    except ledgers.LedgerError as exc:
        raise pytest.UsageError(str(exc)) from exc


@pytest.fixture
def cell_result(cell: matrix.Cell, harness_batches: BatchRunner, request: pytest.FixtureRequest,
                record_property: Any) -> Any:
    """The cell's merged verdict over all ranks, from its world size's batch launch, judged
    under the known-defects ledger (a cell the backend cannot run is skipped: left out)."""
    why = harness_batches.left_out(cell)
    if why is not None:
        pytest.skip(why)
    res = _verdict(lambda: harness_batches.judged(cell, lambda: _collected(request.session)))
    record_property("status", label(res.status))  # the reader's word, as every report uses
    record_property("repro", res.repro)
    if res.known:
        record_property("known", ", ".join(res.known))
    return res


@pytest.fixture
def harness_ledger(harness_batches: BatchRunner) -> Any:
    """The ledger this pytest run judges under (None without one)."""
    return harness_batches.ledger


def known_reason(res: Any, ledger: Any) -> str:
    """``known defect: ENTRY (TE PR #3545); ...`` - the xfail reason of a ``known`` cell (the
    status's label: the word every report uses)."""
    refs = {e.id: e.upstream for e in ledger.entries} if ledger else {}
    return f"{label('known')}: " + "; ".join(f"{i} ({refs.get(i, '?')})" for i in res.known)


def assert_cell_ok(res: Any, ledger: Any = None) -> None:
    """Fail with the first mismatch, every failed check per rank, and the repro command; a
    ``known`` cell is an xfail naming its ledger entries (CONTRACTS §7)."""
    __tracebackhide__ = True
    if res.status == "known":
        pytest.xfail(known_reason(res, ledger))
    if res.status == PATH_NOT_TAKEN:  # TE ran another path: nothing of the named one was tested
        pytest.skip(f"{label(PATH_NOT_TAKEN)}: {res.first_failure}")
    if res:
        return
    lines = [f"{res.id}: {res.status} (expected {res.expect})", f"first failure: {res.first_failure}"]
    if res.status == HARNESS_ERROR:
        lines.insert(0, "HARNESS BUG: the harness itself failed on this cell; this is not a verdict on the backend")
    shown: dict[str, int] = {}
    for r in res.ranks:
        for c in r.comparisons:
            if not c.ok and not (r.error and c.kind == "exception"):
                lines.append(f"[rank {r.rank}] {c.message or c.name}")
        if r.error:
            lines.append(f"[rank {r.rank}] {r.error['type']}: {r.error['message']}")
            tb = r.error.get("traceback", "").rstrip()
            if tb in shown:
                lines.append(f"(same traceback as rank {shown[tb]})")
            elif tb:
                shown[tb] = r.rank
                lines.append(tb)
    lines.append(f"repro: {res.repro}")
    pytest.fail("\n".join(lines), pytrace=False)
