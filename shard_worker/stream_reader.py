"""One WebSocket feed of a shard: connect, subscribe, dedup, write; reconnect when it breaks.

Messages are handled synchronously between two ``get_message()`` calls, so cancellation (stop)
can only land at the receive point: a message that was received is always written.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from .backoff import Backoff
from .log import Log
from .protocol import StreamSpec, WorkerSettings
from .recorder import Recorder
from .sequence import MalformedMessage, SequencePath, SequenceTracker

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
RECEIVE_BUFFER_BYTES = 64 * 1024  # trio-websocket's 4 KiB default costs a syscall per message
DISCONNECT_TIMEOUT = 1.0  # a close handshake must not hold up a stop or a fence exit
MALFORMED_LOG_INTERVAL = 1.0
VERIFY_OFF_WARNING = (
    "[tls] verify = false: feed certificates are NOT checked; anyone on the path can"
    " impersonate a feed"
)


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


@attrs.define
class RateLimitedCount:
    """Counts events; ``hit()`` says whether it is time to log again (once per interval)."""

    interval: float
    count: int = 0
    _last_logged: float = float("-inf")

    def hit(self) -> bool:
        self.count += 1
        now = time.monotonic()
        if now - self._last_logged >= self.interval:
            self._last_logged = now
            return True
        return False


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
        recorder: Recorder,
        settings: WorkerSettings,
        placeholders: Placeholders,
        log: Log,
    ) -> None:
        self.spec = spec
        self.recorder = recorder
        self.settings = settings
        self.placeholders = placeholders
        self.log = log
        self.path = SequencePath.parse(spec.sequence) if spec.sequence else None
        self.tracker = SequenceTracker(last=recorder.last(spec.id))
        self.malformed = RateLimitedCount(MALFORMED_LOG_INTERVAL)
        self.received = 0  # messages from the feed, whatever became of them
        self.reconnects = 0
        self.headers = [(name.encode(), value.encode()) for name, value in spec.headers]
        self._tls: ssl.SSLContext | None = None  # built at the first wss:// connect
        self._tls_failure: ssl.SSLError | None = None
        self._connecting: trio.CancelScope | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read forever (until cancelled), reconnecting with backoff."""
        task_status.started()
        backoff = Backoff(self.settings.reconnect_initial, self.settings.reconnect_max)
        while True:
            delivered, problem = await self._connect_once()
            if delivered:
                backoff.reset()
            delay = backoff.next_delay()
            self.reconnects += 1
            self._warning(f"{problem}; reconnecting in {delay:.3f}s (after={self.tracker.last})")
            await trio.sleep(delay)

    async def _connect_once(self) -> tuple[bool, str]:
        """One connection, until it breaks: (did it deliver a message, what went wrong)."""
        after = self.tracker.last
        url = self.placeholders.render(self.spec.url, after)
        delivered = False
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
                    max_message_size=MAX_MESSAGE_BYTES,
                    receive_buffer_size=RECEIVE_BUFFER_BYTES,
                    connect_timeout=self.settings.connect_timeout,
                    disconnect_timeout=DISCONNECT_TIMEOUT,
                ) as ws:
                    self._info(f"connected to {_redact(url)} (after={after})")
                    if self.spec.subscribe:
                        await ws.send_message(self.placeholders.render(self.spec.subscribe, after))
                    while True:
                        message = await ws.get_message()
                        delivered = True
                        self.handle(message)
        except ConnectionClosed as exc:
            return delivered, f"disconnected: {_describe_close(exc)}"
        except HandshakeError as exc:
            return delivered, f"cannot connect to {_redact(url)}: {_describe_handshake(exc)}"
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

    def handle(self, message: str | bytes) -> None:
        """Decode, dedup and write one message (synchronous: see the module docstring)."""
        self.received += 1
        text, raw = decode_frame(message)
        if text is None:
            if self.path is not None:
                self._malformed("binary frame is not UTF-8")
                return
            self.recorder.write(self.spec.id, None, base64.b64encode(raw).decode(), "base64")
            return
        try:
            data: Any = json.loads(text)
        except (ValueError, RecursionError):
            if self.path is not None:
                self._malformed("not JSON")
                return
            data = text
        if self.path is None:
            self.recorder.write(self.spec.id, None, data)
            return
        try:
            seq = self.path.extract(data)
        except MalformedMessage as exc:
            self._malformed(str(exc))
            return
        skipped = self.tracker.admit(seq)
        if skipped is None:
            return
        if skipped:
            self._warning(f"gap: {skipped} message(s) missing before seq {seq}")
        self.recorder.write(self.spec.id, seq, data)

    def counts(self, written: int) -> dict[str, int]:
        """This stream's counts for the heartbeat (``written`` comes from the recorder)."""
        return {
            "received": self.received,
            "written": written,
            "duplicates": self.tracker.duplicates,
            "gaps": self.tracker.gaps,
            "malformed": self.malformed.count,
            "reconnects": self.reconnects,
        }

    def _malformed(self, reason: str) -> None:
        if self.malformed.hit():
            self._warning(f"malformed message skipped ({self.malformed.count} so far): {reason}")

    def _info(self, message: str) -> None:
        self.log.info(message, stream=self.spec.id)

    def _warning(self, message: str) -> None:
        self.log.warning(message, stream=self.spec.id)


def _describe_close(exc: ConnectionClosed) -> str:
    reason = exc.reason
    if reason is None:
        return "connection closed"
    return f"code {reason.code} {reason.name}" + (f" ({reason.reason})" if reason.reason else "")


def _describe_handshake(exc: HandshakeError) -> str:
    """Handshake errors wrap the interesting OSError; show it (str(exc) is often empty)."""
    text = str(exc) or type(exc).__name__
    return f"{text}: {exc.__cause__}" if exc.__cause__ is not None else text
