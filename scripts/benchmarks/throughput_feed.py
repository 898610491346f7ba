"""Row 4's feed: 100-byte sequenced JSON text messages, as fast as TCP takes them (or at --rate).

    python -m benchmarks.throughput_feed --port PORT [--rate MSG_PER_S]

A WebSocket handshake by wsproto, then raw frames built in bulk, so that the feed is never the
bottleneck of the receiver measured. ``ws://127.0.0.1:PORT/blast?after=N`` starts after N;
``&deflate=1`` accepts permessage-deflate when the client offers it (RFC 7692, context takeover,
as most feeds that compress do), and the frames are compressed one message at a time like any
server would. Unlike the reference feed it keeps no history and generates per connection.
The messages look like a trade feed's (a symbol, a side, a price and a size that vary), so
that deflate meets text it can compress the way it would in production, not a run of padding.
"""

from __future__ import annotations

import argparse
import contextlib
import zlib
from collections.abc import Callable
from functools import partial
from urllib.parse import parse_qs, urlsplit

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request
from wsproto.extensions import PerMessageDeflate
from wsproto.utilities import ProtocolError

PAYLOAD_BYTES = 100
CHUNK_MESSAGES = 512  # frames per send_all


TEXT, COMPRESSED_TEXT = 0x81, 0xC1  # FIN + text; with RSV1: a compressed message
SYMBOLS = (b"BTC-USD", b"ETH-USD", b"SOL-USD", b"ETH-BTC")


def frame(text: bytes, first: int = TEXT) -> bytes:
    n = len(text)
    if n < 126:
        return bytes((first, n)) + text
    if n < 65536:
        return bytes((first, 126)) + n.to_bytes(2, "big") + text
    return bytes((first, 127)) + n.to_bytes(8, "big") + text


def _trade(i: int) -> bytes:
    """The fields after ``seq`` of trade variant ``i``: they vary as a trade feed's would."""
    mix = i * 2654435761 & 0xFFFFFFFF  # Knuth's multiplicative hash: cheap, varied digits
    return b'"sym":"%s","side":"%s","px":"%d.%02d","qty":"%d.%04d"' % (
        SYMBOLS[mix & 3],
        b"buy" if mix & 4 else b"sell",
        30000 + (mix >> 8) % 5000,
        mix % 100,
        (mix >> 4) % 10,
        (mix >> 12) % 10000,
    )


_TRADES = [_trade(i) for i in range(4096)]  # made once: the feed must outrun every receiver
_PAD = b"x" * PAYLOAD_BYTES


def message(seq: int) -> bytes:
    """Message ``seq``: a trade (one of 4096 variants), padded to PAYLOAD_BYTES."""
    head = b'{"seq":%d,%s,"pad":"' % (seq, _TRADES[seq & 4095])
    return head + _PAD[: max(0, PAYLOAD_BYTES - len(head) - 2)] + b'"}'


def deflater() -> Callable[[bytes], bytes]:
    """permessage-deflate's compression of one message after another (context takeover):
    a raw deflate stream, flushed at each message's end, without the flush's last 4 bytes."""
    compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -zlib.MAX_WBITS)

    def deflate(text: bytes) -> bytes:
        return (compressor.compress(text) + compressor.flush(zlib.Z_SYNC_FLUSH))[:-4]

    return deflate


def frames(first: int, last: int, deflate: Callable[[bytes], bytes] | None) -> bytes:
    """The frames of messages ``first`` to ``last``, compressed with ``deflate`` if given."""
    if deflate is None:
        return b"".join(frame(message(n)) for n in range(first, last + 1))
    return b"".join(frame(deflate(message(n)), COMPRESSED_TEXT) for n in range(first, last + 1))


async def handshake(stream: trio.SocketStream) -> tuple[str, bool]:
    """The request's target once the upgrade is accepted ("" if the client left), and
    whether permessage-deflate was agreed (asked for by ``deflate=1`` and offered)."""
    ws = WSConnection(ConnectionType.SERVER)
    while True:
        data = await stream.receive_some(65536)
        if not data:
            return "", False
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, Request):
                wanted = "deflate=1" in event.target
                offered = any("permessage-deflate" in str(e) for e in event.extensions)
                deflate = wanted and offered
                extensions = [PerMessageDeflate()] if deflate else []
                await stream.send_all(ws.send(AcceptConnection(extensions=extensions)))
                return event.target, deflate


async def serve_connection(stream: trio.SocketStream, rate: float) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        try:
            target, deflate = await handshake(stream)
        except ProtocolError:
            return  # not a WebSocket client (a readiness probe)
        if not target:
            return
        compress = deflater() if deflate else None
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
            await stream.send_all(frames(seq + 1, seq + count, compress))
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
