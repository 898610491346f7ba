"""An in-memory shard worker for driver tests under trio's MockClock (no processes, no threads).

It speaks protocol v1 like the real child: hello, then ready after start, a checkpoint every
``checkpoint_interval`` (each one "writes" 10 records, logged with the virtual time), stopped on
stop. It keeps the fence rule: it records no write at or after its fence deadline and exits 3.
"""

from __future__ import annotations

import itertools
import signal

import attrs
import trio

from shard_worker.adapters.pipes import PipeClosed
from shard_worker.contract import pipe as p

_pids = itertools.count(10_000)


@attrs.define
class Write:
    shard: str
    epoch: int
    at: float
    seq: int


@attrs.define(eq=False)
class FakeChild:
    shard: str
    writes: list[Write]  # shared by every fake child of a test: the "sink"
    crash_after_ready: bool = False
    silent: bool = False  # never says hello (a child stuck in its imports)
    pid: int = attrs.field(factory=lambda: next(_pids))
    returncode: int | None = None
    _start: p.Start | None = None
    _fence: float = float("-inf")
    _hello_sent: bool = False
    _ready_sent: bool = False
    _stop: p.Stop | None = None
    _seq: int = 0
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _exited: trio.Event = attrs.field(factory=trio.Event)

    async def send(self, msg: p.Message) -> None:
        await trio.lowlevel.checkpoint()
        if self.returncode is not None:
            raise PipeClosed("child exited")  # as the real pipe adapter says it
        if isinstance(msg, p.Start):
            self._start, self._fence = msg, msg.fence_deadline
            self._seq = max(msg.checkpoint.values(), default=0)
        elif isinstance(msg, p.Fence):
            assert self._start is not None, "fence before start"
            self._fence = msg.deadline
        elif isinstance(msg, p.Stop):
            self._stop = msg
        self._poke()

    async def receive(self) -> p.Message | None:
        if self.returncode is not None:
            return None
        while self.silent and self.returncode is None:
            await self._sleep(1.0)
        if self.returncode is not None:
            return None
        if not self._hello_sent:
            self._hello_sent = True
            return p.Hello(version=p.PROTOCOL_VERSION, pid=self.pid)
        while self._start is None and self.returncode is None and self._stop is None:
            await self._sleep(1.0)
        if self._stop is not None or self.returncode is not None:
            return self._finish()
        if not self._ready_sent:
            self._ready_sent = True
            return p.Ready()
        if self.crash_after_ready:
            self._exit(1)
            return None
        await self._sleep(self._start.settings.checkpoint_interval)
        if self._stop is not None or self.returncode is not None:
            return self._finish()
        now = trio.current_time()
        if now >= self._fence:
            self._exit(3)
            return p.Error("fence deadline passed: lease may be lost", fatal=True)
        self._seq += 10
        self.writes.append(Write(self.shard, self._start.epoch, now, self._seq))
        return p.Checkpoint(checkpoint=self._checkpoint(), written=self._seq)

    def _checkpoint(self) -> dict[str, int]:
        return {self.shard: self._seq} if self._seq else {}

    def _finish(self) -> p.Message | None:
        if self.returncode is not None:
            return None
        reason = self._stop.reason if self._stop else "?"
        self._exit(0)
        return p.Stopped(checkpoint=self._checkpoint(), written=self._seq, reason=reason)

    async def _sleep(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            await self._wake.wait()
        self._wake = trio.Event()

    def _poke(self) -> None:
        self._wake.set()

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()
        self._poke()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def signal(self, signum: int) -> None:
        if signum in (signal.SIGKILL, signal.SIGTERM):
            self._exit(-signum)

    async def aclose(self) -> None:
        self._exit(-signal.SIGKILL)
