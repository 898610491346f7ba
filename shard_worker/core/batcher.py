"""Groups records into batches by count, bytes and age: a pure core, no I/O, no clock reads.

The caller passes ``now`` (any monotonic clock) and each record's size as its sink counts it,
and sends what comes back. Everything ``add`` and ``drain`` return comes out in the order the
records went in (a batch, then an oversized record, then the next batch...), so a caller that
handles the results in order can advance its checkpoint past a record only once everything up
to it has been delivered (or dead-lettered).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar, overload

import attrs

T = TypeVar("T")


@attrs.frozen
class Batch(Sequence[T], Generic[T]):
    """Records to deliver in one request: never empty, within the batcher's limits.

    ``opened_at`` is the ``now`` of its first record; ``size`` the sum of the records' sizes.
    """

    records: tuple[T, ...]
    size: int
    opened_at: float

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...
    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        return self.records[index]

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[T]:
        return iter(self.records)


@attrs.frozen
class Oversized(Generic[T]):
    """A record larger than ``max_bytes`` on its own: no batch can carry it. Reported, never
    dropped, so the caller can dead-letter it (and still account for it in the checkpoint)."""

    record: T
    size: int


def _positive(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be at least 1, got {value}")


def _non_negative(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value >= 0:  # (also rejects NaN)
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


# No setattr hooks: the limits are checked once, at init, and ``add`` (once per record of a
# batch sink's hot path) then costs plain attribute writes, not attrs' validating setattr.
@attrs.define(on_setattr=attrs.setters.NO_OP)
class Batcher(Generic[T]):
    """One open batch at a time. A batch is released when it is full (``max_records`` records,
    or ``max_bytes`` exactly), when the next record would not fit, or once ``max_wait`` has
    passed since its first record: by ``due``, or by the next ``add`` (a record never joins an
    overdue batch, so no batch waits longer than ``max_wait`` for its first record's sake)."""

    max_records: int = attrs.field(validator=_positive)
    max_bytes: int = attrs.field(validator=_positive)
    max_wait: float = attrs.field(validator=_non_negative)
    _records: list[T] = attrs.field(factory=list, init=False)
    _size: int = attrs.field(default=0, init=False)
    _opened_at: float = attrs.field(default=0.0, init=False)

    def add(self, record: T, size: int, now: float) -> list[Batch[T] | Oversized[T]]:
        """Take ``record`` (``size`` bytes as the sink counts them); returns what is ready to
        send, in record order: an overdue or displaced open batch, a full batch, an oversized
        record. Usually empty."""
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        ready: list[Batch[T] | Oversized[T]] = []
        if self._records and (
            now >= self._opened_at + self.max_wait or self._size + size > self.max_bytes
        ):
            ready.append(self._close())
        if size > self.max_bytes:
            ready.append(Oversized(record, size))
            return ready
        if not self._records:
            self._opened_at = now
        self._records.append(record)
        self._size += size
        if len(self._records) >= self.max_records or self._size >= self.max_bytes:
            ready.append(self._close())
        return ready

    def due(self, now: float) -> Batch[T] | None:
        """The open batch if ``max_wait`` has passed since its first record (else None)."""
        if self._records and now >= self._opened_at + self.max_wait:
            return self._close()
        return None

    def deadline(self) -> float | None:
        """When the open batch becomes due (on the caller's clock); None when nothing is open."""
        return self._opened_at + self.max_wait if self._records else None

    def drain(self) -> Batch[T] | None:
        """The open batch regardless of age (at a checkpoint or stop); None when empty."""
        return self._close() if self._records else None

    @property
    def pending(self) -> int:
        """Records in the open batch."""
        return len(self._records)

    def _close(self) -> Batch[T]:
        batch = Batch(tuple(self._records), self._size, self._opened_at)
        self._records = []
        self._size = 0
        return batch
