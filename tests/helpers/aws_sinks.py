"""What the Kinesis and SQS sink tests share: records of every shape a sink must carry, a boto3
client for moto's server, and batches cut as the worker cuts them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from shard_worker.adapters.sinks.aws import make_client
from shard_worker.adapters.sinks.batch import Sink
from shard_worker.core.batcher import Batch, Batcher, Oversized
from shard_worker.records import Record

REGION = "us-east-1"
FAST = {"backoff_initial": 0.001, "backoff_max": 0.01}  # retries without waiting


def make_records(count: int, epoch: int = 7, worker: str = "w-1", first: int = 0) -> list[Record]:
    """Three streams, two sequenced (feed-0, feed-1) and one not (feed-2); JSON with non-ASCII
    text and nested values, and every fifth record binary (base64)."""
    records = []
    for i in range(first, first + count):
        stream = f"feed-{i % 3}"
        if i % 5 == 4:
            data, encoding = "AAEC/w==", "base64"
        else:
            data, encoding = {"i": i, "text": "é ☃ \u2028", "nested": [1.5, None]}, ""
        seq = None if stream == "feed-2" else i
        records.append(Record("shard-a", stream, seq, epoch, worker, 1.7e9 + i / 7, data, encoding))
    return records


def client_for(service: str, endpoint_url: str) -> Iterator[Any]:
    """A fixture's body: the sinks' own kind of client for ``service``, closed afterwards."""
    client = make_client(service, REGION, endpoint_url)
    yield client
    client.close()


def batches(sink: Sink, records: Sequence[Record], max_records: int) -> list[Batch[Record]]:
    """``records`` in batches as the worker cuts them (the sink's count and size limits)."""
    batcher: Batcher[Record] = Batcher(min(max_records, sink.max_records), sink.max_bytes, 60.0)
    cut: list[Batch[Record]] = []
    for record in records:
        for item in batcher.add(record, sink.size(record), 0.0):
            assert not isinstance(item, Oversized)
            cut.append(item)
    last = batcher.drain()
    if last is not None:
        cut.append(last)
    return cut
