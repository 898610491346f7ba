"""Readers -> bounded channel -> one sink task that batches and delivers (every kind but jsonl).

::

    reader (stream a) --\\                                       /--> sink.deliver(batch)
    reader (stream b) ----> memory channel (capacity N) --> Batcher --> dead letters
    reader (stream c) --/       full: readers stop reading,        \\--> checkpoint
                                so TCP pushes back on the feeds

- **Bounded memory.** The channel holds at most ``capacity`` records (the batch size, at
  least 256); the batcher one open batch; the sink one batch in flight. A reader whose send
  blocks does not read, so a feed faster than its sink is slowed down by TCP, not buffered.
- **The checkpoint** moves past a record only once its batch was delivered (``deliver``
  returned) or its records were dead-lettered (``on_failure = "dead_letter"``); the dead
  letters are flushed before a checkpoint that covers them is reported.
- **The fence.** No delivery starts at or after the fence deadline, and one still running when
  it passes is cancelled (its records are not checkpointed): FenceExpired, the child exits 3.
- **on_failure = "crash"**: SinkFailed; the checkpoint stays before the first record not
  delivered, the child exits 4 and its restart resumes from there.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Sequence

import trio

from shard_worker.adapters.log import Log, RateLimitedCount
from shard_worker.adapters.sinks.batch import DeliveryFailed, Sink
from shard_worker.adapters.sinks.jsonl import DeadLetterSink
from shard_worker.contract.pipe import SinkSpec
from shard_worker.core.batcher import Batch, Batcher, Oversized
from shard_worker.drivers.fence import FencedDoor, FenceGuard
from shard_worker.records import Record

FAILURE_LOG_INTERVAL = 1.0
MIN_CAPACITY = 256  # records: what a busy feed sends while the sink task gathers (COALESCE)
COALESCE = 0.002  # seconds the sink task lets records gather after a burst


class SinkFailed(Exception):
    """A batch could not be delivered and ``on_failure = "crash"``: the child exits non-zero."""


class BatchPipeline(FencedDoor):
    def __init__(
        self,
        sink: Sink,
        *,
        spec: SinkSpec,
        fence: FenceGuard,
        checkpoint: dict[str, int],
        dead_letters: DeadLetterSink,
        log: Log,
        measure_frames: bool = False,
        capacity: int = 0,
    ) -> None:
        super().__init__(fence, dead_letters)
        self.sink = sink
        self.log = log
        self.on_failure = spec.on_failure
        self._batcher: Batcher[Record] = Batcher(
            sink.max_records, sink.max_bytes, spec.batch_max_wait
        )
        # A handler has no wire format: the frame's length is its measure (no JSON rendering).
        self._size: Callable[[Record], int] | None = None if measure_frames else sink.size
        self.capacity = capacity or max(MIN_CAPACITY, sink.max_records)
        self._send, self._receive = trio.open_memory_channel[tuple[Record, int]](self.capacity)
        self._last = dict(checkpoint)  # last delivered (or dead-lettered) seq per stream
        self.written = 0  # records delivered since start, all streams
        self.written_by_stream: dict[str, int] = {}
        self.dead_lettered_by_stream: dict[str, int] = {}
        self._failures = RateLimitedCount(FAILURE_LOG_INTERVAL)
        self._retries = RateLimitedCount(FAILURE_LOG_INTERVAL)
        self._finished = trio.Event()
        self._ready: list[Batch[Record] | Oversized[Record]] = []  # see _take_burst

    # --- For the readers ------------------------------------------------------------------

    def sender(self) -> trio.MemorySendChannel[tuple[Record, int]]:
        """A send channel for one reader (close it when the reader ends)."""
        return self._send.clone()

    def seal(self) -> None:
        """Every reader has its sender: once they are all closed, the sink task drains the
        channel, delivers the last batch and finishes."""
        self._send.close()

    # --- The checkpoint -------------------------------------------------------------------

    def last(self, stream: str) -> int:
        return self._last.get(stream, 0)

    def checkpoint(self) -> dict[str, int]:
        """Last sequence per stream of the records delivered or dead-lettered."""
        return dict(self._last)

    def flush(self) -> dict[str, int]:
        """Make the dead letters durable, then name what the checkpoint covers."""
        self.dead_letters.flush()
        return self.checkpoint()

    async def drained(self) -> None:
        """Return once the sink task has delivered everything the (closed) readers sent."""
        await self._finished.wait()

    async def aclose(self) -> None:
        try:
            await self.sink.aclose()
        finally:
            self.dead_letters.close()

    def on_retry(self, exc: BaseException, attempt: int, delay: float) -> None:
        """A handler attempt failed (logged once per burst, with the traceback)."""
        if self._retries.hit():
            trace = "".join(traceback.format_exception(exc))
            self.log.line(
                "WARNING",
                f"handler failed (attempt {attempt}, {self._retries.count} failed attempt(s)"
                f" so far): {type(exc).__name__}: {exc}; again in {delay:.3f}s",
                exc=trace,
            )

    # --- The sink task --------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Batch and deliver until every sender is closed (then the last batch too)."""
        task_status.started()
        batcher = self._batcher
        receive = self._receive
        try:
            async with receive:
                while True:
                    deadline = batcher.deadline()
                    item: tuple[Record, int] | None = None
                    with trio.move_on_at(math.inf if deadline is None else deadline):
                        try:
                            item = await receive.receive()
                        except trio.EndOfChannel:
                            break
                    if item is None:  # the open batch is due
                        due = batcher.due(trio.current_time())
                        if due is not None:
                            await self._handle(due)
                        continue
                    if self._take_burst(item) or await self._take_queued():
                        break
                    # Let records gather instead of waking up for each one (a busy feed would
                    # cost a task switch per record): the readers fill the channel meanwhile,
                    # and block on it only if it fills up first.
                    deadline = batcher.deadline()
                    if deadline is not None:
                        await trio.sleep_until(min(deadline, trio.current_time() + COALESCE))
                last = batcher.drain()
                if last is not None:
                    await self._handle(last)
        finally:
            self._finished.set()

    def _take_burst(self, item: tuple[Record, int]) -> bool:
        """Batch ``item`` and every record queued behind it, up to the first batch that is
        ready (left in ``self._ready`` for _take_queued to deliver); True at the end of the
        channel. Synchronous, one clock read for the whole burst: no await happens in it, so
        every record of it was taken at that same moment."""
        receive, add = self._receive.receive_nowait, self._batcher.add
        size = self._size
        now = trio.current_time()
        while True:
            record, frame_bytes = item
            ready = add(record, frame_bytes if size is None else size(record), now)
            if ready:
                self._ready = ready
                return False
            try:
                item = receive()
            except trio.WouldBlock:
                return False
            except trio.EndOfChannel:
                return True

    async def _take_queued(self) -> bool:
        """Deliver what _take_burst left ready, then go on with the queued records (a new
        burst, a new clock read: delivering took time); True at the end of the channel."""
        while self._ready:
            ready, self._ready = self._ready, []
            for batch in ready:
                await self._handle(batch)
            try:
                item = self._receive.receive_nowait()
            except trio.WouldBlock:
                return False
            except trio.EndOfChannel:
                return True
            if self._take_burst(item):
                return True  # (a burst that ends the channel leaves nothing ready)
        return False

    async def _handle(self, ready: Batch[Record] | Oversized[Record]) -> None:
        if isinstance(ready, Oversized):
            error = f"{ready.size} bytes, over the batch limit of {self._batcher.max_bytes}"
            self._dead_letter_records([ready.record], "record_too_large", error)
            self._advance([ready.record])
            return
        batch = ready.records
        try:
            with self.fence.delivering():
                await self.sink.deliver(batch)
        except DeliveryFailed as exc:
            if self.on_failure == "crash":
                failed = {id(record) for record in exc.records}
                first = next((i for i, r in enumerate(batch) if id(r) in failed), len(batch))
                self._advance(batch[:first], delivered=batch[:first])
                raise SinkFailed(
                    f"{len(exc.records)} of {len(batch)} record(s) not delivered"
                    f" (on_failure = crash): {exc.reason}"
                ) from exc
            self._dead_letter_records(exc.records, "delivery_failed", exc.reason)
            failed = {id(record) for record in exc.records}
            self._advance(batch, delivered=[r for r in batch if id(r) not in failed])
            return
        self._advance(batch, delivered=batch)

    def _dead_letter_records(self, records: Sequence[Record], reason: str, error: str) -> None:
        self.fence.check()
        counts = self.dead_lettered_by_stream
        for record in records:
            self.dead_letters.write_record(record, reason=reason, error=error)
            counts[record.stream] = counts.get(record.stream, 0) + 1
        if self._failures.hit(len(records)):
            self.log.warning(
                f"{len(records)} record(s) dead-lettered ({reason}; {self._failures.count} so"
                f" far): {error}"
            )

    def _advance(self, records: Sequence[Record], delivered: Sequence[Record] = ()) -> None:
        last = self._last
        for record in records:
            if record.seq is not None:
                last[record.stream] = record.seq
        counts = self.written_by_stream
        for record in delivered:
            counts[record.stream] = counts.get(record.stream, 0) + 1
        self.written += len(delivered)
