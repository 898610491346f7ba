"""A standby's buffer (shard_worker/core/standby.py): trimming by age and size, the hold of a
standby_ready, readiness, and what promotion writes. Pure: every time is given."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_worker.core.standby import StandbyBuffer, ready_first_seq, ready_recheck_at


def held_in(streams: list[str], *, buffer: float, max_bytes: int) -> StandbyBuffer:
    """A buffer counting message lengths only (no per-record overhead): plain arithmetic."""
    return StandbyBuffer(streams, buffer=buffer, max_bytes=max_bytes, overhead=0)


def frame(seq: int, size: int = 10) -> str:
    text = f'{{"seq":{seq}}}'
    return text + " " * (size - len(text))


def filled(seqs: range, *, buffer: float = 30.0, max_bytes: int = 10_000) -> StandbyBuffer:
    """Stream "a" holding ``seqs``, one frame of 10 bytes per second from t = 0."""
    held = held_in(["a", "b"], buffer=buffer, max_bytes=max_bytes)
    append = held.appender("a")
    for at, seq in enumerate(seqs):
        append(seq, frame(seq), float(at))
    return held


def test_frames_are_held_with_their_bytes_and_first_seq() -> None:
    held = filled(range(5, 10))
    assert (held.buffered, held.bytes, held.dropped) == (5, 50, 0)
    assert held.first_seq() == {"a": 5}  # "b" holds nothing: absent


def test_trim_drops_what_is_older_than_the_buffer_uncounted() -> None:
    held = filled(range(1, 11), buffer=4.0)  # received at t = 0..9
    assert held.trim(now=10.0) == 6  # t < 6 goes
    assert held.first_seq() == {"a": 7}
    assert (held.buffered, held.bytes, held.dropped) == (4, 40, 0)


def test_max_bytes_drops_the_oldest_of_every_stream_counted() -> None:
    held = held_in(["a", "b"], buffer=30.0, max_bytes=45)
    a, b = held.appender("a"), held.appender("b")
    a(1, frame(1), 0.0)
    b(1, frame(1), 1.0)
    a(2, frame(2), 2.0)
    b(2, frame(2), 3.0)
    assert held.dropped == 0
    a(3, frame(3), 4.0)  # 50 bytes: the oldest of all (a1) goes
    assert (held.bytes, held.dropped) == (40, 1)
    assert held.first_seq() == {"a": 2, "b": 1}
    b(3, frame(3, size=25), 5.0)  # 65 bytes: b1 and a2 go
    assert (held.bytes, held.dropped) == (45, 3)
    assert held.first_seq() == {"a": 3, "b": 2}


def test_a_full_buffer_makes_room_for_a_64th_of_it_at_once() -> None:
    """Not a drop per frame once full: the oldest go down to max_bytes less 1/64th."""
    held = held_in(["a"], buffer=30.0, max_bytes=6400)
    append = held.appender("a")
    for seq in range(1, 321):
        append(seq, frame(seq, 20), 0.0)
    assert (held.bytes, held.dropped) == (6400, 0)
    append(321, frame(321, 20), 0.0)
    assert (held.bytes, held.dropped) == (6300, 6)
    for seq in range(322, 327):
        append(seq, frame(seq, 20), 0.0)
    assert (held.bytes, held.dropped) == (6400, 6)  # room for 5 more at no cost
    assert held.first_seq() == {"a": 7}


def test_a_frame_larger_than_the_whole_buffer_is_dropped_itself() -> None:
    held = held_in(["a"], buffer=30.0, max_bytes=5)
    held.appender("a")(1, frame(1), 0.0)
    assert (held.buffered, held.bytes, held.dropped) == (0, 0, 1)


def test_a_hold_keeps_first_seq_for_buffer_seconds_after_ready() -> None:
    held = filled(range(1, 6), buffer=4.0)  # received at t = 0..4
    held.hold(now=4.5)  # standby_ready at 4.5 with first_seq 1 (received at 0)
    assert held.trim(now=8.0) == 0  # 1 would have aged out at 4.0
    assert held.first_seq() == {"a": 1}
    assert held.trim(now=8.5) == 5  # the hold is over: everything older than 4.5 goes


def test_max_bytes_overrides_a_hold() -> None:
    held = filled(range(1, 6), max_bytes=50)
    held.hold(now=5.0)
    held.appender("a")(6, frame(6), 5.0)
    assert held.first_seq() == {"a": 2} and held.dropped == 1


def test_take_gives_the_frames_after_the_checkpoint_and_frees_the_stream() -> None:
    held = filled(range(5, 10))
    held.appender("b")(3, frame(3), 0.0)
    assert held.take("a", checkpoint=6) == [frame(7), frame(8), frame(9)]
    assert held.take("a", checkpoint=6) == []
    assert (held.buffered, held.bytes) == (1, 10)  # b is still held


@pytest.mark.parametrize(
    ("checkpoint", "expected"),
    [(0, [5, 6, 7]), (4, [5, 6, 7]), (6, [7]), (7, []), (99, [])],
)
def test_take_around_the_ends(checkpoint: int, expected: list[int]) -> None:
    held = filled(range(5, 8))
    assert held.take("a", checkpoint) == [frame(seq) for seq in expected]


def test_take_keeps_a_malformed_frame_received_after_the_cut() -> None:
    """Unnumbered frames (malformed) are written at promotion (dead-lettered there) only if
    they came after the last record the old owner wrote."""
    held = held_in(["a"], buffer=30.0, max_bytes=1000)
    append = held.appender("a")
    for at, (seq, text) in enumerate([(4, "4"), (None, "bad-1"), (5, "5"), (None, "bad-2")]):
        append(seq, text, float(at))
    assert held.take("a", checkpoint=4) == ["bad-1", "5", "bad-2"]
    held = held_in(["a"], buffer=30.0, max_bytes=1000)
    append = held.appender("a")
    for at, (seq, text) in enumerate([(4, "4"), (None, "bad-1"), (5, "5"), (None, "bad-2")]):
        append(seq, text, float(at))
    assert held.take("a", checkpoint=5) == ["bad-2"]


@given(
    sizes=st.lists(st.integers(1, 40), max_size=60),
    max_bytes=st.integers(1, 200),
    buffer=st.floats(0.5, 20.0),
    checkpoint=st.integers(0, 70),
)
def test_bounds_always_hold_and_take_is_exactly_after_the_checkpoint(
    sizes: list[int], max_bytes: int, buffer: float, checkpoint: int
) -> None:
    held = held_in(["a"], buffer=buffer, max_bytes=max_bytes)
    append = held.appender("a")
    for seq, size in enumerate(sizes, start=1):
        append(seq, "x" * size, float(seq))
        assert held.bytes <= max_bytes
        held.trim(now=float(seq))
    first = held.first_seq().get("a")
    taken = held.take("a", checkpoint)
    if first is None:
        assert taken == []
    else:
        # Oldest-first drops keep the tail whole: what is taken is every seq after the cut.
        kept = range(max(first, checkpoint + 1), len(sizes) + 1)
        assert [len(t) for t in taken] == [sizes[seq - 1] for seq in kept]
    assert held.bytes == 0


def test_ready_needs_every_stream_connected() -> None:
    since = {"a": 0.0, "b": None}
    assert ready_first_seq(since, {"a", "b"}, {"a": 3}, quiet=1.0, now=5.0) is None


def test_ready_with_a_record_on_every_sequenced_stream() -> None:
    since = {"a": 0.0, "b": 0.2, "u": 0.0}  # u: unsequenced, needs only its connection
    assert ready_first_seq(since, {"a", "b"}, {"a": 3, "b": 9}, quiet=1.0, now=0.3) == {
        "a": 3,
        "b": 9,
    }


def test_a_quiet_stream_is_ready_after_quiet_seconds_and_left_out() -> None:
    since = {"a": 0.0, "b": 0.5}
    assert ready_first_seq(since, {"a", "b"}, {"a": 3}, quiet=1.0, now=1.4) is None
    assert ready_first_seq(since, {"a", "b"}, {"a": 3}, quiet=1.0, now=1.5) == {"a": 3}


def test_the_rule_is_due_again_when_the_first_quiet_period_ends() -> None:
    since = {"a": 0.0, "b": 0.5, "c": 0.2, "u": 0.1}  # c holds a record; u is unsequenced
    assert ready_recheck_at(since, {"a", "b", "c"}, {"c": 4}, quiet=1.0) == 1.0
    assert ready_recheck_at(since, {"a", "b", "c"}, {"a": 1, "c": 4}, quiet=1.0) == 1.5


def test_only_a_connect_or_a_record_can_make_a_standby_ready_when_none_is_quiet() -> None:
    """Nothing for a clock to wait for: the standby sleeps until a reader tells it."""
    assert ready_recheck_at({"a": None, "b": None}, {"a", "b"}, {}, quiet=1.0) is None
    assert ready_recheck_at({"a": 0.0, "b": None}, {"a", "b"}, {"a": 2}, quiet=1.0) is None


def test_what_a_buffer_counts_is_about_the_memory_it_takes() -> None:
    """max_bytes bounds memory: each record counts its length plus what Python keeps with it."""
    held = StandbyBuffer(["a"], buffer=30.0, max_bytes=1 << 40)
    append = held.appender("a")
    texts = [f'{{"seq":{seq},"pad":"{"x" * 80}"}}' for seq in range(100_000, 110_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seq, text in enumerate(texts, start=100_000):
            append(seq, text, float(seq))
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # (the texts themselves were allocated before: what the buffer adds is the rest)
    assert 0.85 < (taken + sum(map(len, texts)) + 49 * len(texts)) / held.bytes < 1.15
