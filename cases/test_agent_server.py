"""The agent server (``harness/rank/agent_server.py``) and its client (``harness/launcher/served.py``).

Why: the suite forks every torchrun agent from one server (conftest.py); an agent forked there
must behave as ``python -m harness.rank.agent ARGS`` started anew would - its arguments, exit
code, streams, environment and session - or every launch of the suite would test something a
user never runs. A server that cannot serve (another checkout, not listening) must cost the
caller nothing but the old way.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.launcher import served
from harness.vocabulary.errors import BAD_INPUT

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server of our own (the reference's ranks preload nothing: torch and torchrun only)."""
    path = tmp_path_factory.mktemp("agents") / "s.sock"
    proc = subprocess.Popen([sys.executable, "-m", "harness.rank.agent_server", "--socket", str(path),
                             "--backends", "reference"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline() == b"ready\n"
    yield path, proc
    proc.stdin.close()
    proc.wait(timeout=30)


def _env(path) -> dict[str, str]:
    return {**os.environ, served.SERVER_ENV: str(path), "PYTHONPATH": str(ROOT)}


def test_a_served_agent_is_the_agent_with_its_exit_code_streams_and_session(server, monkeypatch):
    path, proc = server
    monkeypatch.setenv(served.SERVER_ENV, str(path))
    agent = served.start_agent(["--standalone", "--nproc-per-node", "1", "script.py"], env=_env(path),
                               stdout=served.PIPE, stderr=served.STDOUT)
    assert isinstance(agent, served.ServedAgent)
    assert agent.wait(timeout=60) == BAD_INPUT  # the agent's own refusal, through the server
    out = agent.stdout.read().decode()
    assert out.startswith("harness.rank.agent: ") and "--standalone=True" in out, out
    assert agent.cpu_s is not None and agent.cpu_s < 5
    # a session of its own (killpg ends the agent and its ranks), a child of the server
    agent = served.start_agent(["--warm", "reference"], env=_env(path), stdin=served.PIPE, stdout=served.PIPE,
                               stderr=served.DEVNULL)
    assert os.getpgid(agent.pid) == agent.pid and agent.poll() is None
    assert f"PPid:\t{proc.pid}" in Path(f"/proc/{agent.pid}/status").read_text()
    os.killpg(agent.pid, signal.SIGKILL)
    assert agent.wait(timeout=30) == -signal.SIGKILL


def test_a_sweep_through_the_server_gives_the_verdicts_of_one_without(server, tmp_path):
    path, _ = server
    args = [sys.executable, "-m", "harness", "sweep", "--preset", "smoke", "--modules", "linear", "--quiet"]
    runs = {}
    for name, env in (("served", _env(path)),
                      ("fresh", {k: v for k, v in _env(path).items() if k != served.SERVER_ENV})):
        done = subprocess.run([*args, "--out", str(tmp_path / name)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        record = json.loads(gzip.decompress((tmp_path / name / "results.json.gz").read_bytes()))
        runs[name] = [(c["id"], c["status"], c["worst_ratio"]) for c in record["cells"]]
    assert runs["served"] == runs["fresh"] and len(runs["served"]) == 2


def test_another_checkout_or_no_server_falls_back_to_a_new_process(server, monkeypatch, tmp_path):
    path, _ = server
    monkeypatch.setattr(served, "harness_root", lambda: "/elsewhere")
    monkeypatch.setenv(served.SERVER_ENV, str(path))
    agent = served.start_agent(["--standalone", "script.py"], env=_env(path), stdout=served.PIPE,
                               stderr=served.STDOUT)
    assert isinstance(agent, subprocess.Popen) and agent.wait(timeout=60) == BAD_INPUT
    monkeypatch.undo()
    monkeypatch.setenv(served.SERVER_ENV, str(path))
    # a folder on the caller's PYTHONPATH that the server's imports never saw (a fake TE, a
    # backend file): an agent of its own
    agent = served.start_agent(["--standalone", "script.py"], stdout=served.PIPE, stderr=served.STDOUT,
                               env={**_env(path), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    assert isinstance(agent, subprocess.Popen) and agent.wait(timeout=60) == BAD_INPUT
    agent.stdout.close()
    monkeypatch.setenv(served.SERVER_ENV, str(tmp_path / "none.sock"))
    agent = served.start_agent(["--standalone", "script.py"], env=_env(path), stdout=served.PIPE,
                               stderr=served.STDOUT)
    assert isinstance(agent, subprocess.Popen) and agent.wait(timeout=60) == BAD_INPUT
    agent.stdout.close()


def test_the_server_ends_when_its_owner_does(tmp_path, monkeypatch):
    path = tmp_path / "s.sock"
    proc = subprocess.Popen([sys.executable, "-m", "harness.rank.agent_server", "--socket", str(path),
                             "--backends", "reference"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline() == b"ready\n" and path.exists()
    # an agent it forked outlives it (its own session), and its caller still sees it run
    env = {**os.environ, served.SERVER_ENV: str(path), "PYTHONPATH": str(ROOT)}
    # (monkeypatch gives the suite's own server back to the tests after this one: a plain
    # ``del`` left this worker's later launches without it)
    monkeypatch.setenv(served.SERVER_ENV, str(path))
    agent = served.start_agent(["--warm", "reference"], env=env, stdin=served.PIPE, stdout=served.PIPE,
                               stderr=served.DEVNULL)
    monkeypatch.undo()
    assert isinstance(agent, served.ServedAgent)
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    assert agent.poll() is None
    os.killpg(agent.pid, signal.SIGKILL)
    assert agent.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not path.exists()
