"""The real shard worker child: real pipes, a real feed on 127.0.0.1, real files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio
from helpers.feeds import serve_script
from helpers.worker_helpers import make_start, read_records, spawn_worker, stop_in

from shard_worker.contract.pipe import (
    Checkpoint,
    Error,
    Fence,
    Hello,
    Ready,
    Stopped,
    StreamSpec,
    encode,
)
from supervisor.devtools.feed import FeedServer

pytestmark = pytest.mark.slow


def spec(url: str, stream: str = "a") -> StreamSpec:
    return StreamSpec(id=stream, url=url, sequence="seq")


def sink_file(out: Path, stream: str = "a", shard: str = "shard-1", epoch: int = 1) -> Path:
    return out / shard / f"{stream}.{epoch}.jsonl"


def seqs(path: Path) -> list[int]:
    return [record["seq"] for record in read_records(path)]


async def test_checkpoints_follow_the_sink_and_stop_reports_the_last_line(
    feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    server, url = feed
    async with spawn_worker() as worker:
        await worker.send(make_start([spec(url, "a"), spec(url, "b")], tmp_path))
        await worker.expect(Ready)
        checkpoints = 0
        while checkpoints < 5:
            checkpoint = await worker.expect(Checkpoint)
            for stream, last in checkpoint.checkpoint.items():
                # Everything the checkpoint names is already in the file, in order.
                assert seqs(sink_file(tmp_path, stream))[:last] == list(range(1, last + 1))
            checkpoints += "a" in checkpoint.checkpoint and "b" in checkpoint.checkpoint
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    assert stopped.reason == "test"
    total = 0
    for stream in ("a", "b"):
        records = read_records(sink_file(tmp_path, stream))
        assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
        assert stopped.checkpoint[stream] == records[-1]["seq"]
        assert records[0]["data"]["stream"] == f"shard-1-{stream}"  # placeholders filled in
        assert {(r["shard"], r["stream"], r["epoch"], r["worker"]) for r in records} == {
            ("shard-1", stream, 1, "w1")
        }
        total += len(records)
    assert stopped.written == total
    assert worker.stdout == b""
    assert server.last_seq("shard-1-a") >= stopped.checkpoint["a"]


async def test_resume_from_checkpoint_writes_only_what_follows(
    feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    server, url = feed
    server.stream("shard-1-a")
    with trio.fail_after(5):
        while server.last_seq("shard-1-a") < 100:
            await trio.sleep(0.01)
    async with spawn_worker() as worker:
        await worker.send(make_start([spec(url)], tmp_path, epoch=2, checkpoint={"a": 60}))
        await worker.expect(Ready)
        await worker.wait_for(Checkpoint, predicate=lambda c: c.checkpoint["a"] > 200)
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    written = seqs(sink_file(tmp_path, epoch=2))
    assert written == list(range(61, stopped.checkpoint["a"] + 1))


async def test_reconnects_after_a_drop_without_a_gap(
    feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    server, url = feed
    async with spawn_worker() as worker:
        await worker.send(make_start([spec(url)], tmp_path))
        await worker.expect(Ready)
        first = await worker.wait_for(Checkpoint)
        for connections in (2, 3):
            with trio.fail_after(5):
                while server.connection_count() < 1:
                    await trio.sleep(0.01)
            await server.drop_connections()
            with trio.fail_after(5):
                while worker.log.count("stream=a connected to") < connections:
                    await trio.sleep(0.01)
        await worker.wait_for(
            Checkpoint, predicate=lambda c: c.checkpoint["a"] > first.checkpoint["a"] + 500
        )
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    assert seqs(sink_file(tmp_path)) == list(range(1, stopped.checkpoint["a"] + 1))
    assert worker.log.count("stream=a disconnected: code 1001") == 2
    assert "gap" not in worker.log


async def test_closing_the_control_pipe_exits_within_a_second(
    feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = feed
    async with spawn_worker() as worker:
        await worker.send(make_start([spec(url)], tmp_path))
        await worker.expect(Ready)
        await worker.wait_for(Checkpoint)
        await worker.close_control()
        closed_at = trio.current_time()
        assert await worker.wait(timeout=2) == 0
        assert trio.current_time() - closed_at < 1.0
    assert "control pipe closed" in worker.log
    written = seqs(sink_file(tmp_path))
    assert written == list(range(1, len(written) + 1))  # flushed, whole lines only


@pytest.mark.parametrize("fence_in", [-1.0, 1.5])  # 1.5 s: a loaded CI box still writes first
async def test_no_write_after_the_fence_deadline(
    feed: tuple[FeedServer, str], tmp_path: Path, fence_in: float
) -> None:
    _, url = feed
    async with spawn_worker() as worker:
        start = make_start([spec(url)], tmp_path, fence_in=fence_in)
        deadline_wall = time.time() + (start.fence_deadline - time.monotonic())
        await worker.send(start)
        await worker.expect(Ready)
        checkpoint: dict[str, int] = {}
        with trio.fail_after(5):
            while not isinstance(message := await worker.receive(), Error):
                if isinstance(message, Checkpoint):
                    checkpoint = message.checkpoint
        error = message
        assert await worker.wait() == 3
    assert error.fatal
    assert "fence deadline passed" in error.message
    records = read_records(sink_file(tmp_path))
    assert all(record["ts"] < deadline_wall for record in records)
    if fence_in > 0:
        assert records, "records written before the deadline must be flushed"
        assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
        # Reported before the exit: a restart in the same epoch resumes after the last record
        # in the file instead of writing the unreported ones a second time.
        assert checkpoint == {"a": records[-1]["seq"]}
    else:
        assert records == []


async def test_fence_messages_move_the_deadline(
    feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = feed
    async with spawn_worker() as worker:
        # The Fence right behind the Start (the pipe keeps the order): the child applies it as
        # soon as it is ready, well before the first deadline, even on a loaded machine.
        start = make_start([spec(url)], tmp_path, fence_in=1.0)
        first_deadline_wall = time.time() + (start.fence_deadline - time.monotonic())
        await worker.send(start)
        await worker.send(Fence(deadline=time.monotonic() + 30))
        await worker.expect(Ready)
        await trio.sleep(1.6)  # well past the first deadline
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)  # (and no Error on the way)
        assert await worker.wait() == 0
    records = read_records(sink_file(tmp_path))
    assert records[-1]["ts"] > first_deadline_wall + 0.2
    assert stopped.checkpoint["a"] == records[-1]["seq"]


async def test_malformed_messages_are_dead_lettered_and_frames_are_decoded(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    scripts: dict[str, list[str | bytes]] = {
        "seq": [
            '{"seq": 1}',
            "not json",
            '{"seq": "2"}',
            '{"other": 2}',
            '{"seq": true}',
            '{"seq": 2.0}',
            b"\xff\xfe",
            '{"seq": 2}',
            '{"seq": 2}',  # duplicate
            b'{"seq": 5}',  # binary UTF-8 is text; a gap of 2
            "[[[[[[[[[[",
        ],
        "raw": ["hello", '{"a": [1, 2]}', b"\xff\x00", "last"],
    }
    subscribed: dict[str, str] = {}
    port = await nursery.start(serve_script, scripts, subscribed)
    streams = [
        StreamSpec(
            id=name,
            url=f"ws://127.0.0.1:{port}/{name}",
            sequence="seq" if name == "seq" else "",
            subscribe='{"op":"sub","stream":"{stream}","after":{after},"shard":"{shard}"}',
        )
        for name in scripts
    ]
    async with spawn_worker() as worker:
        await worker.send(make_start(streams, tmp_path))
        await worker.expect(Ready)
        with trio.fail_after(5):  # flushed every checkpoint interval (0.1 s)
            while len(read_records(sink_file(tmp_path, "raw"))) < 4 or seqs(
                sink_file(tmp_path, "seq")
            ) != [1, 2, 5]:
                await trio.sleep(0.05)
        await trio.sleep(0.2)  # the sequenced stream's tail: malformed, so nothing to wait for
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    assert subscribed["seq"] == '{"op":"sub","stream":"seq","after":0,"shard":"shard-1"}'
    assert [r["data"] for r in read_records(sink_file(tmp_path, "seq"))] == [
        {"seq": 1},
        {"seq": 2},
        {"seq": 5},
    ]
    raw = read_records(sink_file(tmp_path, "raw"))
    assert [(r["seq"], r["data"], r.get("encoding")) for r in raw] == [
        (None, "hello", None),
        (None, {"a": [1, 2]}, None),
        (None, "/wA=", "base64"),
        (None, "last", None),
    ]
    assert stopped.checkpoint == {"seq": 5}
    assert stopped.written == 7
    assert "malformed message dead-lettered (1 so far)" in worker.log  # then rate-limited
    reasons = [d["error"] for d in read_records(tmp_path / "shard-1" / "dead-letter.1.jsonl")]
    assert reasons == [
        "not JSON",
        "sequence '2' is not an integer",
        "no 'seq' in the message",
        "sequence True is not an integer",
        "sequence 2.0 is not an integer",
        "binary frame is not UTF-8",
        "not JSON",
    ]
    assert "gap: 2 message(s) missing before seq 5" in worker.log


async def test_stop_before_start(tmp_path: Path) -> None:
    async with spawn_worker() as worker:
        await worker.send(stop_in(reason="never mind"))
        assert await worker.expect(Stopped) == Stopped(
            checkpoint={}, written=0, reason="never mind"
        )
        assert await worker.wait() == 0


async def test_wrong_protocol_version_is_fatal(tmp_path: Path) -> None:
    async with spawn_worker() as worker:
        start = make_start([spec("ws://127.0.0.1:1/x")], tmp_path)
        fields = json.loads(encode(start))
        await worker.send_raw(json.dumps({**fields, "version": 99}).encode() + b"\n")
        error = await worker.expect(Error)
        assert await worker.wait() == 2
    assert error.fatal
    assert "version 99" in error.message


@pytest.mark.parametrize(
    "streams",
    [
        [StreamSpec("a", "ws://127.0.0.1:1/a"), StreamSpec("a", "ws://127.0.0.1:1/b")],
        [StreamSpec("a", "http://127.0.0.1:1/a")],
        [StreamSpec("a", "ws://127.0.0.1:1/a", sequence="meta..seq")],
    ],
    ids=["duplicate-ids", "not-ws", "bad-sequence-path"],
)
async def test_a_start_it_cannot_run_is_a_protocol_error(
    tmp_path: Path, streams: list[StreamSpec]
) -> None:
    async with spawn_worker() as worker:
        await worker.send(make_start(streams, tmp_path))
        error = await worker.expect(Error)
        assert await worker.wait() == 2
    assert error.fatal
    assert not (tmp_path / "shard-1").exists()  # nothing opened


@pytest.mark.parametrize("garbage", [b"nonsense\n", b'{"type":"hello","version":1,"pid":1}\n'])
async def test_protocol_errors_after_start_are_fatal(
    feed: tuple[FeedServer, str], tmp_path: Path, garbage: bytes
) -> None:
    _, url = feed
    async with spawn_worker() as worker:
        await worker.send(make_start([spec(url)], tmp_path))
        await worker.expect(Ready)
        await worker.send_raw(garbage)
        error = await worker.wait_for(Error)
        assert await worker.wait() == 2
    assert error.fatal
    assert "protocol error" in error.message


async def test_hello_comes_first() -> None:
    async with spawn_worker(handshake=False) as worker:
        hello = await worker.expect(Hello, timeout=10)
        assert hello.version == 1
        await worker.close_control()
        assert await worker.wait() == 0
