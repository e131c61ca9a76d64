"""Whose failure a cell's is, in-process: the fold's rule (``harness.records.fold.decisive``),
a rank's recognition of a collective its peer broke (``harness.cell.faults.peer_lost``), the
launcher's reading of a rank that never reported (``harness.launcher.forensics.silent_rank``)
and the bound a cell's cost gives it (``harness.vocabulary.cost.hang_bound``).
The same rules over real launches: ``cases/test_faults_ci.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from harness.cell.faults import BackendFault, HarnessBug, PhaseBoard, peer_lost
from harness.launcher import forensics, launch
from harness.launcher.launch import LaunchOptions, cell_bound
from harness.records.fold import cell_status, first_failure
from harness.records.record import RankResult
from harness.vocabulary import cost, matrix
from harness.vocabulary.shape import DRAWN_MAX

RESET = "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:30109: Connection reset by peer"


def _rank(rank: int, status: str, by_peer: bool = False, what: str = "RuntimeError") -> RankResult:
    return RankResult(rank, status, [], None if status in ("pass", "xfail") else
                      {"type": what, "message": f"rank {rank}'s {status}", "traceback": ""}, by_peer=by_peer)


def test_a_failure_by_a_peer_never_decides_the_cell_while_a_rank_failed_on_its_own():
    # a killed rank (its own error) and a peer whose harness collective broke under it
    ranks = [_rank(0, "harness_error", by_peer=True), _rank(1, "error")]
    assert cell_status(ranks) == "error"
    assert first_failure(ranks) == "[rank 1] RuntimeError: rank 1's error"
    # a hung rank and its peers stuck in a collective: the hang, once
    ranks = [_rank(0, "timeout", what="Timeout"), _rank(1, "error", by_peer=True), _rank(2, "timeout", by_peer=True)]
    assert cell_status(ranks) == "timeout" and first_failure(ranks).startswith("[rank 0] Timeout")
    # a rank that passed stays counted beside the culprit
    assert cell_status([_rank(0, "pass"), _rank(1, "fail"), _rank(2, "harness_error", by_peer=True)]) == "fail"
    # nobody failed on their own: every rank counts (the harness's collectives contradict themselves)
    assert cell_status([_rank(0, "harness_error", by_peer=True), _rank(1, "pass")]) == "harness_error"
    # and a harness bug of a rank's own still outranks the backend's failures
    assert cell_status([_rank(0, "harness_error"), _rank(1, "error")]) == "harness_error"


def test_by_peer_is_recorded_only_when_set():
    assert "by_peer" not in _rank(0, "error").serialize()
    back = RankResult.from_dict(_rank(0, "error", by_peer=True).serialize())
    assert back.by_peer and not RankResult.from_dict({"rank": 0, "status": "error"}).by_peer


def test_a_collective_a_peer_broke_is_told_by_its_words_and_its_origin():
    # gloo's transport error is a plain RuntimeError out of the collective's wait: raised here
    # by code compiled under the file name of torch's collectives
    torch_file = str(Path(dist.__file__).parent / "distributed_c10d.py")
    gloo = RuntimeError(RESET)
    try:
        exec(compile("raise e", torch_file, "exec"), {"e": gloo})  # noqa: S102
    except RuntimeError as e:
        gloo = e
    assert peer_lost(gloo)
    assert peer_lost(dist.DistNetworkError("Socket Timeout"))
    assert peer_lost(BackendFault("forward", gloo))
    try:
        try:
            raise gloo
        except RuntimeError as inner:
            raise HarnessBug("the harness failed in its consumer phase") from inner
    except HarnessBug as bug:
        assert peer_lost(bug)
    # the same words from anyone's own code, or a collective's other errors, are no peer's
    assert not peer_lost(RuntimeError(RESET))
    assert not peer_lost(dist.DistBackendError("Tensors must be the same size"))
    assert not peer_lost(HarnessBug("the oracle failed"))


DUMP = """[rank0] 1.0 start 3/9 some-cell [ref] lane [0, 1]
Fatal Python error: Terminated

Current thread 0x00007feccae87b80 (most recent call first):
  File "{inner}", line 4394 in {func}
  File "/x/harness/cell/runner.py", line 424 in _run_microbatches
  File "/x/harness/rank/worker.py", line 293 in _run_lane
  File "/x/harness/rank/worker.py", line 234 in run
"""


@pytest.mark.parametrize("inner, func, board, status, by_peer", [
    ("/v/site-packages/torch/distributed/distributed_c10d.py", "all_gather_single", "backend\tforward", "timeout", True),
    ("/x/fixtures/faults.py", "_fire", "backend\tforward", "timeout", False),
    ("/x/harness/cell/oracle.py", "compute", "harness\tchecks", "harness_error", False),
])
def test_a_silent_rank_is_judged_by_where_it_was(tmp_path, inner, func, board, status, by_peer):
    (tmp_path / "rank0.log").write_text(DUMP.format(inner=inner, func=func))
    (tmp_path / "board").write_text(board.ljust(PhaseBoard.SIZE))
    where = forensics.SilentRank(tmp_path, 0, 2, 9, tmp_path / "board")
    got = forensics.silent_rank(0, where, "no progress", named=False, after_peer=False)
    assert (got.status, got.by_peer) == (status, by_peer), got.error
    # once a peer failed on its own, the rest were ended because of it, wherever they were
    got = forensics.silent_rank(0, where, "peers did not finish", named=False, after_peer=True)
    assert (got.status, got.by_peer) == ("error", True)


def test_the_phase_board_shows_the_phase_in_flight_and_restores_the_one_before(tmp_path):
    board = PhaseBoard(tmp_path / "b")
    before = board.post("backend", "forward")
    assert forensics.read_board(tmp_path / "b") == ("backend", "forward") and before == ("harness", "worker")
    board.post(*before)
    assert forensics.read_board(tmp_path / "b") == ("harness", "worker")
    assert forensics.read_board(tmp_path / "missing") is None


def test_a_cells_bound_follows_its_predicted_cost_and_the_user_overrides_it():
    cells = matrix.select("ci")
    bounds = [cost.hang_bound(c) for c in cells]
    assert min(bounds) >= cost.HANG_FLOOR_S and max(bounds) <= 40, (min(bounds), max(bounds))
    big = max(cells, key=cost.run_seconds)
    assert cost.hang_bound(big) == cost.HANG_FLOOR_S + cost.HANG_FACTOR * cost.run_seconds(big)
    # larger shapes, larger bound: a named example, or the largest that --examples draws
    opts = LaunchOptions(backend="reference", run_dir=Path("."))
    assert cell_bound(opts, big) == cost.hang_bound(big)
    assert cell_bound(opts, big, examples=5) == cost.hang_bound(big, DRAWN_MAX) > cost.hang_bound(big)
    huge = LaunchOptions(backend="reference", run_dir=Path("."), example={"in_features": 240, "out_features": 300,
                                                                         "rows": 12})
    assert cell_bound(huge, big) == cost.HANG_FLOOR_S + 100 * cost.HANG_FACTOR * cost.run_seconds(big)
    assert cell_bound(LaunchOptions(backend="reference", run_dir=Path("."), cell_timeout=7.0), big, examples=5) == 7.0


def test_a_rank_using_the_cpu_is_seen_working_and_one_asleep_is_not(tmp_path):
    if launch.cpu_seconds(os.getpid()) is None:
        pytest.skip("no /proc here: the bound alone applies")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = launch._Launch(2, [], LaunchOptions(backend="reference", run_dir=tmp_path), "ws2-0", [])
        run.pids = {0: busy.pid, 1: idle.pid}
        t0 = time.monotonic()
        run.sample_cpu(t0, every=0.0)
        time.sleep(1.0)
        run.sample_cpu(time.monotonic(), every=0.0)
        assert run.busy_at[0] > t0 and run.busy_at[1] < t0, run.busy_at
    finally:
        for proc in (busy, idle):
            proc.kill()
            proc.wait()
    assert launch.cpu_seconds(busy.pid) is None  # gone


def test_a_rank_process_that_ended_says_how_until_it_is_reaped():
    if launch.process_end(os.getpid()) is not None or not Path("/proc/self/stat").exists():
        pytest.skip("no /proc here: torchrun alone says how a rank ended")
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        assert launch.process_end(killed.pid) is None
        killed.send_signal(9)
        deadline = time.monotonic() + 30
        while launch.process_end(exited.pid) is None or launch.process_end(killed.pid) is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert (launch.process_end(killed.pid), launch.process_end(exited.pid)) == ("signal 9", "exit 3")
    finally:
        killed.kill()
        for proc in (killed, exited):
            proc.wait()
    assert launch.process_end(killed.pid) == "gone"
