"""A reference sequenced WebSocket feed for tests, the demo and benchmarks.

``ws://HOST:PORT/feed/<name>?after=N`` replays the kept history after N, then goes live.
Each stream numbers its messages 1, 2, 3... and generates ``rate`` of them per second in
ticks, so high rates work.

With ``live`` (``shardvisor feed --live``) it is a live-only feed, as most real ones are
(exchanges, chat and telemetry gateways): a connection gets only the messages generated after
it was accepted, whatever ``after`` it asks for; the numbering keeps counting, so a client
sees what it missed as a jump of its sequence numbers.

Connections send straight from the shared history by index: a slow client costs no memory
(it only falls behind, and skips to the oldest kept message once its position has been
dropped).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import ssl
import time
from collections.abc import Iterable
from functools import partial
from urllib.parse import parse_qs, urlsplit

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket

TICK = 0.01  # seconds between generation ticks
FEED_PREFIX = "/feed/"
DROP_TIMEOUT = 1.0
LIVE_HELP = "live-only: a client gets only what is generated after it connected (no replay)"


class FeedStream:
    """One stream: a ring buffer of the last ``max_history`` message texts."""

    def __init__(self, name: str, rate: float, payload_bytes: int, max_history: int) -> None:
        self.name = name
        self.rate = rate
        self.payload_bytes = payload_bytes
        self.max_history = max_history
        self.first_seq = 1  # oldest kept
        self.next_seq = 1  # next to generate
        self._ring: list[str] = []
        self._name_json = json.dumps(name)
        self._pad = "x" * payload_bytes
        self._more = trio.Event()  # set (and replaced) whenever messages are appended

    @property
    def last_seq(self) -> int:
        return self.next_seq - 1

    def message(self, seq: int) -> str:
        """The text of message ``seq`` (must be kept: first_seq <= seq <= last_seq)."""
        if not self.first_seq <= seq < self.next_seq:
            raise IndexError(f"seq {seq} not kept ({self.first_seq}..{self.last_seq})")
        return self._ring[(seq - 1) % self.max_history]

    def append(self, count: int) -> None:
        """Generate ``count`` new messages and wake the connections waiting for them."""
        ts = time.time()
        for _ in range(count):
            text = self._render(self.next_seq, ts)
            if len(self._ring) < self.max_history:
                self._ring.append(text)
            else:
                self._ring[(self.next_seq - 1) % self.max_history] = text
            self.next_seq += 1
        self.first_seq = max(self.first_seq, self.next_seq - self.max_history)
        if count:
            self._more.set()
            self._more = trio.Event()

    async def wait_beyond(self, seq: int) -> None:
        """Return once a message after ``seq`` exists."""
        while self.last_seq <= seq:
            await self._more.wait()

    async def generate(self) -> None:
        """Append ``rate`` messages per second, in ticks, until cancelled."""
        started = trio.current_time()
        produced = 0
        while True:
            await trio.sleep(TICK)
            due = int((trio.current_time() - started) * self.rate) - produced
            self.append(due)
            produced += due

    def _render(self, seq: int, ts: float) -> str:
        head = f'{{"seq":{seq},"stream":{self._name_json},"ts":{ts:.6f},"pad":"'
        return f'{head}{self._pad[: max(0, self.payload_bytes - len(head) - 2)]}"}}'


class FeedServer:
    def __init__(
        self,
        rate: float,
        payload_bytes: int = 100,
        max_history: int = 1_000_000,
        stream_names: Iterable[str] = (),
        ssl_context: ssl.SSLContext | None = None,
        *,
        live: bool = False,
    ) -> None:
        """``ssl_context``: serve wss:// with this server-side context (None: plain ws://).
        ``live``: no replay; a connection starts with the next message generated."""
        if rate <= 0:
            raise ValueError("rate must be > 0 messages/s")
        if max_history < 1:
            raise ValueError("max_history must be >= 1")
        self.rate = rate
        self.payload_bytes = payload_bytes
        self.max_history = max_history
        self._initial = tuple(stream_names)
        self.ssl_context = ssl_context
        self.live = live
        self._streams: dict[str, FeedStream] = {}
        self._connections: dict[WebSocketConnection, str] = {}
        self._nursery: trio.Nursery | None = None

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled; reports the bound port (port 0 picks a free one)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for stream in self._streams.values():  # created before serving: generate now
                nursery.start_soon(stream.generate)
            for name in self._initial:
                self.stream(name)
            server = await nursery.start(
                partial(
                    serve_websocket,
                    self._handle,
                    host,
                    port,
                    self.ssl_context,
                    handler_nursery=nursery,
                )
            )
            task_status.started(server.port)

    def stream(self, name: str) -> FeedStream:
        """The stream ``name``, created (and generating, once serving) on first use."""
        stream = self._streams.get(name)
        if stream is None:
            stream = FeedStream(name, self.rate, self.payload_bytes, self.max_history)
            self._streams[name] = stream
            if self._nursery is not None:
                self._nursery.start_soon(stream.generate)
        return stream

    def last_seq(self, stream: str) -> int:
        """Last generated sequence of ``stream`` (0 if it does not exist yet)."""
        feed = self._streams.get(stream)
        return feed.last_seq if feed is not None else 0

    def connection_count(self, stream: str | None = None) -> int:
        """Accepted connections not yet closed or dropped (of one stream, or all)."""
        return sum(stream in (None, name) for name in self._connections.values())

    async def drop_connections(self, stream: str | None = None) -> None:
        """Close the active connections (of one stream, or all): clients must reconnect.

        A client may see its handshake complete just before the server registers the
        connection; wait for ``connection_count()`` first to be sure a drop reaches it.
        """
        victims = [ws for ws, name in self._connections.items() if stream in (None, name)]
        for ws in victims:
            del self._connections[ws]
        async with trio.open_nursery() as nursery:
            for ws in victims:
                nursery.start_soon(self._drop, ws)

    async def _drop(self, ws: WebSocketConnection) -> None:
        with trio.move_on_after(DROP_TIMEOUT):
            await ws.aclose(code=1001, reason="dropped by test hook")

    async def _handle(self, request: WebSocketRequest) -> None:
        parts = urlsplit(request.path)
        name = parts.path.removeprefix(FEED_PREFIX)
        if not parts.path.startswith(FEED_PREFIX) or not name or "/" in name:
            await request.reject(404, body=b"unknown path: use /feed/<stream>\n")
            return
        try:
            after = int(parse_qs(parts.query).get("after", ["0"])[-1])
        except ValueError:
            await request.reject(400, body=b"after must be an integer\n")
            return
        stream = self.stream(name)
        ws = await request.accept()
        if self.live:
            after = stream.last_seq  # only what is generated from now on
        self._connections[ws] = name
        try:
            await self._send_from(ws, stream, after)
        except ConnectionClosed:
            pass  # the client left, or drop_connections closed it: both are normal
        finally:
            self._connections.pop(ws, None)  # (drop_connections may have removed it)

    async def _send_from(self, ws: WebSocketConnection, stream: FeedStream, after: int) -> None:
        seq = max(after + 1, stream.first_seq)
        while True:
            await stream.wait_beyond(seq - 1)
            while seq <= stream.last_seq:
                seq = max(seq, stream.first_seq)  # fell behind the kept history: skip ahead
                await ws.send_message(stream.message(seq))
                seq += 1


async def run_feed(
    host: str, port: int, streams: int | list[str], rate: float, *, live: bool = False
) -> None:
    """Run a feed until cancelled (``shardvisor feed``); streams N means "s1".."sN"."""
    names = [f"s{i}" for i in range(1, streams + 1)] if isinstance(streams, int) else streams
    server = FeedServer(rate, stream_names=names, live=live)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(server.serve, host, port)
        kind = "live-only " if live else ""
        print(
            f"{kind}feed listening on ws://{host}:{bound}/feed/<stream>"
            f" (streams: {', '.join(names)})",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    """``python -m supervisor.devtools.feed``: the feed as a process of its own (the servers of
    ``supervisor.devtools.servers``); named streams generate from the start, others are created
    on first use. SIGTERM or Ctrl-C stops it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--rate", type=float, default=100.0, help="messages/s per stream")
    parser.add_argument("--streams", default="", help="comma-separated stream names")
    parser.add_argument("--live", action="store_true", help=LIVE_HELP)
    args = parser.parse_args(argv)
    names = [name for name in args.streams.split(",") if name]
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(partial(run_feed, args.host, args.port, names, args.rate, live=args.live))


if __name__ == "__main__":
    main()
