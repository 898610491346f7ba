"""The reference feed: numbering, replay after N, live delivery, 404s and dropped connections."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable

import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from supervisor.devtools.feed import FeedServer, run_feed
from supervisor.devtools.servers import start_feed


@pytest.fixture
async def feed(nursery: trio.Nursery) -> AsyncIterator[tuple[FeedServer, str]]:
    server = FeedServer(rate=2000, payload_bytes=120, max_history=10_000, stream_names=["s1"])
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    yield server, f"ws://127.0.0.1:{port}/feed"


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


async def receive(url: str, count: int) -> list[dict]:
    with trio.fail_after(5):
        async with open_websocket_url(url) as ws:
            return [json.loads(await ws.get_message()) for _ in range(count)]


async def test_numbering_and_message_shape(feed: tuple[FeedServer, str]) -> None:
    server, url = feed
    messages = await receive(f"{url}/s1", 50)
    assert [m["seq"] for m in messages] == list(range(1, 51))
    first = messages[0]
    assert list(first) == ["seq", "stream", "ts", "pad"]
    assert first["stream"] == "s1"
    assert isinstance(first["ts"], float)
    text = json.dumps(first, separators=(",", ":"))
    assert abs(len(text) - server.payload_bytes) <= 2


async def test_replay_after_then_live(feed: tuple[FeedServer, str]) -> None:
    server, url = feed
    await wait_until(lambda: server.last_seq("s1") >= 100)
    live_from = server.last_seq("s1")
    count = live_from - 40 + 200  # the replay, then 200 generated after we connected
    messages = await receive(f"{url}/s1?after=40", count)
    assert [m["seq"] for m in messages] == list(range(41, 41 + count))


async def test_streams_are_created_lazily_and_numbered_separately(
    feed: tuple[FeedServer, str],
) -> None:
    server, url = feed
    assert server.last_seq("fresh") == 0
    assert [m["seq"] for m in await receive(f"{url}/fresh", 3)] == [1, 2, 3]
    assert server.stream("fresh").name == "fresh"
    assert server.last_seq("fresh") >= 3


async def test_old_history_is_dropped(nursery: trio.Nursery) -> None:
    server = FeedServer(rate=5000, max_history=100)
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    server.stream("s")
    await wait_until(lambda: server.last_seq("s") >= 500)
    messages = await receive(f"ws://127.0.0.1:{port}/feed/s?after=3", 5)
    first = messages[0]["seq"]
    assert first > 300  # the oldest kept, not 4
    assert [m["seq"] for m in messages] == list(range(first, first + 5))


async def handshake_status(url: str, path: str) -> int:
    """The HTTP status a WebSocket upgrade of ``path`` gets (raw, so a rejection leaks nothing)."""
    host, port = url.removeprefix("ws://").split("/")[0].split(":")
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    )
    with trio.fail_after(5):
        async with await trio.open_tcp_stream(host, int(port)) as stream:
            await stream.send_all(request.encode())
            response = b""
            while b"\r\n" not in response:
                response += await stream.receive_some(4096)
    return int(response.split()[1])


@pytest.mark.parametrize("path", ["/", "/feed", "/feed/", "/other/s1", "/feed/a/b"])
async def test_unknown_paths_get_404(feed: tuple[FeedServer, str], path: str) -> None:
    _, url = feed
    assert await handshake_status(url, path) == 404
    assert await handshake_status(url, "/feed/s1") == 101


async def test_bad_after_gets_400(feed: tuple[FeedServer, str]) -> None:
    _, url = feed
    assert await handshake_status(url, "/feed/s1?after=abc") == 400


async def test_drop_connections_forces_a_reconnect_without_loss(
    feed: tuple[FeedServer, str],
) -> None:
    server, url = feed
    seen: list[int] = []
    with trio.fail_after(5):
        async with open_websocket_url(f"{url}/s1") as ws:
            seen += [json.loads(await ws.get_message())["seq"] for _ in range(20)]
            assert server.connection_count() == server.connection_count("s1") == 1
            await server.drop_connections("other")  # another stream's: no effect here
            seen.append(json.loads(await ws.get_message())["seq"])
            await server.drop_connections("s1")
            assert server.connection_count() == 0
            with pytest.raises(ConnectionClosed):
                while True:  # whatever was in flight, then the close
                    seen.append(json.loads(await ws.get_message())["seq"])
            # trio-websocket 0.12 leaves the client socket open when the server closes first.
            await ws._stream.aclose()
        seen += [m["seq"] for m in await receive(f"{url}/s1?after={seen[-1]}", 20)]
    assert seen == list(range(1, len(seen) + 1))


async def test_rate_is_respected(nursery: trio.Nursery) -> None:
    server = FeedServer(rate=20_000, stream_names=["fast"])
    await nursery.start(server.serve, "127.0.0.1", 0)
    await wait_until(lambda: server.last_seq("fast") > 0)
    start, started = server.last_seq("fast"), trio.current_time()
    await trio.sleep(0.3)
    rate = (server.last_seq("fast") - start) / (trio.current_time() - started)
    assert 12_000 < rate < 28_000


def test_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rate"):
        FeedServer(rate=0)


async def test_run_feed_prints_where_it_listens(capsys: pytest.CaptureFixture[str]) -> None:
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_feed, "127.0.0.1", 0, 2, 100.0)
            while "feed listening" not in (out := capsys.readouterr().out):
                await trio.sleep(0.01)
            match = re.search(r"ws://127\.0\.0\.1:(\d+)/feed/<stream> \(streams: s1, s2\)", out)
            assert match, out
            messages = await receive(f"ws://127.0.0.1:{match[1]}/feed/s2", 2)
            assert [m["stream"] for m in messages] == ["s2", "s2"]
            nursery.cancel_scope.cancel()


async def test_the_feed_as_a_process_of_its_own_serves_and_stops() -> None:
    """``supervisor.devtools.servers.start_feed``: how the benchmarks run it (its own CPU)."""
    server = await trio.to_thread.run_sync(start_feed, 500.0, ["p1", "p2"])
    try:
        messages = await receive(f"{server.url}/p2?after=3", 5)
        assert [(m["stream"], m["seq"]) for m in messages] == [("p2", n) for n in range(4, 9)]
    finally:
        server.stop()
    assert server.proc.returncode is not None
