"""The one door to the sink: checks the fence before every write and tracks the checkpoint.

Keeping both here means no record can reach the sink without a fence check, and the
checkpoint can only name sequences that are in the sink.

Two doors, one per kind of sink:

- ``Recorder``: the jsonl sink, written synchronously by the stream readers (one buffered
  write per message, no queue: the fast path). A reader that writes is not reading, so a slow
  disk slows the feed down through TCP by itself.
- ``shard_worker.drivers.pipeline.BatchPipeline``: every other kind, through a bounded channel
  and a sink task that batches and delivers.

Both are a ``FencedDoor`` (drivers/fence.py): one fence guard, the dead-letter sink behind it.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from shard_worker.adapters.sinks.jsonl import DeadLetterSink, JsonlSink, LineWriter
from shard_worker.drivers.fence import FencedDoor, FenceExpired, FenceGuard


class Recorder(FencedDoor):
    """The jsonl door: ``writer(stream)`` writes synchronously, ``flush`` makes the checkpoint
    durable."""

    def __init__(
        self,
        sink: JsonlSink,
        fence_deadline: float | FenceGuard,
        checkpoint: dict[str, int],
        dead_letters: DeadLetterSink,
    ) -> None:
        fence = (
            fence_deadline if isinstance(fence_deadline, FenceGuard) else FenceGuard(fence_deadline)
        )
        super().__init__(fence, dead_letters)
        self.sink = sink
        self._tallies = {stream: _Tally(last=seq) for stream, seq in checkpoint.items()}
        self.dead_lettered_by_stream: dict[str, int] = {}  # (jsonl gives up on nothing)

    def writer(self, stream: str) -> LineWriter:
        """The write of one stream, ``(seq, data, encoding, data_json)`` (JsonlSink.write):
        the fence check, the line, the counts, in one call. Raises FenceExpired once the fence
        deadline has passed (nothing is written then)."""
        fence = self.fence
        monotonic = time.monotonic
        write_line = self.sink.line_writer(stream)
        tally = self._tallies.setdefault(stream, _Tally())

        def write(seq: int | None, data: Any, encoding: str, data_json: str | None) -> None:
            if monotonic() >= fence._deadline:
                raise FenceExpired("fence deadline passed: lease may be lost")
            write_line(seq, data, encoding, data_json)
            tally.written += 1
            if seq is not None:
                tally.last = seq

        return write

    @property
    def written(self) -> int:
        """Records written since start, all streams."""
        return sum(tally.written for tally in self._tallies.values())

    @property
    def written_by_stream(self) -> dict[str, int]:
        return {stream: tally.written for stream, tally in self._tallies.items()}

    def last(self, stream: str) -> int:
        """Last sequence written for ``stream`` (or resumed from), 0 if none."""
        tally = self._tallies.get(stream)
        return 0 if tally is None or tally.last is None else tally.last

    def checkpoint(self) -> dict[str, int]:
        """Last written sequence per stream: only durable once ``flush()`` has run."""
        return {s: tally.last for s, tally in self._tallies.items() if tally.last is not None}

    def flush(self) -> dict[str, int]:
        """Flush the dead letters and the sink; returns the checkpoint the flush made durable."""
        self.dead_letters.flush()
        self.sink.flush()
        return self.checkpoint()

    async def drained(self) -> None:
        """Nothing is queued behind the synchronous writes."""

    async def aclose(self) -> None:
        """Flush and close the sink and the dead letters."""
        try:
            self.sink.close()
        finally:
            self.dead_letters.close()


@attrs.define
class _Tally:
    """One stream's writes, counted where they happen (slots: cheaper per write than dicts
    keyed by stream): how many, and the last sequence number (None: none yet)."""

    written: int = 0
    last: int | None = None
