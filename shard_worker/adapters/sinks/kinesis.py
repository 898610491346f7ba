"""Kinesis Data Streams sink: PutRecords in batches, resending only the entries that failed.

Each Kinesis record's ``Data`` is one public record (records.record_json, UTF-8, no newline);
its partition key comes from a template (default ``{shard}:{stream}``, so one stream's records
share a Kinesis shard and keep their order there, barring a retry — see docs/sinks.md).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import trio

from shard_worker.adapters.sinks.aws import EntryFailure, deliver_entries, make_client
from shard_worker.adapters.sinks.jsonl import render_path
from shard_worker.core.backoff import Backoff
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


class KinesisSink:
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
        if not 1 <= max_records <= MAX_RECORDS:
            raise ValueError(f"max_records must be in 1..{MAX_RECORDS}, got {max_records}")
        if not 1 <= max_bytes <= MAX_BYTES:
            raise ValueError(f"max_bytes must be in 1..{MAX_BYTES}, got {max_bytes}")
        if not partition_key:
            raise ValueError("the partition key template is empty")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.max_record_bytes = min(max_record_bytes, max_bytes)
        self._template = partition_key
        self._target = {"StreamARN" if stream.startswith("arn:") else "StreamName": stream}
        self._max_attempts = max_attempts
        self._backoff = (backoff_initial, backoff_max)
        self._rng = rng or random.Random()
        if client is None:
            client = make_client("kinesis", region, endpoint_url)
        self._client = client
        self._closed = False

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

    async def deliver(self, batch: Sequence[Record]) -> None:
        """Put every record of ``batch`` (in several requests if it is over the limits)."""
        if self._closed:
            raise RuntimeError("deliver on a closed sink")
        entries: list[tuple[Record, dict[str, Any], int]] = []
        rejected: list[tuple[Record, str]] = []
        for record in batch:
            data = record_json(record).encode()
            key = self.partition_key(record)
            size = len(data) + len(key.encode())
            if size > self.max_record_bytes or not 1 <= len(key) <= MAX_KEY_CHARS:
                why = (
                    f"record {record.stream}:{record.seq}: {size} bytes, partition key of "
                    f"{len(key)} characters (limits {self.max_record_bytes}, {MAX_KEY_CHARS})"
                )
                rejected.append((record, why))
            else:
                entries.append((record, {"Data": data, "PartitionKey": key}, size))
        await deliver_entries(
            batch,
            entries,
            rejected,
            self._put,
            max_records=self.max_records,
            max_bytes=self.max_bytes,
            max_attempts=self._max_attempts,
            backoff=lambda: Backoff(*self._backoff, rng=self._rng),
        )

    def _put(self, entries: list[dict[str, Any]]) -> list[EntryFailure]:
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

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await trio.to_thread.run_sync(self._client.close)
