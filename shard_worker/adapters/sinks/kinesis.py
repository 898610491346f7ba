"""Kinesis Data Streams sink: PutRecords in batches, resending only the entries that failed.

Each Kinesis record's ``Data`` is one public record (records.record_json, UTF-8, no newline);
its partition key comes from a template (default ``{shard}:{stream}``, so one stream's records
share a Kinesis shard and keep their order there, barring a retry — see docs/sinks.md).
"""

from __future__ import annotations

import random
from typing import Any

from shard_worker.adapters.sinks.aws import AwsBatchSink, EntryFailure
from shard_worker.adapters.sinks.jsonl import render_path
from shard_worker.records import Record, record_json

MAX_RECORDS = 500  # PutRecords: entries per request
MAX_BYTES = 5 * 1024 * 1024  # PutRecords: data + partition keys per request
MAX_RECORD_BYTES = 1024 * 1024  # one entry: data + partition key
MAX_KEY_CHARS = 256  # partition key length (Unicode characters)
DEFAULT_PARTITION_KEY = "{shard}:{stream}"

# Per-entry error codes worth resending (the rest, e.g. KMSAccessDeniedException, stay failed).
_RETRY_ENTRY_CODES = frozenset(
    {"ProvisionedThroughputExceededException", "InternalFailure", "KMSThrottlingException"}
)


class KinesisSink(AwsBatchSink[dict[str, Any]]):
    """At-least-once delivery to one Kinesis stream (by name, or by ARN if it starts with
    ``arn:``). ``client``: a boto3 Kinesis client to use instead of making one (tests)."""

    def __init__(
        self,
        stream: str,
        *,
        region: str = "",
        endpoint_url: str = "",
        partition_key: str = DEFAULT_PARTITION_KEY,
        max_records: int = MAX_RECORDS,
        max_bytes: int = MAX_BYTES,
        max_record_bytes: int = MAX_RECORD_BYTES,
        max_attempts: int = 8,
        backoff_initial: float = 0.05,
        backoff_max: float = 2.0,
        client: Any = None,
        rng: random.Random | None = None,
    ) -> None:
        if not partition_key:
            raise ValueError("the partition key template is empty")
        super().__init__(
            "kinesis",
            region=region,
            endpoint_url=endpoint_url,
            max_records=max_records,
            records_limit=MAX_RECORDS,
            max_bytes=max_bytes,
            bytes_limit=MAX_BYTES,
            max_attempts=max_attempts,
            backoff=(backoff_initial, backoff_max),
            client=client,
            rng=rng,
        )
        self.max_record_bytes = min(max_record_bytes, max_bytes)
        self._template = partition_key
        self._target = {"StreamARN" if stream.startswith("arn:") else "StreamName": stream}

    def partition_key(self, record: Record) -> str:
        """The template filled in (str.replace, like the JSONL sink's path: other braces stay)."""
        return render_path(
            self._template,
            shard=record.shard,
            stream=record.stream,
            epoch=record.epoch,
            worker=record.worker,
        )

    def size(self, record: Record) -> int:
        """Data plus partition key, in bytes: what Kinesis counts against its limits."""
        return len(record_json(record)) + len(self.partition_key(record).encode())

    def _entry(self, record: Record) -> tuple[dict[str, Any], int] | str:
        data = record_json(record).encode()
        key = self.partition_key(record)
        size = len(data) + len(key.encode())
        if size > self.max_record_bytes or not 1 <= len(key) <= MAX_KEY_CHARS:
            return (
                f"record {record.stream}:{record.seq}: {size} bytes, partition key of "
                f"{len(key)} characters (limits {self.max_record_bytes}, {MAX_KEY_CHARS})"
            )
        return {"Data": data, "PartitionKey": key}, size

    def _send(self, entries: list[dict[str, Any]]) -> list[EntryFailure]:
        """One PutRecords request (blocking); the entries Kinesis did not take, and why."""
        response = self._client.put_records(Records=entries, **self._target)
        if not response.get("FailedRecordCount"):
            return []
        return [
            EntryFailure(
                index,
                result["ErrorCode"] in _RETRY_ENTRY_CODES,
                f"{result['ErrorCode']}: {result.get('ErrorMessage', '')}",
            )
            for index, result in enumerate(response["Records"])
            if result.get("ErrorCode")
        ]
