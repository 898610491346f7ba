"""The make-before-break decisions on plain data: whether a move uses it, why not, what each
side makes of the shard item it reads, and the waits."""

from __future__ import annotations

import pytest

from shard_worker.contract.pipe import StreamSpec
from supervisor.core.items import ShardItem
from supervisor.core.make_before_break import (
    Adoption,
    Fallback,
    HandoffPlan,
    Mode,
    OwnerSees,
    SuccessorSees,
    adoption,
    min_cut,
    owner_sees,
    plan_handoff,
    release_wait,
    successor_sees,
)

SEQUENCED = (StreamSpec("a", "ws://x/a", sequence="seq"), StreamSpec("b", "ws://x/b", "m.seq"))
MBB = frozenset({"mbb"})


def decide(**changes) -> HandoffPlan:
    kw = dict(
        me="w1",
        successor="w2",
        streams=SEQUENCED,
        successor_features=MBB,
        child_ready=True,
        fast=False,
        budget=None,
        handoff_timeout=5.0,
        stop_grace=10.0,
    )
    kw.update(changes)
    return plan_handoff(**kw)


def test_a_move_of_a_sequenced_shard_to_a_capable_peer_is_make_before_break():
    assert decide() == HandoffPlan(Mode.MAKE_BEFORE_BREAK, None)
    assert decide(budget=15.0) == HandoffPlan(Mode.MAKE_BEFORE_BREAK, None)  # exactly enough


def test_the_owner_hands_the_lease_over_only_to_a_successor_that_adopts():
    """A successor of an older version never adopts: it gets the release it knows."""
    both = frozenset({"mbb", "handover"})
    assert decide(successor_features=both) == HandoffPlan(Mode.MAKE_BEFORE_BREAK, hand_over=True)
    assert decide(successor_features=MBB).hand_over is False
    assert decide(successor_features=both, fast=True).hand_over is False  # break-before-make
    assert decide(successor="", successor_features=both).hand_over is False


def test_no_peer_is_no_hand_off_at_all():
    assert decide(successor="") == HandoffPlan(None)
    assert decide(successor="w1") == HandoffPlan(None)  # a changed definition: back to us


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"fast": True}, Fallback.FAST_SHUTDOWN),
        ({"streams": (*SEQUENCED, StreamSpec("c", "ws://x/c"))}, Fallback.UNSEQUENCED),
        ({"successor_features": frozenset()}, Fallback.OLD_SUCCESSOR),
        ({"child_ready": False}, Fallback.NOT_RUNNING),
        ({"budget": 14.99}, Fallback.SHUTDOWN_BUDGET),
    ],
)
def test_each_fallback_and_its_reason(changes, why):
    assert decide(**changes) == HandoffPlan(Mode.BREAK_BEFORE_MAKE, why)


def test_the_first_reason_in_order_is_the_one_counted():
    every = dict(
        fast=True, streams=(StreamSpec("c", "ws://x/c"),), successor_features=(), budget=0.0
    )
    assert decide(**every).fallback is Fallback.FAST_SHUTDOWN
    del every["fast"]
    assert decide(**every).fallback is Fallback.UNSEQUENCED


def test_the_public_labels():
    assert [m.value for m in Mode] == ["make_before_break", "break_before_make"]
    assert [f.value for f in Fallback] == [
        "fast_shutdown",
        "unsequenced",
        "successor_without_mbb",
        "child_not_running",
        "shutdown_budget",
        "timeout",
        "cancelled",
        "store_unavailable",
        "child_exited",
        "successor_left",
    ]


def test_the_cut_is_one_before_the_successors_first_message():
    assert min_cut({"b": 101, "a": 5}) == {"a": 4, "b": 100}
    assert min_cut({}) == {}


def item(owner="w1", epoch=3, successor="w2", stage="requested", first=None) -> ShardItem:
    return ShardItem(
        "s", owner, epoch, successor=successor, handoff_stage=stage, handoff_first=first or {}
    )


def test_what_the_owner_makes_of_the_item():
    def sees(shard):
        return owner_sees(shard, me="w1", epoch=3, successor="w2")

    assert sees(item()) is OwnerSees.WAIT
    assert sees(item(stage="ready", first={"a": 7})) is OwnerSees.READY
    assert sees(item(stage="")) is OwnerSees.CANCELLED
    assert sees(item(successor="")) is OwnerSees.CANCELLED  # `shards remove` cleared it
    assert sees(item(successor="w9", stage="ready")) is OwnerSees.CANCELLED
    assert sees(item(owner="w2", epoch=4)) is OwnerSees.LOST
    assert sees(item(epoch=4)) is OwnerSees.LOST
    assert sees(None) is OwnerSees.LOST


def test_what_the_successor_makes_of_the_item():
    def sees(shard):
        return successor_sees(shard, me="w2", epoch=3)

    assert sees(item()) is SuccessorSees.WAIT
    assert sees(item(stage="ready")) is SuccessorSees.WAIT
    assert sees(item(owner="", stage="")) is SuccessorSees.TAKE  # released naming us
    assert sees(item(owner="w2", epoch=4, successor="")) is SuccessorSees.HANDED_OVER
    assert sees(item(owner="", successor="w9", stage="")) is SuccessorSees.GIVE_UP
    assert sees(item(owner="", successor="", stage="")) is SuccessorSees.GIVE_UP
    assert sees(item(successor="", stage="")) is SuccessorSees.GIVE_UP  # cancelled
    assert sees(item(owner="w9", epoch=4, successor="")) is SuccessorSees.GIVE_UP
    assert sees(item(owner="", epoch=4, successor="w2")) is SuccessorSees.GIVE_UP
    assert sees(None) is SuccessorSees.GIVE_UP


def test_what_the_successor_does_with_a_shard_handed_over_to_it():
    mine = item(owner="w2", epoch=4, successor="", stage="")

    def adopt(shard=mine, **changes):
        kw = {"me": "w2", "held": False, "runnable": True, "accepting": True, **changes}
        return adoption(shard, **kw)

    assert adopt() is Adoption.ADOPT
    assert adopt(held=True) is Adoption.HELD  # a take here (poll, round) got it first
    assert adopt(accepting=False) is Adoption.RELEASE  # stopping or drained: give it up now
    assert adopt(runnable=False) is Adoption.RELEASE  # removed from our config meanwhile
    assert adopt(held=True, accepting=False) is Adoption.HELD  # its runner releases it
    assert adopt(item(owner="w9", epoch=5, successor="")) is Adoption.NOT_OURS
    assert adopt(None) is Adoption.NOT_OURS


def test_the_successor_waits_for_the_owners_stop_and_release():
    assert release_wait(10.0) == 12.0
    assert release_wait(0.25) == 2.25
