"""An in-memory shard worker for driver tests under trio's MockClock (no processes, no threads).

It speaks protocol v1 like the real child: hello, then ready after start, a checkpoint every
``checkpoint_interval`` (each one "writes" 10 records, logged with the virtual time), stopped on
stop. It keeps the fence rule: it records no write at or after its fence deadline and exits 3.

With a ``feed`` (the feed's position now: the last sequence generated) it models a live feed
instead: each write takes the child up to the feed's position, a stop with ``min_cut`` writes
on up to it, and a standby child (``mode = "standby"``) buffers from the position at its
connect on, says ``standby_ready``, and on ``promote`` writes its buffer after the checkpoint
(a first buffered sequence beyond it is a gap, recorded in ``gaps``), then goes on as an owner.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Callable

import attrs
import trio

from shard_worker.adapters.pipes import PipeClosed
from shard_worker.contract import pipe as p

_pids = itertools.count(10_000)
CONNECT = 0.05  # a standby child's connect, in virtual seconds


@attrs.define
class Write:
    shard: str
    epoch: int
    at: float
    seq: int  # the last sequence of this write
    first: int = 0  # its first (0: not recorded, as in the plain mode)


@attrs.define(eq=False)
class FakeChild:
    shard: str
    writes: list[Write]  # shared by every fake child of a test: the "sink"
    crash_after_ready: bool = False
    silent: bool = False  # never says hello (a child stuck in its imports)
    feed: Callable[[], int] | None = None  # the live feed's position now (see the module)
    # Asked once a standby child is ready: True = it dies then (e.g. a budget of crashes).
    crash_as_standby: Callable[[], bool] | None = None
    never_ready: bool = False  # a standby child that never reports standby_ready
    linger: float = 0.0  # seconds between its clean exit and wait() seeing it (teardown)
    pid: int = attrs.field(factory=lambda: next(_pids))
    returncode: int | None = None
    gaps: list[tuple[int, int]] = attrs.field(factory=list)  # (checkpoint, first) at promote
    received: list[p.Message] = attrs.field(factory=list)  # every message sent to it
    _start: p.Start | None = None
    _epoch: int = 0
    _standby: bool = False
    _first: int = 0  # a standby's first buffered sequence
    _promote: p.Promote | None = None
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
        self.received.append(msg)
        if isinstance(msg, p.Start):
            self._start, self._fence, self._epoch = msg, msg.fence_deadline, msg.epoch
            self._standby = msg.mode == p.STANDBY
            self._seq = max(msg.checkpoint.values(), default=0)
        elif isinstance(msg, p.Fence):
            assert self._start is not None, "fence before start"
            self._fence = msg.deadline
        elif isinstance(msg, p.Stop):
            self._stop = msg
        elif isinstance(msg, p.Promote):
            assert self._standby and self._start is not None, "promote of a non-standby"
            self._promote = msg
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
        if self._standby:
            return await self._as_standby()
        if not self._ready_sent:
            self._ready_sent = True
            return p.Ready()
        if self.crash_after_ready:
            self._exit(1)
            return None
        return await self._as_owner()

    async def _as_owner(self) -> p.Message | None:
        assert self._start is not None
        await self._sleep(self._start.settings.checkpoint_interval)
        if self._stop is not None or self.returncode is not None:
            return self._finish()
        now = trio.current_time()
        if now >= self._fence:
            self._exit(3)
            return p.Error("fence deadline passed: lease may be lost", fatal=True)
        self._write(self.feed() if self.feed is not None else self._seq + 10)
        return p.Checkpoint(checkpoint=self._checkpoint(), written=self._seq)

    async def _as_standby(self) -> p.Message | None:
        """Connect, say standby_ready once, then heartbeats with the buffer, until promoted."""
        assert self._start is not None
        if not self._first:
            await self._sleep(CONNECT)
            if self._stop is not None or self.returncode is not None:
                return self._finish()
            here = self.feed() if self.feed is not None else self._seq
            self._first = here + 1
            if not self.never_ready:
                return p.StandbyReady(first_seq={self.shard: self._first})
        if self.crash_as_standby is not None and self.crash_as_standby():
            self._exit(1)
            return None
        while self._promote is None:
            await self._sleep(self._start.settings.heartbeat_interval)
            if self._stop is not None or self.returncode is not None:
                return self._finish()
            if self._promote is None:
                return self._standby_heartbeat()
        return self._promoted(self._promote)

    def _standby_heartbeat(self) -> p.Heartbeat:
        held = (self.feed() if self.feed is not None else self._seq) - self._first + 1
        stats = p.StandbyStats(buffered=held, bytes=100 * held, first_seq={self.shard: self._first})
        return p.Heartbeat(written=0, last_seq={}, loop_lag=0.0, standby=stats)

    def _promoted(self, promote: p.Promote) -> p.Message:
        self._standby, self._epoch, self._fence = False, promote.epoch, promote.fence_deadline
        cut = promote.checkpoint.get(self.shard, 0)
        if self._first > cut + 1:
            self.gaps.append((cut, self._first))
        self._seq = max(cut, self._first - 1)
        self._write(self.feed() if self.feed is not None else self._seq)
        self._ready_sent = True
        return p.Ready()

    def _write(self, upto: int) -> None:
        if upto > self._seq:
            now = trio.current_time()
            self.writes.append(Write(self.shard, self._epoch, now, upto, self._seq + 1))
            self._seq = upto

    def _checkpoint(self) -> dict[str, int]:
        return {self.shard: self._seq} if self._seq else {}

    def _finish(self) -> p.Message | None:
        if self.returncode is not None:
            return None
        reason = self._stop.reason if self._stop else "?"
        if self._standby:
            self._exit(0)
            return p.Stopped(checkpoint={}, written=0, reason=reason)
        if self._stop is not None and self._stop.min_cut:
            self._write(max(self._stop.min_cut.values()))  # reads on up to the cut
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
        if self.returncode == 0:
            await trio.sleep(self.linger)
        return self.returncode

    def signal(self, signum: int) -> None:
        if signum in (signal.SIGKILL, signal.SIGTERM):
            self._exit(-signum)

    async def aclose(self) -> None:
        self._exit(-signal.SIGKILL)
