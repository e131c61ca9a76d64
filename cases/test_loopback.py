"""A single-machine sweep listens on loopback only (``harness.rank.agent``, docs/security.md).

The main test runs a real ``python -m harness sweep`` at world size 2 against
``fixtures/faults.py`` in its ``gate`` mode: every rank stops inside the cell until the test
has looked, so the listening sockets are read while torchrun's agent and both ranks are known
to be up - no race with a fast sweep. Every listening TCP socket of the sweep's whole process
tree (the CLI, torchrun's agent, the ranks; from ``/proc``) must be bound to 127.0.0.1 or ::1.
The sweep sets ``GLOO_SOCKET_IFNAME`` to a network interface when the machine has one, as on
a host whose name resolves to a network address: gloo must still listen on loopback.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures import sockets
from harness.rank import agent as loopback
from harness.vocabulary.plan import agent_command
from harness.vocabulary.errors import BAD_INPUT

ROOT = Path(__file__).resolve().parents[1]
SELECTION = ["--modules", "linear", "--weights", "distributed", "--world-sizes", "2", "--hooks", "off",
             "--dtypes", "bf16", "--delay-wgrad", "off", "--fused", "on", "--microbatches", "1"]
WORLD_SIZE = 2

pytestmark = pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="reads /proc/<pid>/net (Linux)")


def _ipv4_of(interface: str) -> str | None:
    """The interface's IPv4 address (SIOCGIFADDR), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", interface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def network_interface() -> str | None:
    """An interface with a non-loopback IPv4 address, if this machine has one."""
    for _, name in socket.if_nameindex():
        address = _ipv4_of(name)
        if address and not ipaddress.ip_address(address).is_loopback:
            return name
    return None


def _wait_for_gate(gate: Path, proc: subprocess.Popen, limit_s: float = 240.0) -> None:
    deadline = time.monotonic() + limit_s
    while not all((gate / f"rank{r}").exists() for r in range(WORLD_SIZE)):
        assert proc.poll() is None, f"the sweep exited with {proc.returncode} before its ranks reached the gate"
        assert time.monotonic() < deadline, f"ranks did not reach the gate within {limit_s:g}s"
        time.sleep(0.05)


def test_sweep_process_tree_listens_on_loopback_only(tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    # a user's sweep: its agent is its own child, not one the suite's agent server forked
    # (conftest.py), so the process tree below holds the agent and its ranks
    env = {**{k: v for k, v in os.environ.items() if k != "DW_AGENT_SERVER"}, "DW_FAULT": "gate", "DW_FAULT_GATE": str(gate), "DW_FAULT_CELL": "1",
           "PYTHONPATH": str(ROOT)}
    interface = network_interface()
    if interface:
        env["GLOO_SOCKET_IFNAME"] = interface
    cmd = [sys.executable, "-m", "harness", "sweep", *SELECTION, "--backend", "fixtures/faults.py",
           "--out", str(tmp_path / "run"), "--quiet"]
    with open(tmp_path / "sweep.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait_for_gate(gate, proc)
        tree = sockets.process_tree(proc.pid)
        found = sockets.listeners(tree)
        commands = {pid: sockets.command_line(pid) for pid in tree}
        # torchrun's agent and its ranks all name the worker; the ranks are the agent's children
        workers = {pid for pid, c in commands.items() if "harness.rank.worker" in c}
        ranks = [pid for pid in workers if sockets.parent_pid(pid) in workers]
        agents = {sockets.parent_pid(pid) for pid in ranks}
    finally:
        (gate / "open").touch()
    try:
        returncode = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    listing = "\n".join(f"  {x}" for x in found) or "  (none)"
    assert all(x.loopback for x in found), \
        f"sockets of the sweep listen beyond loopback (GLOO_SOCKET_IFNAME={interface}):\n{listing}"

    # The check saw what it is about: the agent's store and every rank's gloo listeners.
    assert len(ranks) == WORLD_SIZE and len(agents) == 1, commands
    holders = {x.pid for x in found}
    assert all(pid in holders for pid in ranks), f"a rank had no listening socket (gloo):\n{listing}"
    assert agents <= holders, f"torchrun's agent had no listening socket (its store):\n{listing}"
    assert returncode == 0, (tmp_path / "sweep.log").read_text()[-3000:]


@pytest.mark.parametrize("wildcard,local", [("0.0.0.0", "127.0.0.1"), ("::", "::1")])
def test_socket_listing_tells_wildcard_from_loopback(wildcard, local):
    """The detector can fail: a wildcard listener is reported as not loopback."""
    family = socket.AF_INET6 if ":" in local else socket.AF_INET
    with socket.socket(family) as wide, socket.socket(family) as near:
        try:
            wide.bind((wildcard, 0))
            near.bind((local, 0))
        except OSError as exc:
            pytest.skip(f"no {local} on this machine: {exc}")
        wide.listen()
        near.listen()
        ports = wide.getsockname()[1], near.getsockname()[1]
        found = {x.port: x for x in sockets.listeners(sockets.process_tree(os.getpid()))}
    assert str(found[ports[0]].address) == wildcard and not found[ports[0]].loopback
    assert str(found[ports[1]].address) == local and found[ports[1]].loopback
    assert {found[p].pid for p in ports} == {os.getpid()}


@pytest.mark.parametrize("extra", [["--standalone"], ["--rdzv-endpoint", "example.org:29400"],
                                   ["--master-addr", "0.0.0.0"], ["--nnodes", "2"], ["--rdzv-backend", "c10d"]])
def test_launcher_refuses_rendezvous_options_of_its_own(extra):
    with pytest.raises(loopback.LoopbackError, match="sets the rendezvous itself"):
        loopback.torchrun_argv(1234, [*extra, "--nproc-per-node", "2", "script.py"])


def test_launcher_rejects_a_rendezvous_option_as_bad_input_before_starting_anything():
    proc = subprocess.run([*agent_command("--standalone", "--nproc-per-node", "1", "script.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == BAD_INPUT, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harness.rank.agent: ") and "--standalone=True" in lines[0], proc.stderr


def test_launcher_ignores_inherited_rendezvous_environment(monkeypatch):
    # every variable set through monkeypatch, so that teardown restores what the launcher changed
    monkeypatch.setenv("PET_STANDALONE", "1")
    monkeypatch.setenv("PET_RDZV_ENDPOINT", "example.org:29400")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth-somewhere")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth-somewhere")
    loopback.confine_environment()
    assert "PET_STANDALONE" not in os.environ and "PET_RDZV_ENDPOINT" not in os.environ
    assert os.environ["GLOO_SOCKET_IFNAME"] == loopback.loopback_interface()
    assert os.environ["NCCL_SOCKET_IFNAME"] == "=" + loopback.loopback_interface()
    assert loopback.torchrun_argv(1234, ["--nproc-per-node", "2", "script.py"])[:6] == \
        ["--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", "1234"]
