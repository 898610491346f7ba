"""The one door to the sink: checks the fence before every write and tracks the checkpoint.

Keeping both here means no record can reach the sink without a fence check, and the
checkpoint can only name sequences that are in the sink.

Two doors, one per kind of sink:

- ``Recorder``: the jsonl sink, written synchronously by the stream readers (one buffered
  write per message, no queue: the fast path). A reader that writes is not reading, so a slow
  disk slows the feed down through TCP by itself.
- ``shard_worker.drivers.pipeline.BatchPipeline``: every other kind, through a bounded channel and a
  sink task that batches and delivers.

Both share a ``FenceGuard`` with the dead-letter sink.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import trio

from shard_worker.adapters.sinks.jsonl import DeadLetterSink, JsonlSink


class FenceExpired(Exception):
    """The lease may be lost: a peer may own the shard, so writing would make a second writer."""


def trio_deadline(monotonic_deadline: float) -> float:
    """A time.monotonic() deadline on trio's clock (which has a random offset)."""
    return trio.current_time() + (monotonic_deadline - time.monotonic())


class FenceGuard:
    """The fence deadline (time.monotonic() of this host), moved by Fence messages.

    ``check()`` before a write; ``delivering()`` around an awaited delivery: it refuses to
    start at or after the deadline and cancels the delivery when the deadline passes (moving
    the deadline moves the cancellation too)."""

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline
        self._scopes: set[trio.CancelScope] = set()

    @property
    def deadline(self) -> float:
        return self._deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self._deadline = value
        if self._scopes:
            at = trio_deadline(value)
            for scope in self._scopes:
                scope.deadline = at

    def check(self) -> None:
        if time.monotonic() >= self._deadline:
            raise FenceExpired("fence deadline passed: lease may be lost")

    @contextmanager
    def delivering(self) -> Iterator[None]:
        self.check()
        scope = trio.CancelScope(deadline=trio_deadline(self._deadline))
        self._scopes.add(scope)
        try:
            with scope:
                yield
        finally:
            self._scopes.discard(scope)
        if scope.cancelled_caught:
            raise FenceExpired("fence deadline passed during a delivery: lease may be lost")


class Recorder:
    """The jsonl door: ``write`` is synchronous, ``flush`` makes the checkpoint durable."""

    def __init__(
        self,
        sink: JsonlSink,
        fence_deadline: float | FenceGuard,
        checkpoint: dict[str, int],
        dead_letters: DeadLetterSink | None = None,
    ) -> None:
        self.sink = sink
        self.fence = (
            fence_deadline if isinstance(fence_deadline, FenceGuard) else FenceGuard(fence_deadline)
        )
        self.dead_letters = dead_letters
        self.written = 0  # records written since start, all streams
        self._last = dict(checkpoint)  # last written seq per sequenced stream
        self.written_by_stream: dict[str, int] = {}
        self.dead_lettered_by_stream: dict[str, int] = {}  # (jsonl gives up on nothing)

    @property
    def fence_deadline(self) -> float:
        return self.fence.deadline

    @fence_deadline.setter
    def fence_deadline(self, value: float) -> None:
        self.fence.deadline = value

    def write(
        self,
        stream: str,
        seq: int | None,
        data: Any,
        encoding: str | None = None,
        data_json: str | None = None,
    ) -> None:
        """Write one record unless the fence deadline has passed (then raise FenceExpired)."""
        if time.monotonic() >= self.fence._deadline:
            raise FenceExpired("fence deadline passed: lease may be lost")
        self.sink.write(stream, seq, data, encoding, data_json)
        self.written += 1
        self.written_by_stream[stream] = self.written_by_stream.get(stream, 0) + 1
        if seq is not None:
            self._last[stream] = seq

    def writer(self, stream: str) -> Callable[[int | None, str], None]:
        """``write`` of one stream for a record whose data is JSON text already (the message
        as received), in one call: the fence check, the line, the counts. The jsonl hot path
        (StreamReader); everything else goes through ``write``."""
        fence = self.fence
        monotonic = time.monotonic
        write_line = self.sink.line_writer(stream)
        last = self._last
        counts = self.written_by_stream
        counts.setdefault(stream, 0)

        def write(seq: int | None, data_json: str) -> None:
            if monotonic() >= fence._deadline:
                raise FenceExpired("fence deadline passed: lease may be lost")
            write_line(seq, data_json)
            self.written += 1
            counts[stream] += 1
            if seq is not None:
                last[stream] = seq

        return write

    def last(self, stream: str) -> int:
        """Last sequence written for ``stream`` (or resumed from), 0 if none."""
        return self._last.get(stream, 0)

    def checkpoint(self) -> dict[str, int]:
        """Last written sequence per stream: only durable once ``flush()`` has run."""
        return dict(self._last)

    def flush(self) -> dict[str, int]:
        """Flush the dead letters and the sink; returns the checkpoint the flush made durable."""
        if self.dead_letters is not None:
            self.dead_letters.flush()
        self.sink.flush()
        return self.checkpoint()

    def dead_letter(
        self,
        stream: str,
        seq: int | None,
        data: Any,
        *,
        reason: str,
        error: str,
        encoding: str = "",
    ) -> None:
        """Put a message that cannot be a record in the dead-letter sink (fence-checked)."""
        if self.dead_letters is None:
            return
        self.fence.check()
        self.dead_letters.write(stream, seq, data, reason=reason, error=error, encoding=encoding)

    async def drained(self) -> None:
        """Nothing is queued behind the synchronous writes."""

    async def aclose(self) -> None:
        """Flush and close the sink and the dead letters."""
        try:
            self.sink.close()
        finally:
            if self.dead_letters is not None:
                self.dead_letters.close()
