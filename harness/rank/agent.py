"""``python -m harness.rank.agent [torchrun options] -m harness.rank.worker ...``: torchrun on one
machine with every listening socket on loopback.

Why: ``torchrun --standalone`` listens on every interface for the whole launch. Its agent
hosts two ``TCPStore`` servers - the c10d rendezvous and the workers' store - and a TCPStore
server binds ``::`` / ``0.0.0.0`` whatever host it is given (PyTorch issue #173909). Neither
authenticates, and the dynamic rendezvous unpickles the state it reads back: whoever can reach
the port while a launch runs can hang it, corrupt it, or run code in the agent. gloo's and
NCCL's own listeners bind to the address the host name resolves to, which on a CI runner or
an office machine is a network address.

How: this entry point runs torchrun in this process (its argument parser, configuration and
``elastic_launch``), so torchrun's agent still starts, watches and ends the ranks, after
three steps:

1. It binds a socket to ``127.0.0.1:0`` itself and starts a multi-tenant ``TCPStore`` server
   on it (``master_listen_fd``). That is the agent's only listening socket.
2. It selects torchrun's static rendezvous at ``127.0.0.1:<that port>`` for one node. The
   static handler constructs ``TCPStore(127.0.0.1, port, is_master=True, multi_tenant=True)``;
   multi-tenant servers are shared per process and port, so it gets step 1's server and binds
   nothing. Its ``use_agent_store`` is true: the ranks receive ``MASTER_ADDR=127.0.0.1``,
   ``MASTER_PORT=<port>`` and ``TORCHELASTIC_USE_AGENT_STORE=True`` and join that server as
   clients; rank 0 starts no store of its own.
3. It sets ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` to the loopback interface,
   overriding any inherited value (the ranks inherit them): gloo and NCCL bind their
   listeners to its address, not to the host name's.

Why it is sound for the supported torch versions (``torch>=2.4``, the project's floor): each
step uses public behaviour that predates 2.4 and still holds in 2.13 - ``TCPStore``'s
``master_listen_fd`` (served by the legacy server throughout, by the libuv server from 2.8,
see ``start_store``), the multi-tenant server cache keyed by port, the static rendezvous's
multi-tenant store shared with the ranks (``use_agent_store`` ->
``TORCHELASTIC_USE_AGENT_STORE``), and the two ``*_SOCKET_IFNAME`` variables. Each way it
could break fails loudly, never wider: were a torch release's static rendezvous to start a
server of its own on the port, its bind to ``::``/``0.0.0.0`` would fail with EADDRINUSE
(step 1's socket holds the port) and the launch would stop with that error; a server that
did not serve the passed socket would leave torchrun's rendezvous unanswered, and the
harness's start-up timeout would end the launch. ``cases/test_loopback.py`` lists the listening
sockets of a real sweep's whole process tree (run on the installed torch: 2.13 in CI).

Limits: loopback is not a boundary between users of one machine. Every local process (and
every container sharing the host's network namespace) can still reach the store, which has no
authentication. The guarantee covers what torch.distributed opens (the stores, gloo, NCCL's
bootstrap and socket transport); a backend under test that opens sockets of its own is
outside it. A run across nodes cannot be loopback: it uses the user's own launcher (docs/gpu.md).

Ranks of ``-m harness.rank.worker`` are forked from the agent on Linux (torchrun's ``fork`` start
method for a function entrypoint, ``harness.rank.worker.forked``) rather than started as new
Python processes: the agent has imported torch already, and a fresh process would import it
again (about 2 s of CPU per rank, most of a small launch); it also imports the plan's
backends' heavy third-party dependencies once (``harness.rank.worker.preload``: TE's, about 3 s of
CPU per rank), never a backend itself. The agent never touches CUDA, so
a forked rank may still initialize it; the agent's threads (the store server) do not exist
in a forked rank, which only connects to the store as a client. ``DW_RANK_START=spawn`` gives
torchrun's own start (what ``-m harness.rank.external`` and any other script always get).

``--warm SPEC`` starts a warm agent (``harness.launcher.warm``): the backend probe first, then, handed
a launch on its stdin, this entry point with that launch's arguments, environment and log.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.vocabulary.errors import LoopbackError
from harness.vocabulary.errors import BAD_INPUT
from harness.vocabulary.plan import WARM_MARKER, agent_command, ranks_forked

LOOPBACK_HOST = "127.0.0.1"

#: torchrun's ``PET_*`` environment defaults for the rendezvous options this launcher sets
#: itself; inherited from the caller they would move the rendezvous off loopback.
_OWNED_ENV = ("PET_STANDALONE", "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_MASTER_ADDR",
              "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK")

_IFF_LOOPBACK = 0x8

#: fork the ranks from the agent (``harness.vocabulary.plan.ranks_forked``)
FORK = ranks_forked()


def loopback_interface() -> str:
    """The name of this machine's loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    for name in names:
        try:
            if int(Path(f"/sys/class/net/{name}/flags").read_text(), 16) & _IFF_LOOPBACK:
                return name
        except (OSError, ValueError):
            continue
    for name in ("lo", "lo0"):
        if name in names:
            return name
    raise LoopbackError(f"no loopback interface among {names}")


def start_store() -> tuple[Any, int]:
    """A multi-tenant ``TCPStore`` server listening on ``127.0.0.1`` only, and its port.

    The caller must keep the store alive for the whole launch: were it collected, the
    port's multi-tenant cache entry would expire before torchrun looks it up.
    """
    import torch
    from torch.distributed import TCPStore

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK_HOST, 0))
        sock.listen(socket.SOMAXCONN)
        port = sock.getsockname()[1]
    except OSError as exc:
        sock.close()
        raise LoopbackError(f"cannot listen on {LOOPBACK_HOST}: {exc}") from exc
    # libuv's server serves a passed socket only from torch 2.8 on (pytorch#150215 added the
    # missing uv_listen; before, it never accepted a connection); older releases get the
    # legacy server, which always has. The server owns the descriptor from here on.
    store = TCPStore(LOOPBACK_HOST, port, is_master=True, multi_tenant=True,
                     master_listen_fd=sock.detach(), wait_for_workers=False,
                     use_libuv=torch.__version__ >= (2, 8))
    return store, port


def torchrun_argv(port: int, args: Sequence[str]) -> list[str]:
    """torchrun's arguments: a one-node static rendezvous at ``127.0.0.1:port``, then ``args``.

    Raises:
        LoopbackError: ``args`` set a rendezvous option of their own.
    """
    from torch.distributed.run import parse_args

    argv = ["--rdzv-backend", "static", "--master-addr", LOOPBACK_HOST, "--master-port", str(port),
            "--nnodes", "1", "--node-rank", "0", *args]
    parsed = parse_args(argv)
    got = {"--standalone": parsed.standalone, "--rdzv-backend": parsed.rdzv_backend,
           "--rdzv-endpoint": parsed.rdzv_endpoint, "--master-addr": parsed.master_addr,
           "--master-port": parsed.master_port, "--nnodes": parsed.nnodes,
           "--node-rank": parsed.node_rank}
    want = {"--standalone": False, "--rdzv-backend": "static", "--rdzv-endpoint": "",
            "--master-addr": LOOPBACK_HOST, "--master-port": port, "--nnodes": "1", "--node-rank": 0}
    wrong = [f"{opt}={got[opt]!r}" for opt in want if got[opt] != want[opt]]
    if wrong:
        raise LoopbackError(f"a single-machine launch sets the rendezvous itself; remove {', '.join(wrong)}")
    return argv


def confine_environment() -> None:
    """Drop inherited rendezvous defaults; pin gloo's and NCCL's listeners to loopback."""
    for name in _OWNED_ENV:
        os.environ.pop(name, None)
    interface = loopback_interface()
    os.environ["GLOO_SOCKET_IFNAME"] = interface
    os.environ["NCCL_SOCKET_IFNAME"] = f"={interface}"   # '=': exactly this interface


def main(argv: Sequence[str] | None = None) -> None:
    """Run torchrun with ``argv`` (torchrun options and the script), confined to loopback;
    ``--warm SPEC``: first the warm agent's probe and wait (``harness.launcher.warm``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--warm"] and len(args) == 2:
        args = _warm(args[1])
        if args is None:
            return
    try:
        confine_environment()
        store, port = start_store()
        full = torchrun_argv(port, args)
    except LoopbackError as exc:
        print(f"harness.rank.agent: {exc}", file=sys.stderr)
        raise SystemExit(BAD_INPUT) from None
    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        record(_run)(full)   # as torchrun's main: a failure's summary goes to the log
    finally:
        del store   # held until torchrun is done: its rendezvous and the ranks use it


def _warm(spec: str) -> list[str] | None:
    """The warm agent (``harness.launcher.warm``): preload for ``spec``'s ranks, describe ``spec`` from
    a forked child, print the outcome, then wait for a launch. Returns torchrun's arguments
    with this process's stdout and stderr now the launch's log and its environment the
    launch's, or None when no launch came (stdin closed)."""
    import setproctitle

    from harness.rank import worker

    # set up now: it moves the environment's strings to make room, which it cannot find
    # once the launch's environment replaced them
    setproctitle.setproctitle(setproctitle.getproctitle())
    worker.preload_backends([spec])
    print(WARM_MARKER + json.dumps(_probe_in_child(spec)), flush=True)
    line = sys.stdin.readline()
    if not line:
        return None
    launch = json.loads(line)
    os.environ.clear()
    os.environ.update(launch["env"])
    log = os.open(launch["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    setproctitle.setproctitle(" ".join(agent_command(*launch["argv"])))
    return launch["argv"]


def _probe_in_child(spec: str) -> dict[str, Any]:
    """``{"info": BackendInfo}`` or ``{"error": one line}``: the backend imported and described
    in a forked child, so that neither its import nor anything it runs reaches the agent."""
    from harness.rank import loading

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own prints go to stderr, the outcome through the pipe
        os.close(read)
        os.dup2(2, 1)
        try:
            outcome = loading.probe_outcome(spec)
        except BaseException as exc:  # noqa: BLE001 (said in one line, as the plain probe's traceback ends)
            outcome = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        with os.fdopen(write, "w") as fh:
            fh.write(json.dumps(outcome))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        text = fh.read()
    _, status = os.waitpid(pid, 0)
    if text:
        return json.loads(text)
    return {"error": f"the probe exited with code {os.waitstatus_to_exitcode(status)}"}


def _run(argv: list[str]) -> None:
    """torchrun's ``main`` on ``argv``, except that ranks of ``-m harness.rank.worker`` on Linux are
    forked from this agent (see ``harness.rank.worker.forked``) instead of started as new Python
    processes: each skips importing torch (about 2 s of CPU), and torchrun's agent starts,
    watches and ends them as it does any function entrypoint."""
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args, run

    args = parse_args(argv)
    if not (FORK and args.module and not args.no_python and args.training_script == "harness.rank.worker"):
        run(args)
        return
    from harness.rank import worker

    config, _, _ = config_from_args(args)
    script_args = list(args.training_script_args)
    if not worker.preload(script_args):  # a backend failed to import here: ranks start anew
        run(args)
        return
    config.start_method = "fork"
    elastic_launch(config=config, entrypoint=worker.forked)(*script_args)


if __name__ == "__main__":
    main()
