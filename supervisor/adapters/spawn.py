"""Starting a shard worker process and talking to it over two dedicated pipes.

The control pipe (parent -> child) and the report pipe (child -> parent) are passed as extra file
descriptors, never stdin/stdout, so user code that prints cannot corrupt the protocol. The child's
stdout and stderr are read line by line and logged with its shard id. trio waits on the process
itself (pidfd on Linux), so no other process is ever reaped by accident.

With ``[sink] kind = "stdout"`` a child's stdout carries records (JSON lines), not log text:
``relay_stdout(True)`` makes every child's stdout go verbatim to this process's standard output
instead, whole lines only, one child's lines at a time (see ``StdoutRelay``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import trio

from shard_worker.adapters.pipes import MessageChannel, PipeClosed
from shard_worker.contract.pipe import Message, ProtocolError
from supervisor.adapters.logs import RESERVED_ATTRS

log = logging.getLogger("shardvisor.child")
_READ_SIZE = 65536
MAX_LOG_LINE = 8192


class ChildHandle(Protocol):
    """What a shard runner needs from a child, real or fake."""

    pid: int

    async def send(self, msg: Message) -> None:
        """One whole message; raises ``PipeClosed`` once the child no longer reads."""

    async def receive(self) -> Message | None:
        """The next message, or None at EOF of the report pipe."""

    async def wait(self) -> int: ...

    def signal(self, signum: int) -> None: ...

    @property
    def returncode(self) -> int | None: ...

    async def aclose(self) -> None: ...


Outputs = list[tuple[str, trio.abc.ReceiveStream]]  # ("stdout" | "stderr", stream)
SpawnResult = tuple[ChildHandle, Outputs]
Spawn = Callable[[str], Awaitable[SpawnResult]]  # shard id -> a started child


class PipedChild:
    """Our ends of a child's two pipes, as the child's own ``MessageChannel`` (one adapter for
    both processes). The base of every kind of child handle, fresh or forked by the zygote."""

    def __init__(self, control: trio.abc.SendStream, report: trio.abc.ReceiveStream) -> None:
        self._channel = MessageChannel(report, control)

    async def send(self, msg: Message) -> None:
        await self._channel.send(msg)

    async def receive(self) -> Message | None:
        return await self._channel.receive()

    async def close_control(self) -> None:
        """EOF on the control pipe: the child flushes and exits within a second."""
        await self._channel.aclose_send()


class ChildProcess(PipedChild):
    """A real ``python -m shard_worker`` process."""

    def __init__(
        self,
        process: trio.Process,
        control: trio.lowlevel.FdStream,
        report: trio.lowlevel.FdStream,
    ) -> None:
        super().__init__(control, report)
        self._process = process
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        return await self._process.wait()

    def signal(self, signum: int) -> None:
        if self._process.returncode is None:
            self._process.send_signal(signum)

    async def aclose(self) -> None:
        """Kill if still running, reap, close our pipe ends. Safe to call twice."""
        with trio.CancelScope(shield=True):
            self.signal(signal.SIGKILL)
            await self._process.wait()
            await self._channel.aclose()


async def spawn_child(
    shard_id: str, *, argv: Sequence[str] | None = None, env: dict[str, str] | None = None
) -> tuple[ChildProcess, trio.abc.ReceiveStream, trio.abc.ReceiveStream]:
    """Start a child; returns it plus its stdout and stderr streams (for ``pump_output``)."""
    control_r, control_w = os.pipe()
    report_r, report_w = os.pipe()
    command = list(argv or [sys.executable, "-m", "shard_worker"])
    command += ["--control-fd", str(control_r), "--report-fd", str(report_w)]
    try:
        process = await trio.lowlevel.open_process(
            command,
            pass_fds=(control_r, report_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
    except BaseException:
        for fd in (control_w, report_r):
            os.close(fd)
        raise
    finally:
        os.close(control_r)
        os.close(report_w)
    child = ChildProcess(
        process, trio.lowlevel.FdStream(control_w), trio.lowlevel.FdStream(report_r)
    )
    log.debug("spawned child", extra={"shard": shard_id, "pid": process.pid})
    assert process.stdout is not None and process.stderr is not None
    return child, process.stdout, process.stderr


def fresh_spawner(worker_command: Sequence[str] = ()) -> Spawn:
    """Each child a new interpreter: ``python -m shard_worker``, or ``worker_command`` if set
    (``[supervisor] worker_command``). The zygote's fallback too."""
    argv = list(worker_command) or None

    async def spawn(shard_id: str) -> SpawnResult:
        child, out, err = await spawn_child(shard_id, argv=argv)
        return child, [("stdout", out), ("stderr", err)]

    return spawn


spawn_fresh = fresh_spawner()  # the default command


class StdoutRelay:
    """Children's record lines to our own standard output (fd 1), never interleaved.

    Each write is a run of whole lines of one child, made under a lock, so lines of two children
    never mix (a pipe only guarantees that for writes up to PIPE_BUF, 4 KiB). The write runs in
    a worker thread: a slow reader of our stdout blocks the relays, then the children's pipes,
    then their sinks (backpressure), never this event loop. fd 1 is written directly, past
    sys.stdout: a record is data, not text for the log redaction to edit."""

    def __init__(self, fd: int = 1) -> None:
        self.enabled = False
        self.fd = fd
        self._lock = trio.Lock()

    async def write(self, data: bytes) -> None:
        async with self._lock:
            await trio.to_thread.run_sync(self._write_all, data)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


STDOUT_RELAY = StdoutRelay()


def relay_stdout(enabled: bool) -> None:
    """Whether the children's stdout carries records ([sink] kind = "stdout")."""
    STDOUT_RELAY.enabled = enabled


async def pump_output(shard_id: str, pid: int, name: str, stream: trio.abc.ReceiveStream) -> None:
    """Log each line the child writes on stdout/stderr, tagged with its shard; ends at EOF.
    The stdout of a child of a stdout sink is relayed instead (``relay_stdout``)."""
    buffer = bytearray()
    while True:
        data = await stream.receive_some(_READ_SIZE)
        if not data:
            break
        buffer += data
        if name == "stdout" and STDOUT_RELAY.enabled:
            end = buffer.rfind(b"\n") + 1  # whole lines only
            if end:
                lines = bytes(buffer[:end])
                del buffer[:end]
                try:
                    await STDOUT_RELAY.write(lines)
                except OSError as exc:  # our reader is gone: say so, keep draining the child
                    log.error("cannot relay records to stdout: %s", exc, extra={"shard": shard_id})
            continue
        while (newline := buffer.find(b"\n")) >= 0 or len(buffer) > MAX_LOG_LINE:
            cut = newline if newline >= 0 else MAX_LOG_LINE
            line = buffer[:cut].decode(errors="replace").rstrip()
            del buffer[: cut + 1 if newline >= 0 else cut]
            if line:
                forward_line(shard_id, pid, name, line)
    if buffer.strip():
        if name == "stdout" and STDOUT_RELAY.enabled:  # a torn record: never relayed (at-least-
            # once: its batch did not return, so it is delivered again)
            log.warning("torn record line of an exiting child dropped", extra={"shard": shard_id})
        else:
            forward_line(shard_id, pid, name, buffer.decode(errors="replace").rstrip())
    await stream.aclose()


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_LEVELS |= {"error": logging.ERROR, "critical": logging.CRITICAL}
_CHILD_OWN = ("ts", "level", "event", "shard", "pid", "fd", "logger")  # ours, or set below


def forward_line(shard_id: str, pid: int, name: str, line: str) -> None:
    """One line of a child's output as one supervisor log event.

    A JSON line (a child logging in json mode) is merged: its ``event`` is the message, its
    ``level`` the level, and its fields (``stream``, ``epoch``, ``exc``...) are kept; the
    shard and pid are ours (a child cannot misattribute its lines). Anything else (text
    mode, a stray print, an interpreter traceback) is forwarded as the event text, as is."""
    context = {"shard": shard_id, "pid": pid, "fd": name}
    child = _child_event(line)
    if child is None:
        log.info("%s", line, extra=context)
        return
    level = _LEVELS.get(str(child.get("level", "info")).lower(), logging.INFO)
    fields = {k: v for k, v in child.items() if k not in _CHILD_OWN and k not in RESERVED_ATTRS}
    log.log(level, "%s", child["event"], extra={**context, **fields})


def _child_event(line: str) -> dict | None:
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
        return None
    return obj


__all__ = [
    "ChildHandle",
    "ChildProcess",
    "Outputs",
    "PipeClosed",
    "PipedChild",
    "ProtocolError",
    "Spawn",
    "SpawnResult",
    "StdoutRelay",
    "forward_line",
    "fresh_spawner",
    "pump_output",
    "relay_stdout",
    "spawn_child",
    "spawn_fresh",
]
