"""Test helpers: run the real shard worker child over real pipes, and talk to it.

Shared with the supervisor tests, so keep it generic (no feed or shard specifics).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from shard_worker.adapters.pipes import MessageChannel
from shard_worker.contract.pipe import (
    Hello,
    Message,
    SinkSpec,
    Start,
    Stop,
    StreamSpec,
    WorkerSettings,
)

M = TypeVar("M")

FAST_SETTINGS = WorkerSettings(
    checkpoint_interval=0.1, reconnect_initial=0.05, reconnect_max=0.2, connect_timeout=2.0
)


def pipe_channel_pair() -> tuple[MessageChannel, MessageChannel]:
    """Two MessageChannels connected by two real pipes (a <-> b)."""
    a_to_b_read, a_to_b_write = os.pipe()
    b_to_a_read, b_to_a_write = os.pipe()
    fd = trio.lowlevel.FdStream
    a = MessageChannel(fd(b_to_a_read), fd(a_to_b_write))
    b = MessageChannel(fd(a_to_b_read), fd(b_to_a_write))
    return a, b


class WorkerProcess:
    """The parent's side of one child: its process, its pipes and its stderr."""

    def __init__(
        self, process: trio.Process, control: trio.abc.SendStream, reports: trio.abc.ReceiveStream
    ) -> None:
        self.process = process
        self._control = control
        self.channel = MessageChannel(reports, control)
        self.stderr = bytearray()
        self.stdout = bytearray()  # the protocol never uses it: anything here is a stray print

    @property
    def log(self) -> str:
        return self.stderr.decode(errors="replace")

    async def send(self, message: Message) -> None:
        await self.channel.send(message)

    async def send_raw(self, data: bytes) -> None:
        """Bytes on the control pipe, as they are (to test how the child handles garbage)."""
        await self._control.send_all(data)

    async def receive(self, timeout: float = 5.0) -> Message | None:
        """The next report (None at EOF)."""
        with trio.fail_after(timeout):
            return await self.channel.receive()

    async def expect(self, kind: type[M], timeout: float = 5.0) -> M:
        """The next report, which must be a ``kind``."""
        message = await self.receive(timeout)
        assert isinstance(message, kind), f"expected {kind.__name__}, got {message!r}\n{self.log}"
        return message

    async def wait_for(
        self, kind: type[M], timeout: float = 5.0, predicate: Callable[[M], bool] = lambda m: True
    ) -> M:
        """Skip reports until a ``kind`` satisfying ``predicate`` arrives."""
        with trio.fail_after(timeout):
            while True:
                message = await self.channel.receive()
                assert message is not None, f"report pipe closed while waiting\n{self.log}"
                if isinstance(message, kind) and predicate(message):
                    return message

    async def close_control(self) -> None:
        """Close the pipe the child reads commands from (as if the parent died)."""
        await self.channel.aclose_send()

    async def wait(self, timeout: float = 5.0) -> int:
        """The exit code, waiting at most ``timeout`` seconds."""
        with trio.fail_after(timeout):
            return await self.process.wait()

    async def _drain(self, stream: trio.abc.ReceiveStream | None, into: bytearray) -> None:
        assert stream is not None
        async with stream:
            while chunk := await stream.receive_some(65536):
                into += chunk


def pythonpath() -> str:
    """The repository first, so the child imports this checkout even when not installed; then
    tests/, so that a handler sink can name the test handlers (tests/helpers/sink_handlers.py)."""
    here = Path(__file__).resolve().parents[1]  # tests/: helpers.sink_handlers
    repo = str(here.parent)
    return os.pathsep.join(p for p in (repo, str(here), os.environ.get("PYTHONPATH", "")) if p)


@asynccontextmanager
async def spawn_worker(
    *, cwd: Path | None = None, handshake: bool = True, env: dict[str, str] | None = None
) -> AsyncIterator[WorkerProcess]:
    """Start ``python -m shard_worker`` with its two pipes; kill it on exit if still running.

    With ``handshake`` the Hello is already consumed (and checked) when this yields.
    """
    control_read, control_write = os.pipe()
    report_read, report_write = os.pipe()
    try:
        process = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "shard_worker",
                "--control-fd",
                str(control_read),
                "--report-fd",
                str(report_write),
            ],
            pass_fds=(control_read, report_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": pythonpath(), **(env or {})},
        )
    finally:
        os.close(control_read)
        os.close(report_write)
    worker = WorkerProcess(
        process, trio.lowlevel.FdStream(control_write), trio.lowlevel.FdStream(report_read)
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker._drain, process.stdout, worker.stdout)
            nursery.start_soon(worker._drain, process.stderr, worker.stderr)
            if handshake:
                hello = await worker.expect(Hello, timeout=10)
                assert hello.pid == process.pid
            yield worker
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
                await process.wait()
            await worker.channel.aclose()
        if process.returncode not in (0, None):
            sys.stderr.write(f"--- shard worker stderr ---\n{worker.log}")


def make_start(
    streams: list[StreamSpec],
    out_dir: Path,
    *,
    shard: str = "shard-1",
    epoch: int = 1,
    worker: str = "w1",
    checkpoint: dict[str, int] | None = None,
    fence_in: float = 60.0,
    settings: WorkerSettings = FAST_SETTINGS,
    sink: SinkSpec | None = None,
) -> Start:
    """A Start with test-friendly timings; the sink (default jsonl) and the dead letters write
    under ``out_dir``."""
    if sink is None:
        sink = SinkSpec(path=str(out_dir / "{shard}" / "{stream}.{epoch}.jsonl"))
    return Start(
        shard=shard,
        epoch=epoch,
        worker=worker,
        streams=tuple(streams),
        checkpoint=checkpoint or {},
        sink=attrs.evolve(sink, dead_letter=str(out_dir / "{shard}" / "dead-letter.{epoch}.jsonl")),
        settings=settings,
        fence_deadline=time.monotonic() + fence_in,
    )


def stop_in(seconds: float = 5.0, reason: str = "test") -> Stop:
    """A Stop whose deadline is ``seconds`` from now."""
    return Stop(reason=reason, deadline=time.monotonic() + seconds)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a sink file, parsed (a torn last line is not a record)."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    return [json.loads(line) for line in lines[:-1]]
