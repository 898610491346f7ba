"""The batcher's contract, as properties: every record comes out exactly once (in a batch, or
reported oversized), in order; batches are non-empty and within both limits; a batch is
released by time exactly when max_wait has passed since its first record, and not earlier
for any other reason than being full or displaced."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shard_worker.core.batcher import Batch, Batcher, Oversized

limits = st.tuples(
    st.integers(1, 12),  # max_records
    st.integers(1, 120),  # max_bytes
    st.one_of(st.just(0.0), st.floats(0.0, 20.0, allow_nan=False)),  # max_wait
)
# ("add", size, dt) or ("due", dt): dt moves the clock forward first.
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 160), st.floats(0.0, 8.0, allow_nan=False)),
        st.tuples(st.just("due"), st.just(0), st.floats(0.0, 8.0, allow_nan=False)),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None)
@given(limits, operations)
def test_every_record_once_in_order_within_limits_and_on_time(limits, ops):
    max_records, max_bytes, max_wait = limits
    batcher: Batcher[int] = Batcher(max_records, max_bytes, max_wait)
    sizes: list[int] = []  # by record id (= the order of adding)
    added_at: list[float] = []
    out: list[Batch[int] | Oversized[int]] = []
    released = 0  # records that have come out so far
    now = 1000.0

    def take(results, cause, next_size=None):
        nonlocal released
        for item in results:
            out.append(item)
            if isinstance(item, Oversized):
                assert item.size == sizes[item.record] > max_bytes
                released += 1
                continue
            assert 1 <= len(item) <= max_records
            assert item.size == sum(sizes[r] for r in item) <= max_bytes
            assert item.opened_at == added_at[item[0]]
            # Only the first record may arrive once the batch is overdue.
            assert all(added_at[r] < item.opened_at + max_wait for r in item[1:])
            if cause == "add" and item[-1] == len(sizes) - 1:  # holds the new record
                assert len(item) == max_records or item.size >= max_bytes  # full
            elif cause == "add":  # the open batch, released before the new record
                overdue = now >= item.opened_at + max_wait
                assert overdue or item.size + next_size > max_bytes, (item, now, next_size)
            released += len(item)

    for op, size, dt in ops:
        now += dt
        open_before = len(sizes) - released
        if op == "add":
            record = len(sizes)
            sizes.append(size)
            added_at.append(now)
            take(batcher.add(record, size, now), "add", next_size=size)
        else:
            deadline = batcher.deadline()
            batch = batcher.due(now)
            if open_before:
                first_open = added_at[released]
                assert deadline == first_open + max_wait
                assert (batch is not None) == (now >= first_open + max_wait)
            else:
                assert deadline is None
                assert batch is None
            if batch is not None:
                assert len(batch) == open_before  # the whole open batch
                take([batch], "due")
        assert batcher.pending == len(sizes) - released
    last = batcher.drain()
    if last is not None:
        take([last], "drain")
    assert batcher.drain() is None
    assert batcher.deadline() is None

    flat = [r for item in out for r in ([item.record] if isinstance(item, Oversized) else item)]
    assert flat == list(range(len(sizes)))
    assert {i.record for i in out if isinstance(i, Oversized)} == {
        r for r, s in enumerate(sizes) if s > max_bytes
    }


def test_oversized_record_closes_the_open_batch_first():
    batcher: Batcher[str] = Batcher(max_records=5, max_bytes=10, max_wait=1.0)
    assert batcher.add("a", 3, 0.0) == []
    assert batcher.add("big", 11, 0.1) == [Batch(("a",), 3, 0.0), Oversized("big", 11)]
    assert batcher.drain() is None


def test_full_by_count_by_bytes_and_displaced():
    batcher: Batcher[str] = Batcher(max_records=2, max_bytes=10, max_wait=5.0)
    assert batcher.add("a", 1, 0.0) == []
    assert batcher.add("b", 1, 0.0) == [Batch(("a", "b"), 2, 0.0)]
    assert batcher.add("c", 10, 1.0) == [Batch(("c",), 10, 1.0)]  # exactly max_bytes
    assert batcher.add("d", 6, 2.0) == []
    assert batcher.add("e", 6, 3.0) == [Batch(("d",), 6, 2.0)]  # e does not fit beside d
    assert batcher.deadline() == 8.0
    assert batcher.due(7.999) is None
    assert batcher.due(8.0) == Batch(("e",), 6, 3.0)


def test_an_overdue_batch_takes_no_more_records():
    batcher: Batcher[str] = Batcher(max_records=10, max_bytes=100, max_wait=1.0)
    batcher.add("a", 1, 0.0)
    assert batcher.add("b", 1, 1.0) == [Batch(("a",), 1, 0.0)]
    assert batcher.drain() == Batch(("b",), 1, 1.0)


def test_batch_is_a_sequence():
    batch = Batch((1, 2, 3), 3, 0.0)
    assert list(batch) == [1, 2, 3]
    assert batch[1] == 2
    assert batch[1:] == (2, 3)
    assert len(batch) == 3
    assert 3 in batch


@pytest.mark.parametrize("args", [(0, 1, 1.0), (1, 0, 1.0), (1, 1, -1.0), (1, 1, float("nan"))])
def test_invalid_limits(args):
    with pytest.raises(ValueError):
        Batcher(*args)


def test_negative_size():
    with pytest.raises(ValueError):
        Batcher(1, 1, 1.0).add("a", -1, 0.0)
