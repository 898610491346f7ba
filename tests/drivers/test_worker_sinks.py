"""The real shard worker child with each kind of sink: handler (retries, dead letters, crash,
backpressure with flat memory), stdout, kinesis and sqs against moto's server, and what becomes
of malformed and too large messages. Real pipes, real feeds on 127.0.0.1."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from helpers.feeds import serve_script, start_feed
from helpers.worker_helpers import make_start, read_records, spawn_worker, stop_in

from shard_worker.adapters.sinks.aws import make_client
from shard_worker.contract.pipe import (
    Checkpoint,
    Error,
    Heartbeat,
    Ready,
    SinkSpec,
    Stopped,
    StreamSpec,
)
from supervisor.devtools.feed import FeedServer
from supervisor.devtools.servers import ServerProcess

pytestmark = pytest.mark.slow


def handled(out: Path, stream: str = "a", epoch: int = 1) -> list[dict[str, Any]]:
    return read_records(out / "handled" / "shard-1" / f"{stream}.{epoch}.jsonl")


def dead_letters(out: Path, epoch: int = 1) -> list[dict[str, Any]]:
    return read_records(out / "shard-1" / f"dead-letter.{epoch}.jsonl")


def handler_env(out: Path, **extra: str) -> dict[str, str]:
    return {"SINK_HANDLER_OUT": str(out / "handled"), **extra}


def handler_sink(name: str, **fields: Any) -> SinkSpec:
    return SinkSpec(
        kind="handler", handler=f"helpers.sink_handlers:{name}", batch_max_wait=0.05, **fields
    )


async def test_a_failing_batch_is_retried_then_dead_lettered_and_the_stream_moves_on(
    feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = feed
    calls = tmp_path / "calls.txt"
    env = handler_env(tmp_path, SINK_HANDLER_FAIL="5", SINK_HANDLER_CALLS=str(calls))
    sink = handler_sink("record", batch_max_records=1, max_attempts=3)
    async with spawn_worker(env=env) as worker:
        await worker.send(make_start([StreamSpec("a", url, sequence="seq")], tmp_path, sink=sink))
        await worker.expect(Ready)
        await worker.wait_for(Checkpoint, predicate=lambda c: c.checkpoint.get("a", 0) >= 50)
        beat = await worker.wait_for(Heartbeat)
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    [letter] = dead_letters(tmp_path)
    assert (letter["seq"], letter["reason"]) == (5, "delivery_failed")
    assert letter["error"] == "handler raised ValueError: seq 5 refused (3 attempt(s))"
    assert letter["data"]["seq"] == 5 and letter["epoch"] == 1
    attempts = [line.split() for line in calls.read_text().splitlines()]
    assert [int(call[1]) for call in attempts].count(5) == 3  # retried, then given up
    last = stopped.checkpoint["a"]
    assert [r["seq"] for r in handled(tmp_path)] == [n for n in range(1, last + 1) if n != 5]
    assert beat.streams["a"]["dead_lettered"] == 1
    assert stopped.written == last - 1  # delivered; the dead letter is not counted as written
    assert "handler failed (attempt 1" in worker.log


async def test_on_failure_crash_exits_4_after_reporting_what_was_delivered(
    feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = feed
    env = handler_env(tmp_path, SINK_HANDLER_FAIL="20")
    sink = handler_sink("record", batch_max_records=5, max_attempts=2, on_failure="crash")
    reports: list[Any] = []
    async with spawn_worker(env=env) as worker:
        await worker.send(make_start([StreamSpec("a", url, sequence="seq")], tmp_path, sink=sink))
        await worker.expect(Ready)
        while not (reports and isinstance(reports[-1], Error)):
            message = await worker.receive(timeout=10)
            assert message is not None, worker.log
            reports.append(message)
        assert await worker.wait() == 4
    error = reports[-1]
    assert error.fatal
    assert "sink failed" in error.message and "seq 20 refused" in error.message
    checkpoint = [r for r in reports if isinstance(r, Checkpoint)][-1].checkpoint["a"]
    assert 15 <= checkpoint < 20  # everything before the refused batch, nothing after
    assert [r["seq"] for r in handled(tmp_path)] == list(range(1, checkpoint + 1))
    assert dead_letters(tmp_path) == []


async def test_no_delivery_starts_after_the_fence_deadline(
    feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = feed
    calls = tmp_path / "calls.txt"
    sink = handler_sink("record", batch_max_records=50)
    async with spawn_worker(env=handler_env(tmp_path, SINK_HANDLER_CALLS=str(calls))) as worker:
        start = make_start(
            [StreamSpec("a", url, sequence="seq")], tmp_path, sink=sink, fence_in=1.5
        )
        deadline_wall = time.time() + (start.fence_deadline - time.monotonic())
        await worker.send(start)
        await worker.expect(Ready)
        error = await worker.wait_for(Error, timeout=5)
        assert await worker.wait() == 3
    assert error.fatal and "fence deadline passed" in error.message
    started = [float(line.split()[3]) for line in calls.read_text().splitlines()]
    assert started, "batches were delivered before the deadline"
    assert max(started) < deadline_wall
    seqs = [r["seq"] for r in handled(tmp_path)]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_an_async_handler_gets_every_record_once_on_a_graceful_stop(
    feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = feed
    streams = [StreamSpec(s, url, sequence="seq") for s in ("a", "b")]
    async with spawn_worker(env=handler_env(tmp_path)) as worker:
        await worker.send(make_start(streams, tmp_path, sink=handler_sink("record_async")))
        await worker.expect(Ready)
        await worker.wait_for(
            Checkpoint, predicate=lambda c: min(c.checkpoint.get(s, 0) for s in "ab") >= 300
        )
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    for stream in ("a", "b"):
        records = handled(tmp_path, stream)
        assert [r["seq"] for r in records] == list(range(1, stopped.checkpoint[stream] + 1))
        assert {(r["shard"], r["epoch"], r["worker"]) for r in records} == {("shard-1", 1, "w1")}
    assert stopped.written == stopped.checkpoint["a"] + stopped.checkpoint["b"]


async def test_a_sink_slower_than_the_feed_keeps_memory_flat_and_loses_nothing(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """The feed sends 5,000 messages/s, the handler takes 500/s: readers stop reading, TCP
    pushes back, the child's RSS stays flat; after stop, everything up to the checkpoint was
    handled, exactly once."""
    server, url = await start_feed(nursery, 5000.0)
    env = handler_env(tmp_path, SINK_HANDLER_RATE="500")
    sink = handler_sink("slow", batch_max_records=100)
    samples: list[float] = []
    async with spawn_worker(env=env) as worker:
        await worker.send(make_start([StreamSpec("a", url, sequence="seq")], tmp_path, sink=sink))
        await worker.expect(Ready)

        async def drain_reports() -> None:
            while await worker.channel.receive() is not None:
                pass

        async with trio.open_nursery() as reports:
            reports.start_soon(drain_reports)
            for _ in range(10):
                samples.append(rss_mib(worker.process.pid))
                await trio.sleep(1.0)
            reports.cancel_scope.cancel()
        await worker.send(stop_in(10))
        stopped = await worker.wait_for(Stopped, timeout=10)
        assert await worker.wait() == 0
    last = stopped.checkpoint["a"]
    assert [r["seq"] for r in handled(tmp_path)] == list(range(1, last + 1))
    ahead = server.last_seq("shard-1-a")
    assert ahead > 5 * last, "the feed ran well ahead: backpressure held it back"
    settled = samples[3:]
    assert max(settled) - min(settled) < 8, f"RSS grew under backpressure: {samples}"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("kind", ["jsonl", "handler"])
async def test_malformed_and_too_large_messages_are_dead_lettered_and_the_child_stays_up(
    nursery: trio.Nursery, tmp_path: Path, kind: str
) -> None:
    big = '{"seq": 3, "pad": "' + "x" * 3000 + '"}'
    scripts: dict[str, list[str | bytes]] = {
        "bad": ['{"seq": 1}', "not json", '{"seq": "2"}', b"\xff\xfe", '{"seq": 2}'],
        "big": ['{"seq": 1}', '{"seq": 2}', big],  # replayed on every reconnect
    }
    port = await nursery.start(serve_script, scripts, {})
    streams = [
        StreamSpec(id=name, url=f"ws://127.0.0.1:{port}/{name}", sequence="seq", subscribe="go")
        for name in scripts
    ]
    sink = (
        SinkSpec(path=str(tmp_path / "{shard}" / "{stream}.{epoch}.jsonl"), max_message_size=2048)
        if kind == "jsonl"
        else handler_sink("record", max_message_size=2048)
    )
    async with spawn_worker(env=handler_env(tmp_path)) as worker:
        await worker.send(make_start(streams, tmp_path, sink=sink))
        await worker.expect(Ready)
        with trio.fail_after(10):
            while sum(d["reason"] == "message_too_large" for d in dead_letters(tmp_path)) < 2:
                await trio.sleep(0.05)
        # A heartbeat queued before the second dead letter would be stale: wait for one after.
        with trio.fail_after(10):
            beat = await worker.wait_for(Heartbeat)
            while (
                beat.streams["big"]["dead_lettered"] < 2
                or beat.streams["big"]["reconnects"] < 2
                or beat.streams["bad"]["malformed"] < 3
            ):
                beat = await worker.wait_for(Heartbeat)
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    assert stopped.checkpoint == {"bad": 2, "big": 2}
    letters = dead_letters(tmp_path)
    bad = [
        (d["reason"], d["error"], d["data"], d.get("encoding"))
        for d in letters
        if d["stream"] == "bad"
    ]
    assert bad == [
        ("malformed", "not JSON", "not json", None),
        ("malformed", "sequence '2' is not an integer", {"seq": "2"}, None),
        ("malformed", "binary frame is not UTF-8", "//4=", "base64"),
    ]
    too_large = [d for d in letters if d["stream"] == "big"]
    assert {d["reason"] for d in too_large} == {"message_too_large"}
    assert too_large[0]["data"] is None and too_large[0]["seq"] is None
    assert "over max_message_size (2048 bytes) after seq 2" in too_large[0]["error"]
    assert beat.streams["bad"]["dead_lettered"] == 3 and beat.streams["bad"]["malformed"] == 3
    assert beat.streams["big"]["dead_lettered"] >= 2 and beat.streams["big"]["reconnects"] >= 2
    assert "code 1009" in worker.log
    assert "malformed message dead-lettered (1 so far)" in worker.log


async def test_stdout_sink_writes_only_records_to_stdout(
    feed: tuple[FeedServer, str], tmp_path: Path
) -> None:
    _, url = feed
    async with spawn_worker() as worker:
        start = make_start(
            [StreamSpec("a", url, sequence="seq")],
            tmp_path,
            sink=SinkSpec(kind="stdout", batch_max_wait=0.05),
        )
        await worker.send(start)
        await worker.expect(Ready)
        await worker.wait_for(Checkpoint, predicate=lambda c: c.checkpoint.get("a", 0) >= 200)
        await worker.send(stop_in())
        stopped = await worker.wait_for(Stopped)
        assert await worker.wait() == 0
    lines = worker.stdout.decode().splitlines(keepends=True)
    assert all(line.endswith("\n") for line in lines)
    records = [json.loads(line) for line in lines]
    assert [r["seq"] for r in records] == list(range(1, stopped.checkpoint["a"] + 1))
    assert list(records[0]) == ["shard", "stream", "seq", "epoch", "worker", "ts", "data"]
    assert "ready" in worker.log  # the log stays on stderr


# --- Kinesis and SQS through a real child, against moto's server ------------------------------


async def run_child_to(
    stream: StreamSpec, tmp_path: Path, sink: SinkSpec, at_least: int = 200
) -> Stopped:
    """Run a child until ``at_least`` records are checkpointed, then stop it; the stop
    deadline leaves it time to deliver what it had queued (up to a channel of 256 records)."""
    async with spawn_worker() as worker:
        await worker.send(make_start([stream], tmp_path, sink=sink))
        await worker.expect(Ready, timeout=10)
        await worker.wait_for(
            Checkpoint, timeout=20, predicate=lambda c: c.checkpoint.get("a", 0) >= at_least
        )
        await worker.send(stop_in(30))
        stopped = await worker.wait_for(Stopped, timeout=30)
        assert await worker.wait() == 0
        assert "stop deadline reached" not in worker.log, worker.log
    return stopped


async def test_kinesis_sink_through_a_child(
    feed: tuple[FeedServer, str], tmp_path: Path, moto_server: ServerProcess
) -> None:
    _, url = feed
    client = make_client("kinesis", "us-east-1", moto_server.url)
    name = "k-" + uuid.uuid4().hex[:10]
    client.create_stream(StreamName=name, ShardCount=1)
    sink = SinkSpec(
        kind="kinesis",
        stream=name,
        region="us-east-1",
        endpoint_url=moto_server.url,
        batch_max_wait=0.1,
    )
    stopped = await run_child_to(StreamSpec("a", url, sequence="seq"), tmp_path, sink)
    shard_id = client.list_shards(StreamName=name)["Shards"][0]["ShardId"]
    iterator = client.get_shard_iterator(
        StreamName=name, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    got: list[dict[str, Any]] = []
    while True:
        response = client.get_records(ShardIterator=iterator, Limit=10000)
        if not response["Records"]:
            break
        got += [json.loads(r["Data"]) | {"_key": r["PartitionKey"]} for r in response["Records"]]
        iterator = response["NextShardIterator"]
    client.close()
    assert [r["seq"] for r in got] == list(range(1, stopped.checkpoint["a"] + 1))  # once each
    assert {r["_key"] for r in got} == {"shard-1:a"}
    assert {(r["epoch"], r["worker"]) for r in got} == {(1, "w1")}


async def test_sqs_fifo_sink_through_a_child(
    nursery: trio.Nursery, tmp_path: Path, moto_server: ServerProcess
) -> None:
    # moto's server takes 40-300 ms per FIFO SendMessageBatch of 10 (it grows with the queue,
    # and with the load on the machine): a live feed outruns it, and after Stop the child
    # had up to a channel of records (256) left to deliver within the stop deadline. A feed
    # of exactly COUNT messages lets the test wait until all of them are delivered (the
    # checkpoint) and stop the child with nothing left queued.
    count = 120
    frames: list[str | bytes] = [json.dumps({"seq": n}) for n in range(1, count + 1)]
    port = await nursery.start(serve_script, {"a": frames}, {})
    stream = StreamSpec("a", f"ws://127.0.0.1:{port}/a", sequence="seq", subscribe="go")
    client = make_client("sqs", "us-east-1", moto_server.url)
    queue = client.create_queue(
        QueueName=f"q-{uuid.uuid4().hex[:10]}.fifo", Attributes={"FifoQueue": "true"}
    )["QueueUrl"]
    sink = SinkSpec(
        kind="sqs",
        queue_url=queue,
        region="us-east-1",
        endpoint_url=moto_server.url,
        batch_max_wait=0.05,
    )
    stopped = await run_child_to(stream, tmp_path, sink, at_least=count)
    bodies: list[dict[str, Any]] = []
    while True:
        messages = client.receive_message(
            QueueUrl=queue, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        ).get("Messages", [])
        if not messages:
            break
        bodies += [json.loads(m["Body"]) for m in messages]
        assert all(m["MessageAttributes"]["stream"]["StringValue"] == "a" for m in messages)
        client.delete_message_batch(
            QueueUrl=queue,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )
    client.close()
    assert [b["seq"] for b in bodies] == list(range(1, stopped.checkpoint["a"] + 1))
