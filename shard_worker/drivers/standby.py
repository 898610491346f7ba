"""A standby child: connected to every stream of its shard, keeping the recent feed, writing
nothing, until ``promote`` makes it the owner without a reconnect (or ``stop`` ends it).

- ``StandbyReader``: a ``StreamReader`` whose door, until promotion, is the buffer
  (shard_worker/core/standby.py): each message is parsed for its sequence number (duplicates
  of a reconnect dropped) and kept raw with its receive time. An unsequenced stream keeps
  nothing: without a sequence there is no cut to resume after (docs/pipe-protocol.md).
- ``Standby``: the readers, their buffer, the heartbeats (with the buffer's stats; the age
  trim rides on them), the ``standby_ready`` announcement, and ``promote``: pause every
  reader at a message boundary, give each the owner's door, write what it buffered after the
  checkpoint through the normal path, and read on.

The lifecycle around it (start, the sink, the owner's loops, exit codes) is the worker's
(shard_worker/drivers/worker.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import trio

from shard_worker.adapters.log import Log
from shard_worker.adapters.transports import stream_transport
from shard_worker.adapters.websocket import MessageTooLarge
from shard_worker.contract.pipe import (
    Fence,
    Heartbeat,
    Message,
    Promote,
    ProtocolError,
    StandbyReady,
    StandbyStats,
    Start,
    Stop,
    StreamSpec,
)
from shard_worker.core.frames import DeadLetter, Gap
from shard_worker.core.standby import StandbyBuffer, ready_first_seq, ready_recheck_at
from shard_worker.drivers.pipeline import BatchPipeline
from shard_worker.drivers.reader import Door, Placeholders, Receive, StreamReader
from shard_worker.drivers.recorder import Recorder
from shard_worker.records import Record

READY_BACKSTOP = 1.0  # seconds: the readiness rule is looked at again at least this often

Report = Callable[[Message], Awaitable[None]]
Sender = trio.MemorySendChannel[tuple[Record, int]]


class _Held:
    """A standby reader's door besides its loop: it resumes after the start's checkpoint and
    writes nothing (a malformed or too large message is only counted)."""

    def __init__(self, checkpoint: dict[str, int]) -> None:
        self._checkpoint = checkpoint

    def last(self, stream: str) -> int:
        return self._checkpoint.get(stream, 0)

    def dead_letter(self, *message: Any, **details: Any) -> None:
        """Nothing: a standby writes no dead letter (a buffered one is written if promoted)."""


class StandbyReader(StreamReader):
    """A stream reader that buffers until it is switched to the owner's door."""

    def __init__(
        self,
        spec: StreamSpec,
        *,
        buffer: StandbyBuffer,
        checkpoint: dict[str, int],
        changed: Callable[[], None] = lambda: None,
        **kwargs: Any,
    ) -> None:
        super().__init__(spec, recorder=_Held(checkpoint), **kwargs)
        self.frames.keep_text = False  # the text is kept whole, not rendered
        self.buffer: StandbyBuffer | None = buffer  # None once promoted
        self.connected_since: float | None = None  # time.monotonic() of the current connection
        self._changed = changed  # called on a connect and on its first record kept

    def _loop(self, receive: Receive) -> Awaitable[NoReturn]:
        if self.buffer is None:
            return super()._loop(receive)
        return self._buffer_loop(receive, self.buffer)

    async def _buffer_loop(self, receive: Receive, buffer: StandbyBuffer) -> NoReturn:
        """Keep each message with its sequence number and receive time (one clock read per
        batch: the messages of one socket read); write nothing."""
        clock = time.monotonic  # (cheaper than trio's clock)
        self.connected_since = clock()
        self._changed()
        try:
            if self.path is None:  # unsequenced: nothing to resume after, nothing kept
                while True:
                    self.frames.received += len(await receive())
            accept, append = self.frames.accept, buffer.appender(self.spec.id)
            told = False  # the readiness rule has heard of this connection's first record
            while True:
                batch = await receive()
                now = clock()
                for message in batch:
                    item = accept(message)
                    if isinstance(item, tuple):
                        append(item[0], message, now)
                    elif item is not None:  # a gap (counted) or a dead letter: kept, raw
                        append(self._seq_of(item), message, now)
                if not told:
                    told = True
                    self._changed()
        finally:
            self.connected_since = None

    def _seq_of(self, item: Gap | DeadLetter) -> int | None:
        if isinstance(item, Gap):
            return item.entry[0]
        if self.malformed.hit():
            self._warning(
                f"malformed message held, dead-lettered only if promoted"
                f" ({self.malformed.count} so far): {item.error}"
            )
        return None

    def _too_large(self, exc: MessageTooLarge) -> None:
        """Counted and logged (once per burst); nothing is kept of it, no dead letter."""
        if self.buffer is None:
            super()._too_large(exc)
        elif self.malformed.hit():
            self._warning(
                f"message over max_message_size ({exc.limit} bytes): connection closed (1009);"
                f" {self.malformed.count} so far"
            )

    async def promote(
        self, door: Door, *, sender: Sender | None, epoch: int, checkpoint: dict[str, int]
    ) -> int:
        """While paused: the owner's door, then what was buffered after the checkpoint written
        through it (in order; dedup, gaps and dead letters as for a live message). How many
        frames were replayed."""
        assert self.buffer is not None
        frames = self.buffer.take(self.spec.id, checkpoint.get(self.spec.id, 0))
        self.buffer = None
        self.switch(door, sender=sender, epoch=epoch)
        await self.replay(frames)
        return len(frames)


class Standby:
    """The standby side of a child: its readers and their buffer, until promotion."""

    def __init__(self, start: Start, log: Log) -> None:
        settings = start.standby
        self.start = start
        self.log = log
        self.buffer = StandbyBuffer(
            [spec.id for spec in start.streams],
            buffer=settings.buffer,
            max_bytes=settings.max_bytes,
        )
        self._changed = trio.Event()  # set when the readiness rule may have turned true
        self.readers = [
            StandbyReader(
                spec,
                buffer=self.buffer,
                checkpoint=start.checkpoint,
                changed=self._notify,
                settings=start.settings,
                placeholders=Placeholders(start.shard, spec.id, start.epoch, start.worker),
                log=log,
                transport=stream_transport(spec, start.settings, start.sink.max_message_size),
            )
            for spec in start.streams
        ]

    async def serve(
        self, receive: Callable[[], Awaitable[Message | None]], report: Report
    ) -> Promote | Stop | None:
        """Heartbeats and the readiness announcement until a ``promote`` or a ``stop`` arrives
        (returned; None: the control pipe closed). A ``fence`` is ignored: a standby holds no
        lease (``promote`` carries the fence deadline)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeats, report)
            nursery.start_soon(self._announce_ready, report)
            while True:
                message = await receive()
                if message is None or isinstance(message, Promote | Stop):
                    nursery.cancel_scope.cancel()
                    return message
                if not isinstance(message, Fence):
                    raise ProtocolError(f"unexpected {message.type!r} message to a standby")
        raise AssertionError("unreachable")

    async def promote(
        self, promote: Promote, door: Recorder | BatchPipeline, pipeline: BatchPipeline | None
    ) -> None:
        """Every reader paused at a message boundary, switched to ``door`` with its buffer
        written, then reading on: the connections stay open."""
        for reader in self.readers:
            await reader.pause()
        replayed = {}
        for reader in self.readers:
            sender = pipeline.sender() if pipeline is not None else None
            replayed[reader.spec.id] = await reader.promote(
                door, sender=sender, epoch=promote.epoch, checkpoint=promote.checkpoint
            )
        if pipeline is not None:
            pipeline.seal()
        for reader in self.readers:
            reader.resume()
        self.log.info(
            f"promoted: epoch={promote.epoch} checkpoint={promote.checkpoint}"
            f" replayed={replayed} dropped={self.buffer.dropped}"
        )

    def _notify(self) -> None:
        self._changed.set()

    async def _announce_ready(self, report: Report) -> None:
        """``standby_ready`` once, as soon as the readiness rule holds. It is looked at again
        only when a reader connects or keeps its first record, or a quiet period ends: a
        standby whose streams cannot connect sleeps (no polling)."""
        sequenced = {reader.spec.id for reader in self.readers if reader.path is not None}
        quiet = self.start.standby.quiet
        while True:
            self._changed = trio.Event()  # before looking: a change from now on wakes us
            now = time.monotonic()
            since = {reader.spec.id: reader.connected_since for reader in self.readers}
            held = self.buffer.first_seq()
            first = ready_first_seq(since, sequenced, held, quiet=quiet, now=now)
            if first is not None:
                break
            due = ready_recheck_at(since, sequenced, held, quiet=quiet)
            wait = READY_BACKSTOP if due is None else min(READY_BACKSTOP, max(0.0, due - now))
            with trio.move_on_after(wait):
                await self._changed.wait()
        self.buffer.hold(now)
        await report(StandbyReady(first_seq=first))
        self.log.info(f"standby ready: first_seq={first}")

    async def _heartbeats(self, report: Report) -> None:
        """Liveness, as from any child (hang detection), with the buffer's stats; the buffer's
        age trim runs here, once per heartbeat."""
        interval = self.start.settings.heartbeat_interval
        while True:
            before = trio.current_time()
            await trio.sleep(interval)
            now = trio.current_time()
            self.buffer.trim(time.monotonic())
            await report(
                Heartbeat(
                    written=0,
                    last_seq={},
                    loop_lag=round(max(0.0, now - before - interval), 6),
                    standby=self.stats(),
                )
            )

    def stats(self) -> StandbyStats:
        readers = self.readers
        return StandbyStats(
            buffered=self.buffer.buffered,
            bytes=self.buffer.bytes,
            dropped=self.buffer.dropped,
            first_seq=self.buffer.first_seq(),
            connected=tuple(r.spec.id for r in readers if r.connected_since is not None),
            received=sum(r.received for r in readers),
            malformed=sum(r.malformed.count for r in readers),
        )
