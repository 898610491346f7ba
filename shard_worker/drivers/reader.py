"""One WebSocket feed of a shard: connect, subscribe, read; reconnect with backoff when it breaks.

The loop between three parts: the connection (a ``Transport``, adapters/websocket.py), what each
message becomes (the pure ``FrameDecoder``, core/frames.py) and the door to the sink (the
``Recorder``: jsonl, written synchronously; or the ``BatchPipeline``'s channel: every other kind).

The reader takes the messages of one socket read at once (``receive_batch``) and handles them
between two receives, so cancellation (stop) can only land at the receive point: a message that
was received is always written (jsonl: synchronously, by the Recorder) or handed to the sink task
(other kinds: a send on the bounded channel, shielded from cancellation; while the channel is
full the reader does not read, and TCP pushes back).

Liveness (core/liveness.py): a keepalive task per connection sleeps until its next deadline;
then it pings, or gives the connection up (``ping_timeout``, ``idle``: it cancels the reading)
and the reader reconnects from the checkpoint like after any other break. Each reconnect is
counted by its reason (``RECONNECT_REASONS``) and logged once per burst; a stream silent past
its timeout is stale.

A message that cannot be a record (malformed, or over ``max_message_size``) goes to the
dead-letter sink with its reason, and is counted; the log says so once per burst.

The door can change under an open connection (a standby's promotion: from its buffer to the
sink): ``pause()`` cancels the read loop, which only lands at the receive point (a cancelled
``receive_batch()`` loses no message: the transport keeps it for the next one), ``switch()``
sets the new door, ``replay()`` runs frames received earlier through it, ``resume()`` reads on.
The keepalive goes on meanwhile: a connection is watched whatever its door.
"""

from __future__ import annotations

import random
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, NoReturn, Protocol
from urllib.parse import urlsplit

import attrs
import trio

from shard_worker.adapters.log import Log, RateLimitedCount
from shard_worker.adapters.sinks.jsonl import LineWriter
from shard_worker.adapters.tls import client_tls_context
from shard_worker.adapters.websocket import (
    Closed,
    ConnectFailed,
    Connection,
    MessageTooLarge,
    Transport,
)
from shard_worker.contract.pipe import (
    RECONNECT_PREFIX,
    VERIFY_OFF_WARNING,
    StreamSpec,
    WorkerSettings,
)
from shard_worker.core.backoff import Backoff
from shard_worker.core.frames import DeadLetter, Entry, FrameDecoder, Gap
from shard_worker.core.liveness import Keepalive, LivenessSettings, Staleness
from shard_worker.drivers.keepalive import GaveUp, watch
from shard_worker.drivers.recorder import Recorder
from shard_worker.records import Record

MALFORMED_LOG_INTERVAL = 1.0
RECONNECT_LOG_INTERVAL = 1.0
REPLAY_YIELD = 1024  # frames a replay writes between two schedule points

Batch = Sequence[str | bytes]
Receive = Callable[[], Awaitable[Batch]]  # the messages of one socket read, at least one


class _SinkTaskGone(Exception):
    """The sink task closed its channel (the worker is exiting)."""


class _Replayed(Exception):
    """The frames of a replay are all handled."""


class Door(Protocol):
    """What a reader needs of the door to the sink besides its read loop (the Recorder, the
    BatchPipeline, or a standby's buffer, which writes nothing)."""

    def last(self, stream: str) -> int: ...

    def dead_letter(
        self,
        stream: str,
        seq: int | None,
        data: Any,
        *,
        reason: str,
        error: str,
        encoding: str = "",
    ) -> None: ...


@attrs.frozen
class Placeholders:
    """Values for ``{shard}``, ``{stream}``, ``{epoch}``, ``{worker}`` (and ``{after}``)."""

    shard: str
    stream: str
    epoch: int
    worker: str

    def render(self, template: str, after: int) -> str:
        """str.replace, not str.format: URLs and subscribe messages may hold other braces."""
        values = {
            "{after}": str(after),
            "{shard}": self.shard,
            "{stream}": self.stream,
            "{epoch}": str(self.epoch),
            "{worker}": self.worker,
        }
        for placeholder, value in values.items():
            template = template.replace(placeholder, value)
        return template


def _redact(url: str) -> str:
    """The URL without its query: queries often carry tokens, which must not reach the logs."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


class StreamReader:
    def __init__(
        self,
        spec: StreamSpec,
        *,
        recorder: Door,
        settings: WorkerSettings,
        placeholders: Placeholders,
        log: Log,
        transport: Transport,
        sender: trio.MemorySendChannel[tuple[Record, int]] | None = None,
    ) -> None:
        """``recorder``: the Recorder (jsonl: written synchronously), or the BatchPipeline, whose
        channel ``sender`` takes the records (closed when the reader ends); a standby's reader
        (drivers/standby.py) has a door of its own and its own read loop."""
        self.spec = spec
        self.recorder = recorder
        self.settings = settings
        self.placeholders = placeholders
        self.log = log
        self.transport = transport
        self.sender = sender
        self.liveness = LivenessSettings.of(spec, settings)
        # (outlives connections and promotions: a stream's silence is the stream's)
        self.staleness = Staleness(self.liveness.stale_after, trio.current_time())
        self._count_from(recorder.last(spec.id))
        self._tls: ssl.SSLContext | None = None  # built at the first wss:// connect
        self._open = trio.Event()  # the gate: set = read, clear = paused (see pause)
        self._open.set()
        self._reading: trio.CancelScope | None = None  # the read loop's, while it runs
        self._left = trio.Event()  # set when that loop has ended

    def _count_from(self, last: int) -> None:
        """A new decoder resuming after ``last``, and every count from zero."""
        self.frames = FrameDecoder(self.spec.sequence, last=last, keep_text=self.sender is None)
        self.path = self.frames.path  # None: an unsequenced stream
        self.tracker = self.frames.tracker
        self.malformed = RateLimitedCount(MALFORMED_LOG_INTERVAL)
        self.reconnects = 0
        self.reconnect_reasons: dict[str, int] = {}  # RECONNECT_REASONS
        self._reconnect_log = RateLimitedCount(RECONNECT_LOG_INTERVAL)
        self._logged_reconnects = 0
        self.dead_lettered = 0  # malformed or too large messages put in the dead-letter sink

    @property
    def received(self) -> int:
        """Messages from the feed, whatever became of them."""
        return self.frames.received

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read forever (until cancelled), reconnecting with backoff."""
        task_status.started()
        backoff = Backoff(
            self.settings.reconnect_initial, self.settings.reconnect_max, rng=random.Random()
        )
        try:
            while True:
                delivered, problem, reason = await self._connect_once()
                self.staleness.disconnected(trio.current_time())
                if delivered:
                    backoff.reset()
                delay = backoff.next_delay()
                self._reconnecting(problem, reason, delay)
                await trio.sleep(delay)
        except _SinkTaskGone:
            return  # the worker is exiting: nothing more to read for
        finally:
            if self.sender is not None:
                self.sender.close()

    def _reconnecting(self, problem: str, reason: str, delay: float) -> None:
        """Count the reconnect by its reason; log it, once per burst (with what the burst
        held since the last line)."""
        self.reconnects += 1
        self.reconnect_reasons[reason] = self.reconnect_reasons.get(reason, 0) + 1
        if not self._reconnect_log.hit():
            return
        quiet = self.reconnects - self._logged_reconnects - 1
        self._logged_reconnects = self.reconnects
        more = f"; {quiet} more reconnect(s) since the last line" if quiet > 0 else ""
        after = self.tracker.last
        self._warning(f"{problem}; reconnecting in {delay:.3f}s (after={after}){more}")

    async def _connect_once(self) -> tuple[bool, str, str]:
        """One connection, until it breaks: (did it deliver a message, what went wrong, the
        reconnect reason)."""
        after = self.tracker.last
        url = self.placeholders.render(self.spec.url, after)
        received = self.received  # did this connection deliver a message: more than this
        try:
            tls = self._tls_context() if url.startswith("wss://") else None
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            return False, f"cannot load the TLS settings (tls.ca_bundle): {exc}", "connect_failed"
        try:
            async with self.transport.connect(url, self.spec.headers, tls) as connection:
                self.staleness.connected()
                extensions = connection.extensions or "none"
                self._info(f"connected to {_redact(url)} (after={after}; extensions: {extensions})")
                if self.spec.subscribe:
                    await connection.send(self.placeholders.render(self.spec.subscribe, after))
                await self._watched(connection)
        except GaveUp as exc:
            return self.received > received, f"disconnected: {exc}", exc.reason
        except MessageTooLarge as exc:
            # Not a healthy connection: a feed that replays the message meets a growing
            # backoff (up to reconnect_max), not a tight reconnect loop.
            self._too_large(exc)
            return False, f"disconnected: {exc}", "too_large"
        except Closed as exc:
            return self.received > received, f"disconnected: {exc}", "closed"
        except ConnectFailed as exc:
            return False, f"cannot connect to {_redact(url)}: {exc}", "connect_failed"
        raise AssertionError("unreachable: the read loops end only by raising")

    async def _watched(self, connection: Connection) -> NoReturn:
        """Read until the connection breaks or the keepalive (drivers/keepalive.py, a task
        beside the reading) gives it up: then the reading is cancelled and ``GaveUp`` raised."""
        keepalive = Keepalive(self.liveness, trio.current_time())
        staleness, now, receive_batch = self.staleness, trio.current_time, connection.receive_batch

        async def receive() -> Batch:
            batch = await receive_batch()
            keepalive.last_message = staleness.last_message = now()
            return batch

        gave_up: GaveUp | None = None

        async def keep_alive() -> None:
            nonlocal gave_up
            gave_up = await watch(connection, keepalive)
            if gave_up is not None:
                nursery.cancel_scope.cancel()

        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_alive)
            try:
                await self._read(receive)
            except Exception as exc:  # noqa: BLE001 - raised below, not in the nursery's group
                failure = exc
            nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
        assert gave_up is not None  # (nothing else cancels the nursery but the caller)
        raise gave_up

    def stale(self, now: float) -> bool:
        """Silent for longer than its timeout (``now``: trio's clock)."""
        return self.staleness.stale(now, self.liveness.idle_timeout)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = client_tls_context(self.settings.ca_bundle, self.settings.verify_tls)
        if not self.settings.verify_tls:
            self._warning(VERIFY_OFF_WARNING)
        return self._tls

    async def _read(self, receive: Receive) -> NoReturn:
        """The door's read loop, run again after each pause (on the same connection)."""
        while True:
            await self._open.wait()
            if not self._open.is_set():
                continue  # paused again before this task ran
            self._left = trio.Event()
            try:
                with trio.CancelScope() as self._reading:
                    await self._loop(receive)
            finally:
                self._reading = None
                self._left.set()

    def _loop(self, receive: Receive) -> Awaitable[NoReturn]:
        """The read loop of this reader's door."""
        return self._write_loop(receive) if self.sender is None else self._send_loop(receive)

    async def pause(self) -> None:
        """Stop reading at a message boundary, the connection left open; returns once no
        message is being handled (a record being handed to a full channel is handed first).
        A reader between connections is paused at once: it connects, then waits."""
        self._open = trio.Event()
        if self._reading is not None:
            self._reading.cancel()
            await self._left.wait()

    def resume(self) -> None:
        """Read on, through whatever door is set now."""
        self._open.set()

    def switch(
        self,
        recorder: Door,
        *,
        sender: trio.MemorySendChannel[tuple[Record, int]] | None,
        epoch: int,
    ) -> None:
        """A new door, while paused (a promotion): the decoder resumes after the door's
        checkpoint, the counts start over, ``{epoch}`` is ``epoch`` at the next connect."""
        self.recorder, self.sender = recorder, sender
        self.placeholders = attrs.evolve(self.placeholders, epoch=epoch)
        self._count_from(recorder.last(self.spec.id))

    async def replay(self, frames: Sequence[str | bytes]) -> None:
        """Run ``frames`` (received earlier: a standby's buffer) through the door, in order,
        as if they arrived now: dedup, gaps, dead letters as for any message. While paused;
        ``REPLAY_YIELD`` frames at a time, with a schedule point between two."""
        batches = iter(_slices(frames, REPLAY_YIELD))

        async def receive() -> Batch:
            await trio.sleep(0)  # the connections' own tasks and the pipes go on
            for batch in batches:
                return batch
            raise _Replayed

        try:
            await self._loop(receive)
        except _Replayed:
            return

    def _recorder(self) -> Recorder:
        assert isinstance(self.recorder, Recorder)  # (no sender: the jsonl door)
        return self.recorder

    async def _write_loop(self, receive: Receive) -> NoReturn:
        """The jsonl door: each record written synchronously (Recorder); no coroutine per
        batch."""
        write = self._write_batch(self._recorder().writer(self.spec.id))
        while True:
            write(await receive())

    def _write_batch(self, write: LineWriter) -> Callable[[Batch], None]:
        accept, event = self.frames.accept, self._event

        def write_batch(batch: Batch) -> None:
            for message in batch:
                item = accept(message)
                if not isinstance(item, tuple) and (item is None or (item := event(item)) is None):
                    continue
                write(*item)

        return write_batch

    async def _send_loop(self, receive: Receive) -> NoReturn:
        """Hand each record to the sink task. No schedule point while the channel has room
        (``receive()`` has one); a full channel blocks the send, and with it the reading: TCP
        pushes back on the feed."""
        assert self.sender is not None
        send_nowait, accept, event = self.sender.send_nowait, self.frames.accept, self._event
        stream, names = self.spec.id, self.placeholders
        shard, epoch, worker, wall = names.shard, names.epoch, names.worker, time.time
        while True:
            batch = await receive()
            received_at = wall()  # (the messages of one socket read came at one moment)
            for message in batch:
                item = accept(message)
                if not isinstance(item, tuple) and (item is None or (item := event(item)) is None):
                    continue
                seq, data, encoding, _ = item
                record = Record(shard, stream, seq, epoch, worker, received_at, data, encoding)
                try:
                    send_nowait((record, len(message)))
                except trio.WouldBlock:
                    await self._send_blocking((record, len(message)))
                except trio.BrokenResourceError:
                    raise _SinkTaskGone from None

    async def _send_blocking(self, item: tuple[Record, int]) -> None:
        """The send of a full channel: shielded, so a received record reaches the channel even
        while the reader is being stopped (the sink task drains it before the final checkpoint)."""
        assert self.sender is not None
        try:
            with trio.CancelScope(shield=True):
                await self.sender.send(item)
        except trio.BrokenResourceError:
            raise _SinkTaskGone from None

    def _event(self, item: Gap | DeadLetter) -> Entry | None:
        """A gap is logged, then its record written; a dead letter goes to its sink."""
        if isinstance(item, Gap):
            self._warning(f"gap: {item.skipped} message(s) missing before seq {item.entry[0]}")
            return item.entry
        self._malformed(item)
        return None

    def counts(self, written: int, dead_lettered: int = 0) -> dict[str, int]:
        """This stream's counts for the heartbeat (``written``, and the records the sink gave
        up on, ``dead_lettered``, come from the recorder or pipeline)."""
        counts = {
            "received": self.received,
            "written": written,
            "duplicates": self.tracker.duplicates,
            "gaps": self.tracker.gaps,
            "malformed": self.malformed.count,
            "reconnects": self.reconnects,
            "dead_lettered": self.dead_lettered + dead_lettered,
        }
        for reason, count in self.reconnect_reasons.items():
            counts[RECONNECT_PREFIX + reason] = count
        return counts

    def _malformed(self, letter: DeadLetter) -> None:
        """Dead-letter a message that cannot be a record; counted, logged once per burst."""
        self.recorder.dead_letter(
            self.spec.id,
            None,
            letter.data,
            reason="malformed",
            error=letter.error,
            encoding=letter.encoding,
        )
        self.dead_lettered += 1
        if self.malformed.hit():
            self._warning(
                f"malformed message dead-lettered ({self.malformed.count} so far): {letter.error}"
            )

    def _too_large(self, exc: MessageTooLarge) -> None:
        """We closed the connection (1009) on a message over max_message_size, without keeping
        any of it: the event goes to the dead-letter sink, without data. (Counted as malformed
        too: docs/pipe-protocol.md.)"""
        after = f" after seq {self.tracker.last}" if self.path is not None else ""
        error = (
            f"a message over max_message_size ({exc.limit} bytes){after}: connection closed"
            " (1009), reconnecting"
        )
        self.recorder.dead_letter(self.spec.id, None, None, reason="message_too_large", error=error)
        self.dead_lettered += 1
        if self.malformed.hit():
            self._warning(f"message too large, dead-lettered ({self.malformed.count} so far)")

    def _info(self, message: str) -> None:
        self.log.info(message, stream=self.spec.id)

    def _warning(self, message: str) -> None:
        self.log.warning(message, stream=self.spec.id)


def _slices(frames: Sequence[str | bytes], size: int) -> Iterable[Batch]:
    return (frames[i : i + size] for i in range(0, len(frames), size))
