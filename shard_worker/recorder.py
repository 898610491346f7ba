"""The one door to the sink: checks the fence before every write and tracks the checkpoint.

Keeping both here means no record can reach the sink without a fence check, and the
checkpoint can only name sequences that are in the sink.
"""

from __future__ import annotations

import time
from typing import Any

from .sink import JsonlSink


class FenceExpired(Exception):
    """The lease may be lost: a peer may own the shard, so writing would make a second writer."""


class Recorder:
    def __init__(self, sink: JsonlSink, fence_deadline: float, checkpoint: dict[str, int]):
        self.sink = sink
        self.fence_deadline = fence_deadline  # time.monotonic(); moved by Fence messages
        self.written = 0  # records written since start, all streams
        self._last = dict(checkpoint)  # last written seq per sequenced stream
        self.written_by_stream: dict[str, int] = {}

    def write(self, stream: str, seq: int | None, data: Any, encoding: str | None = None) -> None:
        """Write one record unless the fence deadline has passed (then raise FenceExpired)."""
        if time.monotonic() >= self.fence_deadline:
            raise FenceExpired("fence deadline passed: lease may be lost")
        self.sink.write(stream, seq, data, encoding)
        self.written += 1
        self.written_by_stream[stream] = self.written_by_stream.get(stream, 0) + 1
        if seq is not None:
            self._last[stream] = seq

    def last(self, stream: str) -> int:
        """Last sequence written for ``stream`` (or resumed from), 0 if none."""
        return self._last.get(stream, 0)

    def checkpoint(self) -> dict[str, int]:
        """Last written sequence per stream: only durable once ``flush()`` has run."""
        return dict(self._last)

    def flush(self) -> dict[str, int]:
        """Flush the sink; returns the checkpoint that the flush made durable."""
        self.sink.flush()
        return self.checkpoint()
