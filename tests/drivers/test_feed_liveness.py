"""Issue 15's proof: a real child against real servers on 127.0.0.1, for both transports.

A feed that goes silent (still answering pings) is reconnected within idle_timeout + 1 s and
resumes without a gap; a connection black-holed by a proxy is reconnected within ping_interval +
ping_timeout + 1 s; a quiet feed that answers pings is left alone; a compressed feed delivers
every message; a decompression bomb is dead-lettered and the child stays up.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import attrs
import pytest
import trio
from helpers.waiting import wait_until
from helpers.worker_helpers import FAST_SETTINGS, make_start, read_records, spawn_worker, stop_in
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket
from websockets.trio.server import ServerConnection, serve
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Ping, Request

from shard_worker.contract.pipe import (
    STANDBY,
    TRANSPORTS,
    Checkpoint,
    Heartbeat,
    Promote,
    Ready,
    StandbyReady,
    StandbySettings,
    StreamSpec,
    WorkerSettings,
)
from supervisor.devtools.feed import FeedServer

pytestmark = pytest.mark.slow
SLACK = 1.0  # what the issue allows beyond a timeout: a backoff and a connect


@pytest.fixture(params=TRANSPORTS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


def settings(kind: str, **timers: float) -> WorkerSettings:
    return attrs.evolve(FAST_SETTINGS, transport=kind, heartbeat_interval=0.25, **timers)


def message(seq: int) -> str:
    return json.dumps({"seq": seq, "pad": "x" * 40})


def after_of(path: str) -> int:
    return int(parse_qs(urlsplit(path).query).get("after", ["0"])[0])


def seqs(out: Path, stream: str = "a") -> list[int]:
    return [record["seq"] for record in read_records(out / "shard-1" / f"{stream}.1.jsonl")]


@attrs.define
class Connected:
    at: float  # trio.current_time() of the accept
    after: int  # the {after} it asked for
    last_sent: float = 0.0


async def scripted_feed(
    nursery: trio.Nursery, script: Callable[[int, int], list[str]]
) -> tuple[int, list[Connected]]:
    """A trio-websocket feed: connection n (from 0) gets ``script(n, after)``, then silence
    (it still answers pings). Returns its port and the connections, in order."""
    connections: list[Connected] = []

    async def accept(request: WebSocketRequest) -> None:
        ws = await request.accept()
        connection = Connected(trio.current_time(), after_of(request.path))
        script_of = script(len(connections), connection.after)
        connections.append(connection)
        with contextlib.suppress(ConnectionClosed):
            for text in script_of:
                await ws.send_message(text)
            connection.last_sent = trio.current_time()
            await ws.get_message()  # (never comes: answers pings until the client leaves)

    server = await nursery.start(serve_websocket, accept, "127.0.0.1", 0, None)
    return server.port, connections


async def test_a_feed_gone_silent_is_reconnected_within_idle_timeout_and_resumes(
    nursery: trio.Nursery, tmp_path: Path, kind: str
) -> None:
    idle = 1.0

    def script(n: int, after: int) -> list[str]:  # 5 messages on each of two connections
        return [message(seq) for seq in range(after + 1, after + 6)] if n < 2 else []

    port, connections = await scripted_feed(nursery, script)
    url = f"ws://127.0.0.1:{port}/a?after={{after}}"
    stream = StreamSpec(id="a", url=url, sequence="seq", idle_timeout=idle)
    async with spawn_worker() as worker:
        await worker.send(make_start([stream], tmp_path, settings=settings(kind)))
        await worker.expect(Ready)
        await wait_until(lambda: len(connections) >= 3, timeout=10)
        stale = await worker.wait_for(
            Heartbeat,
            timeout=5,
            predicate=lambda b: b.stale == ["a"] and b.streams["a"]["reconnects"] >= 2,
        )
        await worker.send(stop_in())
        assert await worker.wait() == 0
    for before, later in itertools.pairwise(connections[:3]):
        assert later.at - before.last_sent <= idle + SLACK
    assert [c.after for c in connections[:3]] == [0, 5, 10]  # resumed from the checkpoint
    assert seqs(tmp_path) == list(range(1, 11))  # no gap, nothing twice
    assert stale.streams["a"]["reconnect.idle"] >= 2
    assert stale.streams["a"]["reconnects"] == sum(
        n for key, n in stale.streams["a"].items() if key.startswith("reconnect.")
    )
    assert "no message for 1s (idle)" in worker.log


class BlackHoleProxy:
    """A TCP proxy to ``port``; ``hole()`` makes every connection open now swallow what it
    gets both ways (the client's socket stays open, nothing answers); later ones pass."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.accepted: list[float] = []
        self._holed: set[int] = set()
        self._open: set[int] = set()

    def hole(self) -> None:
        self._holed |= self._open

    async def handle(self, client: trio.SocketStream) -> None:
        ident = len(self.accepted)
        self.accepted.append(trio.current_time())
        self._open.add(ident)
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.port)
            async with upstream, trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, client, upstream, ident, nursery.cancel_scope)
                nursery.start_soon(self._pump, upstream, client, ident, nursery.cancel_scope)
        finally:
            self._open.discard(ident)

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, ident: int, done: trio.CancelScope
    ) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await source.receive_some(65536):
                if ident not in self._holed:
                    await sink.send_all(data)
        done.cancel()


async def test_a_black_holed_connection_is_reconnected_within_a_pings_round(
    nursery: trio.Nursery, tmp_path: Path, kind: str
) -> None:
    interval, timeout = 0.5, 0.5
    feed = FeedServer(rate=200.0)
    feed_port = await nursery.start(feed.serve, "127.0.0.1", 0)
    proxy = BlackHoleProxy(feed_port)
    listeners = await nursery.start(partial(trio.serve_tcp, proxy.handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    stream = StreamSpec(id="a", url=f"ws://127.0.0.1:{port}/feed/a?after={{after}}", sequence="seq")
    timers = {"ping_interval": interval, "ping_timeout": timeout}
    async with spawn_worker() as worker:
        await worker.send(make_start([stream], tmp_path, settings=settings(kind, **timers)))
        await worker.expect(Ready)
        before = await worker.wait_for(Checkpoint, predicate=lambda c: c.checkpoint["a"] > 50)
        holed_at = trio.current_time()
        proxy.hole()
        await wait_until(lambda: len(proxy.accepted) >= 2, timeout=10)
        reconnected_at = proxy.accepted[1]
        beat = await worker.wait_for(
            Heartbeat,
            timeout=5,
            predicate=lambda b: b.last_seq.get("a", 0) > before.checkpoint["a"] + 200,
        )
        await worker.send(stop_in())
        assert await worker.wait() == 0
    assert reconnected_at - holed_at <= interval + timeout + SLACK
    assert beat.streams["a"]["reconnect.ping_timeout"] == 1
    written = seqs(tmp_path)
    assert written == list(range(1, written[-1] + 1))  # the swallowed ones came again
    assert "no answer to a ping within 0.5s" in worker.log


async def test_a_quiet_feed_that_answers_pings_is_not_reconnected(
    nursery: trio.Nursery, tmp_path: Path, kind: str
) -> None:
    """One message, then nothing for 2.5 s, pings every 0.2 s: all answered, no reconnect."""
    pings: list[float] = []

    async def quiet(stream: trio.SocketStream) -> None:
        ws = WSConnection(ConnectionType.SERVER)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await stream.receive_some(65536):
                ws.receive_data(data)
                for event in ws.events():
                    if isinstance(event, Request):
                        await stream.send_all(ws.send(AcceptConnection()))
                        await stream.send_all(b"\x81" + bytes((len(message(1)),)))
                        await stream.send_all(message(1).encode())
                    elif isinstance(event, Ping):
                        pings.append(trio.current_time())
                        await stream.send_all(ws.send(event.response()))

    listeners = await nursery.start(partial(trio.serve_tcp, quiet, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    stream = StreamSpec(id="a", url=f"ws://127.0.0.1:{port}/?after={{after}}", sequence="seq")
    timers = {"ping_interval": 0.2, "ping_timeout": 0.3}
    async with spawn_worker() as worker:
        await worker.send(make_start([stream], tmp_path, settings=settings(kind, **timers)))
        await worker.expect(Ready)
        await trio.sleep(2.5)
        beat = await worker.wait_for(Heartbeat)
        await worker.send(stop_in())
        assert await worker.wait() == 0
    assert beat.streams["a"]["reconnects"] == 0
    assert beat.stale == []
    assert len(pings) >= 5  # about one per 0.2 s of silence
    assert seqs(tmp_path) == [1]


async def serve_websockets(
    nursery: trio.Nursery, handler: Callable[[ServerConnection], object]
) -> int:
    """A ``websockets`` server (permessage-deflate on, its default); returns its port."""
    server = await nursery.start(partial(serve, handler, 0, host="127.0.0.1", max_size=None))
    return server.listeners[0].socket.getsockname()[1]


async def test_a_compressed_feed_delivers_every_message(
    nursery: trio.Nursery, tmp_path: Path, kind: str
) -> None:
    count = 3000

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        after = after_of(ws.request.path)
        for seq in range(after + 1, count + 1):
            await ws.send(message(seq))
        await trio.sleep_forever()

    port = await serve_websockets(nursery, handler)
    stream = StreamSpec(id="a", url=f"ws://127.0.0.1:{port}/?after={{after}}", sequence="seq")
    async with spawn_worker() as worker:
        await worker.send(make_start([stream], tmp_path, settings=settings(kind)))
        await worker.expect(Ready)
        await worker.wait_for(
            Checkpoint, timeout=10, predicate=lambda c: c.checkpoint["a"] == count
        )
        await worker.send(stop_in())
        assert await worker.wait() == 0
    assert seqs(tmp_path) == list(range(1, count + 1))
    if kind == "websockets":
        assert "extensions: permessage-deflate" in worker.log
    else:  # trio-websocket offers no extension: the same feed, uncompressed
        assert "extensions: none" in worker.log


async def test_a_decompression_bomb_is_dead_lettered_and_the_child_stays_up(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """64 MiB of zeros deflate to about 64 KiB (DEFLATE's ratio tops out near 1032:1): over
    max_message_size once inflated, so the connection is closed with 1009, the event
    dead-lettered, and the stream goes on from its checkpoint on the next connection."""
    closes: list[int | None] = []

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        after = after_of(ws.request.path)
        await ws.send(message(after + 1))
        if not closes:
            await ws.send(b"\x00" * (64 << 20))  # compressed by the server, as any message
            await ws.wait_closed()
            closes.append(ws.close_code)
            return
        for seq in range(after + 2, after + 101):
            await ws.send(message(seq))
        await trio.sleep_forever()

    port = await serve_websockets(nursery, handler)
    stream = StreamSpec(id="a", url=f"ws://127.0.0.1:{port}/?after={{after}}", sequence="seq")
    async with spawn_worker() as worker:
        await worker.send(make_start([stream], tmp_path, settings=settings("websockets")))
        await worker.expect(Ready)
        await worker.wait_for(Checkpoint, timeout=15, predicate=lambda c: c.checkpoint["a"] == 101)
        beat = await worker.wait_for(Heartbeat)
        await worker.send(stop_in())
        assert await worker.wait() == 0
    assert closes == [1009]
    assert seqs(tmp_path) == list(range(1, 102))
    assert beat.streams["a"]["reconnect.too_large"] == 1
    letters = read_records(tmp_path / "shard-1" / "dead-letter.1.jsonl")
    assert [(d["reason"], d["data"]) for d in letters] == [("message_too_large", None)]
    assert "over max_message_size (16777216 bytes) after seq 1" in letters[0]["error"]


async def test_a_standby_child_connects_like_an_owner_idle_timeout_and_compression(
    nursery: trio.Nursery, tmp_path: Path, kind: str
) -> None:
    """A standby (issue 14) reads through the same reader: its stream's idle timeout, transport
    and compression; the reconnects resume after what it buffered, and the promotion writes
    it all, without a gap."""
    connects: list[int] = []

    async def handler(ws: ServerConnection) -> None:  # 5 messages on two connections, then none
        assert ws.request is not None
        after = after_of(ws.request.path)
        connects.append(after)
        for seq in range(after + 1, after + 6) if len(connects) <= 2 else ():
            await ws.send(message(seq))
        await trio.sleep_forever()

    port = await serve_websockets(nursery, handler)
    url = f"ws://127.0.0.1:{port}/?after={{after}}"
    stream = StreamSpec(id="a", url=url, sequence="seq", idle_timeout=1.0)
    start = make_start([stream], tmp_path, epoch=2, settings=settings(kind))
    async with spawn_worker() as worker:
        await worker.send(attrs.evolve(start, mode=STANDBY, standby=StandbySettings()))
        await worker.wait_for(StandbyReady)
        await wait_until(lambda: len(connects) >= 3, timeout=10)
        fence = time.monotonic() + 60
        await worker.send(Promote(epoch=2, checkpoint={}, fence_deadline=fence))
        await worker.wait_for(Checkpoint, predicate=lambda c: c.checkpoint.get("a") == 10)
        await worker.send(stop_in())
        assert await worker.wait() == 0
    assert connects[:3] == [0, 5, 10]  # each reconnect after what the standby holds
    records = read_records(tmp_path / "shard-1" / "a.2.jsonl")
    assert [r["seq"] for r in records] == list(range(1, 11))
    assert "no message for 1s (idle)" in worker.log
    extensions = "permessage-deflate" if kind == "websockets" else "none"
    assert f"(after=5; extensions: {extensions}" in worker.log
