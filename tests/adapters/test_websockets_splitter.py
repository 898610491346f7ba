"""The websockets transport's split of a connection's bytes into messages (its own cut for
simple frames, the library's protocol for the rest) against the library's own server-side
protocol: every message, in order, wherever the reads cut the bytes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.client import ClientProtocol
from websockets.extensions.permessage_deflate import (
    ClientPerMessageDeflateFactory,
    ServerPerMessageDeflateFactory,
)
from websockets.frames import Frame, Opcode
from websockets.protocol import OPEN
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from shard_worker.adapters.websocket import MessageTooLarge
from shard_worker.adapters.websockets_transport import _Splitter

LIMIT = 4096
KEEP = 256  # a simple frame up to this size waits in the splitter for its end


def connected(deflate: bool) -> tuple[_Splitter, ServerProtocol]:
    """A client protocol in its splitter and a server protocol, after an in-memory handshake."""
    offer = [ClientPerMessageDeflateFactory()] if deflate else None
    client = ClientProtocol(parse_uri("ws://feed/"), extensions=offer, max_size=LIMIT)
    server = ServerProtocol(extensions=[ServerPerMessageDeflateFactory()] if deflate else None)
    client.send_request(client.connect())
    for data in client.data_to_send():
        server.receive_data(data)
    [request] = server.events_received()
    server.send_response(server.accept(request))  # type: ignore[arg-type]
    for data in server.data_to_send():
        client.receive_data(data)
    client.events_received()
    assert client.state is OPEN and len(client.extensions) == deflate
    split = _Splitter(client, LIMIT, KEEP)
    split.negotiated()
    return split, server


def script(server: ServerProtocol) -> list[str | bytes]:
    """A feed's worth of frames of every kind; returns the messages they make."""
    sent: list[str | bytes] = []
    for n in range(30):
        text = f'{{"seq":{n},"pad":"{"x" * (n * 37 % 300)}"}}'
        server.send_text(text.encode())
        sent.append(text)
        if n % 7 == 3:
            server.send_ping(b"p%d" % n)
        if n % 9 == 4:
            server.send_binary(bytes(range(n % 256)) * 3)
            sent.append(bytes(range(n % 256)) * 3)
        if n % 11 == 5:  # a fragmented message, a ping between its fragments
            server.send_text(b"frag", fin=False)
            server.send_ping(b"mid")
            server.send_continuation("mented é".encode(), fin=False)
            server.send_continuation(b"!", fin=True)
            sent.append("fragmented é!")
    return sent


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=60, deadline=None)
@given(deflate=st.booleans(), cuts=st.lists(st.integers(min_value=0), max_size=40))
def test_every_message_in_order_wherever_the_reads_cut(deflate: bool, cuts: list[int]) -> None:
    split, server = connected(deflate)
    sent = script(server)
    wire = b"".join(server.data_to_send())
    received: list[str | bytes] = []
    for chunk in chunks(wire, cuts):
        split.feed(chunk, received)
    assert received == sent
    assert split.failure is None
    pongs = [d for d in split._protocol.data_to_send() if d]
    assert len(pongs) >= 1  # (the pings were answered by the protocol)


@pytest.mark.parametrize("deflate", [False, True])
def test_a_message_over_the_limit_ends_the_connection_after_those_before(deflate: bool) -> None:
    split, server = connected(deflate)
    server.send_text(b"before")
    server.send_binary(b"\x00" * (LIMIT + 1))  # (deflated: a few bytes that inflate past it)
    server.send_text(b"after")
    received: list[str | bytes] = []
    split.feed(b"".join(server.data_to_send()), received)
    assert received == ["before"]
    assert isinstance(split.failure, MessageTooLarge)
    assert split.failure.limit == LIMIT
    [close] = [d for d in split._protocol.data_to_send() if d]
    assert close[0] == 0x88  # FIN + close, masked (a client's): the code is after the key
    code = bytes(b ^ close[2 + i] for i, b in enumerate(close[6:8]))
    assert int.from_bytes(code, "big") == 1009


def test_a_text_message_that_is_not_utf8_fails_the_connection_with_1007() -> None:
    split, server = connected(False)
    server.send_frame(Frame(Opcode.TEXT, b"ok"))
    server.send_frame(Frame(Opcode.TEXT, b"\xff\xfe"))
    received: list[str | bytes] = []
    split.feed(b"".join(server.data_to_send()), received)
    assert received == ["ok"]
    assert split.failure is not None and split.failure.code == 1007
