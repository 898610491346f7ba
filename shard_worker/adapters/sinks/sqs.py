"""SQS sink: SendMessageBatch, standard or FIFO queues, resending only the entries that failed.

Each message body is one public record (records.record_json, no newline), with the message
attributes ``shard``, ``stream``, ``epoch`` (Number) and ``seq`` (Number, sequenced streams
only), so a consumer can filter or fence without parsing the body. On a FIFO queue (its URL
ends in ``.fifo``) the group id is the stream and the deduplication id ``{stream}:{seq}``: a
new owner's replay after a hand-off carries the same ids, and SQS drops it within its 5-minute
deduplication window.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from shard_worker.adapters.sinks.aws import AwsBatchSink, EntryFailure
from shard_worker.records import Record, record_json

MAX_RECORDS = 10  # SendMessageBatch: entries per request
MAX_BYTES = 256 * 1024  # the classic limit per message and per request (body + attributes)
API_MAX_BYTES = 1024 * 1024  # what SQS accepts since 2025 on queues that allow it

# MessageGroupId / MessageDeduplicationId: 1-128 of alphanumerics and punctuation.
_FIFO_ID = re.compile(r"[\x21-\x7e]{1,128}")


def fifo_id(text: str) -> str:
    """``text`` if SQS accepts it as a group or deduplication id, else its SHA-256 (hex):
    deterministic either way, so a replay still maps to the same id."""
    if _FIFO_ID.fullmatch(text):
        return text
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class SqsSink(AwsBatchSink[dict[str, Any]]):
    """At-least-once delivery to one queue. ``client``: a boto3 SQS client to use instead of
    making one (tests)."""

    def __init__(
        self,
        queue_url: str,
        *,
        region: str = "",
        endpoint_url: str = "",
        max_records: int = MAX_RECORDS,
        max_bytes: int = MAX_BYTES,
        max_attempts: int = 8,
        backoff_initial: float = 0.05,
        backoff_max: float = 2.0,
        client: Any = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(
            "sqs",
            region=region,
            endpoint_url=endpoint_url,
            max_records=max_records,
            records_limit=MAX_RECORDS,
            max_bytes=max_bytes,  # also the largest single message
            bytes_limit=API_MAX_BYTES,
            max_attempts=max_attempts,
            backoff=(backoff_initial, backoff_max),
            client=client,
            rng=rng,
        )
        self.queue_url = queue_url
        self.fifo = queue_url.endswith(".fifo")

    def entry(self, record: Record) -> tuple[dict[str, Any], int]:
        """The SendMessageBatch entry for ``record`` (without its Id), and its size as SQS
        counts it: body plus every attribute's name, type and value."""
        body = record_json(record)
        attributes = {
            "shard": {"DataType": "String", "StringValue": record.shard},
            "stream": {"DataType": "String", "StringValue": record.stream},
            "epoch": {"DataType": "Number", "StringValue": str(record.epoch)},
        }
        if record.seq is not None:
            attributes["seq"] = {"DataType": "Number", "StringValue": str(record.seq)}
        entry: dict[str, Any] = {"MessageBody": body, "MessageAttributes": attributes}
        if self.fifo:
            entry["MessageGroupId"] = fifo_id(record.stream)
            entry["MessageDeduplicationId"] = (
                fifo_id(f"{record.stream}:{record.seq}")
                if record.seq is not None
                else hashlib.sha256(body.encode()).hexdigest()  # only exact resends dedup
            )
        size = len(body) + sum(
            len(name) + len(value["DataType"]) + len(value["StringValue"].encode())
            for name, value in attributes.items()
        )
        return entry, size

    def size(self, record: Record) -> int:
        return self.entry(record)[1]

    def _entry(self, record: Record) -> tuple[dict[str, Any], int] | str:
        entry, size = self.entry(record)
        if size > self.max_bytes:
            return f"record {record.stream}:{record.seq}: {size} bytes > {self.max_bytes}"
        return entry, size

    def _send(self, entries: list[dict[str, Any]]) -> list[EntryFailure]:
        """One SendMessageBatch request (blocking); the entries SQS did not take, and why.
        Entry ids are positions in this request; a sender fault will fail again: no retry."""
        request = [{"Id": str(index), **entry} for index, entry in enumerate(entries)]
        response = self._client.send_message_batch(QueueUrl=self.queue_url, Entries=request)
        return [
            EntryFailure(
                int(failed["Id"]),
                not failed.get("SenderFault", False),
                f"{failed.get('Code', '?')}: {failed.get('Message', '')}",
            )
            for failed in response.get("Failed", [])
        ]
