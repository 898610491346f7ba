"""Why a held shard leaves, to whom, and the drain's timings: exact values, no I/O."""

from __future__ import annotations

import pytest
from helpers.fake_runner import FakeRunner as Runner

from supervisor.core.handoff import (
    LeaveReason,
    OperatorRequests,
    drain_budget,
    operator_requests,
    stop_grace,
    successors,
)
from supervisor.core.items import ShardItem, WorkerItem
from supervisor.core.lease import PeerTracker
from supervisor.core.runner_state import RunnerState


def me(session: str = "sess", drain: float = 0.0) -> WorkerItem:
    return WorkerItem("me", session, 1, "running", 0.0, 0.0, drain_requested=drain)


def item(sid: str, epoch: int = 1, owner: str = "me", **kw) -> ShardItem:
    return ShardItem(sid, owner, epoch, **kw)


def ask(shards, held, *, workers=(), runnable=("a", "b", "c")) -> OperatorRequests:
    return operator_requests(
        me="me", session="sess", workers=workers, shards=shards, held=held, runnable=runnable
    )


def test_each_mark_in_the_table_and_its_reason():
    shards = [
        item("a", retired_at=5.0, release_requested=1.0),  # retired wins over a release
        item("gone"),  # not in the config, not registered
        item("b", release_requested=2.0),
        item("c"),  # nothing asked
    ]
    held = {sid: Runner() for sid in ("a", "gone", "b", "c")}
    assert ask(shards, held, workers=[me()]) == OperatorRequests(
        drain=False,
        leaving=(
            ("a", LeaveReason.RETIRED),
            ("gone", LeaveReason.REMOVED),
            ("b", LeaveReason.OPERATOR_RELEASE),
        ),
    )


def test_a_drain_of_this_incarnation_hands_off_every_serving_shard():
    shards = [item("a"), item("b"), item("c")]
    held = {
        "a": Runner(),
        "b": Runner(state=RunnerState.STOPPING),  # already leaving
        "c": Runner(state=RunnerState.BACKOFF),
    }
    requests = ask(shards, held, workers=[me(drain=3.0)])
    assert requests == OperatorRequests(
        drain=True, leaving=(("a", LeaveReason.OPERATOR_DRAIN), ("c", LeaveReason.OPERATOR_DRAIN))
    )
    # A drain written for an earlier incarnation of our id is not ours to obey.
    assert ask(shards, held, workers=[me(session="old", drain=3.0)]).drain is False
    assert ask(shards, held, workers=[]).drain is False


def test_a_mark_for_another_epoch_or_another_owner_changes_nothing():
    shards = [item("a", epoch=2, retired_at=1.0), item("b", owner="w2", release_requested=1.0)]
    held = {"a": Runner(epoch=1), "b": Runner(epoch=1)}
    assert ask(shards, held, workers=[me()]).leaving == ()


def test_shards_we_do_not_serve_are_skipped():
    shards = [item("a", retired_at=1.0), item("b", retired_at=1.0), item("x", retired_at=1.0)]
    held = {"a": Runner(state=RunnerState.LOST), "b": Runner(state=RunnerState.QUARANTINED)}
    assert ask(shards, held, workers=[me()]).leaving == ()


@pytest.mark.parametrize(
    ("reason", "value", "cools", "named"),
    [
        (LeaveReason.RETIRED, "retired", False, False),
        (LeaveReason.REMOVED, "removed from the config", True, True),
        (LeaveReason.OPERATOR_DRAIN, "operator drain", True, True),
        (LeaveReason.OPERATOR_RELEASE, "operator release", True, True),
        (LeaveReason.REBALANCE, "rebalance", True, True),
        (LeaveReason.DEFINITION_CHANGED, "definition changed", False, False),
        (LeaveReason.SHUTDOWN, "shutdown", False, True),
        (LeaveReason.FAST_SHUTDOWN, "fast shutdown", False, False),
    ],
)
def test_each_reason_its_public_string_cool_down_and_successor(reason, value, cools, named):
    assert (f"{reason}", reason.cools_down, reason.names_successor) == (value, cools, named)
    assert list(LeaveReason).count(reason) == 1


def test_successors_are_the_least_loaded_live_peers():
    tracker = PeerTracker(duration=10.0)
    workers = [
        WorkerItem(w, "s", 1, state, 0.0, 0.0)
        for w, state in (
            ("me", "running"),
            ("p1", "running"),
            ("p2", "running"),
            ("p3", "draining"),
        )
    ]
    tracker.observe(workers, now=0.0)
    shards = [item("x", owner="p1"), item("a"), item("b")]
    got = successors(["b", "a"], me="me", tracker=tracker, shards=shards, now=5.0)
    assert got == {"a": "p2", "b": "p1"}  # p2 has none; then both have one: lowest id
    assert successors(["a"], me="me", tracker=tracker, shards=shards, now=10.0) == {}  # all dead
    assert successors(["a"], me="me", tracker=tracker, shards=None, now=5.0) == {}  # no scan yet
    assert successors([], me="me", tracker=tracker, shards=shards, now=5.0) == {}


def test_stop_grace_and_drain_budget():
    assert stop_grace(20.0) == 10.0
    assert stop_grace(0.2) == 0.25
    assert drain_budget(20.0) == 18.0
    assert drain_budget(0.2) == 0.5
