"""The SQS sink against moto's server over HTTP: standard queues get every record as sent;
FIFO queues drop a hand-off's replays by their deduplication ids; failed entries that are
not the sender's fault are resent alone; sender faults are named, never dropped."""

from __future__ import annotations

import hashlib
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
from shard_worker.adapters.sinks.sqs import SqsSink, fifo_id
from shard_worker.records import Record, record_json
from supervisor.devtools.servers import ServerProcess


@pytest.fixture
def client(moto_server: ServerProcess, _aws_env: None) -> Iterator[Any]:
    yield from client_for("sqs", moto_server.url)


@pytest.fixture
def queue(client: Any) -> str:
    return client.create_queue(QueueName="q-" + uuid.uuid4().hex[:12])["QueueUrl"]


@pytest.fixture
def fifo_queue(client: Any) -> str:
    name = "q-" + uuid.uuid4().hex[:12] + ".fifo"
    return client.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]


def receive_all(client: Any, queue: str) -> list[dict[str, Any]]:
    """Every message in the queue (received and deleted), in the order SQS handed them out."""
    out: list[dict[str, Any]] = []
    while True:
        response = client.receive_message(
            QueueUrl=queue,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            WaitTimeSeconds=0,
        )
        messages = response.get("Messages", [])
        if not messages:
            return out
        out.extend(messages)
        client.delete_message_batch(
            QueueUrl=queue,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )


def expected_attributes(record: Record) -> dict[str, Any]:
    attributes = {
        "shard": {"DataType": "String", "StringValue": record.shard},
        "stream": {"DataType": "String", "StringValue": record.stream},
        "epoch": {"DataType": "Number", "StringValue": str(record.epoch)},
    }
    if record.seq is not None:
        attributes["seq"] = {"DataType": "Number", "StringValue": str(record.seq)}
    return attributes


def assert_received_exactly(messages: list[dict[str, Any]], records: list[Record]) -> None:
    """Each record once: body and attributes as sent."""
    assert sorted(m["Body"] for m in messages) == sorted(record_json(r) for r in records)
    by_body = {record_json(r): r for r in records}
    for message in messages:
        assert message["MessageAttributes"] == expected_attributes(by_body[message["Body"]])


class FlakySqs:
    """The real client, except that ``fail(attempt, record)`` picks entries that are not sent
    and come back in ``Failed`` (with ``sender_fault``), and the first ``throttle`` calls fail
    whole. Each request's bodies are kept in ``calls``."""

    def __init__(
        self,
        real: Any,
        fail: Any = lambda attempt, record: False,
        sender_fault: bool = False,
        throttle: int = 0,
    ) -> None:
        self.real = real
        self.fail = fail
        self.sender_fault = sender_fault
        self.throttle = throttle
        self.calls: list[list[str]] = []
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()

    def send_message_batch(self, **kwargs: Any) -> dict[str, Any]:
        with self.lock:
            self.calls.append([e["MessageBody"] for e in kwargs["Entries"]])
            if len(self.calls) <= self.throttle:
                error = {"Code": "AWS.SimpleQueueService.RequestThrottled", "Message": "slow"}
                raise ClientError({"Error": error}, "SendMessageBatch")
            failed, sent = [], []
            for entry in kwargs["Entries"]:
                body = entry["MessageBody"]
                attempt = self.seen[body] = self.seen.get(body, 0) + 1
                if self.fail(attempt, json.loads(body)):
                    code = "InvalidParameterValue" if self.sender_fault else "InternalError"
                    failed.append(
                        {"Id": entry["Id"], "SenderFault": self.sender_fault, "Code": code}
                    )
                else:
                    sent.append(entry)
            response = {"Successful": [], "Failed": []}
            if sent:
                response = self.real.send_message_batch(**{**kwargs, "Entries": sent})
            return {**response, "Failed": [*response.get("Failed", []), *failed]}

    def close(self) -> None:
        pass


async def test_standard_queue_receives_every_record_as_sent(moto_server, client, queue):
    records = make_records(25)
    sink = SqsSink(queue, region=REGION, endpoint_url=moto_server.url, **FAST)
    assert not sink.fifo
    cut = batches(sink, records, sink.max_records)
    assert [len(b) for b in cut] == [10, 10, 5]
    try:
        with trio.fail_after(20):
            for batch in cut:
                await sink.deliver(batch)
    finally:
        await sink.aclose()
    messages = receive_all(client, queue)
    assert len(messages) == 25
    assert_received_exactly(messages, records)


async def test_fifo_queue_drops_a_hand_offs_replay(client, fifo_queue):
    first_owner = make_records(12, epoch=7, worker="w-1")
    # The next owner resumes from an older checkpoint: seqs 6..11 again, then new ones.
    replay = [r for r in make_records(12, epoch=8, worker="w-2") if r.seq is not None][4:]
    assert [r.seq for r in replay] == [6, 7, 9, 10]
    new = [r for r in make_records(6, epoch=8, worker="w-2", first=12) if r.seq is not None]
    sink = SqsSink(fifo_queue, client=client, **FAST)
    assert sink.fifo
    with trio.fail_after(20):
        await sink.deliver(first_owner)
        await sink.deliver(first_owner[:10])  # an exact resend (lost answer, crash)
        await sink.deliver(replay)
        await sink.deliver(new)
    messages = receive_all(client, fifo_queue)
    # Replays are dropped by SQS (first copy wins), unsequenced exact resends too.
    assert_received_exactly(messages, first_owner + new)
    for stream in ("feed-0", "feed-1"):
        seqs = [json.loads(m["Body"])["seq"] for m in messages if f'"{stream}"' in m["Body"]]
        assert seqs == sorted(seqs)  # FIFO per group


def test_fifo_ids():
    sink = SqsSink("http://x/1/q.fifo", client=object())
    sequenced, unsequenced = make_records(3)[1:3]
    entry, _ = sink.entry(sequenced)
    assert entry["MessageGroupId"] == "feed-1"
    assert entry["MessageDeduplicationId"] == "feed-1:1"
    entry, _ = sink.entry(unsequenced)
    body = record_json(unsequenced).encode()
    assert entry["MessageDeduplicationId"] == hashlib.sha256(body).hexdigest()
    # Not allowed by SQS (a space, non-ASCII, too long): a stable hash instead.
    assert fifo_id("a b") == hashlib.sha256(b"a b").hexdigest()
    assert fifo_id("ström") == fifo_id("ström") != "ström"
    assert len(fifo_id("x" * 200)) == 64
    assert fifo_id("x" * 128) == "x" * 128
    standard, _ = SqsSink("http://x/1/q", client=object()).entry(sequenced)
    assert "MessageGroupId" not in standard


async def test_failed_entries_are_resent_alone(client, queue):
    records = make_records(10)
    flaky = FlakySqs(client, fail=lambda attempt, r: attempt == 1 and r["stream"] == "feed-1")
    sink = SqsSink(queue, client=flaky, **FAST)
    with trio.fail_after(20):
        await sink.deliver(records)
    assert flaky.calls == [
        [record_json(r) for r in records],
        [record_json(r) for r in records if r.stream == "feed-1"],
    ]
    assert_received_exactly(receive_all(client, queue), records)


async def test_throttled_calls_are_retried(client, queue):
    records = make_records(4)
    flaky = FlakySqs(client, throttle=2)
    sink = SqsSink(queue, client=flaky, **FAST)
    with trio.fail_after(20):
        await sink.deliver(records)
    assert len(flaky.calls) == 3
    assert_received_exactly(receive_all(client, queue), records)


async def test_retries_are_bounded(client, queue):
    records = make_records(6)
    flaky = FlakySqs(client, fail=lambda attempt, r: r["stream"] == "feed-0")
    sink = SqsSink(queue, client=flaky, max_attempts=3, **FAST)
    with trio.fail_after(20), pytest.raises(DeliveryFailed) as caught:
        await sink.deliver(records)
    assert caught.value.records == tuple(r for r in records if r.stream == "feed-0")
    assert "gave up after 3 attempts" in caught.value.reason
    assert len(flaky.calls) == 3
    assert_received_exactly(
        receive_all(client, queue), [r for r in records if r.stream != "feed-0"]
    )


async def test_a_sender_fault_is_not_retried_and_names_its_records(client, queue):
    records = make_records(8)
    flaky = FlakySqs(client, fail=lambda attempt, r: r["stream"] == "feed-2", sender_fault=True)
    sink = SqsSink(queue, client=flaky, **FAST)
    with trio.fail_after(20), pytest.raises(DeliveryFailed) as caught:
        await sink.deliver(records)
    assert caught.value.records == tuple(r for r in records if r.stream == "feed-2")
    assert "InvalidParameterValue" in caught.value.reason
    assert len(flaky.calls) == 1
    assert_received_exactly(
        receive_all(client, queue), [r for r in records if r.stream != "feed-2"]
    )


async def test_a_missing_queue_fails_the_batch(client, queue):
    records = make_records(3)
    sink = SqsSink(queue + "-gone", client=client, **FAST)
    with trio.fail_after(20), pytest.raises(DeliveryFailed) as caught:
        await sink.deliver(records)
    assert caught.value.records == tuple(records)
    assert "NonExistentQueue" in caught.value.reason or "QueueDoesNotExist" in caught.value.reason


async def test_size_counts_body_and_attributes_and_oversized_fails_alone(client, queue):
    records = make_records(3)
    big = Record("shard-a", "feed-0", 99, 7, "w-1", 1.7e9, "x" * 2000)
    sink = SqsSink(queue, client=client, max_bytes=1024, **FAST)
    body = record_json(records[0])
    attributes = len("shardStringshard-astreamStringfeed-0epochNumber7")
    assert sink.size(records[0]) == len(body) + attributes + len("seqNumber0")
    with trio.fail_after(20), pytest.raises(DeliveryFailed) as caught:
        await sink.deliver([records[0], big, *records[1:]])
    assert caught.value.records == (big,)
    assert_received_exactly(receive_all(client, queue), records)


def test_limits_are_checked():
    with pytest.raises(ValueError):
        SqsSink("http://x/1/q", client=object(), max_records=11)
    with pytest.raises(ValueError):
        SqsSink("http://x/1/q", client=object(), max_bytes=1024 * 1024 + 1)
