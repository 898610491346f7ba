"""The transport contract: both WebSocket transports (trio-websocket, and ``websockets``'
Sans-I/O protocol) against the same real servers on 127.0.0.1 (trio-websocket's, a TLS one with
a test CA, and raw TCP ones for what a well-behaved server never does): what they deliver, and
the errors they map to our own. What only one of them does (permessage-deflate) is in
test_websockets_transport.py."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Awaitable, Callable
from functools import partial

import pytest
import trio
import trustme
from helpers.waiting import wait_until
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request

from shard_worker.adapters.tls import client_tls_context
from shard_worker.adapters.transports import TRANSPORTS, open_transport
from shard_worker.adapters.websocket import (
    Closed,
    ConnectFailed,
    MessageTooLarge,
    Transport,
    TrioWebSocket,
)
from shard_worker.adapters.websockets_transport import WebSocketsTransport

Handler = Callable[[WebSocketConnection, WebSocketRequest], Awaitable[None]]
Make = Callable[..., Transport]


@pytest.fixture(params=TRANSPORTS)
def make(request: pytest.FixtureRequest) -> Make:
    """The transport under test, built with the settings a test gives (as ``[websocket]
    transport`` would build it; settings absent from the factory are set directly)."""
    kind = request.param

    def build(**settings: object) -> Transport:
        cls = TrioWebSocket if kind == "trio-websocket" else WebSocketsTransport
        return cls(**settings)  # type: ignore[arg-type]

    build.kind = kind  # type: ignore[attr-defined]
    return build


def test_the_factory_builds_each_kind() -> None:
    built = [
        open_transport(kind, max_message_size=2048, connect_timeout=3.0, compression=True)
        for kind in TRANSPORTS
    ]
    assert [type(t) for t in built] == [WebSocketsTransport, TrioWebSocket]
    assert all(t.max_message_size == 2048 for t in built)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown WebSocket transport"):
        open_transport("wsproto", max_message_size=2048, connect_timeout=3.0, compression=True)


async def serve(nursery: trio.Nursery, handler: Handler, tls: ssl.SSLContext | None = None) -> int:
    """A trio-websocket server running ``handler`` per connection; returns its port."""

    async def accept(request: WebSocketRequest) -> None:
        ws = await request.accept()
        with contextlib.suppress(ConnectionClosed):  # the client left first
            await handler(ws, request)

    server = await nursery.start(serve_websocket, accept, "127.0.0.1", 0, tls)
    return server.port


async def serve_tcp(
    nursery: trio.Nursery, handler: Callable[[trio.SocketStream], Awaitable[None]]
) -> int:
    """A plain TCP server (for servers that misbehave); returns its port."""
    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1]


async def test_connects_with_headers_and_passes_text_and_binary_both_ways(
    nursery: trio.Nursery, make: Make
) -> None:
    seen: dict[str, object] = {}

    async def handler(ws: WebSocketConnection, request: WebSocketRequest) -> None:
        seen["headers"] = dict(request.headers)
        seen["path"] = request.path
        seen["subscribe"] = await ws.get_message()
        await ws.send_message('{"seq":1}')
        await ws.send_message(b"\x00\xff")
        seen["closed"] = await closed_code(ws)

    port = await serve(nursery, handler)
    transport = make(connect_timeout=5)
    with trio.fail_after(5):
        async with transport.connect(
            f"ws://127.0.0.1:{port}/feed?after=3", [("X-Token", "t0k3n")], None
        ) as connection:
            assert connection.extensions == ""  # this server negotiates none
            await connection.send("subscribe")
            assert await connection.receive() == '{"seq":1}'
            assert await connection.receive() == b"\x00\xff"
            await connection.close(4000)
        await wait_until(lambda: "closed" in seen)
    assert seen["headers"][b"x-token"] == b"t0k3n"  # type: ignore[index]
    assert seen["path"] == "/feed?after=3"
    assert seen["subscribe"] == "subscribe"
    assert seen["closed"] == 4000


async def closed_code(ws: WebSocketConnection) -> int | None:
    try:
        while True:
            await ws.get_message()
    except ConnectionClosed as exc:
        return None if exc.reason is None else exc.reason.code


async def test_a_message_over_the_limit_is_our_too_large_error(
    nursery: trio.Nursery, make: Make
) -> None:
    codes: list[int | None] = []

    async def handler(ws: WebSocketConnection, request: WebSocketRequest) -> None:
        await ws.send_message("x" * 1000)
        await ws.send_message("x" * 1025)
        codes.append(await closed_code(ws))

    port = await serve(nursery, handler)
    received: list[str | bytes] = []
    with trio.fail_after(5), pytest.raises(MessageTooLarge) as caught:
        async with make(max_message_size=1024).connect(
            f"ws://127.0.0.1:{port}/", [], None
        ) as connection:
            while True:
                received.append(await connection.receive())
    assert received == ["x" * 1000]
    error = caught.value
    assert (error.code, error.limit) == (1009, 1024)
    assert str(error) == "code 1009 MESSAGE_TOO_BIG (Exceeded maximum message size: 1024 bytes)"
    assert error.__cause__ is not None  # the library's own error, chained
    await wait_until(lambda: codes)
    assert codes == [1009]  # we closed it, with 1009


@pytest.mark.parametrize(
    ("code", "reason", "text"),
    [
        (4001, "bye", "code 4001 PRIVATE_RESERVED (bye)"),
        (1001, "", "code 1001 GOING_AWAY"),
        (1009, "yours was too big", "code 1009 MESSAGE_TOO_BIG (yours was too big)"),
    ],
)
async def test_a_peer_close_is_reported_with_its_code(
    nursery: trio.Nursery, make: Make, code: int, reason: str, text: str
) -> None:
    async def handler(ws: WebSocketConnection, request: WebSocketRequest) -> None:
        await ws.send_message("last")
        await ws.aclose(code, reason or None)

    port = await serve(nursery, handler)
    with trio.fail_after(5), pytest.raises(Closed) as caught:
        async with make().connect(f"ws://127.0.0.1:{port}/", [], None) as connection:
            assert await connection.receive() == "last"
            await connection.receive()
    assert type(caught.value) is Closed  # a feed's 1009 is not *our* too-large close
    assert (caught.value.code, caught.value.reason, str(caught.value)) == (code, reason, text)


async def test_a_failed_tls_handshake_is_reported_at_once(
    nursery: trio.Nursery, make: Make
) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)

    async def handler(ws: WebSocketConnection, request: WebSocketRequest) -> None:
        await ws.send_message("never")

    port = await serve(nursery, handler, server_context)
    tls = client_tls_context("", verify=True)  # the system's CAs: not our test CA
    transport = make(connect_timeout=30)
    for _ in range(2):  # the same context serves again (it is built once per stream)
        with trio.fail_after(3), pytest.raises(ConnectFailed) as caught:  # not after 30 s
            async with transport.connect(f"wss://127.0.0.1:{port}/", [], tls):
                pytest.fail("connected")
        assert str(caught.value).startswith("TLS handshake failed: ")
        assert "certificate verify failed" in str(caught.value)
        assert isinstance(caught.value.__cause__, trio.BrokenResourceError)
        assert isinstance(caught.value.__cause__.__cause__, ssl.SSLError)


async def test_a_trusted_tls_server_connects(nursery: trio.Nursery, make: Make, tmp_path) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))

    async def handler(ws: WebSocketConnection, request: WebSocketRequest) -> None:
        await ws.send_message("hello over TLS")

    port = await serve(nursery, handler, server_context)
    tls = client_tls_context(str(tmp_path / "ca.pem"), verify=True)
    with trio.fail_after(5):
        async with make().connect(f"wss://127.0.0.1:{port}/", [], tls) as connection:
            assert await connection.receive() == "hello over TLS"


async def test_what_never_connects_is_connect_failed(nursery: trio.Nursery, make: Make) -> None:
    async def reject(request: WebSocketRequest) -> None:
        await request.reject(403, body=b"no")

    server = await nursery.start(serve_websocket, reject, "127.0.0.1", 0, None)

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()  # accepts TCP, never answers the upgrade

    silent_port = await serve_tcp(nursery, silent)
    with trio.socket.socket() as unused:  # a port nobody listens on
        await unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    transport = make(connect_timeout=0.5)
    problems = []
    with trio.fail_after(5):
        for url in (
            f"ws://127.0.0.1:{server.port}/",
            f"ws://127.0.0.1:{silent_port}/",  # no answer to the upgrade
            f"ws://127.0.0.1:{closed_port}/",
            f"wss://127.0.0.1:{silent_port}/",  # no answer to the TLS handshake
        ):
            with pytest.raises(ConnectFailed) as caught:
                async with transport.connect(url, [], client_tls_context("", verify=True)):
                    pytest.fail("connected")
            problems.append(str(caught.value))
    assert problems[0] == "the server refused the WebSocket upgrade: HTTP 403"
    assert problems[1] == problems[3] == "ConnectionTimeout (no connection within 0.5s)"
    assert problems[2] == f"all attempts to connect to 127.0.0.1:{closed_port} failed"


async def test_a_close_handshake_that_times_out_does_not_hide_why_we_left(
    nursery: trio.Nursery, make: Make
) -> None:
    """A server that accepts, then never answers our close: leaving the block on our own error
    waits out the disconnect timeout, and our error is what the caller sees."""

    async def deaf(stream: trio.SocketStream) -> None:
        ws = WSConnection(ConnectionType.SERVER)
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, Request):
                    await stream.send_all(ws.send(AcceptConnection()))

    port = await serve_tcp(nursery, deaf)

    class Ours(Exception):
        pass

    with trio.fail_after(5), pytest.raises(Ours):
        async with make(disconnect_timeout=0.2).connect(f"ws://127.0.0.1:{port}/", [], None):
            raise Ours


async def test_pings_are_answered_and_move_last_frame_at(nursery: trio.Nursery, make: Make) -> None:
    """Our ping is answered by the server's pong, which moves ``last_frame_at`` with no message;
    the server's ping is answered by us (its ``ping()`` returns only on our pong)."""
    ponged = trio.Event()

    async def handler(ws: WebSocketConnection, request: WebSocketRequest) -> None:
        await ws.ping(b"srv")
        ponged.set()
        await ws.send_message("after the ping")
        await trio.sleep_forever()

    port = await serve(nursery, handler)
    with trio.fail_after(5):
        async with make().connect(f"ws://127.0.0.1:{port}/", [], None) as connection:
            assert await connection.receive_batch() == ["after the ping"]
            assert ponged.is_set()
            before = connection.last_frame_at
            await trio.sleep(0.05)
            await connection.ping()
            while connection.last_frame_at == before:  # only the pong can move it
                with trio.move_on_after(0.01):
                    await connection.receive_batch()
            assert connection.last_frame_at >= before + 0.05


async def test_a_batch_holds_every_message_of_a_read_in_order(
    nursery: trio.Nursery, make: Make
) -> None:
    """Many small messages, a fragmented one, a large one: all of them, in order, whatever
    the batches (trio-websocket's hold one message each)."""
    sent = [f'{{"seq":{n}}}' for n in range(1, 501)] + ["y" * 200_000, b"\x00" * 70_000]

    async def handler(ws: WebSocketConnection, request: WebSocketRequest) -> None:
        for message in sent:
            await ws.send_message(message)
        await trio.sleep_forever()

    port = await serve(nursery, handler)
    received: list[str | bytes] = []
    batches = 0
    with trio.fail_after(10):
        async with make().connect(f"ws://127.0.0.1:{port}/", [], None) as connection:
            await trio.sleep(0.3)  # the server sends them all meanwhile: reads find many
            while len(received) < len(sent):
                received += await connection.receive_batch()
                batches += 1
    assert received == sent
    if make.kind == "websockets":  # type: ignore[attr-defined]
        assert batches < len(sent) / 10
