"""Row 4's feed: 100-byte sequenced JSON text messages, as fast as TCP takes them (or at --rate).

    python -m benchmarks.throughput_feed --port PORT [--rate MSG_PER_S]

A WebSocket handshake by wsproto, then raw frames built in bulk, so that the feed is never the
bottleneck of the receiver measured. ``ws://127.0.0.1:PORT/blast?after=N`` starts after N.
Unlike the reference feed it keeps no history and generates per connection.
"""

from __future__ import annotations

import argparse
import contextlib
from functools import partial
from urllib.parse import parse_qs, urlsplit

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request
from wsproto.utilities import ProtocolError

PAYLOAD_BYTES = 100
CHUNK_MESSAGES = 512  # frames per send_all


def frame(text: bytes) -> bytes:
    n = len(text)
    if n < 126:
        return bytes((0x81, n)) + text
    if n < 65536:
        return bytes((0x81, 126)) + n.to_bytes(2, "big") + text
    return bytes((0x81, 127)) + n.to_bytes(8, "big") + text


def message(seq: int) -> bytes:
    head = b'{"seq":%d,"pad":"' % seq
    return head + b"x" * max(0, PAYLOAD_BYTES - len(head) - 2) + b'"}'


async def handshake(stream: trio.SocketStream) -> str:
    """The request's target once the upgrade is accepted ("" if the client left)."""
    ws = WSConnection(ConnectionType.SERVER)
    while True:
        data = await stream.receive_some(65536)
        if not data:
            return ""
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, Request):
                await stream.send_all(ws.send(AcceptConnection()))
                return event.target


async def serve_connection(stream: trio.SocketStream, rate: float) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        try:
            target = await handshake(stream)
        except ProtocolError:
            return  # not a WebSocket client (a readiness probe)
        if not target:
            return
        seq = int(parse_qs(urlsplit(target).query).get("after", ["0"])[0])
        started = trio.current_time()
        while True:
            count = CHUNK_MESSAGES
            if rate:
                due = int((trio.current_time() - started) * rate) - seq
                if due <= 0:
                    await trio.sleep(0.005)
                    continue
                count = min(count, due)
            await stream.send_all(
                b"".join(frame(message(n)) for n in range(seq + 1, seq + count + 1))
            )
            seq += count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.0, help="messages/s (0: as fast as TCP)")
    args = parser.parse_args()

    async def handler(stream: trio.SocketStream) -> None:
        await serve_connection(stream, args.rate)

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(partial(trio.serve_tcp, handler, args.port, host="127.0.0.1"))


if __name__ == "__main__":
    main()
