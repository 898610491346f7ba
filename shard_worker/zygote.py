"""``python -m shard_worker.zygote --socket-fd N``: a warm fork server for shard workers.

A fresh ``python -m shard_worker`` spends ~0.2 s importing before it can say hello and keeps
~40 MB of private memory. The zygote imports the child's modules once, freezes them out of the
garbage collector (so children's collections do not dirty the shared pages) and forks one child
per request: the child is up in milliseconds and shares most of its memory with the zygote.

The zygote imports only what a child needs (stdlib, attrs, trio, trio_websocket, shard_worker),
never boto3 nor ``supervisor``, and never starts trio itself: a forked trio would be unsafe.

Protocol on the unix socket (SOCK_SEQPACKET, one JSON object per message):

- zygote -> supervisor, once warm: ``{"ready": <zygote pid>}``
- supervisor -> zygote: ``{"op": "spawn", "shard": id}`` + 4 fds (SCM_RIGHTS): control_r,
  report_w, stdout_w, stderr_w.
- zygote -> supervisor, per request in order: ``{"pid": pid}`` + the child's pidfd, opened
  before the zygote can reap the child (so it can never name a reused pid), or ``{"error": text}``.
- zygote -> supervisor, when a child is reaped: ``{"exited": pid, "code": code}``, ``code`` in the
  subprocess convention (negative signal number if killed).

EOF on the socket means the supervisor is gone: the zygote exits. Its children see EOF on their
own control pipe and exit by themselves; the zygote reaps those that do within ``EXIT_GRACE``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from typing import NoReturn

MAX_MESSAGE = 4096
EXIT_GRACE = 1.0  # after EOF, how long to wait for children to exit (the supervisor waits 2 s)
SPAWN_FDS = 4  # control_r, report_w, stdout_w, stderr_w

# What a child imports besides the shard_worker package (all of which ``warm_up`` imports, so a
# new module can never be left for each child to import on its own): loaded once here, shared
# copy-on-write by every child.
PRELOAD = (
    "trio",
    "trio_websocket",
    "websockets.client",  # the default transport (shard_worker.adapters.websockets_transport)
    "ssl",
    "zlib",  # permessage-deflate
    "json",
    "base64",
    "random",
    "traceback",
    "inspect",
    "importlib",
    "datetime",
    "pathlib",
    "urllib.parse",
    "encodings.idna",  # trio's getaddrinfo encodes host names lazily
)


def warm_up() -> None:
    """Import everything a child runs, so a child imports nothing: a module imported after the
    fork costs every child its import time at each start and its own private copy in memory."""
    import importlib
    import pkgutil

    import shard_worker

    for name in PRELOAD:
        importlib.import_module(name)
    for module in pkgutil.walk_packages(shard_worker.__path__, "shard_worker."):
        if module.name != "shard_worker.zygote":  # this module (as __main__ when it serves)
            importlib.import_module(module.name)


class Zygote:
    """The blocking serve loop: spawn requests in, pids and exit notices out."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def serve(self) -> int:
        # SIGCHLD only has to interrupt poll(): the handler does nothing, the wakeup fd wakes us.
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        self._send({"ready": os.getpid()})
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        try:
            while True:
                for fd, _events in poller.poll():
                    if fd == self.wake_r:
                        self._drain_wakeups()
                    elif not self._handle_request():
                        self._linger()
                        return 0
                self._reap()
        except (BrokenPipeError, ConnectionResetError):  # gone while we were answering
            self._linger()
            return 0
        finally:
            signal.set_wakeup_fd(-1)
            os.close(self.wake_r)
            os.close(self.wake_w)

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 512):
                pass

    def _send(self, obj: dict, fds: list[int] | tuple[int, ...] = ()) -> None:
        data = json.dumps(obj).encode()
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.send(data)

    def _handle_request(self) -> bool:
        """Serve one request; False at EOF (the supervisor closed its end)."""
        data, fds, flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, SPAWN_FDS)
        if not data and not fds:
            return False
        try:
            shard = _parse_spawn(data, len(fds), flags)
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            self._send({"error": str(exc)})
            return True
        self._spawn(shard, fds)
        return True

    def _spawn(self, shard: str, fds: list[int]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()  # or the child would print our buffered output a second time
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            self._send({"error": f"fork failed: {exc}"})
            return
        if pid == 0:
            self._become_child(shard, fds)
        for fd in fds:
            os.close(fd)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:  # not reaped yet, so the pid is still ours: kill is safe
            os.kill(pid, signal.SIGKILL)
            self._send({"error": f"pidfd_open failed: {exc}"})
            return
        try:
            self._send({"pid": pid}, [pidfd])
        finally:
            os.close(pidfd)

    def _reap(self, *, notify: bool = True) -> bool:
        """Reap every exited child (telling the supervisor); True if some still run."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if notify:
                self._send({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    def _linger(self) -> None:
        """The supervisor is gone and its children exit at their own control EOF: reap them
        for a moment, so their zombies are not left to an init that may reap lazily."""
        deadline = time.monotonic() + EXIT_GRACE
        while self._reap(notify=False) and (left := deadline - time.monotonic()) > 0:
            select.select([self.wake_r], [], [], left)
            self._drain_wakeups()

    def _become_child(self, shard: str, fds: list[int]) -> NoReturn:
        """In the forked child: drop the zygote's state, then run the worker as ``__main__``."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)  # trio installs its own
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in shard_worker.__main__
            self.sock.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            control_r, report_w, stdout_w, stderr_w = fds
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(stdout_w, 1)
            os.dup2(stderr_w, 2)
            for fd in (devnull, stdout_w, stderr_w):
                if fd > 2:
                    os.close(fd)
            import random

            random.seed()  # forked children must not draw the same jitter
            _set_name(f"shard {shard}")
            from shard_worker.__main__ import main as worker_main

            code = worker_main(["--control-fd", str(control_r), "--report-fd", str(report_w)])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - a child must never return into the zygote loop
            traceback.print_exc()
            code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):  # the pipe is gone: nobody to tell
                    stream.flush()
            os._exit(code)


def _parse_spawn(data: bytes, nfds: int, flags: int) -> str:
    """The shard id of a well-formed spawn request; ValueError otherwise."""
    request = json.loads(data)  # json.JSONDecodeError is a ValueError
    if not isinstance(request, dict) or request.get("op") != "spawn":
        raise ValueError(f"unknown request {data[:200]!r}")
    if nfds != SPAWN_FDS or flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
        raise ValueError(f"spawn needs {SPAWN_FDS} fds, got {nfds}")
    return str(request.get("shard", ""))


def _set_name(name: str) -> None:
    """Best effort: show the shard in ``ps -o comm``/top (Linux keeps 15 bytes)."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(name[:15])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shard_worker.zygote", description=__doc__)
    parser.add_argument("--socket-fd", type=int, required=True, help="SOCK_SEQPACKET unix socket")
    args = parser.parse_args(argv)
    # Ctrl-C reaches the whole process group: the supervisor owns shutdown (EOF on the socket).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.disable()  # no collection while importing: it would leave holes in shared pages
    warm_up()
    gc.freeze()
    gc.enable()
    sock = socket.socket(fileno=args.socket_fd)
    try:
        return Zygote(sock).serve()
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
