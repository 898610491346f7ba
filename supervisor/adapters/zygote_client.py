"""Warm spawns: the supervisor's side of the ``shard_worker.zygote`` fork server.

``ZygoteSpawner.run`` keeps one zygote process alive for the supervisor's life (restarting it with
backoff) and ``ZygoteSpawner.spawn`` asks it for children: a forked child answers in milliseconds
where a fresh ``python -m shard_worker`` takes ~0.2 s. While no zygote is up, spawns fall back to
``spawn.spawn_fresh``, so a broken zygote slows restarts down but never stops them.

Each child comes with a pidfd opened by the zygote before it could reap the child: signals and
death detection go through it, so they can never reach a reused pid. The zygote reaps its own
children and tells us their exit codes; the supervisor never calls ``waitpid(-1)``.
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from supervisor.adapters.spawn import PipedChild, Spawn, SpawnResult, spawn_fresh

log = logging.getLogger("shardvisor.zygote")

SPAWN_TIMEOUT = 2.0  # a zygote that takes longer to fork is broken: killed, then restarted
READY_TIMEOUT = 10.0  # from exec to "ready": imports only, well under a second normally
EXIT_NOTICE_TIMEOUT = 1.0  # from the pidfd turning readable to the zygote's exit notice
STOP_TIMEOUT = 2.0  # from closing our end to the zygote's exit
KILL_TIMEOUT = 5.0  # from SIGKILL to death; longer means the kernel is stuck (D state)
RESTART_INITIAL, RESTART_MAX = 0.5, 10.0
RESTART_RESET_AFTER = 30.0  # a zygote up this long restarts fast again when it dies
MAX_MESSAGE = 4096
_FD = array.array("i").itemsize


class ZygoteUnavailable(Exception):
    """The zygote cannot serve this spawn (down, refused, or too slow): spawn fresh."""


def _close_pidfd(fd: int) -> None:
    trio.lowlevel.notify_closing(fd)
    os.close(fd)


def _kill(pidfd: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already exited: nothing to kill
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)


@attrs.define(eq=False)
class _ChildExit:
    """How one zygote child ended, as far as we know."""

    pid: int
    pidfd: int
    code: int | None = None
    settled: trio.Event = attrs.field(factory=trio.Event)  # no more news will come


@attrs.define(eq=False)
class _Request:
    """One spawn request waiting for its answer (answers come in request order)."""

    done: trio.Event = attrs.field(factory=trio.Event)
    child: _ChildExit | None = None
    error: str = ""
    abandoned: bool = False

    def abandon(self) -> None:
        """The requester gave up: a child that was or will be forked for it is killed."""
        self.abandoned = True
        if self.child is not None:
            _kill(self.child.pidfd)
            _close_pidfd(self.child.pidfd)
            self.child = None


class _Zygote:
    """One zygote process and our end of its socket."""

    def __init__(self, proc: subprocess.Popen, pidfd: int, sock: trio.socket.SocketType) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.pidfd = pidfd
        self.sock = sock
        self.ready = trio.Event()
        self.dead = trio.Event()
        self._requests: deque[_Request] = deque()
        self._children: dict[int, _ChildExit] = {}
        self._send_lock = trio.Lock()

    @classmethod
    def start(cls, env: dict[str, str] | None) -> _Zygote:
        """Fork+exec from this (the main) thread: never from a worker thread that may exit."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            command = [sys.executable, "-m", "shard_worker.zygote"]
            proc = subprocess.Popen(
                [*command, "--socket-fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            pidfd = os.pidfd_open(proc.pid)  # nobody reaps it but us: this is still our child
        except OSError:
            ours.close()
            proc.kill()
            proc.wait()
            raise
        return cls(proc, pidfd, trio.socket.from_stdlib_socket(ours))

    def kill(self) -> None:
        _kill(self.pidfd)

    # --- requests ------------------------------------------------------------------------------

    async def spawn(self, shard_id: str, fds: Sequence[int]) -> _ChildExit:
        """Fork a child holding ``fds``; raises ZygoteUnavailable if that cannot be done now."""
        if self.dead.is_set() or not self.ready.is_set():
            raise ZygoteUnavailable("zygote not running")
        request = _Request()
        data = json.dumps({"op": "spawn", "shard": shard_id}).encode()
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        async with self._send_lock:  # answers come in request order: so must requests
            self._requests.append(request)
            try:
                await self.sock.sendmsg([data], rights)
            except BaseException as exc:  # not sent: no answer will come for it
                self._requests.remove(request)
                if isinstance(exc, OSError):
                    raise ZygoteUnavailable(f"cannot reach the zygote: {exc}") from exc
                raise
        try:
            with trio.move_on_after(SPAWN_TIMEOUT):
                await request.done.wait()
        except BaseException:
            request.abandon()
            raise
        if not request.done.is_set():
            request.abandon()
            log.error("zygote gave no answer in %.1fs: killing it", SPAWN_TIMEOUT)
            self.kill()
            raise ZygoteUnavailable(f"no answer within {SPAWN_TIMEOUT}s")
        if request.child is None:
            raise ZygoteUnavailable(request.error or "zygote died")
        return request.child

    # --- the socket ----------------------------------------------------------------------------

    async def read_loop(self) -> None:
        """Handle the zygote's messages until EOF (it exited) or a protocol error (killed)."""
        while True:
            try:
                data, ancdata, _flags, _addr = await self.sock.recvmsg(
                    MAX_MESSAGE, socket.CMSG_SPACE(4 * _FD), socket.MSG_CMSG_CLOEXEC
                )
            except OSError as exc:
                log.debug("zygote socket closed: %s", exc)  # its exit is logged next
                return
            fds = _received_fds(ancdata)
            if not data and not fds:
                return
            try:
                self._handle(json.loads(data), fds)
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                for fd in fds:
                    os.close(fd)
                log.error("zygote broke the protocol (%r): killing it", exc)
                self.kill()
                return

    def _handle(self, msg: dict[str, Any], fds: list[int]) -> None:
        if "exited" in msg:
            child = self._children.pop(int(msg["exited"]), None)
            if child is not None:
                child.code = int(msg["code"])
                child.settled.set()
        elif "ready" in msg:
            self.ready.set()
        elif "pid" in msg:
            if len(fds) != 1:
                raise ValueError(f"expected 1 pidfd with {msg}, got {len(fds)} fds")
            request = self._requests.popleft()
            child = _ChildExit(int(msg["pid"]), fds.pop())
            self._children[child.pid] = child
            request.child = child
            if request.abandoned:
                request.abandon()  # too late: kill the child forked for it
            request.done.set()
            return
        elif "error" in msg:
            request = self._requests.popleft()
            request.error = str(msg["error"])
            request.done.set()
        else:
            raise ValueError(f"unknown message {msg!r:.200}")
        if fds:
            raise ValueError(f"unexpected fds with {msg!r:.200}")

    async def close(self) -> int:
        """Close our end (the zygote exits at EOF), reap it; returns its exit code."""
        self.sock.close()
        with trio.move_on_after(STOP_TIMEOUT) as scope:
            await trio.lowlevel.wait_readable(self.pidfd)
        if scope.cancelled_caught:
            log.error("zygote still running %.1fs after EOF: SIGKILL", STOP_TIMEOUT)
            self.kill()
            with trio.fail_after(KILL_TIMEOUT):
                await trio.lowlevel.wait_readable(self.pidfd)
        code = self.proc.wait()  # it has exited: this reaps it at once
        _close_pidfd(self.pidfd)
        self.dead.set()
        for request in self._requests:
            request.error = "zygote died"
            request.done.set()
        self._requests.clear()
        for child in self._children.values():
            child.settled.set()  # orphans: their exit codes will never be reported
        self._children.clear()
        return code


def _received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % _FD])
    return list(fds)


class ZygoteChild(PipedChild):
    """A shard worker forked by the zygote: a ``ChildHandle`` over its pidfd and pipes."""

    def __init__(
        self,
        child_exit: _ChildExit,
        control: trio.lowlevel.FdStream,
        report: trio.lowlevel.FdStream,
        outputs: Sequence[trio.lowlevel.FdStream] = (),
    ) -> None:
        super().__init__(control, report)
        self._exit = child_exit
        self._outputs = tuple(outputs)
        self._wait_lock = trio.Lock()
        self._closed = False
        self.pid = child_exit.pid

    @property
    def returncode(self) -> int | None:
        return self._exit.code

    async def wait(self) -> int:
        """Death shows on the pidfd at once; the exit code comes from the zygote just after."""
        async with self._wait_lock:
            if self._exit.code is None:
                if not self._closed:
                    await trio.lowlevel.wait_readable(self._exit.pidfd)
                with trio.move_on_after(EXIT_NOTICE_TIMEOUT):
                    await self._exit.settled.wait()
                if self._exit.code is None:
                    self._exit.code = self._code_without_zygote()
        return self._exit.code

    def _code_without_zygote(self) -> int:
        """Its zygote died first. If we inherited the orphan (PID 1, subreaper), reap it."""
        result = None
        if not self._closed:
            with contextlib.suppress(ChildProcessError):  # not ours: init or a subreaper reaps it
                result = os.waitid(os.P_PIDFD, self._exit.pidfd, os.WEXITED | os.WNOHANG)
        if result is not None:
            return result.si_status if result.si_code == os.CLD_EXITED else -result.si_status
        log.warning("exit code of pid %d unknown: its zygote died; reporting -1", self.pid)
        return -1

    def signal(self, signum: int) -> None:
        if self._exit.code is None and not self._closed:
            with contextlib.suppress(ProcessLookupError):  # exited, maybe reaped: no one to hit
                signal.pidfd_send_signal(self._exit.pidfd, signum)

    async def aclose(self) -> None:
        """Kill if still running, wait for it, close the pidfd and our pipe ends. Idempotent."""
        with trio.CancelScope(shield=True):
            if not self._closed:
                self.signal(signal.SIGKILL)
                with trio.move_on_after(KILL_TIMEOUT + EXIT_NOTICE_TIMEOUT) as scope:
                    await self.wait()
                if scope.cancelled_caught:
                    log.error("child did not die after SIGKILL", extra={"pid": self.pid})
                self._closed = True
                _close_pidfd(self._exit.pidfd)
            await self._channel.aclose()
            for stream in self._outputs:
                await stream.aclose()


class ZygoteSpawner:
    """Owns the zygote process; ``spawn`` is a ``Spawn`` (as ``spawn.fresh_spawner``'s)."""

    def __init__(
        self,
        *,
        env: dict[str, str] | None = None,
        fallback: Spawn = spawn_fresh,
    ) -> None:
        self._env = env
        self._fallback = fallback
        self._zygote: _Zygote | None = None
        self._degraded = False

    @property
    def available(self) -> bool:
        """True while a warm zygote takes spawn requests."""
        zygote = self._zygote
        return zygote is not None and zygote.ready.is_set() and not zygote.dead.is_set()

    @property
    def zygote_pid(self) -> int | None:
        return self._zygote.pid if self._zygote is not None else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a zygote up until cancelled; ``started`` once the first is warm (or failed)."""
        started = False

        def mark_started() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        delay = RESTART_INITIAL
        while True:
            began = trio.current_time()
            pid = None
            try:
                zygote = _Zygote.start(self._env)
            except OSError as exc:
                log.error("cannot start the zygote: %s", exc)
                code: int | str = "no process"
            else:
                pid = zygote.pid
                code = await self._serve(zygote, mark_started)
            mark_started()
            if trio.current_time() - began >= RESTART_RESET_AFTER:
                delay = RESTART_INITIAL
            log.warning(
                "zygote exited with %s; starting a new one in %.1fs",
                code,
                delay,
                extra={"pid": pid},
            )
            await trio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX)

    async def _serve(self, zygote: _Zygote, mark_started: Callable[[], None]) -> int:
        self._zygote = zygote
        log.debug("zygote starting", extra={"pid": zygote.pid})
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_ready, zygote, mark_started)
                await zygote.read_loop()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                code = await zygote.close()
                log.debug("zygote reaped", extra={"pid": zygote.pid, "code": code})
        return code

    async def _watch_ready(self, zygote: _Zygote, mark_started: Callable[[], None]) -> None:
        with trio.move_on_after(READY_TIMEOUT):
            await zygote.ready.wait()
        if not zygote.ready.is_set():
            log.error("zygote not ready after %.0fs: killing it", READY_TIMEOUT)
            zygote.kill()
            return
        if self._degraded:
            self._degraded = False
            log.info("zygote available again: spawning warm (recovered)", extra={"pid": zygote.pid})
        else:
            log.info("zygote ready", extra={"pid": zygote.pid})
        mark_started()

    async def spawn(self, shard_id: str) -> SpawnResult:
        """A warm child if the zygote is up, else a fresh one (logged once per outage)."""
        zygote = self._zygote
        if zygote is not None:
            try:
                return await self._spawn_warm(zygote, shard_id)
            except ZygoteUnavailable as exc:
                reason = str(exc)
        else:
            reason = "zygote not started"
        if not self._degraded:
            self._degraded = True
            log.warning(
                "zygote unavailable: spawning fresh (degraded): %s",
                reason,
                extra={"shard": shard_id},
            )
        return await self._fallback(shard_id)

    async def _spawn_warm(self, zygote: _Zygote, shard_id: str) -> SpawnResult:
        control_r, control_w = os.pipe()
        report_r, report_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        ours = (control_w, report_r, stdout_r, stderr_r)
        try:
            child_exit = await zygote.spawn(shard_id, (control_r, report_w, stdout_w, stderr_w))
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in (control_r, report_w, stdout_w, stderr_w):
                os.close(fd)
        fd_stream = trio.lowlevel.FdStream
        stdout, stderr = fd_stream(stdout_r), fd_stream(stderr_r)
        child = ZygoteChild(child_exit, fd_stream(control_w), fd_stream(report_r), (stdout, stderr))
        log.debug("spawned warm child", extra={"shard": shard_id, "pid": child.pid})
        if self._degraded:
            self._degraded = False
            log.info("zygote available again: spawning warm (recovered)")
        return child, [("stdout", stdout), ("stderr", stderr)]


__all__ = ["SpawnResult", "ZygoteChild", "ZygoteSpawner", "ZygoteUnavailable", "spawn_fresh"]
