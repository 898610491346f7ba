"""The reference feed: numbering, replay after N, live delivery, live-only mode, 404s, drops."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import attrs
import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from supervisor.devtools.feed import FeedServer, run_feed
from supervisor.devtools.fleet import Fleet
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
    seqs = [m["seq"] for m in messages]
    assert seqs[0] > 300  # the oldest kept, not 4
    # Rising, not necessarily contiguous: the kept history spans 20 ms here, and a client
    # that falls behind it skips ahead (as documented), which a loaded machine makes happen.
    assert seqs == sorted(set(seqs))


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


# --- the live-only feed ---------------------------------------------------------------------


@pytest.fixture
async def live_feed(nursery: trio.Nursery) -> AsyncIterator[tuple[FeedServer, str]]:
    server = FeedServer(rate=2000, max_history=10_000, stream_names=["s1"], live=True)
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    await wait_until(lambda: server.last_seq("s1") >= 200)
    yield server, f"ws://127.0.0.1:{port}/feed"


@pytest.mark.parametrize("after", ["", "?after=0", "?after=40", "?after=999999999"])
async def test_a_live_client_gets_only_what_is_generated_after_it_connected(
    live_feed: tuple[FeedServer, str], after: str
) -> None:
    server, url = live_feed
    before = server.last_seq("s1")
    with trio.fail_after(5):
        async with open_websocket_url(f"{url}/s1{after}") as ws:
            connected = server.last_seq("s1")  # (the handler accepted us meanwhile)
            seqs = [json.loads(await ws.get_message())["seq"] for _ in range(100)]
    # Nothing from before the connection, whatever was asked; the numbering keeps counting.
    assert before < seqs[0] <= connected + 1
    assert seqs == list(range(seqs[0], seqs[0] + 100))


async def test_a_second_live_client_connecting_later_starts_later(
    live_feed: tuple[FeedServer, str],
) -> None:
    server, url = live_feed
    with trio.fail_after(5):
        async with open_websocket_url(f"{url}/s1?after=0") as first:
            early = [json.loads(await first.get_message())["seq"] for _ in range(10)]
            await wait_until(lambda: server.last_seq("s1") >= early[-1] + 100)
            async with open_websocket_url(f"{url}/s1?after=0") as second:
                late = json.loads(await second.get_message())["seq"]
                # The first client goes on where it was: each connection has its own position.
                assert json.loads(await first.get_message())["seq"] == early[-1] + 1
    assert late > early[-1] + 100


async def test_a_live_client_that_reconnects_sees_the_outage_as_a_jump(
    live_feed: tuple[FeedServer, str],
) -> None:
    server, url = live_feed
    first = await receive(f"{url}/s1", 5)
    last = first[-1]["seq"]
    await wait_until(lambda: server.last_seq("s1") >= last + 50)
    again = await receive(f"{url}/s1?after={last}", 5)
    assert again[0]["seq"] > last + 50  # what no one was connected for is gone


async def test_the_live_feed_as_a_process_of_its_own() -> None:
    server = await trio.to_thread.run_sync(partial(start_feed, 500.0, ["p1"], live=True))
    try:
        early = await receive(f"{server.url}/p1?after=0", 3)
        assert [m["seq"] for m in early] == list(range(early[0]["seq"], early[0]["seq"] + 3))
        # A later client asking for everything gets only what came after it connected.
        later = await receive(f"{server.url}/p1?after=0", 1)
        assert later[0]["seq"] > early[-1]["seq"]
    finally:
        server.stop()


async def test_run_feed_live_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(run_feed, "127.0.0.1", 0, 1, 100.0, live=True))
            while "feed listening" not in (out := capsys.readouterr().out):
                await trio.sleep(0.01)
            assert out.startswith("live-only feed listening on ws://127.0.0.1:")
            nursery.cancel_scope.cancel()


def test_shardvisor_feed_takes_live() -> None:
    from supervisor.cli import _parser

    assert _parser().parse_args(["feed", "--live"]).live is True
    assert _parser().parse_args(["feed"]).live is False


def test_a_fleet_on_a_live_feed_asks_no_position(tmp_path: Path) -> None:
    """``Fleet(live_feed=True)``: the stream URLs a live-only feed gets carry no ``after``."""
    shards = {"s1": ["s1-a"]}
    replaying = Fleet(tmp_path, "http://ddb", "t", "ws://127.0.0.1:1/feed", shards)
    live = attrs.evolve(replaying, live_feed=True)
    assert 'url = "ws://127.0.0.1:1/feed/s1-a?after={after}"' in replaying.config_text("w1")
    assert 'url = "ws://127.0.0.1:1/feed/s1-a"\n' in live.config_text("w1")
