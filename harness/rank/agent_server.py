"""``python -m harness.rank.agent_server --socket PATH [--backends SPEC,...]``: a process that has
imported torch and the backends' heavy dependencies once, and forks a torchrun agent
(``harness.rank.agent``) for whoever asks on a Unix socket.

Why: every launch starts torchrun's agent as a new Python process, which imports torch (about
1.5 s of CPU) and, for ``te-cpu``, TE's dependencies ``torch._dynamo`` and ``onnxscript``
(about 2.5 s more) before it forks the ranks; a sweep's backend probe starts one more. A
suite that runs a few hundred launches pays that a few hundred times. An agent forked from
this server inherits those modules and pays nothing for them; what the agent does next -
probe, rendezvous, fork the ranks, import the backends (``harness.rank.worker.preload``) - is unchanged.

What a forked agent sees is what a fresh ``python -m harness.rank.agent ARGS`` process would
see: the caller's arguments, environment, working directory, standard streams (passed as
file descriptors over the socket) and a session of its own. Only third-party modules are
preloaded (``harness.vocabulary.backend_specs.RANK_PRELOAD``, torch and torchrun's own), never a
module of the harness or a backend, which the agent and its ranks import themselves under the
caller's environment. The server starts with the environment an agent starts with
(``harness.launcher.warm.agent_env``'s defaults) and refuses a caller whose harness is another
checkout (``root``) or who would import from a folder its imports never saw (a working
directory or ``PYTHONPATH`` entry not on its ``sys.path``), so that caller starts its agent as
a new process instead (``harness.launcher.served``).

Protocol, one connection per agent: the caller sends one JSON line (``argv``, ``env``, ``cwd``,
``root``) with its stdin, stdout and stderr descriptors; the server answers ``{"pid": N}`` (or
``{"error": ...}``), and when the agent has ended ``{"exit": code, "cpu_s": s}`` - the exit code
as ``subprocess`` gives it (negative: the signal) and the CPU seconds of the agent and every
process it waited for (its ranks, its probe), from ``wait4``.

The server ends when its stdin closes (its owner ended) or on SIGTERM.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, NoReturn

from harness.vocabulary.plan import harness_root

#: what every agent imports whatever its backend: torch and torchrun's agent; the harness's
#: own rank code (the worker, which every agent imported anew at each launch) and its
#: reference package, which a backend of the user's built on it (the suite's fault backends)
#: imported in every rank - both the same whatever the launch or the rank
_ALWAYS = ("torch", "torch.distributed.run", "torch.distributed.launcher.api",
           "torch.distributed.elastic.multiprocessing.errors", "setproctitle",
           "harness.rank.worker", "harness.backends.reference")
#: descriptors a request carries: the agent's stdin, stdout, stderr
_STREAMS = 3


def preload(specs: list[str]) -> None:
    """Import torch, torchrun's agent, the harness's worker, and what ``specs``' ranks and any
    plan's hook modes preload (``harness.rank.worker.preload_backends``, after the environment
    their preload sets); a module that fails is left to the agent, which imports it itself and
    says why."""
    for name in _ALWAYS:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001
            pass
    try:
        from harness.cell.hooks import FIRST_USE_IMPORTS
        from harness.rank import worker
    except Exception:  # noqa: BLE001
        return
    worker.preload_backends(specs, FIRST_USE_IMPORTS)


def fork_session() -> int:
    """``os.fork()`` with the child in a session of its own before the parent returns - a caller
    told the pid may ``killpg`` its group at once: 0 in the child, its pid in the parent."""
    sys.stdout.flush()
    sys.stderr.flush()
    started_r, started_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(started_r)
        os.setsid()
        os.close(started_w)
        return 0
    os.close(started_w)
    os.read(started_r, 1)  # empty once the child has its session (or died)
    os.close(started_r)
    return pid


def end_as_process(body: Callable[[], None]) -> NoReturn:
    """In a forked child: run ``body`` and exit as a new Python process running it would - 0,
    the code of a ``SystemExit``, or 1 with the traceback on stderr for any other exception -
    after flushing its streams (``os._exit``: nothing of the parent's runs at the child's exit)."""
    code = 1
    try:
        body()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 (as an uncaught exception ends a fresh process)
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    os._exit(code)


def _agent(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """In the forked child: become ``python -m harness.rank.agent ARGV`` and exit with its code."""
    def become() -> None:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [str(Path(harness_root()) / "harness" / "rank" / "agent.py"), *request["argv"]]
        from harness.rank import agent

        agent.main(list(request["argv"]))

    end_as_process(become)


def unseen_paths(request: dict[str, Any]) -> list[str]:
    """What the caller's agent would import from that this server's modules were not imported
    from: its working directory (``python -m`` puts it first) and its ``PYTHONPATH`` entries,
    each unless already on this server's ``sys.path``. A caller with a module of its own there
    (a fake TE version's metadata, a backend file beside a tree) gets an agent of its own."""
    seen = {os.path.realpath(p or os.getcwd()) for p in sys.path}
    wanted = [request["cwd"], *request["env"].get("PYTHONPATH", "").split(os.pathsep)]
    return [p for p in wanted if p and os.path.realpath(os.path.join(request["cwd"], p)) not in seen]


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass  # the caller went away: the agent is its own session and runs on


def _serve_one(conn: socket.socket) -> int | None:
    """Read one request and fork its agent; its pid, or None when refused."""
    raw, fds, _, _ = socket.recv_fds(conn, 1 << 20, _STREAMS)
    buf = raw
    while not buf.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            break
        buf += more
    try:
        request = json.loads(buf)
        if request.get("root") != harness_root():
            raise ValueError(f"this server runs the harness of {harness_root()}, not {request.get('root')}")
        unseen = unseen_paths(request)
        if unseen:
            raise ValueError(f"the caller imports from {unseen}, which this server's imports did not see")
        if len(fds) != _STREAMS:
            raise ValueError(f"expected {_STREAMS} descriptors, got {len(fds)}")
    except ValueError as exc:
        _send(conn, {"error": str(exc)})
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    pid = fork_session()
    if pid == 0:
        conn.close()
        _agent(request, fds)
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    return pid


def _reap(waiting: dict[int, socket.socket]) -> None:
    """Tell the caller of every agent that ended how it ended and what it cost."""
    while waiting:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            _send(conn, {"exit": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime})
            conn.close()


def serve(path: Path, specs: list[str]) -> None:
    """Preload, listen on ``path``, print ``ready`` and fork agents until stdin closes.

    One thread only, by design: a forked agent (and the ranks it forks in turn) inherits no
    other thread's locks - a thread blocked reading stdin would leave ``sys.stdin``'s lock held
    in every child, and a forked rank closes its stdin first thing."""
    preload(specs)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if path.exists():
        path.unlink()
    listener.bind(str(path))
    listener.listen(64)
    waiting: dict[int, socket.socket] = {}
    print("ready", flush=True)
    try:
        while True:
            ready, _, _ = select.select([listener, sys.stdin.fileno()], [], [], 0.2)
            if sys.stdin.fileno() in ready and not os.read(sys.stdin.fileno(), 4096):
                return  # the owner ended or closed our stdin
            if listener in ready:
                conn, _ = listener.accept()
                pid = _serve_one(conn)
                if pid is not None:
                    waiting[pid] = conn
            _reap(waiting)
    finally:
        listener.close()
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness.rank.agent_server", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, type=Path, help="the Unix socket to listen on")
    parser.add_argument("--backends", default="te-cpu",
                        help="comma-separated backend specs whose ranks' dependencies to preload")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(args.socket, [s for s in args.backends.split(",") if s])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
