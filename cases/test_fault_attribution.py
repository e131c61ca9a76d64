"""Whose failure a cell's is, in-process: the fold's rule (``harness.records.fold.decisive``),
a rank's recognition of a collective its peer broke (``harness.cell.faults.peer_lost``), the
launcher's reading of a rank that never reported (``harness.launcher.forensics.silent_rank``)
and the bound a cell's cost gives it (``harness.vocabulary.cost.hang_bound``).
The same rules over real launches: ``cases/test_faults_ci.py``."""

from __future__ import annotations

import dataclasses
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
from harness.vocabulary import cost, matrix, packing
from harness.vocabulary.shape import DRAWN_MAX, Example

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
    base = [c for c in cells if c.shape == "base"]
    bounds = [cost.hang_bound(c) for c in base if c.recipe == "none"]
    assert min(bounds) >= cost.HANG_FLOOR_S and max(bounds) <= 4 * cost.HANG_FLOOR_S, (min(bounds), max(bounds))
    big = max(base, key=cost.run_seconds)
    assert cost.hang_bound(big) == cost.HANG_FLOOR_S + cost.HANG_FACTOR * cost.run_seconds(big)
    assert cost.hang_bound(big, sees_cpu=False) == cost.BLIND_FACTOR * cost.hang_bound(big)
    # a cell that spans blocks runs larger shapes than its base twin: a larger bound
    spans = next(c for c in cells if c.shape == "blocks")
    assert cost.hang_bound(spans) > cost.hang_bound(dataclasses.replace(spans, shape="base"))
    # larger shapes, larger bound: a named example, or the largest that --examples draws
    opts = LaunchOptions(backend="reference", run_dir=Path("."))
    assert cell_bound(opts, big) == cost.hang_bound(big, sees_cpu=launch.SEES_CPU)
    assert cell_bound(opts, big, examples=5) == cost.hang_bound(big, DRAWN_MAX, sees_cpu=launch.SEES_CPU) > \
        cell_bound(opts, big)
    huge = LaunchOptions(backend="reference", run_dir=Path("."), example={"in_features": 240, "out_features": 300,
                                                                         "rows": 12})
    assert cell_bound(huge, big) == cost.hang_bound(big, Example(240, 300, 12), sees_cpu=launch.SEES_CPU)
    # 100 times the work, at most 10 times the time (``shape.size_factor``)
    assert cost.run_seconds(big) < cost.run_seconds(big, Example(240, 300, 12)) <= 10 * cost.run_seconds(big)
    assert cell_bound(LaunchOptions(backend="reference", run_dir=Path("."), cell_timeout=7.0), big, examples=5) == 7.0


def test_a_rank_using_the_cpu_is_seen_working_and_one_asleep_is_not(tmp_path):
    if launch.cpu_sample(os.getpid()) is None:
        pytest.skip("no /proc here: the bound alone applies")
    # each says when its interpreter has started: under load the idle one's own start-up,
    # still running at the first sample, would count as work
    busy = subprocess.Popen([sys.executable, "-c", "print('up', flush=True)\nwhile True: pass"],
                            stdout=subprocess.PIPE)
    idle = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE)
    try:
        assert busy.stdout.readline() == idle.stdout.readline() == b"up\n"
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
    assert launch.cpu_sample(busy.pid) is None  # gone


def test_a_rank_waiting_on_the_machine_is_working_and_one_asleep_is_not():
    # a rank in a verdict's fsync (``D``) while its peer waits on it in a collective, and one
    # whose turn on a loaded CPU is late (``R``), are not hung
    assert launch.seen_working("D", 0.0, 6.0) and launch.seen_working("R", 0.0, 6.0)
    assert not launch.seen_working("S", 0.0, 6.0) and not launch.seen_working("S", 0.29, 6.0)
    assert launch.seen_working("S", 0.31, 6.0)  # more than BUSY_SHARE of a core since the last sample
    if launch.cpu_sample(os.getpid()) is not None:
        assert launch.cpu_sample(os.getpid())[0] == "R"  # this process, reading its own state, runs


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


def test_a_kept_twin_that_raised_is_the_backends_error_in_every_cell_it_serves(monkeypatch):
    """The kept-twin path (``harness.cell.twin.Twins``): a hooks-off run that raised in the
    backend's forward is kept with its error and served to the hooked cells after it, each of
    which is then the backend's ``error`` in its twin's forward - never a harness error."""
    import fixtures.faults as faulty
    from harness.cell import twin
    from harness.cell.runner import RankContext, run_cell

    monkeypatch.setenv("DW_FAULT", "raise")
    monkeypatch.setenv("DW_FAULT_RANK", "0")
    monkeypatch.setenv("DW_FAULT_CELLS", 'hooks == "off"')
    off = matrix.Cell(module="linear", weight="plain", hooks="off", fused=False, dtype="fp32", world_size=1,
                      consumer="autograd", microbatches=2, num_gemms=1, bias=True, input_grad=True,
                      delay_wgrad=False)
    ctx = RankContext(twins=twin.Twins())
    own = run_cell(faulty, off, ctx)
    assert own.status == "error" and own.error["phase"] == "forward", own.error
    for hooks in ("identity", "offload"):
        served = run_cell(faulty, matrix.Cell(**{**off.serialize(), "hooks": hooks}), ctx)
        assert served.status == "error" and not served.by_peer, served.error
        assert served.error["phase"] == "hooks-off twin: forward" and "injected fault" in served.error["message"]
        assert cell_status([served]) == "error"
    assert ctx.twins.hits == 2  # both hooked cells took the kept run; neither ran its twin again


def test_a_failed_ranks_peers_get_a_grace_measured_on_the_launch(tmp_path):
    cell = next(c for c in matrix.select("ci") if c.world_size == 2)
    run = launch._Launch(2, [launch.Task("reference", cell)], LaunchOptions(backend="reference", run_dir=tmp_path),
                         "ws2-0", packing.pack([cell], 2))
    ls = run.lanes[0]
    t = run.since(ls)
    # a fast launch: the floor
    assert run.peer_grace(ls, t + 0.1) == launch.PEER_GRACE_FLOOR_S
    # the failed rank's own time in its cell, or the longest cell the launch ran, times the factor
    assert run.peer_grace(ls, t + 1.0) == launch.PEER_GRACE_FACTOR * 1.0
    run.longest_cell = 1.2
    assert run.peer_grace(ls, t + 0.1) == launch.PEER_GRACE_FACTOR * 1.2 < run.bound(ls)
    # never past the cell's bound
    run.longest_cell = 1e6
    assert run.peer_grace(ls, t) == run.bound(ls)
    # a silent peer seen working restarts its clock
    run.busy_at[1] = t + 3.0
    assert run.quiet_since(ls, t + 1.0) == t + 3.0
    run.reports[0] = {1: {"result": {"status": "pass"}}}  # it reported: its work no longer counts
    assert run.quiet_since(ls, t + 1.0) == t + 1.0


def test_a_lane_whose_rank_still_starts_is_bound_by_the_start_up_timeout_not_its_cell(tmp_path):
    # the CI machine's case: a packed relaunch, lane [0, 1] had run a cell while rank 2 of
    # lane [2, 3] still imported its backend (no pid known, no CPU sample), and lane [2, 3]'s
    # cell was taken for a hang 6 s after rank 3 was ready
    cells = [c for c in matrix.select("ci") if c.world_size == 2][:2]
    opts = LaunchOptions(backend="reference", run_dir=tmp_path, startup_timeout=120.0)
    run = launch._Launch(4, [launch.Task("reference", c) for c in cells], opts, "ws4-9", packing.pack(cells, 4))
    assert [ls.lane.ranks for ls in run.lanes] == [(0, 1), (2, 3)]
    run.ready = {0, 1, 3}
    run.lanes[0].done = len(run.lanes[0].lane.tasks)
    run.done = {run.lanes[0].lane.tasks[0]}
    assert run.started and [ls.lane.ranks for ls in run.active()] == [(2, 3)]
    assert run.starting(run.lanes[1]) and not run.starting(run.lanes[0])
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        later = run.t0 + 10 * run.bound(run.lanes[1])
        assert later - run.t0 < opts.startup_timeout
        assert launch._judge_lanes(run, proc, opts, lambda *_: None, later) is None
        assert proc.poll() is None  # not ended
    finally:
        proc.kill()
        proc.wait()


def test_a_rank_waiting_in_the_harness_for_a_rank_hung_in_the_backend_is_its_peer(tmp_path):
    # no stack dumps (cut short): the boards alone say who waited for whom
    boards = {}
    for r, board in ((0, "backend\tforward"), (1, "harness\tconsumer")):
        boards[r] = tmp_path / f"board{r}"
        boards[r].write_text(board.ljust(PhaseBoard.SIZE))
    where = {r: forensics.SilentRank(tmp_path, r, 0, 1, boards[r]) for r in boards}
    assert forensics.hung_in_backend(where[0]) and not forensics.hung_in_backend(where[1])
    got = [forensics.silent_rank(r, where[r], "no progress", named=False, after_peer=False,
                                 peer_in_backend=forensics.hung_in_backend(where[1 - r])) for r in (0, 1)]
    assert [(g.status, g.by_peer) for g in got] == [("timeout", False), ("timeout", True)], got
    assert cell_status(got) == "timeout" and first_failure(got).startswith("[rank 0] Timeout")
    # both in the harness's code: a harness hang, the harness's error
    got = forensics.silent_rank(1, where[1], "no progress", named=False, after_peer=False, peer_in_backend=False)
    assert got.status == "harness_error" and not got.by_peer


def test_a_rank_whose_dump_was_cut_short_beside_one_seen_hung_in_the_backend_is_its_peer(tmp_path):
    # rank 0's dump shows it in the backend's code (the fault); rank 1's dump was cut short
    # (under load a waiting rank's dump may not finish): one hang, rank 0's
    (tmp_path / "rank0.log").write_text(DUMP.format(inner="/x/fixtures/faults.py", func="_fire"))
    (tmp_path / "rank1.log").write_text("[rank1] 1.0 start 3/9 some-cell [ref] lane [0, 1]\n"
                                        "Fatal Python error: Terminated\n\nCurrent thread 0x1 (most recent call first):\n")
    where = {}
    for r in (0, 1):
        (tmp_path / f"board{r}").write_text("backend\tforward".ljust(PhaseBoard.SIZE))
        where[r] = forensics.SilentRank(tmp_path, r, 2, 9, tmp_path / f"board{r}")
    assert forensics.seen_hung_in_backend(where[0]) and not forensics.seen_hung_in_backend(where[1])
    got = [forensics.silent_rank(r, where[r], "no progress", named=False, after_peer=False,
                                 peer_in_backend=True, peer_seen_hung=forensics.seen_hung_in_backend(where[1 - r]))
           for r in (0, 1)]
    assert [(g.status, g.by_peer) for g in got] == [("timeout", False), ("timeout", True)], got
    # without a peer seen hung, a rank with no frame is its own hang, as before
    alone = forensics.silent_rank(1, where[1], "no progress", named=False, after_peer=False, peer_in_backend=True)
    assert (alone.status, alone.by_peer) == ("timeout", False)


def test_a_dump_cut_before_the_lane_still_names_where_the_cell_hung(tmp_path):
    # as a loaded rank's log showed it: the SIGKILL after the SIGTERM's grace cut the dump in
    # the runner's frames, before the worker's _run_lane; the innermost frame was written first
    cut = ('[rank0] 1.0 start 41/41 some-cell [fixtures/faults.py] lane [0, 1, 2, 3]\n'
           'Current thread 0x00007fcc51a6bb80 (most recent call first):\n'
           '  File "/x/fixtures/faults.py", line 103 in _fire\n'
           '  File "/x/fixtures/faults.py", line 160 in forward\n'
           '  File "/v/site-packages/torch/nn/modules/module.py", line 1789 in _call_impl\n'
           '  File "/x/harness/cell/runner.py", line 439 in _run_microbatches\n'
           '  File "/x/harness/cell/runner.py", line 200 in run_cell')
    (tmp_path / "rank0.log").write_text(cut)
    (tmp_path / "board").write_text("backend\tforward".ljust(PhaseBoard.SIZE))
    where = forensics.SilentRank(tmp_path, 0, 40, 41, tmp_path / "board")
    assert forensics.seen_hung_in_backend(where)
    got = forensics.silent_rank(0, where, "no progress", named=False, after_peer=False)
    assert (got.status, got.by_peer) == ("timeout", False)
    assert got.error["message"].startswith('this rank hung in the backend\'s forward phase, at "/x/fixtures/faults.py", '
                                           'line 103 in _fire'), got.error
    # another thread's dump (no runner, no lane) names nothing
    (tmp_path / "rank0.log").write_text(cut.split("Current thread")[0] + 'Thread 0x1 (most recent call first):\n'
                                        '  File "/usr/lib/python3.11/threading.py", line 327 in wait\n')
    assert forensics.innermost_frame((tmp_path / "rank0.log").read_text()) is None
