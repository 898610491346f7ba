"""Finding sequence numbers in messages, and the dedup/gap rules (pure code)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_worker.core.sequence import MalformedMessage, SequencePath, SequenceTracker


def test_top_level_and_dotted_paths() -> None:
    assert SequencePath.parse("seq").extract({"seq": 5}) == 5
    assert SequencePath.parse("meta.seq").extract({"meta": {"seq": 7}, "seq": 1}) == 7
    assert SequencePath.parse("a.b.c").lookup({"a": {"b": {"c": [1]}}}) == [1]


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("seq", {}),
        ("seq", {"seq": "5"}),
        ("seq", {"seq": 5.0}),
        ("seq", {"seq": True}),
        ("seq", {"seq": None}),
        ("seq", [1]),
        ("seq", "seq"),
        ("meta.seq", {"meta": 3}),
        ("meta.seq", {"meta": {"other": 1}}),
        ("meta.seq", {"meta.seq": 1}),
    ],
)
def test_malformed(path: str, data: object) -> None:
    with pytest.raises(MalformedMessage):
        SequencePath.parse(path).extract(data)


@pytest.mark.parametrize("path", ["", ".", "a.", ".a", "a..b"])
def test_bad_paths_are_rejected(path: str) -> None:
    with pytest.raises(ValueError, match="bad sequence path"):
        SequencePath.parse(path)


def test_in_order_duplicates_and_gaps() -> None:
    tracker = SequenceTracker()
    assert [tracker.admit(s) for s in (1, 2, 2, 1, 3, 7, 5, 8)] == [0, 0, None, None, 0, 3, None, 0]
    assert (tracker.last, tracker.duplicates, tracker.gaps, tracker.missing) == (8, 3, 1, 3)


def test_resume_from_checkpoint() -> None:
    tracker = SequenceTracker(last=100)
    assert tracker.admit(100) is None
    assert tracker.admit(101) == 0
    assert tracker.admit(110) == 8


@given(st.lists(st.integers(-5, 60)))
def test_admitted_is_strictly_increasing_and_accounts_for_everything(seqs: list[int]) -> None:
    tracker = SequenceTracker()
    admitted = [s for s in seqs if tracker.admit(s) is not None]
    assert admitted == sorted(set(admitted))
    assert tracker.duplicates == len(seqs) - len(admitted)
    if admitted:
        assert tracker.last == admitted[-1]
        assert tracker.missing == admitted[-1] - len(admitted)  # never-admitted numbers below last
