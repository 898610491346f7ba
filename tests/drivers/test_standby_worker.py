"""Standby children (issue 14): real child processes, real pipes, real feeds on 127.0.0.1.

A standby connects and buffers but writes nothing; it announces standby_ready with first_seq;
it trims by age and by size; promote writes exactly what follows the checkpoint, then goes on
live on the same connections; and an owner stopped at min_cut = first_seq - 1 plus a standby
promoted at the owner's cut write every sequence number exactly once between them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from helpers.worker_helpers import (
    FAST_SETTINGS,
    WorkerProcess,
    make_start,
    read_records,
    spawn_worker,
)
from test_shard_worker import serve_script
from test_worker_sinks import handler_env, handler_sink

from shard_worker.contract.pipe import (
    STANDBY,
    Checkpoint,
    Error,
    Fence,
    Heartbeat,
    Promote,
    Ready,
    StandbyReady,
    StandbySettings,
    Start,
    Stop,
    Stopped,
    StreamSpec,
)
from supervisor.devtools.feed import FeedServer

pytestmark = pytest.mark.slow
RATE = 2000.0
BEATS = attrs.evolve(FAST_SETTINGS, heartbeat_interval=0.1)


@pytest.fixture(params=["live", "replaying"])
async def feed(
    request: pytest.FixtureRequest, nursery: trio.Nursery
) -> AsyncIterator[tuple[FeedServer, str]]:
    server = FeedServer(rate=RATE, live=request.param == "live")
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    yield server, f"ws://127.0.0.1:{port}/feed/{{shard}}-{{stream}}?after={{after}}"


@pytest.fixture
async def live_feed(nursery: trio.Nursery) -> AsyncIterator[tuple[FeedServer, str]]:
    server = FeedServer(rate=RATE, live=True)
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    yield server, f"ws://127.0.0.1:{port}/feed/{{shard}}-{{stream}}?after={{after}}"


def spec(url: str, stream: str = "a") -> StreamSpec:
    return StreamSpec(id=stream, url=url, sequence="seq")


def standby_start(
    streams: list[StreamSpec], out: Path, *, standby: StandbySettings | None = None, **kw: Any
) -> Start:
    """A standby of shard-1 expecting epoch 2 (the owner's is 1)."""
    start = make_start(streams, out, epoch=kw.pop("epoch", 2), **kw)
    return attrs.evolve(start, mode=STANDBY, standby=standby or StandbySettings())


async def stand_by(
    worker: WorkerProcess, streams: list[StreamSpec], out: Path, **kw: Any
) -> dict[str, int]:
    """Start ``worker`` as a standby; its standby_ready's first_seq."""
    await worker.send(standby_start(streams, out, **kw))
    return (await worker.wait_for(StandbyReady)).first_seq


def promote(checkpoint: dict[str, int], epoch: int = 2, fence_in: float = 60.0) -> Promote:
    return Promote(epoch=epoch, checkpoint=checkpoint, fence_deadline=time.monotonic() + fence_in)


def stop_in(seconds: float = 5.0, **kw: Any) -> Stop:
    return Stop(reason="test", deadline=time.monotonic() + seconds, **kw)


def seqs(path: Path) -> list[int]:
    return [record["seq"] for record in read_records(path)]


def sink_file(out: Path, stream: str = "a", epoch: int = 2) -> Path:
    return out / "shard-1" / f"{stream}.{epoch}.jsonl"


async def wait_seq(server: FeedServer, stream: str, seq: int) -> None:
    server.stream(stream)
    with trio.fail_after(10):
        while server.last_seq(stream) < seq:
            await trio.sleep(0.01)


async def test_a_standby_buffers_writes_nothing_and_stops_with_exit_0(
    feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    server, url = feed
    await wait_seq(server, "shard-1-a", 200)
    async with spawn_worker() as worker:
        start = standby_start([spec(url, "a"), spec(url, "b")], tmp_path, settings=BEATS)
        await worker.send(attrs.evolve(start, checkpoint={"a": 100}))
        ready = await worker.wait_for(StandbyReady)
        beat = await worker.wait_for(
            Heartbeat, predicate=lambda b: b.standby is not None and b.standby.buffered > 500
        )
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    assert stopped == Stopped(checkpoint={}, written=0, reason="test")
    assert set(ready.first_seq) == {"a", "b"}
    if server.live:  # only what came after the connect
        assert ready.first_seq["a"] > 200
    else:  # {after} rendered with the start's checkpoint
        assert ready.first_seq["a"] == 101
    assert beat.written == 0 and beat.last_seq == {} and beat.streams == {}
    assert beat.standby is not None
    assert set(beat.standby.connected) == {"a", "b"} and beat.standby.dropped == 0
    assert beat.standby.bytes >= (100 + 173) * beat.standby.buffered  # ~100-byte messages
    assert not any(tmp_path.rglob("*.jsonl"))  # no sink file, no dead letter


@pytest.mark.parametrize("sink_kind", ["jsonl", "handler"])
async def test_promote_writes_exactly_what_follows_the_checkpoint_then_goes_on_live(
    feed: tuple[FeedServer, str], tmp_path: Path, sink_kind: str
) -> None:
    server, url = feed
    sink = handler_sink("record") if sink_kind == "handler" else None
    async with spawn_worker(env=handler_env(tmp_path)) as worker:
        first = await stand_by(worker, [spec(url, "a"), spec(url, "b")], tmp_path, sink=sink)
        cut = {stream: seq + 50 for stream, seq in first.items()}  # 50 records into the buffer
        await wait_seq(server, "shard-1-a", cut["a"] + 1500)  # a replay of > 1024 frames
        await wait_seq(server, "shard-1-b", cut["b"] + 300)
        assert not any(tmp_path.rglob("*.jsonl"))
        await worker.send(promote(cut))
        await worker.wait_for(Ready)
        await worker.wait_for(
            Checkpoint, predicate=lambda c: all(c.checkpoint.get(s, 0) > cut[s] + 1000 for s in cut)
        )
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    out = tmp_path / "handled" if sink_kind == "handler" else tmp_path
    for stream in ("a", "b"):
        records = read_records(sink_file(out, stream))
        assert [r["seq"] for r in records] == list(
            range(cut[stream] + 1, stopped.checkpoint[stream] + 1)
        )
        assert {(r["epoch"], r["stream"]) for r in records} == {(2, stream)}
        # The same connection throughout: promoted in place, not reconnected.
        assert worker.log.count(f"stream={stream} connected to") == 1
    assert "gap" not in worker.log
    assert "promoted: epoch=2" in worker.log


@pytest.mark.parametrize("sink_kind", ["jsonl", "handler"])
async def test_owner_at_min_cut_then_standby_promoted_writes_every_seq_exactly_once(
    live_feed: tuple[FeedServer, str], tmp_path: Path, sink_kind: str
) -> None:
    """Make-before-break at the pipes, without a supervisor: the proof of the protocol on a
    feed that cannot replay."""
    _, url = live_feed
    streams = [spec(url, "a"), spec(url, "b")]
    sink = handler_sink("record") if sink_kind == "handler" else None
    env = handler_env(tmp_path)
    async with spawn_worker(env=env) as owner, spawn_worker(env=env) as standby:
        await owner.send(make_start(streams, tmp_path, epoch=1, sink=sink))
        await owner.expect(Ready)
        await owner.wait_for(Checkpoint, predicate=lambda c: len(c.checkpoint) == 2)
        first = await stand_by(standby, streams, tmp_path, epoch=2, sink=sink)
        await owner.send(stop_in(min_cut={s: seq - 1 for s, seq in first.items()}))
        cut = (await owner.wait_for(Stopped)).checkpoint
        assert await owner.wait() == 0
        await standby.send(promote(cut, epoch=2))
        await standby.wait_for(Ready)
        await standby.wait_for(
            Checkpoint, predicate=lambda c: all(c.checkpoint.get(s, 0) > cut[s] + 500 for s in cut)
        )
        await standby.send(stop_in())
        last = (await standby.wait_for(Stopped)).checkpoint
        assert await standby.wait() == 0
    out = tmp_path / "handled" if sink_kind == "handler" else tmp_path
    for stream in ("a", "b"):
        assert cut[stream] >= first[stream] - 1
        old, new = seqs(sink_file(out, stream, 1)), seqs(sink_file(out, stream, 2))
        assert old[0] < first[stream]  # the owner was there first: the standby could not be
        assert old + new == list(range(old[0], last[stream] + 1))  # each seq once, in order
        assert old[-1] == cut[stream] and new[0] == cut[stream] + 1
    assert "gap" not in standby.log and "gap" not in owner.log


async def test_stop_with_min_cut_reads_on_until_the_cut(
    live_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = live_feed
    async with spawn_worker() as worker:
        await worker.send(make_start([spec(url)], tmp_path, epoch=1))
        await worker.expect(Ready)
        at = (await worker.wait_for(Checkpoint)).checkpoint["a"]
        await worker.send(stop_in(min_cut={"a": at + 2000, "unknown": 5}))  # ~1 s of feed
        stopped = await worker.wait_for(Stopped, timeout=10)
        assert await worker.wait() == 0
    assert stopped.checkpoint["a"] >= at + 2000
    assert seqs(sink_file(tmp_path, "a", 1))[-1] == stopped.checkpoint["a"]


async def test_a_min_cut_out_of_reach_stops_by_the_deadline(
    live_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = live_feed
    async with spawn_worker() as worker:
        await worker.send(make_start([spec(url)], tmp_path, epoch=1))
        await worker.expect(Ready)
        await worker.wait_for(Checkpoint)
        sent = trio.current_time()
        await worker.send(stop_in(1.0, min_cut={"a": 10**9}))
        stopped = await worker.wait_for(Stopped)
        assert 0.7 < trio.current_time() - sent < 1.0  # it tried, and reported in time
        assert await worker.wait() == 0
    assert stopped.checkpoint["a"] == seqs(sink_file(tmp_path, "a", 1))[-1]
    assert "min_cut {'a': 1000000000} not reached by the deadline" in worker.log


async def test_trimming_by_age_keeps_about_buffer_seconds_uncounted(
    live_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = live_feed
    standby = StandbySettings(buffer=0.5)
    async with spawn_worker() as worker:
        first = await stand_by(worker, [spec(url)], tmp_path, settings=BEATS, standby=standby)
        with trio.move_on_after(2.0):  # the hold of standby_ready (0.5 s) is long over
            while True:
                beat = await worker.wait_for(Heartbeat)
        await worker.send(stop_in())
        assert await worker.wait() == 0
    assert beat.standby is not None
    assert beat.standby.first_seq["a"] > first["a"] + RATE  # the old ones went
    # 0.5 s of feed, plus up to one heartbeat interval before the trim runs.
    assert RATE * 0.3 < beat.standby.buffered < RATE * (0.5 + 0.1 + 0.2)
    assert beat.standby.dropped == 0  # aged out, not dropped


async def test_trimming_by_bytes_drops_the_oldest_counted(
    live_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = live_feed
    standby = StandbySettings(max_bytes=30_000)  # about 110 messages of ~100 bytes
    async with spawn_worker() as worker:
        await stand_by(worker, [spec(url)], tmp_path, settings=BEATS, standby=standby)
        beat = await worker.wait_for(
            Heartbeat, predicate=lambda b: b.standby is not None and b.standby.dropped > 1000
        )
        await worker.send(stop_in())
        assert await worker.wait() == 0
    stats = beat.standby
    assert stats is not None
    assert stats.bytes <= 30_000 and 90 < stats.buffered <= 110
    assert stats.received >= stats.dropped + stats.buffered


async def test_a_promotion_after_a_loss_writes_a_counted_gap(
    live_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    """A checkpoint older than the buffer (the owner died long ago): what is missing between
    them is a gap, counted and logged as any gap."""
    _, url = live_feed
    async with spawn_worker() as worker:
        first = (await stand_by(worker, [spec(url)], tmp_path, settings=BEATS))["a"]
        await worker.send(promote({"a": first - 10}))
        await worker.wait_for(Ready)
        beat = await worker.wait_for(Heartbeat, predicate=lambda b: "a" in b.streams)
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    assert beat.gaps == 1 and beat.streams["a"]["gaps"] == 1
    assert f"gap: 9 message(s) missing before seq {first}" in worker.log
    assert seqs(sink_file(tmp_path)) == list(range(first, stopped.checkpoint["a"] + 1))


async def test_a_standby_dead_letters_only_what_it_writes_at_promotion(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    frames: list[str | bytes] = ['{"seq": 1}', "not json", '{"seq": 2}', "bad", '{"seq": 3}']
    port = await nursery.start(serve_script, {"s": frames, "quiet": []}, {})
    streams = [
        StreamSpec(id=name, url=f"ws://127.0.0.1:{port}/{name}", sequence="seq", subscribe="go")
        for name in ("s", "quiet")
    ]
    standby = StandbySettings(quiet=0.3)
    async with spawn_worker() as worker:
        await worker.send(standby_start(streams, tmp_path, settings=BEATS, standby=standby))
        sent = trio.current_time()
        ready = await worker.wait_for(StandbyReady)
        assert trio.current_time() - sent >= 0.3  # the quiet stream was waited for
        beat = await worker.wait_for(
            Heartbeat, predicate=lambda b: b.standby is not None and b.standby.received == 5
        )
        assert not any(tmp_path.rglob("*.jsonl"))
        await worker.send(promote({"s": 1}))
        await worker.wait_for(Ready)
        await worker.wait_for(Checkpoint, predicate=lambda c: c.checkpoint.get("s") == 3)
        await worker.send(stop_in())
        await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    assert ready.first_seq == {"s": 1}  # the quiet stream puts no constraint on the cut
    assert beat.standby is not None and beat.standby.malformed == 2
    assert seqs(sink_file(tmp_path, "s")) == [2, 3]
    letters = read_records(tmp_path / "shard-1" / "dead-letter.2.jsonl")
    assert [(d["data"], d["reason"], d["epoch"]) for d in letters] == [
        ("not json", "malformed", 2),
        ("bad", "malformed", 2),
    ]


async def test_heartbeats_flow_while_a_stream_cannot_connect(
    nursery: trio.Nursery, live_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    """Hang detection works for a standby: its heartbeats come from their own task, whatever
    its streams do (here: one busy, one whose server never answers the upgrade)."""
    _, url = live_feed
    listeners = await nursery.start(trio.serve_tcp, _hold_forever, 0)
    mute = f"ws://127.0.0.1:{listeners[0].socket.getsockname()[1]}/x"
    async with spawn_worker() as worker:
        await worker.send(standby_start([spec(url), spec(mute, "mute")], tmp_path, settings=BEATS))
        beats, times = [], []
        with trio.fail_after(10):
            while len(beats) < 20:
                message = await worker.receive()
                assert not isinstance(message, StandbyReady | Error), message
                if isinstance(message, Heartbeat):
                    beats.append(message)
                    times.append(trio.current_time())
        await worker.send(stop_in())
        assert await worker.wait() == 0
    assert max(b - a for a, b in itertools.pairwise(times[5:])) < 0.5
    assert all(beat.standby is not None for beat in beats)
    assert beats[-1].standby is not None and beats[-1].standby.connected == ("a",)


async def _hold_forever(stream: trio.SocketStream) -> None:
    await trio.sleep_forever()


async def test_a_stale_promotion_fence_exits_3_without_writing(
    live_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = live_feed
    async with spawn_worker() as worker:
        first = (await stand_by(worker, [spec(url)], tmp_path))["a"]
        await worker.send(promote({"a": first}, fence_in=-1.0))
        error = await worker.wait_for(Error)
        assert await worker.wait() == 3
    assert error.fatal and "fence" in error.message
    assert seqs(sink_file(tmp_path)) == []


async def test_a_standby_whose_supervisor_is_gone_exits_0_without_a_last_will(
    live_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = live_feed
    async with spawn_worker() as worker:
        await stand_by(worker, [spec(url)], tmp_path)
        await worker.close_control()
        assert await worker.wait(timeout=2) == 0
    assert "a standby holds no lease" in worker.log


async def test_promote_to_an_owner_child_is_a_protocol_error(
    live_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = live_feed
    async with spawn_worker() as worker:
        await worker.send(make_start([spec(url)], tmp_path))
        await worker.expect(Ready)
        await worker.send(promote({}))
        error = await worker.wait_for(Error)
        assert await worker.wait() == 2
    assert "unexpected 'promote'" in error.message


async def test_a_fence_before_promotion_is_ignored(
    live_feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = live_feed
    async with spawn_worker() as worker:
        first = (await stand_by(worker, [spec(url)], tmp_path))["a"]
        await worker.send(Fence(deadline=time.monotonic() - 1))  # (a stale one, even)
        await worker.wait_for(Heartbeat)
        await worker.send(promote({"a": first}))
        await worker.wait_for(Checkpoint)
        await worker.send(stop_in())
        assert await worker.wait() == 0
