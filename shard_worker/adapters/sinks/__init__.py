"""Batch sinks (every kind but jsonl): ``open_batch_sink`` makes the one a SinkSpec names.

- ``batch``: the interface every batch sink has (``Sink``, ``DeliveryFailed``);
- ``stdout``, ``kinesis``, ``sqs``, ``handler``: the kinds (``aws``: what kinesis and sqs share);
- ``jsonl``: the JSON-lines files and the dead-letter sink (written synchronously, no batches).

The kinds are imported when asked for: this package stays cheap to import for a worker that
writes JSON lines, and boto3 is loaded only by the AWS ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shard_worker.adapters.sinks.batch import Sink
    from shard_worker.contract.pipe import SinkSpec


def open_batch_sink(spec: SinkSpec, *, on_retry: Callable[..., None] | None = None) -> Sink:
    """The batch sink of ``spec.kind`` (stdout, kinesis, sqs, handler), with the batch limits
    of the spec (0 = the sink's own). Raises ValueError for what the spec cannot make."""
    kind = spec.kind
    if kind == "stdout":
        from shard_worker.adapters.sinks import stdout

        return stdout.StdoutSink(
            stdout.records_stdout(),
            max_records=spec.batch_max_records or stdout.MAX_RECORDS,
            max_bytes=spec.batch_max_bytes or stdout.MAX_BYTES,
        )
    if kind == "kinesis":
        from shard_worker.adapters.sinks import kinesis

        return kinesis.KinesisSink(
            spec.stream,
            region=spec.region,
            endpoint_url=spec.endpoint_url,
            partition_key=spec.partition_key or kinesis.DEFAULT_PARTITION_KEY,
            max_records=spec.batch_max_records or kinesis.MAX_RECORDS,
            max_bytes=spec.batch_max_bytes or kinesis.MAX_BYTES,
            max_attempts=spec.max_attempts,
        )
    if kind == "sqs":
        from shard_worker.adapters.sinks import sqs

        return sqs.SqsSink(
            spec.queue_url,
            region=spec.region,
            endpoint_url=spec.endpoint_url,
            max_records=spec.batch_max_records or sqs.MAX_RECORDS,
            max_bytes=spec.batch_max_bytes or sqs.MAX_BYTES,
            max_attempts=spec.max_attempts,
        )
    if kind == "handler":
        from shard_worker.adapters.sinks import handler

        return handler.HandlerSink(
            handler.load_handler(spec.handler),
            max_records=spec.batch_max_records or handler.MAX_RECORDS,
            # By default no single message is too large for a handler.
            max_bytes=spec.batch_max_bytes or max(handler.MAX_BYTES, spec.max_message_size),
            max_attempts=spec.max_attempts,
            on_retry=on_retry,
        )
    raise ValueError(f"unknown sink kind {kind!r}")
