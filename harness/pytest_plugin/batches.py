"""The pytest plugin's batches: each world size's collected cells in one launch, once per
pytest run, shared by every xdist worker.

Kept apart from the pytest wiring (``harness.pytest_plugin.plugin``) so that the launching and sharing
logic reads, and can be driven, without pytest: the plugin turns the options into a
``BatchRunner`` and ``NoVerdict`` into a failed test.

Workers share the batches through a folder and a file lock per world size: the first worker
that needs a world size launches all of its cells; a worker that finds that batch busy
launches another pending world size meanwhile instead of waiting idle, then reads the
verdicts it needs from the finished batch's result stream. (Scheduling is not trusted to
prevent duplicate launches: pytest's ``--dist`` is the user's to choose.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from filelock import FileLock, Timeout

from harness.vocabulary.errors import NoVerdict
from harness.vocabulary import matrix, selection
from harness.orchestration import preflight
from harness.judging import ledger as ledgers
from harness.launcher.launch import LaunchFailure, LaunchOptions, launch_cells
from harness.records.record import CellResult
from harness.records.stream import ResultStream


class BatchRunner:
    """Runs each world size's cells in one launch under ``root``, once per pytest run.

    Raises (when made):
        LedgerError: ``ledger_choice`` names no usable ledger.
        preflight's errors: the backend cannot run the ``selected`` cells here.
    """

    def __init__(self, root: Path, backend: str, selected: Sequence[matrix.Cell], *, cell_timeout: float | None,
                 device: str, examples: int, ledger_choice: str) -> None:
        self.backend = backend
        self.cell_timeout = cell_timeout
        self.examples = examples
        # the backend is probed in a subprocess: a backend like te-cpu patches torch when imported
        self.info, self.device = preflight.check_run(backend, device, {c.world_size for c in selected},
                                                     {c.module for c in selected})
        self.ledger = ledgers.choose(ledger_choice, self.info.upstream, self.info.version)
        #: what this backend lacks of what some cells need (``selection.REQUIREMENTS``)
        self.missing = preflight.missing(self.info)
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, CellResult] = {}
        self.failures: dict[int, str] = {}

    def _batch_dir(self, world_size: int) -> Path:
        return (self.root / f"ws{world_size}").resolve()

    def _load(self, world_size: int) -> bool:
        """Read a finished batch's verdicts from its result stream; False while it runs."""
        d = self._batch_dir(world_size)
        if not (d / "done").exists():
            return False
        self.results.update(ResultStream(d).latest(self.backend))
        failed = d / "launch-failure.txt"
        if failed.exists():
            self.failures[world_size] = failed.read_text()
        return True

    def _try_run(self, world_size: int, cells: list[matrix.Cell]) -> bool:
        """Launch the batch if no one else holds it; True when it has finished (by anyone)."""
        lock = FileLock(str(self.root / f"ws{world_size}.lock"))
        try:
            lock.acquire(blocking=False)
        except Timeout:
            return False
        try:
            if not self._load(world_size):
                self._launch(world_size, cells)
                (self._batch_dir(world_size) / "done").write_text("done")
                self._load(world_size)
            return True
        finally:
            lock.release()

    def left_out(self, cell: matrix.Cell) -> str | None:
        """Why this run leaves ``cell`` out (it needs what the backend lacks), or None: such a
        cell's test is skipped with that reason - never run, never counted as passed."""
        needs = [r for r in selection.REQUIREMENTS if r in selection.requires(cell) & self.missing]
        if not needs:
            return None
        return "left out: it needs " + " and ".join(
            f"{selection.REQUIREMENTS[r][0]} ({selection.REQUIREMENTS[r][1]})" for r in needs)

    def judged(self, cell: matrix.Cell, collected: Callable[[], Iterable[matrix.Cell]]) -> CellResult:
        """The cell's verdict under the ledger (``known`` where its entries explain it all)."""
        return ledgers.judge(self.result(cell, collected), self.ledger.entries if self.ledger else ())[0]

    def result(self, cell: matrix.Cell, collected: Callable[[], Iterable[matrix.Cell]]) -> CellResult:
        """The cell's verdict, running its world size's batch of the ``collected`` cells
        (every cell of the pytest run) first if no one has.

        Raises:
            NoVerdict: the batch ended without one.
        """
        if cell.id in self.results or self._load(cell.world_size) and cell.id in self.results:
            return self.results[cell.id]
        batches: dict[int, list[matrix.Cell]] = {}
        for c in collected():
            if self.left_out(c) is None:
                batches.setdefault(c.world_size, []).append(c)
        while not self._try_run(cell.world_size, batches.get(cell.world_size, [cell])):
            # someone else runs this batch: do another pending one meanwhile, or wait
            other = next((ws for ws in batches if ws != cell.world_size and not self._load(ws)
                          and self._try_run(ws, batches[ws])), None)
            if other is None:
                time.sleep(0.2)
        if cell.id not in self.results:
            why = self.failures.get(cell.world_size, "the batch ended without a verdict for this cell")
            raise NoVerdict(f"{cell.id}: no verdict: {why} (run folder {self._batch_dir(cell.world_size)})")
        return self.results[cell.id]

    def stale_entries(self, collected: Iterable[matrix.Cell]) -> list[str]:
        """The stale-entry lines of the ledger over the ``collected`` cells (each entry that
        selects some of them and reproduces in none: "delete it")."""
        cells = [c for c in dict.fromkeys(collected) if self.left_out(c) is None]
        _, outcome = ledgers.apply([self.result(c, lambda: cells) for c in cells], self.ledger)
        return [ledgers.stale_message(i, outcome) for i in outcome["stale"]]

    def _launch(self, world_size: int, cells: list[matrix.Cell]) -> None:
        run_dir = self._batch_dir(world_size)
        run_dir.mkdir(parents=True, exist_ok=True)
        opts = LaunchOptions(backend=self.backend, run_dir=run_dir, cell_timeout=self.cell_timeout,
                             device=self.device, examples=self.examples)
        try:
            launch_cells(world_size, list(dict.fromkeys(cells)), opts)
        except LaunchFailure as exc:
            (run_dir / "launch-failure.txt").write_text(str(exc))
