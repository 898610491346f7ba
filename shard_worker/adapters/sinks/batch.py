"""Batch sinks: where records go (stdout, Kinesis, SQS, a handler), behind one small interface.

Each sink is at-least-once: ``deliver`` returns only when every record of the batch has been
accepted by the destination, and otherwise raises DeliveryFailed naming the records that were
not, after bounded retries. Nothing is dropped silently, so a caller may advance its checkpoint
past a record once the batch holding it has returned (shard_worker/drivers/pipeline.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from shard_worker.records import Record


class DeliveryFailed(Exception):
    """``records`` were not accepted by the destination (the others of the batch were)."""

    def __init__(self, records: Sequence[Record], reason: str) -> None:
        super().__init__(f"{len(records)} record(s) not delivered: {reason}")
        self.records = tuple(records)
        self.reason = reason


class Sink(Protocol):
    """What the worker needs of a destination; batch with ``max_records``, ``max_bytes`` and
    ``size`` (shard_worker/core/batcher.py), then ``deliver`` each batch."""

    max_records: int  # per deliver() call
    max_bytes: int  # per deliver() call, counted by size()

    def size(self, record: Record) -> int:
        """Bytes ``record`` counts against ``max_bytes`` (the destination's own measure)."""
        ...

    async def deliver(self, batch: Sequence[Record]) -> None:
        """Return once every record is accepted; raise DeliveryFailed naming the rest."""
        ...

    async def aclose(self) -> None:
        """Release the sink's resources (idempotent)."""
        ...
