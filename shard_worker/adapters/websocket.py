"""The WebSocket client, behind one narrow interface (``Transport``), and its trio-websocket
implementation (the other, ``websockets``' Sans-I/O protocol, is adapters/websockets_transport.py;
``[websocket] transport`` chooses, adapters/transports.py builds).

The reader needs these things of a connection: open it (URL, extra headers, TLS), receive the
messages of one read from the socket, send one (a subscribe request), ping, close it with a
code; and two facts: when the peer last sent anything (``last_frame_at``, for the keepalive) and
which extensions the handshake agreed on (``extensions``, logged at connect). ``connect`` is an
async context manager, not a plain call: a trio WebSocket client runs a background task that
reads the socket, and that task lives in a nursery of the ``async with``; leaving it closes the
connection (1000).

Errors are our own, mapped once at the boundary (the ``async with``), never per message:

- ``ConnectFailed``: the connection was never open (TCP, the TLS handshake, the HTTP upgrade,
  the connect timeout). A failed TLS handshake is reported as soon as it fails;
- ``Closed``: the connection ended (``code`` and ``reason`` as the close frame said);
- ``MessageTooLarge`` (a ``Closed``): *we* closed it with 1009 because a message was over
  ``max_message_size``; nothing of that message is kept.

``receive`` and ``send`` are the library's own methods, not wrappers: the receive loop is the
hot path, and the errors they raise reach the caller mapped when they leave the ``async with``.
trio-websocket hands over one message at a time, so its ``receive_batch`` is a list of one; it
negotiates no extension, so it never compresses.

This adapter opens the TCP connection and does the TLS handshake itself, then hands the stream
to trio-websocket for the upgrade (``wrap_client_stream``), so that it owns the socket: closed
on every way out, a TLS failure seen where it happens, one deadline for the whole connect.
(``open_websocket_url`` of trio-websocket 0.12 leaves the socket of a failed connect to the
garbage collector, reports a failed TLS handshake only as a timeout, and waits for ever when a
server accepts the TCP connection but never answers the upgrade.)
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import NoReturn, Protocol
from urllib.parse import urlsplit

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    wrap_client_stream,
)

from shard_worker.contract.pipe import DEFAULT_MAX_MESSAGE_SIZE

RECEIVE_BUFFER_BYTES = 64 * 1024  # trio-websocket's 4 KiB default costs a syscall per message
DISCONNECT_TIMEOUT = 1.0  # a close handshake must not hold up a stop or a fence exit
TOO_LARGE = 1009
_TOO_LARGE_REASON = "Exceeded maximum message size"  # trio-websocket's own close reason
Stream = trio.SocketStream | trio.SSLStream[trio.SocketStream]


class WebSocketError(Exception):
    """Root of the WebSocket adapter's errors."""


class ConnectFailed(WebSocketError):
    """The connection could not be opened; the message says why."""


class Closed(WebSocketError):
    """The connection ended: ``code`` (None when it ended without a close frame), its name
    and the close frame's ``reason``."""

    def __init__(self, code: int | None, name: str = "", reason: str = "") -> None:
        self.code, self.name, self.reason = code, name, reason
        if code is None:
            description = "connection closed"
        else:
            description = f"code {code} {name}" + (f" ({reason})" if reason else "")
        super().__init__(description)


class MessageTooLarge(Closed):
    """We closed the connection (1009): a message was over ``limit`` bytes."""

    def __init__(self, limit: int, name: str = "", reason: str = "") -> None:
        super().__init__(TOO_LARGE, name, reason)
        self.limit = limit


class Connection(Protocol):
    """One open WebSocket connection."""

    # trio.current_time() when the peer last sent anything (a message, a pong, any frame).
    last_frame_at: float
    # The Sec-WebSocket-Extensions the server answered ("" = none), for the connect log line.
    extensions: str

    def receive(self) -> Awaitable[str | bytes]:
        """The next message: text frames as str, binary frames as bytes."""
        ...

    def receive_batch(self) -> Awaitable[list[str | bytes]]:
        """The next messages, at least one: every complete message of one read from the socket
        where the transport can (the reader handles them in one go, not one await each)."""
        ...

    async def ping(self) -> None:
        """Send a ping; its pong moves ``last_frame_at`` (nothing waits for it here)."""
        ...

    def abandon(self) -> None:
        """The peer is gone (no answer to a ping): leaving the ``async with`` closes the
        socket at once, without waiting for a close handshake that cannot come."""
        ...

    def send(self, message: str) -> Awaitable[None]:
        """Send one text message."""
        ...

    async def close(self, code: int = 1000) -> None:
        """Close with ``code`` (the ``async with`` closes with 1000 by itself)."""
        ...


class Transport(Protocol):
    """Opens connections; its settings (limits, timeouts) are its own."""

    def connect(
        self, url: str, headers: Sequence[tuple[str, str]], tls: ssl.SSLContext | None
    ) -> AbstractAsyncContextManager[Connection]:
        """``async with transport.connect(...) as connection``: open for the block's duration.
        ``tls`` is the context of a wss:// URL. Raises ConnectFailed, Closed or
        MessageTooLarge, and lets the block's own errors through."""
        ...


class _TrioConnection:
    """A trio-websocket connection as a ``Connection``: its own methods, no wrapper."""

    extensions = ""  # trio-websocket 0.12 negotiates none
    abandoned = False

    def __init__(self, ws: WebSocketConnection, nursery: trio.Nursery) -> None:
        self._ws = ws
        self._nursery = nursery
        self.receive: Callable[[], Awaitable[str | bytes]] = ws.get_message
        self.send: Callable[[str], Awaitable[None]] = ws.send_message
        self.last_frame_at = trio.current_time()

    async def receive_batch(self) -> list[str | bytes]:
        message = await self._ws.get_message()
        self.last_frame_at = trio.current_time()
        return [message]

    async def ping(self) -> None:
        """trio-websocket's ping waits for its pong: a task of the connection's nursery does
        (a connection that closes meanwhile ends it with the rest)."""
        self._nursery.start_soon(self._await_pong)

    async def _await_pong(self) -> None:
        await self._ws.ping()
        self.last_frame_at = trio.current_time()

    def abandon(self) -> None:
        self.abandoned = True

    async def close(self, code: int = 1000) -> None:
        await self._ws.aclose(code)


@attrs.frozen
class Target:
    """Where a ws:// or wss:// URL points (both transports connect the same way)."""

    host: str
    port: int
    resource: str  # path and query
    host_header: str
    secure: bool

    @classmethod
    def of(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ConnectFailed(f"not a WebSocket URL: {url!r}")
        secure = parts.scheme == "wss"
        port = parts.port or (443 if secure else 80)
        resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.hostname
        return cls(host, port, resource, host if port in (80, 443) else f"{host}:{port}", secure)


@attrs.frozen
class TransportSettings:
    """What both transports are built with."""

    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    connect_timeout: float = 10.0
    disconnect_timeout: float = DISCONNECT_TIMEOUT
    receive_buffer_size: int = RECEIVE_BUFFER_BYTES

    async def open_stream(self, target: Target, tls: ssl.SSLContext | None) -> tuple[Stream, float]:
        """The TCP (and TLS) stream, and the deadline the upgrade must meet: one
        ``connect_timeout`` for the whole connect."""
        with trio.move_on_after(self.connect_timeout) as connecting:
            return await open_stream(target, tls), connecting.deadline
        raise ConnectFailed(self._timed_out())

    def _timed_out(self) -> str:
        return f"ConnectionTimeout (no connection within {self.connect_timeout:g}s)"


@attrs.frozen
class TrioWebSocket(TransportSettings):
    """The trio-websocket ``Transport``: no subprotocol, no extension."""

    @asynccontextmanager
    async def connect(
        self, url: str, headers: Sequence[tuple[str, str]], tls: ssl.SSLContext | None
    ) -> AsyncIterator[Connection]:
        target = Target.of(url)
        stream, deadline = await self.open_stream(target, tls)
        try:
            async with trio.open_nursery() as nursery:
                ws = await self._upgrade(nursery, stream, target, headers, deadline)
                connection = _TrioConnection(ws, nursery)
                try:
                    yield connection
                finally:
                    try:
                        wait = 0 if connection.abandoned else self.disconnect_timeout
                        with trio.move_on_after(wait):
                            await ws.aclose()  # (no answer in time: the socket is closed below)
                    finally:
                        nursery.cancel_scope.cancel()  # the reader task
        except (BaseExceptionGroup, ConnectionClosed, HandshakeError) as exc:
            one = _the_one(exc)  # (a nursery raises a group, even of one)
            mapped = self._mapped(one)
            if mapped is one:
                _reraise(one)  # the block's own error, unchanged
            raise mapped from one
        finally:
            await trio.aclose_forcefully(stream)

    async def _upgrade(
        self,
        nursery: trio.Nursery,
        stream: Stream,
        target: Target,
        headers: Sequence[tuple[str, str]],
        deadline: float,
    ) -> WebSocketConnection:
        """The HTTP upgrade, by ``deadline``; trio-websocket's reader task runs in ``nursery``."""
        with trio.move_on_at(deadline):
            return await wrap_client_stream(
                nursery,
                stream,
                target.host_header,
                target.resource,
                extra_headers=[(name.encode(), value.encode()) for name, value in headers] or None,
                max_message_size=self.max_message_size,
                receive_buffer_size=self.receive_buffer_size,
            )
        raise ConnectFailed(self._timed_out())

    def _mapped(self, exc: BaseException) -> BaseException:
        """Ours for the library's errors; anything else (the block's own errors) as it is."""
        if isinstance(exc, ConnectionClosed):
            return self._closed(exc)
        if isinstance(exc, HandshakeError):
            return ConnectFailed(_describe_handshake(exc))
        return exc

    def _closed(self, exc: ConnectionClosed) -> Closed:
        """A close we made over a message's size is MessageTooLarge (a feed that closes with
        1009 means one of *our* messages was too big, which is something else)."""
        reason = exc.reason
        if reason is None:
            return Closed(None)
        text = reason.reason or ""
        if reason.code == TOO_LARGE and text.startswith(_TOO_LARGE_REASON):
            return MessageTooLarge(self.max_message_size, reason.name, text)
        return Closed(reason.code, reason.name, text)


async def open_stream(target: Target, tls: ssl.SSLContext | None) -> Stream:
    """The TCP connection, and for wss:// its TLS handshake done here: a failure is seen at
    once, with its reason (trio-websocket would start the handshake in its reader task)."""
    try:
        tcp = await trio.open_tcp_stream(target.host, target.port)
    except OSError as exc:
        raise ConnectFailed(str(exc)) from exc
    if not target.secure:
        return tcp
    stream = trio.SSLStream(
        tcp, tls or ssl.create_default_context(), server_hostname=target.host, https_compatible=True
    )
    try:
        await stream.do_handshake()
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(tcp)
        raise ConnectFailed(f"TLS handshake failed: {exc.__cause__ or exc}") from exc
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise
    return stream


def _the_one(exc: BaseException) -> BaseException:
    """What a nursery's group stands for: the block's own error (itself a group, perhaps), or
    the reader task's (a rejected upgrade); a Cancelled only when there is nothing else."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    inner = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)] or exc.exceptions
    return inner[0]


def _reraise(exc: BaseException) -> NoReturn:
    """Raise ``exc`` as it was, without the group it came in as its context."""
    context = exc.__context__
    try:
        raise exc
    finally:
        exc.__context__ = context


def _describe_handshake(exc: HandshakeError) -> str:
    """Handshake errors wrap the interesting OSError; show it (str(exc) is often empty)."""
    if isinstance(exc, ConnectionRejected):
        return f"the server refused the WebSocket upgrade: HTTP {exc.status_code}"
    text = str(exc) or type(exc).__name__
    return f"{text}: {exc.__cause__}" if exc.__cause__ is not None else text
