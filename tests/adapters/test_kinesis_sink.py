"""The Kinesis sink against moto's server over HTTP: every record arrives exactly as sent;
partial failures (injected: entries not sent, reported failed) are resent alone; throttled
calls are retried; and what cannot be delivered is named, never dropped."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from botocore.exceptions import ClientError
from helpers.aws_sinks import FAST, REGION, batches, client_for, make_records

from shard_worker.adapters.sinks.batch import DeliveryFailed
from shard_worker.adapters.sinks.kinesis import KinesisSink
from shard_worker.records import Record, record_json
from supervisor.devtools.servers import ServerProcess


@pytest.fixture
def client(moto_server: ServerProcess, _aws_env: None) -> Iterator[Any]:
    yield from client_for("kinesis", moto_server.url)


@pytest.fixture
def stream(client: Any) -> str:
    name = "s-" + uuid.uuid4().hex[:12]
    client.create_stream(StreamName=name, ShardCount=2)
    return name


def read_stream(client: Any, stream: str) -> list[tuple[str, bytes]]:
    """(partition key, data) of every record, shard by shard, in each shard's order."""
    out = []
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while True:
            response = client.get_records(ShardIterator=iterator, Limit=10000)
            if not response["Records"]:
                break
            out.extend((r["PartitionKey"], r["Data"]) for r in response["Records"])
            iterator = response["NextShardIterator"]
    return out


def assert_exactly_once(
    client: Any, stream: str, records: list[Record], key: str, ordered: bool = True
) -> None:
    """Every record once, as sent; in order per partition key unless a retry reordered it."""
    got = read_stream(client, stream)
    assert sorted(data for _, data in got) == sorted(record_json(r).encode() for r in records)
    for pk in {k for k, _ in got} if ordered else ():
        sent = [record_json(r).encode() for r in records if key.format(**_fields(r)) == pk]
        assert [data for k, data in got if k == pk] == sent


def _fields(record: Record) -> dict[str, Any]:
    return {"shard": record.shard, "stream": record.stream, "epoch": record.epoch}


class FlakyKinesis:
    """The real client, except that chosen entries of a request are not sent and come back
    failed (ProvisionedThroughputExceededException), and the first ``throttle`` calls fail
    whole (ThrottlingException). Every request's (stream, seq) list is kept in ``calls``."""

    def __init__(self, real: Any, fail: Any = lambda attempt, record: False, throttle: int = 0):
        self.real = real
        self.fail = fail  # (attempt of this entry, record dict) -> bool
        self.throttle = throttle
        self.calls: list[list[tuple[str, int | None]]] = []
        self.seen: dict[bytes, int] = {}
        self.lock = threading.Lock()

    def put_records(self, **kwargs: Any) -> dict[str, Any]:
        with self.lock:
            entries = kwargs["Records"]
            parsed = [json.loads(e["Data"]) for e in entries]
            self.calls.append([(p["stream"], p["seq"]) for p in parsed])
            if len(self.calls) <= self.throttle:
                error = {"Code": "ThrottlingException", "Message": "Rate exceeded"}
                raise ClientError({"Error": error}, "PutRecords")
            failing = []
            for entry, record in zip(entries, parsed, strict=True):
                attempt = self.seen[entry["Data"]] = self.seen.get(entry["Data"], 0) + 1
                failing.append(self.fail(attempt, record))
            sent = [e for e, f in zip(entries, failing, strict=True) if not f]
            results = iter(
                self.real.put_records(**{**kwargs, "Records": sent})["Records"] if sent else []
            )
            merged = [
                {"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "slow"}
                if f
                else next(results)
                for f in failing
            ]
            return {"FailedRecordCount": sum(failing), "Records": merged}

    def close(self) -> None:
        pass


async def deliver_all(sink: KinesisSink, records: list[Record], max_records: int) -> int:
    """Batch like the worker will (count and size limits) and deliver; returns the batches."""
    cut = batches(sink, records, max_records)
    for batch in cut:
        await sink.deliver(batch)
    return len(cut)


async def test_every_record_arrives_exactly_as_sent(client, stream):
    records = make_records(60)
    sink = KinesisSink(stream, client=client, **FAST)
    with trio.fail_after(20):
        assert await deliver_all(sink, records, max_records=25) == 3
    assert_exactly_once(client, stream, records, "{shard}:{stream}")
    for _, data in read_stream(client, stream):
        assert json.loads(data)["epoch"] == 7


async def test_own_endpoint_client_and_partition_key_template(moto_server, client, stream):
    sink = KinesisSink(
        stream,
        region=REGION,
        endpoint_url=moto_server.url,
        partition_key="{stream}/{epoch}/{worker}",
    )
    records = make_records(6)
    try:
        with trio.fail_after(20):
            await sink.deliver(records)
    finally:
        await sink.aclose()
    got = read_stream(client, stream)
    assert {key for key, _ in got} == {"feed-0/7/w-1", "feed-1/7/w-1", "feed-2/7/w-1"}
    assert_exactly_once(client, stream, records, "{stream}/{epoch}/w-1")
    with pytest.raises(RuntimeError):
        await sink.deliver(records)


async def test_partial_failures_resend_exactly_the_failed_entries(client, stream):
    records = make_records(40)

    def fail(attempt: int, record: dict[str, Any]) -> bool:  # every third, twice
        binary = "encoding" in record
        return not binary and attempt <= 2 and record["data"]["i"] % 3 == 0

    flaky = FlakyKinesis(client, fail=fail)
    sink = KinesisSink(stream, client=flaky, **FAST)
    with trio.fail_after(20):
        await sink.deliver(records)
    first, second, third = flaky.calls
    failed = [(r.stream, r.seq) for r in records if r.encoding == "" and r.data["i"] % 3 == 0]
    assert first == [(r.stream, r.seq) for r in records]
    assert second == failed  # only the failed ones, in batch order
    assert third == failed
    # The resent entries land after their successful neighbours: order is by seq, not arrival.
    assert_exactly_once(client, stream, records, "{shard}:{stream}", ordered=False)


async def test_throttled_calls_are_retried(client, stream):
    records = make_records(12)
    flaky = FlakyKinesis(client, throttle=3)
    sink = KinesisSink(stream, client=flaky, **FAST)
    with trio.fail_after(20):
        await sink.deliver(records)
    assert len(flaky.calls) == 4
    assert_exactly_once(client, stream, records, "{shard}:{stream}")


async def test_after_max_attempts_the_undelivered_records_are_named(client, stream):
    records = make_records(15)
    stuck = [r for r in records if r.stream == "feed-1"]
    flaky = FlakyKinesis(client, fail=lambda attempt, r: r["stream"] == "feed-1")
    sink = KinesisSink(stream, client=flaky, max_attempts=3, **FAST)
    with trio.fail_after(20), pytest.raises(DeliveryFailed) as caught:
        await sink.deliver(records)
    assert caught.value.records == tuple(stuck)
    assert "gave up after 3 attempts" in caught.value.reason
    assert "ProvisionedThroughputExceededException" in caught.value.reason
    assert len(flaky.calls) == 3
    delivered = [r for r in records if r.stream != "feed-1"]
    assert_exactly_once(client, stream, delivered, "{shard}:{stream}")


async def test_throttling_that_never_ends_fails_the_whole_batch(client, stream):
    records = make_records(5)
    flaky = FlakyKinesis(client, throttle=1000)
    sink = KinesisSink(stream, client=flaky, max_attempts=4, **FAST)
    with trio.fail_after(20), pytest.raises(DeliveryFailed) as caught:
        await sink.deliver(records)
    assert caught.value.records == tuple(records)
    assert "ThrottlingException" in caught.value.reason
    assert len(flaky.calls) == 4
    assert read_stream(client, stream) == []


async def test_other_client_errors_fail_at_once(client):
    sink = KinesisSink("no-such-stream", client=client, **FAST)
    records = make_records(3)
    with trio.fail_after(20), pytest.raises(DeliveryFailed) as caught:
        await sink.deliver(records)
    assert caught.value.records == tuple(records)
    assert "ResourceNotFoundException" in caught.value.reason


async def test_a_record_over_the_limit_fails_alone_and_the_rest_is_delivered(client, stream):
    records = make_records(6)
    big = Record("shard-a", "feed-0", 100, 7, "w-1", 1.7e9, "x" * 3000)
    sink = KinesisSink(stream, client=client, max_record_bytes=2048, **FAST)
    assert sink.size(big) == len(record_json(big)) + len("shard-a:feed-0")
    with trio.fail_after(20), pytest.raises(DeliveryFailed) as caught:
        await sink.deliver([*records[:3], big, *records[3:]])
    assert caught.value.records == (big,)
    assert_exactly_once(client, stream, records, "{shard}:{stream}")


async def test_a_batch_over_the_request_limits_is_split(client, stream):
    records = make_records(30)
    flaky = FlakyKinesis(client)
    sink = KinesisSink(stream, client=flaky, max_records=8, **FAST)
    with trio.fail_after(20):
        await sink.deliver(records)
    assert [len(call) for call in flaky.calls] == [8, 8, 8, 6]
    assert_exactly_once(client, stream, records, "{shard}:{stream}")


def test_limits_are_checked(client):
    with pytest.raises(ValueError):
        KinesisSink("s", client=client, max_records=501)
    with pytest.raises(ValueError):
        KinesisSink("s", client=client, max_bytes=5 * 1024 * 1024 + 1)
    with pytest.raises(ValueError):
        KinesisSink("s", client=client, partition_key="")
