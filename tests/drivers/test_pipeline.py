"""The batch pipeline in-process: bounded channel -> batcher -> sink, the checkpoint only past
what was delivered (or dead-lettered), on_failure, the fence around every delivery, and the
handler sink (sync in a thread, async awaited, retried with backoff)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from shard_worker.adapters.log import Log
from shard_worker.adapters.sinks.batch import DeliveryFailed
from shard_worker.adapters.sinks.handler import HandlerSink, is_async, load_handler
from shard_worker.adapters.sinks.jsonl import DeadLetterSink
from shard_worker.contract.pipe import SinkSpec
from shard_worker.drivers.fence import FenceExpired, FenceGuard
from shard_worker.drivers.pipeline import BatchPipeline, SinkFailed
from shard_worker.records import Record, record_json


class FakeSink:
    """Records every batch; ``fail(batch) -> records`` names the ones to report failed."""

    def __init__(self, max_records: int = 4, max_bytes: int = 10_000, fail=None, block=None):
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.batches: list[list[Record]] = []
        self.fail = fail or (lambda batch: [])
        self.block = block  # an Event to wait for before each delivery
        self.closed = False

    def size(self, record: Record) -> int:
        return len(record_json(record))

    async def deliver(self, batch: Sequence[Record]) -> None:
        if self.block is not None:
            await self.block.wait()
        failed = self.fail(batch)
        self.batches.append([r for r in batch if r not in failed])
        if failed:
            raise DeliveryFailed(failed, "injected")

    async def aclose(self) -> None:
        self.closed = True


def rec(seq: int | None, stream: str = "a", data: Any = None) -> Record:
    return Record("sh", stream, seq, 3, "w", 1.7e9, {"n": seq} if data is None else data)


_opened: list[DeadLetterSink] = []


@pytest.fixture(autouse=True)
def _close_dead_letters():
    yield
    while _opened:
        _opened.pop().close()


def raises_in_group(kind: type[BaseException], match: str = ""):
    """pytest.raises for an exception that a trio nursery wraps in an ExceptionGroup."""
    return pytest.RaisesGroup(pytest.RaisesExc(kind, match=match or None), flatten_subgroups=True)


def make(
    tmp_path: Path, sink: Any, *, fence_in: float = 60.0, capacity: int = 0, **spec: Any
) -> BatchPipeline:
    dead = DeadLetterSink(
        str(tmp_path / "{shard}" / "dl.{epoch}.jsonl"), shard="sh", epoch=3, worker="w"
    )
    _opened.append(dead)
    return BatchPipeline(
        sink,
        spec=SinkSpec(kind="stdout", **spec),
        fence=FenceGuard(time.monotonic() + fence_in),
        checkpoint={"a": 0},
        dead_letters=dead,
        log=Log(),
        capacity=capacity,
    )


def dead_letters(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "sh" / "dl.3.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def feed(pipeline: BatchPipeline, records: list[Record]) -> None:
    sender = pipeline.sender()
    pipeline.seal()
    async with sender:
        for record in records:
            await sender.send((record, 10))


async def test_batches_in_order_and_the_checkpoint_follows_deliveries(tmp_path: Path) -> None:
    sink = FakeSink(max_records=4)
    pipeline = make(tmp_path, sink)
    records = [rec(n) for n in range(1, 11)] + [rec(None, "b")]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await feed(pipeline, records)
        await pipeline.drained()
    assert [r for batch in sink.batches for r in batch] == records
    assert all(len(batch) <= 4 for batch in sink.batches)
    assert pipeline.checkpoint() == {"a": 10}
    assert pipeline.written == 11
    assert pipeline.written_by_stream == {"a": 10, "b": 1}
    assert dead_letters(tmp_path) == []


async def test_an_open_batch_goes_out_after_max_wait(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    sink = FakeSink(max_records=100)
    pipeline = make(tmp_path, sink, batch_max_wait=2.0)
    sender = pipeline.sender()
    pipeline.seal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await sender.send((rec(1), 10))
        await trio.sleep(1.9)
        assert sink.batches == [] and pipeline.checkpoint() == {"a": 0}  # not yet delivered
        await trio.sleep(0.2)
        assert sink.batches == [[rec(1)]] and pipeline.checkpoint() == {"a": 1}
        await sender.aclose()
        await pipeline.drained()


async def test_failed_records_are_dead_lettered_with_the_error(tmp_path: Path) -> None:
    sink = FakeSink(max_records=4, fail=lambda batch: [r for r in batch if r.seq in (2, 3)])
    pipeline = make(tmp_path, sink)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await feed(pipeline, [rec(n) for n in range(1, 6)])
        await pipeline.drained()
    assert pipeline.checkpoint() == {"a": 5}  # the stream moved on
    assert pipeline.written == 3
    assert pipeline.dead_lettered_by_stream == {"a": 2}
    pipeline.flush()
    lines = dead_letters(tmp_path)
    assert [(d["seq"], d["reason"], d["error"]) for d in lines] == [
        (2, "delivery_failed", "injected"),
        (3, "delivery_failed", "injected"),
    ]
    assert list(lines[0]) == [
        *("shard", "stream", "seq", "epoch", "worker", "ts", "data", "reason", "error")
    ]


async def test_crash_keeps_the_checkpoint_before_the_first_failed_record(tmp_path: Path) -> None:
    sink = FakeSink(max_records=4, fail=lambda batch: [r for r in batch if r.seq in (7, 8)])
    pipeline = make(tmp_path, sink, on_failure="crash")
    with raises_in_group(SinkFailed, match="2 of 4 record"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipeline.run)
            await feed(pipeline, [rec(n) for n in range(1, 9)])
    assert pipeline.checkpoint() == {"a": 6}  # 5, 6 were delivered in the failed batch
    assert dead_letters(tmp_path) == []


async def test_a_record_over_the_batch_bytes_is_dead_lettered(tmp_path: Path) -> None:
    sink = FakeSink(max_records=10, max_bytes=200)
    pipeline = make(tmp_path, sink)
    big = rec(2, data={"pad": "x" * 500})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await feed(pipeline, [rec(1), big, rec(3)])
        await pipeline.drained()
    assert [r for b in sink.batches for r in b] == [rec(1), rec(3)]
    assert pipeline.checkpoint() == {"a": 3}
    pipeline.flush()
    [letter] = dead_letters(tmp_path)
    assert (letter["seq"], letter["reason"]) == (2, "record_too_large")
    assert letter["data"] == {"pad": "x" * 500}


async def test_no_delivery_starts_after_the_fence(tmp_path: Path) -> None:
    sink = FakeSink()
    pipeline = make(tmp_path, sink, fence_in=-1.0)
    with raises_in_group(FenceExpired):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipeline.run)
            await feed(pipeline, [rec(1)])
    assert sink.batches == [] and pipeline.checkpoint() == {"a": 0}


async def test_a_delivery_running_at_the_fence_is_cancelled_unless_the_fence_moves(
    tmp_path: Path,
) -> None:
    never = trio.Event()
    pipeline = make(tmp_path, FakeSink(block=never), fence_in=0.3)
    started = time.monotonic()
    with raises_in_group(FenceExpired, match="during a delivery"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipeline.run)
            await feed(pipeline, [rec(1)])
    assert 0.25 < time.monotonic() - started < 2.0
    assert pipeline.checkpoint() == {"a": 0}

    release = trio.Event()
    sink = FakeSink(block=release)
    pipeline = make(tmp_path, sink, fence_in=0.3)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        await feed(pipeline, [rec(1)])
        await trio.sleep(0.1)
        pipeline.fence_deadline = time.monotonic() + 10  # a Fence message arrives
        await trio.sleep(0.4)  # past the first deadline
        release.set()
        await pipeline.drained()
    assert pipeline.checkpoint() == {"a": 1}


async def test_a_full_channel_blocks_the_reader(tmp_path: Path) -> None:
    """Bounded memory: with the sink stuck, a reader can hand over only so many records."""
    stuck = trio.Event()
    pipeline = make(tmp_path, FakeSink(max_records=4, block=stuck), capacity=16)
    sender = pipeline.sender()
    pipeline.seal()
    sent = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipeline.run)
        with trio.move_on_after(0.5):
            while True:
                await sender.send((rec(sent + 1), 10))
                sent += 1
        # one batch in delivery + the channel; never more
        assert sent == 4 + 16
        stuck.set()
        await sender.aclose()
        await pipeline.drained()
    assert pipeline.checkpoint() == {"a": sent}


# --- The handler sink -------------------------------------------------------------------------


async def test_a_sync_handler_runs_in_a_thread_and_an_async_one_on_the_loop() -> None:
    threads: list[str] = []
    got: list[tuple[Record, ...]] = []

    def sync_handler(batch: tuple[Record, ...]) -> None:
        threads.append(threading.current_thread().name)
        got.append(batch)

    async def async_handler(batch: tuple[Record, ...]) -> None:
        await trio.sleep(0)
        threads.append(threading.current_thread().name)
        got.append(batch)

    assert not is_async(sync_handler) and is_async(async_handler)
    for handler in (sync_handler, async_handler):
        await HandlerSink(handler).deliver([rec(1), rec(2)])
    assert got == [(rec(1), rec(2))] * 2
    assert threads[0] != threading.current_thread().name
    assert threads[1] == threading.current_thread().name


async def test_a_raising_handler_is_retried_then_fails_the_batch() -> None:
    calls: list[int] = []
    retries: list[tuple[str, int]] = []

    def flaky(batch: tuple[Record, ...]) -> None:
        calls.append(len(batch))
        raise ValueError(f"nope {len(calls)}")

    sink = HandlerSink(
        flaky,
        max_attempts=3,
        backoff_initial=0.001,
        backoff_max=0.002,
        on_retry=lambda exc, attempt, delay: retries.append((str(exc), attempt)),
    )
    with pytest.raises(DeliveryFailed) as info:
        await sink.deliver([rec(1)])
    assert calls == [1, 1, 1]
    assert retries == [("nope 1", 1), ("nope 2", 2)]
    assert info.value.records == (rec(1),)
    assert info.value.reason == "handler raised ValueError: nope 3 (3 attempt(s))"

    outcomes = iter([RuntimeError("once"), None])

    def recovers(batch: tuple[Record, ...]) -> None:
        if (outcome := next(outcomes)) is not None:
            raise outcome

    await HandlerSink(recovers, backoff_initial=0.001).deliver([rec(1)])  # second try returns


async def test_a_handler_thread_that_starts_after_the_fence_does_not_call_the_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fence is checked when the batch is handed to the handler's worker thread; on a busy
    machine that thread may start after the deadline. Then the handler must not be called
    (the delivery was cancelled, its records are not checkpointed: a call would be a write past
    the fence). Here every worker thread starts 0.6 s late: the fence passes at 0.3 s."""
    real_start = trio._threads.start_thread_soon  # type: ignore[attr-defined]

    def start_late(fn: Any, deliver: Any, name: str | None = None) -> None:
        def late() -> Any:
            time.sleep(0.6)
            return fn()

        real_start(late, deliver, name)

    monkeypatch.setattr(trio._threads, "start_thread_soon", start_late)
    called: list[float] = []
    pipeline = make(
        tmp_path, HandlerSink(lambda batch: called.append(time.monotonic())), fence_in=0.3
    )
    with raises_in_group(FenceExpired, match="during a delivery"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipeline.run)
            await feed(pipeline, [rec(1)])
    await trio.to_thread.run_sync(time.sleep, 0.1)  # (late too: after the handler thread)
    assert called == []
    assert pipeline.checkpoint() == {"a": 0}


async def test_a_sync_handler_that_returns_an_awaitable_is_an_error() -> None:
    async def work() -> None:
        pass

    sink = HandlerSink(lambda batch: work(), max_attempts=1)
    with pytest.raises(DeliveryFailed, match="TypeError"):
        await sink.deliver([rec(1)])


def test_load_handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pkg_handlers.py").write_text(
        "class Sink:\n    @staticmethod\n    def handle(batch):\n        return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_handler("pkg_handlers:Sink.handle")(()) is None
    for bad, message in [
        ("pkg_handlers", "expected"),
        ("pkg_handlers:missing", "has no attribute"),
        ("no_such_pkg_xyz:f", "cannot import module"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_handler(bad)
