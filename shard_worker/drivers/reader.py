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
"""

from __future__ import annotations

import random
import ssl
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn
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
from shard_worker.core.liveness import Due, Keepalive, LivenessSettings, Staleness
from shard_worker.drivers.recorder import Recorder
from shard_worker.records import Record

if TYPE_CHECKING:
    from shard_worker.drivers.pipeline import BatchPipeline

MALFORMED_LOG_INTERVAL = 1.0
RECONNECT_LOG_INTERVAL = 1.0

Batch = Sequence[str | bytes]


class _SinkTaskGone(Exception):
    """The sink task closed its channel (the worker is exiting)."""


class _GaveUp(Exception):
    """The keepalive gave the connection up: ``due`` says why (ping_timeout, idle)."""

    def __init__(self, due: Due, description: str) -> None:
        super().__init__(description)
        self.reason = due.value


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
        recorder: Recorder | BatchPipeline,
        settings: WorkerSettings,
        placeholders: Placeholders,
        log: Log,
        transport: Transport,
        sender: trio.MemorySendChannel[tuple[Record, int]] | None = None,
    ) -> None:
        """``recorder``: the Recorder (jsonl: written synchronously), or the BatchPipeline, whose
        channel ``sender`` takes the records (closed when the reader ends)."""
        self.spec = spec
        self.recorder = recorder
        self.settings = settings
        self.placeholders = placeholders
        self.log = log
        self.transport = transport
        self.sender = sender
        self.frames = FrameDecoder(
            spec.sequence, last=recorder.last(spec.id), keep_text=sender is None
        )
        self.path = self.frames.path  # None: an unsequenced stream
        self.tracker = self.frames.tracker
        self.malformed = RateLimitedCount(MALFORMED_LOG_INTERVAL)
        self.reconnects = 0
        self.reconnect_reasons: dict[str, int] = {}  # RECONNECT_REASONS
        self._reconnect_log = RateLimitedCount(RECONNECT_LOG_INTERVAL)
        self._logged_reconnects = 0
        self.liveness = LivenessSettings.of(spec, settings)
        self.staleness = Staleness(self.liveness.stale_after, trio.current_time())
        self.dead_lettered = 0  # malformed or too large messages put in the dead-letter sink
        self._tls: ssl.SSLContext | None = None  # built at the first wss:// connect

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
                await self._read(connection)
        except _GaveUp as exc:
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
        raise AssertionError("unreachable: the read loop ends only by raising")

    async def _read(self, connection: Connection) -> NoReturn:
        """Receive until the connection breaks or the keepalive gives it up. The keepalive is
        a task of its own, asleep until its next deadline: the receive loop pays one clock read
        per batch (per socket read), no cancel scope."""
        keepalive = Keepalive(self.liveness, trio.current_time())
        gave_up: list[_GaveUp] = []
        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keep_alive, connection, keepalive, gave_up, nursery)
            try:
                await self._receive(connection, keepalive)
            except Exception as exc:  # noqa: BLE001 - raised below, not in the nursery's group
                failure = exc
            nursery.cancel_scope.cancel()
        raise failure or gave_up[0]

    async def _receive(self, connection: Connection, keepalive: Keepalive) -> NoReturn:
        receive, staleness, now = connection.receive_batch, self.staleness, trio.current_time
        if self.sender is None:  # the jsonl door: synchronous, no coroutine per batch
            write = self._write_batch(self._recorder().writer(self.spec.id))
            while True:
                batch = await receive()
                keepalive.last_message = staleness.last_message = now()
                write(batch)
        while True:
            batch = await receive()
            keepalive.last_message = staleness.last_message = now()
            await self._send_batch(batch)

    async def _keep_alive(
        self,
        connection: Connection,
        keepalive: Keepalive,
        gave_up: list[_GaveUp],
        nursery: trio.Nursery,
    ) -> None:
        """Ping when nothing came for ping_interval; give the connection up (cancel the
        reading) when a ping goes unanswered or the feed sends no message for idle_timeout."""
        liveness = self.liveness
        while True:
            await trio.sleep_until(keepalive.deadline())
            now = trio.current_time()
            keepalive.received(connection.last_frame_at, messages=False)
            due = keepalive.due(now)
            if due is Due.PING:
                try:
                    await connection.ping()
                except Closed:
                    return  # the receive loop meets the same end
                keepalive.pinged(now)
            elif due is not None:
                if due is Due.PING_TIMEOUT:
                    connection.abandon()  # no close handshake with a peer that is gone
                    why = f"no answer to a ping within {liveness.ping_timeout:g}s"
                else:
                    why = f"no message for {liveness.idle_timeout:g}s (idle)"
                gave_up.append(_GaveUp(due, why))
                nursery.cancel_scope.cancel()
                return

    def stale(self, now: float) -> bool:
        """Silent for longer than its timeout (``now``: trio's clock)."""
        return self.staleness.stale(now, self.liveness.idle_timeout)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = client_tls_context(self.settings.ca_bundle, self.settings.verify_tls)
        if not self.settings.verify_tls:
            self._warning(VERIFY_OFF_WARNING)
        return self._tls

    def _recorder(self) -> Recorder:
        assert isinstance(self.recorder, Recorder)  # (no sender: the jsonl door)
        return self.recorder

    def _write_batch(self, write: LineWriter) -> Callable[[Batch], None]:
        """The jsonl door of one connection: each record written synchronously (Recorder)."""
        accept, event = self.frames.accept, self._event

        def write_batch(batch: Batch) -> None:
            for message in batch:
                item = accept(message)
                if not isinstance(item, tuple) and (item is None or (item := event(item)) is None):
                    continue
                write(*item)

        return write_batch

    async def _send_batch(self, batch: Batch) -> None:
        """Hand each record to the sink task. No schedule point while the channel has room;
        a full channel blocks the send, and with it the reading: TCP pushes back on the feed."""
        assert self.sender is not None
        send_nowait, accept, event = self.sender.send_nowait, self.frames.accept, self._event
        stream, names = self.spec.id, self.placeholders
        shard, epoch, worker, wall = names.shard, names.epoch, names.worker, time.time
        for message in batch:
            item = accept(message)
            if not isinstance(item, tuple) and (item is None or (item := event(item)) is None):
                continue
            seq, data, encoding, _ = item
            record = Record(shard, stream, seq, epoch, worker, wall(), data, encoding)
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
