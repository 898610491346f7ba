"""The ``websockets`` ``Transport``: its Sans-I/O protocol (``websockets.client.ClientProtocol``)
driven by trio, with permessage-deflate, and every complete message of one socket read handed to
the reader at once.

Why this library: the handshake, permessage-deflate (RFC 7692, with the decompressed size held
to ``max_message_size``), control frames, fragmented messages and the close handshake are its
well-kept code, documented for driving from another event loop; trio stays our concurrency.

The hot path. Most frames of a busy feed are the simplest kind: one unmasked text or binary
frame per message. ``_Splitter`` cuts those out of the bytes of a read itself (a few slices per
message: the library's generator-based parser costs about 3 µs per frame); a compressed one it
inflates with the negotiated extension's own ``decode`` (its public API, which bounds the
inflated size by ``max_message_size``). It hands every other frame whole to the protocol, in
order: a control frame, a fragment, one over the limit, anything while the protocol is not open.
The protocol is therefore only ever fed whole frames, from a frame boundary: its parser and our
split never disagree on where a frame starts. What it decides (a pong to send, a close, a
message too large) is its own.

Errors are raised by ``receive_batch`` once the messages received before them are handed over:
``Closed`` (with the peer's close code), ``MessageTooLarge`` (we closed with 1009: a frame, or
the inflated message, over ``max_message_size``), ``ConnectFailed`` from ``connect``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import attrs
import trio
from websockets.client import ClientProtocol
from websockets.exceptions import InvalidStatus, PayloadTooBig, ProtocolError
from websockets.extensions.permessage_deflate import (
    ClientPerMessageDeflateFactory,
    PerMessageDeflate,
)
from websockets.frames import BINARY, CONT, TEXT, CloseCode, Frame
from websockets.http11 import Response
from websockets.protocol import CONNECTING, OPEN, SEND_EOF
from websockets.uri import parse_uri

from shard_worker.adapters.websocket import (
    Closed,
    ConnectFailed,
    Connection,
    MessageTooLarge,
    Stream,
    Target,
    TransportSettings,
)

HANDSHAKE_BYTES = 16 * 1024  # an upgrade response longer than this goes to the protocol whole


@attrs.frozen
class WebSocketsTransport(TransportSettings):
    """The ``websockets`` (Sans-I/O) ``Transport``; ``compression``: offer permessage-deflate
    (and use it when the server agrees)."""

    compression: bool = True

    @asynccontextmanager
    async def connect(
        self, url: str, headers: Sequence[tuple[str, str]], tls: ssl.SSLContext | None
    ) -> AsyncIterator[Connection]:
        protocol = self._protocol(url)
        stream, deadline = await self.open_stream(Target.of(url), tls)
        try:
            connection = _Connection(stream, protocol, self)
            with trio.move_on_at(deadline) as upgrading:
                await connection.handshake(headers)
            if upgrading.cancelled_caught:
                raise ConnectFailed(self._timed_out())
            try:
                yield connection
            finally:
                if not connection.abandoned:
                    with trio.move_on_after(self.disconnect_timeout):
                        await connection.close_quietly()  # (no answer in time: closed below)
        finally:
            await trio.aclose_forcefully(stream)

    def _protocol(self, url: str) -> ClientProtocol:
        try:
            uri = parse_uri(url)
        except ValueError as exc:  # websockets' InvalidURI is one
            raise ConnectFailed(f"not a WebSocket URL: {exc}") from exc
        offer = [ClientPerMessageDeflateFactory(compress_settings={"memLevel": 5})]
        return ClientProtocol(
            uri, extensions=offer if self.compression else None, max_size=self.max_message_size
        )


class _Connection:
    """One connection: the socket, the protocol, and the messages of the last read."""

    def __init__(self, stream: Stream, protocol: ClientProtocol, settings: WebSocketsTransport):
        self._stream = stream
        self._protocol = protocol
        self._receive_bytes = settings.receive_buffer_size
        self._send_timeout = settings.disconnect_timeout
        self._split = _Splitter(protocol, settings.max_message_size, settings.receive_buffer_size)
        self._ready: list[str | bytes] = []
        self.last_frame_at = trio.current_time()
        self.extensions = ""
        self.abandoned = False
        self._sending = trio.Lock()  # the keepalive's pings, and the reader's pongs and closes

    async def handshake(self, headers: Sequence[tuple[str, str]]) -> None:
        """The HTTP upgrade: the protocol gets the bytes up to the end of the response, the
        splitter what follows (frames the server sent at once)."""
        protocol = self._protocol
        request = protocol.connect()
        for name, value in headers:
            request.headers[name] = value
        protocol.send_request(request)
        await self._flush()
        buffer, head_fed = b"", False
        while protocol.state is CONNECTING and not protocol.handshake_exc:
            data = await self._read()
            if not data:
                protocol.receive_eof()
                break
            if head_fed:  # a refusal's body
                protocol.receive_data(data)
                continue
            buffer += data
            end = buffer.find(b"\r\n\r\n")
            if end < 0 and len(buffer) <= HANDSHAKE_BYTES:
                continue
            head, buffer = (buffer, b"") if end < 0 else (buffer[: end + 4], buffer[end + 4 :])
            protocol.receive_data(head)
            head_fed = True
        response = next((e for e in protocol.events_received() if isinstance(e, Response)), None)
        if protocol.state is not OPEN or response is None:
            raise ConnectFailed(_describe_handshake(protocol.handshake_exc))
        self.extensions = response.headers.get("Sec-WebSocket-Extensions", "")
        self._split.negotiated()
        if buffer:
            self._split.feed(buffer, self._ready)

    async def receive_batch(self) -> list[str | bytes]:
        split, ready = self._split, self._ready
        while not ready:
            if split.failure is not None:
                raise split.failure
            data = await self._read()
            self.last_frame_at = trio.current_time()
            if data:
                split.feed(data, ready)
            else:
                split.eof()
            await self._flush()  # pongs, a close
        self._ready = []
        return ready

    async def receive(self) -> str | bytes:
        if not self._ready:
            self._ready = await self.receive_batch()
        return self._ready.pop(0)

    async def send(self, message: str) -> None:
        self._check_open()
        self._protocol.send_text(message.encode())
        await self._flush()

    async def ping(self) -> None:
        self._check_open()
        self._protocol.send_ping(os.urandom(4))
        await self._flush()

    def abandon(self) -> None:
        self.abandoned = True

    async def close(self, code: int = 1000) -> None:
        """Send our close frame (if the connection is still open), then wait for the server to
        end the connection (the caller bounds the wait)."""
        protocol = self._protocol
        if protocol.state is not OPEN:
            return
        protocol.send_close(code)
        await self._flush()
        while await self._read():
            pass

    async def close_quietly(self) -> None:
        """``close()`` on the way out: a connection that breaks while closing is what the
        caller is leaving anyway; why it leaves (the error in flight) is what counts."""
        try:
            await self.close()
        except Closed:
            return

    def _check_open(self) -> None:
        if self._split.failure is not None:
            raise self._split.failure
        if self._protocol.state is not OPEN:
            raise Closed(None)

    async def _read(self) -> bytes:
        try:
            data = await self._stream.receive_some(self._receive_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise Closed(None) from exc
        return data if type(data) is bytes else bytes(data)  # (a TLS stream's is a bytearray)

    async def _flush(self) -> None:
        """Send what the protocol has to send (two tasks may: the reader and the keepalive).
        Shielded, with a deadline of its own: a send cut by a cancellation (a reader paused
        for a standby's promotion, a stop) would leave part of a frame on the wire and the
        rest lost, so ``receive_batch`` stays cancel-safe; a peer that takes nothing for
        ``disconnect_timeout`` is gone."""
        writes = [data for data in self._protocol.data_to_send() if data is not SEND_EOF]
        if not writes:
            return  # (SEND_EOF: the socket is closed on the way out of ``connect``)
        with trio.CancelScope(shield=True) as sending:
            sending.deadline = trio.current_time() + self._send_timeout
            async with self._sending:
                try:
                    await self._stream.send_all(b"".join(writes))
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise Closed(None) from exc
        if sending.cancelled_caught:
            self.abandoned = True  # (a frame may be half sent: no close handshake after it)
            raise Closed(None)


class _Splitter:
    """The bytes of a connection into messages: simple frames cut out here, the rest given
    whole to the protocol (see the module docstring). ``failure``: the error that ends the
    connection, raised once the messages before it are taken."""

    def __init__(self, protocol: ClientProtocol, limit: int, keep: int) -> None:
        self._protocol = protocol
        self._limit = limit
        self._keep = keep  # a simple frame up to this size waits here for its end
        self._rest = b""  # an incomplete frame at the end of the last read
        self._owed = 0  # bytes of a frame the protocol has the beginning of
        self._parts: list[bytes] = []  # a fragmented message so far
        self._kind = TEXT
        self._inflate: Callable[..., Frame] | None = None  # the deflate extension's decode
        self.failure: Closed | None = None

    def negotiated(self) -> None:
        """After the handshake: with permessage-deflate alone, its compressed messages are
        simple frames too (inflated here, by the extension)."""
        extensions = self._protocol.extensions
        if len(extensions) == 1 and isinstance(extensions[0], PerMessageDeflate):
            self._inflate = extensions[0].decode

    def feed(self, data: bytes, ready: list[str | bytes]) -> None:
        """Append the messages completed by ``data`` to ``ready``, in order. Consecutive whole
        frames for the protocol (a compressed feed's) go to it in one call."""
        if self._rest:
            data, self._rest = self._rest + data, b""
        protocol, limit, owed, inflate = self._protocol, self._limit, self._owed, self._inflate
        pos, end, run = 0, len(data), -1  # run: where whole frames for the protocol start
        while pos < end:
            if owed or protocol.state is not OPEN:
                n = min(owed, end - pos) if owed else end - pos
                self._to_protocol(data[pos : pos + n], ready)
                pos, owed = pos + n, owed - n if owed else 0
                continue
            first, head, length = _header(data, pos, end)
            if head == 0:
                break  # the header is not all here yet
            stop = pos + head + length
            simple = (  # FIN, unmasked data, no RSV bit (or RSV1: deflated), one message
                first in (0x81, 0x82) or (first in (0xC1, 0xC2) and inflate is not None)
            ) and length <= limit
            if stop <= end and not simple:
                run, pos = pos if run < 0 else run, stop
                continue
            if run >= 0:  # what the protocol decides first may change what this frame is
                self._to_protocol(data[run:pos], ready)
                run = -1
                continue
            if simple and protocol.current_size is None:
                if stop <= end:
                    payload, pos = data[pos + head : stop], stop
                    if first & 0x40:
                        payload = self._inflated(first, payload)
                        if self.failure is not None:
                            continue  # (too large, or corrupt: the connection ends)
                        first &= 0xBF
                    if first == 0x82:
                        ready.append(payload)
                        continue
                    try:
                        ready.append(payload.decode())
                    except UnicodeDecodeError as exc:
                        self._invalid_text(exc)
                    continue
                if stop - pos <= self._keep:
                    break  # the rest of a small frame comes with the next read
            n = min(stop, end) - pos
            self._to_protocol(data[pos : pos + n], ready)
            pos, owed = pos + n, stop - pos - n
        if run >= 0:
            self._to_protocol(data[run:pos], ready)
        self._owed = owed
        if pos < end:
            self._rest = data[pos:]

    def _inflated(self, first: int, payload: bytes) -> bytes:
        """A deflated message, inflated by the extension (its context, its size limit); when
        it cannot be (too large, corrupt), the connection fails (``failure``)."""
        assert self._inflate is not None
        frame = Frame(TEXT if first == 0xC1 else BINARY, payload, True, True)
        try:
            return bytes(self._inflate(frame, max_size=self._limit).data)
        except PayloadTooBig as exc:
            self._protocol.parser_exc = exc  # (as its own parser records it)
            self._protocol.fail(CloseCode.MESSAGE_TOO_BIG, str(exc))
        except ProtocolError as exc:  # (zlib's error: corrupt data)
            self._protocol.parser_exc = exc
            self._protocol.fail(CloseCode.PROTOCOL_ERROR, str(exc))
        self._ended()
        return b""

    def eof(self) -> None:
        self._protocol.receive_eof()
        self._ended()

    def _to_protocol(self, frames: bytes, ready: list[str | bytes]) -> None:
        """Whole frames (or the beginning of one) to the protocol; its messages to ``ready``."""
        protocol = self._protocol
        protocol.receive_data(frames)
        for event in protocol.events_received():
            if isinstance(event, Frame):
                self._frame(event, ready)
        self._ended()

    def _frame(self, frame: Frame, ready: list[str | bytes]) -> None:
        """A data frame's message (pings are answered by the protocol, closes seen in its
        state)."""
        opcode = frame.opcode
        if opcode is CONT:
            self._parts.append(bytes(frame.data))
        elif opcode is TEXT or opcode is BINARY:
            self._kind, self._parts = opcode, [bytes(frame.data)]
        else:
            return
        if not frame.fin:
            return
        message, self._parts = b"".join(self._parts), []
        if self._kind is BINARY:
            ready.append(message)
            return
        try:
            ready.append(message.decode())
        except UnicodeDecodeError as exc:
            self._invalid_text(exc)

    def _invalid_text(self, exc: UnicodeDecodeError) -> None:
        """A text message that is not UTF-8: the connection fails (1007), as RFC 6455 says."""
        self._protocol.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
        self._ended()
        if self.failure is not None:
            self.failure.__cause__ = exc

    def _ended(self) -> None:
        """Once the protocol is no longer open: the error that ends the connection."""
        protocol = self._protocol
        if self.failure is not None or protocol.state is OPEN:
            return
        cause = protocol.parser_exc
        if isinstance(cause, PayloadTooBig):
            text = f"Exceeded maximum message size: {self._limit} bytes"
            self.failure = MessageTooLarge(self._limit, "MESSAGE_TOO_BIG", text)
        elif protocol.close_rcvd is not None:
            close = protocol.close_rcvd  # the peer closed
            self.failure = Closed(close.code, _close_name(close.code), close.reason)
        elif protocol.close_sent is not None:
            close = protocol.close_sent  # we failed the connection (a protocol error)
            self.failure = Closed(close.code, _close_name(close.code), close.reason)
        else:
            self.failure = Closed(None)
        if cause is not None:
            self.failure.__cause__ = cause


def _header(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """The frame header at ``pos``: (first byte, header length, payload length); a header
    length of 0 when it is not all in ``data[:end]``. A masked frame (which a server must
    not send) has its first byte's top bit cleared here: never simple, left to the protocol."""
    if end - pos < 2:
        return 0, 0, 0
    first, second = data[pos], data[pos + 1]
    length, head = second & 0x7F, 2
    if length == 126:
        if end - pos < 4:
            return 0, 0, 0
        length, head = int.from_bytes(data[pos + 2 : pos + 4], "big"), 4
    elif length == 127:
        if end - pos < 10:
            return 0, 0, 0
        length, head = int.from_bytes(data[pos + 2 : pos + 10], "big"), 10
    if second & 0x80:
        return first & 0x7F, head + 4, length
    return first, head, length


def _close_name(code: int) -> str:
    """The close code's name, as trio-websocket (wsproto) names the common ones."""
    try:
        return CloseCode(code).name
    except ValueError:
        return "PRIVATE_RESERVED" if 4000 <= code < 5000 else "LIBRARY_RESERVED"


def _describe_handshake(exc: Exception | None) -> str:
    if isinstance(exc, InvalidStatus):
        return f"the server refused the WebSocket upgrade: HTTP {exc.response.status_code}"
    if exc is None:
        return "the connection closed during the WebSocket upgrade"
    cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
    return f"{exc or type(exc).__name__}{cause}"


__all__ = ["WebSocketsTransport"]
