"""Start torchrun's agent (``python -m harness.rank.agent ARGS``): as a new Python process, or
forked from an agent server when ``DW_AGENT_SERVER`` names one (``harness.rank.agent_server``).

Why a server: a new agent process imports torch and the backend's heavy dependencies before
it can fork a rank (about 1.5 CPU-s for the reference, 4 for ``te-cpu``); a server has
imported them once, and its forked agents start in milliseconds. The test suite starts one
for its run (``conftest.py``; ``.ci/run`` one for the whole gate), so its few hundred launches
pay the imports once; a user's sweep starts its agents as new processes unless they run a
server themselves.

Either way the caller gets an object with what the launcher uses of ``subprocess.Popen``:
``pid`` (a process group leader: ``killpg`` ends the agent and its ranks), ``args``,
``stdin``/``stdout`` where piped, ``poll``, ``wait``, ``returncode``, ``kill``. A server that
cannot be reached or refuses (another checkout) is not an error: the agent starts as a new
process, as it would without one.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO, Any, Mapping

from harness.vocabulary.plan import AGENT_MODULE, agent_command, harness_root

#: the environment variable that names an agent server's socket
SERVER_ENV = "DW_AGENT_SERVER"
PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT


class ServedAgent:
    """An agent forked by the server: ``subprocess.Popen``'s surface the launcher uses. Its exit
    code (and CPU seconds, ``cpu_s``) arrive on the connection when the server has reaped it."""

    def __init__(self, conn: socket.socket, pid: int, args: list[str],
                 stdin: IO[bytes] | None, stdout: IO[bytes] | None) -> None:
        self._conn: socket.socket | None = conn
        self._buf = b""
        self.pid = pid
        self.args = args
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self.cpu_s: float | None = None

    def _read(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if self._conn is None:  # the server ended before the agent: watch the pid itself
                if not _alive(self.pid):
                    self.returncode = -signal.SIGKILL  # its code went with the server
                elif deadline is None or time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                return
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._conn], [], [], left)
            if not ready:
                return
            chunk = self._conn.recv(4096)
            if not chunk:  # the agent is its own session and runs on without the server
                self._conn.close()
                self._conn = None
                continue
            self._buf += chunk
            if b"\n" in self._buf:
                message = json.loads(self._buf.split(b"\n", 1)[0])
                self.returncode = int(message["exit"])
                self.cpu_s = message.get("cpu_s")
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie no longer does: nobody of ours reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _fd(spec: Any, opened: list[int], inherited: int) -> int:
    """The descriptor for one of ``subprocess``'s stream arguments (``DEVNULL``, a file; None:
    this process's own, ``inherited``, except stdin, which the agent never reads from us)."""
    if spec is None and inherited != 0:
        return inherited
    if spec == DEVNULL or spec is None:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd
    return spec if isinstance(spec, int) else spec.fileno()


def _serve(path: str, argv: list[str], env: Mapping[str, str], stdin: Any, stdout: Any,
           stderr: Any) -> ServedAgent | None:
    """Ask the server at ``path`` for an agent; None when it cannot be reached or refuses."""
    opened: list[int] = []
    ours: dict[str, IO[bytes]] = {}
    theirs: list[int] = []
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        for target, spec in enumerate((stdin, stdout)):
            if spec == PIPE:  # the agent's end goes to it, ours stays here
                r, w = os.pipe()
                mine, its = (w, r) if target == 0 else (r, w)
                opened.append(its)
                ours["stdin" if target == 0 else "stdout"] = os.fdopen(mine, "wb" if target == 0 else "rb")
                theirs.append(its)
            else:
                theirs.append(_fd(spec, opened, target))
        theirs.append(theirs[1] if stderr == STDOUT else _fd(stderr, opened, 2))
        request = {"argv": argv, "env": dict(env), "cwd": os.getcwd(), "root": harness_root()}
        socket.send_fds(conn, [(json.dumps(request) + "\n").encode()], theirs)
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                raise OSError("the agent server closed the connection")
            line += chunk
        answer = json.loads(line)
        if "pid" not in answer:
            raise OSError(answer.get("error", "the agent server refused"))
    except (OSError, ValueError):
        conn.close()
        for f in ours.values():
            f.close()
        return None
    finally:
        for fd in opened:
            os.close(fd)
    return ServedAgent(conn, int(answer["pid"]), agent_command(*argv), ours.get("stdin"), ours.get("stdout"))


def start_agent(argv: list[str], *, env: Mapping[str, str], stdin: Any = DEVNULL, stdout: Any = None,
                stderr: Any = None) -> subprocess.Popen | ServedAgent:
    """``python -m harness.rank.agent ARGV`` in a session of its own, with ``env`` and the
    streams as ``subprocess.Popen`` takes them (``PIPE``, ``DEVNULL``, ``STDOUT``, a file):
    forked by the server ``DW_AGENT_SERVER`` names, else a new process."""
    path = os.environ.get(SERVER_ENV)
    if path:
        served = _serve(path, argv, env, stdin, stdout, stderr)
        if served is not None:
            return served
    return subprocess.Popen(agent_command(*argv), stdin=stdin, stdout=stdout, stderr=stderr,
                            start_new_session=True, env=dict(env))


__all__ = ["AGENT_MODULE", "SERVER_ENV", "ServedAgent", "start_agent"]
