"""One WebSocket feed of a shard: connect, subscribe, dedup, write; reconnect when it breaks.

Messages are handled between two ``get_message()`` calls, so cancellation (stop) can only land
at the receive point: a message that was received is always written (jsonl: synchronously, by
the Recorder) or handed to the sink task (other kinds: a send on the bounded channel, shielded
from cancellation; while the channel is full the reader does not read, and TCP pushes back).

A message that cannot be a record (malformed, or over ``max_message_size``) goes to the
dead-letter sink with its reason, and is counted; the log says so once per burst.
"""

from __future__ import annotations

import base64
import json
import random
import ssl
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from shard_worker.adapters.log import Log, RateLimitedCount
from shard_worker.contract.pipe import (
    DEFAULT_MAX_MESSAGE_SIZE,
    VERIFY_OFF_WARNING,
    StreamSpec,
    WorkerSettings,
)
from shard_worker.core.backoff import Backoff
from shard_worker.core.sequence import MalformedMessage, SequencePath, SequenceTracker
from shard_worker.records import Record

if TYPE_CHECKING:
    from shard_worker.drivers.pipeline import BatchPipeline
    from shard_worker.drivers.recorder import Recorder

MAX_MESSAGE_BYTES = DEFAULT_MAX_MESSAGE_SIZE
_loads = json.loads
_scan = json.JSONDecoder().scan_once  # the C scanner; called from the event loop's thread only
RECEIVE_BUFFER_BYTES = 64 * 1024  # trio-websocket's 4 KiB default costs a syscall per message
DISCONNECT_TIMEOUT = 1.0  # a close handshake must not hold up a stop or a fence exit
MALFORMED_LOG_INTERVAL = 1.0


class _SinkTaskGone(Exception):
    """The sink task closed its channel (the worker is exiting)."""


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


def decode_frame(message: str | bytes) -> tuple[str | None, bytes]:
    """Text of a frame (binary frames that are UTF-8 count as text), else None and the bytes."""
    if isinstance(message, str):
        return message, b""
    try:
        return message.decode("utf-8"), b""
    except UnicodeDecodeError:
        return None, message


def _redact(url: str) -> str:
    """The URL without its query: queries often carry tokens, which must not reach the logs."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def client_tls_context(ca_bundle: str, verify: bool) -> ssl.SSLContext:
    """The context for wss:// feeds: the system's trust store, or ``ca_bundle``'s CAs; with
    ``verify`` false, no certificate or host name check at all."""
    context = ssl.create_default_context(cafile=ca_bundle or None)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _reporting_handshake_failures(context: ssl.SSLContext, failed) -> ssl.SSLContext:
    """``context``, whose TLS objects call ``failed(exc)`` when their handshake fails.

    trio-websocket 0.12 swallows a failed TLS handshake and then waits for its connect
    timeout, reporting only a timeout; this way the reader can say "certificate verify
    failed" at once, and retry without waiting out the timeout."""

    class _Reporting(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise  # the normal "need more bytes" of a non-blocking handshake
            except ssl.SSLError as exc:
                failed(exc)
                raise

    context.sslobject_class = _Reporting
    return context


class StreamReader:
    def __init__(
        self,
        spec: StreamSpec,
        *,
        recorder: Recorder | BatchPipeline,
        settings: WorkerSettings,
        placeholders: Placeholders,
        log: Log,
        sender: trio.MemorySendChannel[tuple[Record, int]] | None = None,
        max_message_size: int = MAX_MESSAGE_BYTES,
    ) -> None:
        """``recorder``: the Recorder (jsonl: written synchronously), or the BatchPipeline, whose
        channel ``sender`` takes the records (closed when the reader ends)."""
        self.spec = spec
        self.recorder = recorder
        self.settings = settings
        self.placeholders = placeholders
        self.log = log
        self.sender = sender
        self.max_message_size = max_message_size
        self.path = SequencePath.parse(spec.sequence) if spec.sequence else None
        # A one-part path ("seq") is looked up inline; dotted ones through SequencePath.
        self._key = (
            self.path.parts[0] if self.path is not None and len(self.path.parts) == 1 else None
        )
        self.tracker = SequenceTracker(last=recorder.last(spec.id))
        self.malformed = RateLimitedCount(MALFORMED_LOG_INTERVAL)
        self.received = 0  # messages from the feed, whatever became of them
        self.reconnects = 0
        self.dead_lettered = 0  # malformed or too large messages put in the dead-letter sink
        self.headers = [(name.encode(), value.encode()) for name, value in spec.headers]
        self._tls: ssl.SSLContext | None = None  # built at the first wss:// connect
        self._tls_failure: ssl.SSLError | None = None
        self._connecting: trio.CancelScope | None = None
        self._shard = placeholders.shard
        self._epoch = placeholders.epoch
        self._worker = placeholders.worker

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read forever (until cancelled), reconnecting with backoff."""
        task_status.started()
        backoff = Backoff(
            self.settings.reconnect_initial, self.settings.reconnect_max, rng=random.Random()
        )
        try:
            while True:
                delivered, problem = await self._connect_once()
                if delivered:
                    backoff.reset()
                delay = backoff.next_delay()
                self.reconnects += 1
                after = self.tracker.last
                self._warning(f"{problem}; reconnecting in {delay:.3f}s (after={after})")
                await trio.sleep(delay)
        except _SinkTaskGone:
            return  # the worker is exiting: nothing more to read for
        finally:
            if self.sender is not None:
                self.sender.close()

    async def _connect_once(self) -> tuple[bool, str]:
        """One connection, until it breaks: (did it deliver a message, what went wrong)."""
        after = self.tracker.last
        url = self.placeholders.render(self.spec.url, after)
        received = self.received  # did this connection deliver a message: more than this
        try:
            tls = self._tls_context() if url.startswith("wss://") else None
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            return False, f"cannot load the TLS settings (tls.ca_bundle): {exc}"
        self._tls_failure = None
        try:
            with trio.CancelScope() as self._connecting:
                async with open_websocket_url(
                    url,
                    tls,
                    extra_headers=self.headers or None,
                    max_message_size=self.max_message_size,
                    receive_buffer_size=RECEIVE_BUFFER_BYTES,
                    connect_timeout=self.settings.connect_timeout,
                    disconnect_timeout=DISCONNECT_TIMEOUT,
                ) as ws:
                    self._info(f"connected to {_redact(url)} (after={after})")
                    if self.spec.subscribe:
                        await ws.send_message(self.placeholders.render(self.spec.subscribe, after))
                    if self.sender is None:
                        await self._write_loop(ws)
                    else:
                        await self._send_loop(ws)
        except ConnectionClosed as exc:
            if _too_large(exc):
                # Not a healthy connection: a feed that replays the message meets a growing
                # backoff (up to reconnect_max), not a tight reconnect loop.
                self._too_large(exc)
                return False, f"disconnected: {_describe_close(exc)}"
            return self.received > received, f"disconnected: {_describe_close(exc)}"
        except HandshakeError as exc:
            problem = f"cannot connect to {_redact(url)}: {_describe_handshake(exc)}"
            return self.received > received, problem
        finally:
            self._connecting = None
        # Only a failed TLS handshake cancels the scope (see _tls_failed).
        return False, f"cannot connect to {_redact(url)}: TLS handshake failed: {self._tls_failure}"

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            context = client_tls_context(self.settings.ca_bundle, self.settings.verify_tls)
            self._tls = _reporting_handshake_failures(context, self._tls_failed)
        if not self.settings.verify_tls:
            self._warning(VERIFY_OFF_WARNING)
        return self._tls

    def _tls_failed(self, exc: ssl.SSLError) -> None:
        """Called from inside the TLS handshake: stop waiting for this connection."""
        self._tls_failure = exc
        if self._connecting is not None:
            self._connecting.cancel()

    async def _write_loop(self, ws: Any) -> None:
        """The jsonl path: each message written synchronously (Recorder). The common case of
        a busy sequenced stream runs inline: a text frame that is one JSON object, ASCII on one
        line, with the next sequence number at a one-part path, is written with its own text
        as the data (no second encoding), in one call. Anything else goes through ``handle``."""
        recorder: Recorder = self.recorder  # type: ignore[assignment]
        stream = self.spec.id
        write, write_json = recorder.write, recorder.writer(stream)
        handle, key, tracker, scan = self.handle, self._key, self.tracker, _scan
        get_message = ws.get_message
        while True:
            message = await get_message()
            if key is not None and type(message) is str:
                try:
                    data, end = scan(message, 0)
                except (StopIteration, ValueError, RecursionError):
                    end = -1
                if (
                    end == len(message)
                    and type(data) is dict
                    and type(seq := data.get(key)) is int
                    and seq == tracker.last + 1
                    and message.isascii()
                    and "\n" not in message
                    and "\r" not in message
                ):
                    self.received += 1
                    tracker.last = seq
                    write_json(seq, message)
                    continue
            item = handle(message)
            if item is not None:
                write(stream, *item)

    async def _send_loop(self, ws: Any) -> None:
        """Hand each record to the sink task. The send is shielded: a record that was
        received reaches the channel even when the reader is being stopped (the sink task
        drains the channel before the final checkpoint). A full channel blocks the send, and
        with it the reading: TCP pushes back on the feed."""
        sender = self.sender
        assert sender is not None
        send_nowait = sender.send_nowait
        stream, shard, epoch, worker = self.spec.id, self._shard, self._epoch, self._worker
        handle, key, tracker, scan = self.handle, self._key, self.tracker, _scan
        get_message, wall = ws.get_message, time.time
        while True:
            message = await get_message()
            # The common case inline, as in _write_loop: a text frame that is one JSON object
            # with the next sequence number at a one-part path. Anything else: ``handle``.
            in_order = False
            if key is not None and type(message) is str:
                try:
                    data, end = scan(message, 0)
                except (StopIteration, ValueError, RecursionError):
                    end = -1
                in_order = (
                    end == len(message)
                    and type(data) is dict
                    and type(seq := data.get(key)) is int
                    and seq == tracker.last + 1
                )
            if in_order:
                self.received += 1
                tracker.last = seq
                encoding = ""
            else:
                item = handle(message)
                if item is None:
                    continue
                seq, data, encoding, _ = item
                encoding = encoding or ""
            record = Record(shard, stream, seq, epoch, worker, wall(), data, encoding)
            try:  # no schedule point while there is room (get_message() has one)
                send_nowait((record, len(message)))
            except trio.WouldBlock:
                await self._send_blocking((record, len(message)))
            except trio.BrokenResourceError:
                raise _SinkTaskGone from None

    async def _send_blocking(self, item: tuple[Record, int]) -> None:
        """The send of a full channel: shielded, so a received record reaches the channel even
        while the reader is being stopped (see _send_loop)."""
        assert self.sender is not None
        try:
            with trio.CancelScope(shield=True):
                await self.sender.send(item)
        except trio.BrokenResourceError:
            raise _SinkTaskGone from None

    def handle(self, message: str | bytes) -> tuple[int | None, Any, str | None, str | None] | None:
        """Decode and dedup one message: (seq, data, encoding, data_json) to write, or None (a
        duplicate; or malformed, and then dead-lettered here). Synchronous: see the module
        docstring. ``data_json`` is the message text itself when it is JSON that can stand in
        a JSON line as is (ASCII, no line break: the same value, not encoded a second time),
        else None."""
        self.received += 1
        if type(message) is str:
            text: str | None = message
        else:
            text, raw = decode_frame(message)
            if text is None:
                encoded = base64.b64encode(raw).decode()
                if self.path is not None:
                    self._malformed("binary frame is not UTF-8", encoded, "base64")
                    return None
                return None, encoded, "base64", None
        try:
            try:  # the C scanner alone: json.loads adds two regex passes for the whitespace
                data, end = _scan(text, 0)
            except StopIteration:  # not a JSON value at 0 (perhaps leading whitespace)
                end = -1
            if end != len(text):  # whitespace around it, or not JSON: json.loads decides
                data = _loads(text)
        except (ValueError, RecursionError):
            if self.path is not None:
                self._malformed("not JSON", text)
                return None
            return None, text, None, None
        as_is = text if text.isascii() and "\n" not in text and "\r" not in text else None
        path = self.path
        if path is None:
            return None, data, None, as_is
        key = self._key
        if key is not None and type(data) is dict and type(seq := data.get(key)) is int:
            pass  # the common case: a top-level integer sequence number
        else:
            try:
                seq = path.extract(data)
            except MalformedMessage as exc:
                self._malformed(str(exc), data)
                return None
        tracker = self.tracker
        if seq == tracker.last + 1:  # in order: no duplicate, no gap
            tracker.last = seq
            return seq, data, None, as_is
        skipped = tracker.admit(seq)
        if skipped is None:
            return None
        if skipped:
            self._warning(f"gap: {skipped} message(s) missing before seq {seq}")
        return seq, data, None, as_is

    def counts(self, written: int, dead_lettered: int = 0) -> dict[str, int]:
        """This stream's counts for the heartbeat (``written``, and the records the sink gave
        up on, ``dead_lettered``, come from the recorder or pipeline)."""
        return {
            "received": self.received,
            "written": written,
            "duplicates": self.tracker.duplicates,
            "gaps": self.tracker.gaps,
            "malformed": self.malformed.count,
            "reconnects": self.reconnects,
            "dead_lettered": self.dead_lettered + dead_lettered,
        }

    def _malformed(self, reason: str, data: Any, encoding: str = "") -> None:
        """Dead-letter a message that cannot be a record; counted, logged once per burst."""
        self.recorder.dead_letter(
            self.spec.id, None, data, reason="malformed", error=reason, encoding=encoding
        )
        self.dead_lettered += 1
        if self.malformed.hit():
            self._warning(
                f"malformed message dead-lettered ({self.malformed.count} so far): {reason}"
            )

    def _too_large(self, exc: ConnectionClosed) -> None:
        """trio-websocket closed the connection (1009) on a message over max_message_size,
        without keeping any of it: the event goes to the dead-letter sink, without data."""
        error = (
            f"a message over max_message_size ({self.max_message_size} bytes) after seq"
            f" {self.tracker.last}: connection closed (1009), reconnecting"
            if self.path is not None
            else f"a message over max_message_size ({self.max_message_size} bytes): connection"
            " closed (1009), reconnecting"
        )
        self.recorder.dead_letter(self.spec.id, None, None, reason="message_too_large", error=error)
        self.dead_lettered += 1
        if self.malformed.hit():
            self._warning(f"message too large, dead-lettered ({self.malformed.count} so far)")

    def _info(self, message: str) -> None:
        self.log.info(message, stream=self.spec.id)

    def _warning(self, message: str) -> None:
        self.log.warning(message, stream=self.spec.id)


def _too_large(exc: ConnectionClosed) -> bool:
    """Whether we (trio-websocket) closed the connection over a message's size; a feed that
    closes with 1009 means one of *our* messages was too big, which is something else."""
    reason = exc.reason
    return (
        reason is not None
        and reason.code == 1009
        and (reason.reason or "").startswith("Exceeded maximum message size")
    )


def _describe_close(exc: ConnectionClosed) -> str:
    reason = exc.reason
    if reason is None:
        return "connection closed"
    return f"code {reason.code} {reason.name}" + (f" ({reason.reason})" if reason.reason else "")


def _describe_handshake(exc: HandshakeError) -> str:
    """Handshake errors wrap the interesting OSError; show it (str(exc) is often empty)."""
    text = str(exc) or type(exc).__name__
    return f"{text}: {exc.__cause__}" if exc.__cause__ is not None else text
