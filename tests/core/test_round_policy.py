"""The reconcile round's policy without I/O: when to scan, the warm-up gate, the plan's gating,
and the hand-off poll's filter. Exact values, no clock but the ``now`` passed in."""

from __future__ import annotations

import attrs
import pytest
from helpers.fake_runner import FakeRunner as Runner

from shard_worker.contract.table import FEATURE_HANDOFF_NOTICE, FEATURE_HANDOVER, FEATURE_MBB
from supervisor.core import round_policy
from supervisor.core.items import HandoffRequest, ShardItem, VacantShard, WorkerItem
from supervisor.core.planner import Plan, Take
from supervisor.core.round_policy import (
    DUE_SLACK,
    HANDOVER,
    RoundActions,
    ScanSchedule,
    accepting,
    act_on_plan,
    asked_without_notice,
    handoff_answers,
    handoff_takes,
    next_round_in,
    only_members_lost,
    promotion_kind,
    round_signature,
    take_source,
    warmed_up,
)
from supervisor.core.runner_state import RunnerState


def worker(wid: str, mailbox: int = 0) -> WorkerItem:
    return WorkerItem(wid, "sess", 1, "running", 0.0, 0.0, mailbox=mailbox)


LIVE = frozenset({("me", "live"), ("w2", "live")})


def test_accepting_needs_no_shutdown_no_drain_and_a_valid_lease():
    assert accepting(shutting_down=False, operator_drain=False, lease_valid=True)
    assert not accepting(shutting_down=True, operator_drain=False, lease_valid=True)
    assert not accepting(shutting_down=False, operator_drain=True, lease_valid=True)
    assert not accepting(shutting_down=False, operator_drain=False, lease_valid=False)


def test_the_signature_is_membership_vacant_shards_and_our_mailbox():
    vacant = [VacantShard("s1", 3, "w2")]
    sig = round_signature("me", LIVE, vacant, [worker("w2", 9), worker("me", 4)])
    assert sig == (LIVE, (VacantShard("s1", 3, "w2"),), 4, ())
    assert round_signature("me", LIVE, (), [worker("w2", 9)]) == (LIVE, (), -1, ())  # not listed
    standing_by = attrs.evolve(worker("w2"), standbys=("s1",))
    assert round_signature("me", LIVE, (), [standing_by]) == (LIVE, (), -1, (("w2", ("s1",)),))


def test_the_first_round_scans_then_only_changes_or_the_interval_do():
    scans = ScanSchedule(full_scan_interval=60.0)
    sig = round_signature("me", LIVE, (), [worker("me")])
    assert scans.due(sig, now=0.0)  # never scanned
    scans.scanned(0.0)
    scans.saw(sig)
    assert not scans.due(sig, now=2.0)
    assert not scans.due(sig, now=59.999)
    assert scans.due(sig, now=60.0)  # full_scan_interval, to the second


def test_a_changed_signature_means_a_scan():
    scans = ScanSchedule(full_scan_interval=60.0)
    scans.scanned(0.0)
    scans.saw(round_signature("me", LIVE, (), [worker("me")]))
    poked = round_signature("me", LIVE, (), [worker("me", mailbox=1)])
    joined = round_signature("me", LIVE | {("w3", "live")}, (), [worker("me")])
    vacated = round_signature("me", LIVE, [VacantShard("s1", 2)], [worker("me")])
    promoted = round_signature(
        "me", LIVE, (), [worker("me"), attrs.evolve(worker("w2"), standbys=("s9",))]
    )
    assert scans.due(promoted, now=1.0)  # a standby appeared or went: owners may have moved
    assert scans.due(poked, now=1.0)
    assert scans.due(joined, now=1.0)
    assert scans.due(vacated, now=1.0)


def test_a_round_that_only_lost_members_plans_on_the_last_scan_and_scans_next():
    """A death's takes do not wait for a Scan (they are conditional anyway); the round after
    them reads the table as it now is."""
    scans = ScanSchedule(full_scan_interval=60.0)
    scans.scanned(0.0)
    scans.saw(round_signature("me", LIVE, (), [worker("me")]))
    died = round_signature("me", {("me", "live"), ("w2", "dead")}, (), [worker("me")])
    assert not scans.due(died, now=1.0)
    assert scans.deferred  # the driver runs the deferred scan's round at once
    scans.saw(died)
    assert scans.due(died, now=1.01)  # the deferred scan, though nothing changed since
    scans.scanned(1.02)
    assert not scans.deferred
    assert not scans.due(died, now=3.0)
    came_back = round_signature("me", LIVE, (), [worker("me")])
    assert scans.due(came_back, now=4.0)  # a member gained is a scan first


def test_a_loss_beside_any_other_change_still_scans_first():
    before = round_signature("me", LIVE, (), [worker("me")])
    died = frozenset({("me", "live"), ("w2", "dead")})
    drained = frozenset({("me", "live"), ("w2", "alive")})  # alive, no longer a taker
    assert only_members_lost(before, round_signature("me", died, (), [worker("me")]))
    assert only_members_lost(before, round_signature("me", drained, (), [worker("me")]))
    assert not only_members_lost(before, before)  # nothing changed at all
    for other in (
        round_signature("me", died, [VacantShard("s1", 2)], [worker("me")]),
        round_signature("me", died, (), [worker("me", mailbox=1)]),
        round_signature("me", died | {("w3", "live")}, (), [worker("me")]),
    ):
        assert not only_members_lost(before, other), other
    after_death = round_signature("me", died, (), [worker("me")])
    assert not only_members_lost(after_death, before)  # back to live: a member gained


def test_our_own_changes_invalidate_until_the_next_scan():
    scans = ScanSchedule(full_scan_interval=60.0)
    sig = round_signature("me", LIVE, (), [])
    scans.scanned(0.0)
    scans.saw(sig)
    scans.invalidate()  # a take, a runner that ended, a reload
    assert scans.due(sig, now=1.0)
    scans.scanned(1.0)
    assert not scans.due(sig, now=2.0)


def test_the_warm_up_lasts_exactly_one_lease_duration():
    assert not warmed_up(now=109.999, registered_at=100.0, lease_duration=10.0)
    assert warmed_up(now=110.0, registered_at=100.0, lease_duration=10.0)
    assert not warmed_up(now=1e9, registered_at=float("inf"), lease_duration=10.0)  # unregistered


PLAN = Plan(
    take=(Take("t1", "", 0), Take("t2", "me", 4), Take("t3", "dead", 2)),
    lost=("l1", "l2", "l3"),
    shed=("s1", "s2"),
)
HELD = {
    "l1": Runner(state=RunnerState.RUNNING),
    "l2": Runner(state=RunnerState.STOPPING),  # retired or removed: stops gracefully
    "l3": Runner(state=RunnerState.BACKOFF),
    "s1": Runner(),
    "s2": Runner(),
}


def test_a_warm_worker_that_scanned_acts_on_the_whole_plan():
    actions = act_on_plan(PLAN, me="me", scanned=True, warm=True, held=HELD)
    assert actions == RoundActions(lose=("l1", "l3"), shed=("s1", "s2"), take=PLAN.take)


def test_a_cold_worker_sheds_nothing_and_leaves_its_own_earlier_shards_alone():
    actions = act_on_plan(PLAN, me="me", scanned=True, warm=False, held=HELD)
    assert actions == RoundActions(
        lose=("l1", "l3"), shed=(), take=(Take("t1", "", 0), Take("t3", "dead", 2))
    )


def test_lost_needs_a_fresh_scan():
    actions = act_on_plan(PLAN, me="me", scanned=False, warm=True, held=HELD)
    assert actions.lose == ()
    assert actions.shed == ("s1", "s2")


def test_quarantined_or_lost_runners_are_not_lost_again():
    held = {"l1": Runner(state=RunnerState.QUARANTINED), "l2": Runner(state=RunnerState.LOST)}
    plan = Plan(lost=("l1", "l2"))
    assert act_on_plan(plan, me="me", scanned=True, warm=True, held=held).lose == ()


def test_the_hand_off_poll_takes_only_what_names_us_and_we_may_run():
    vacant = [
        VacantShard("a", 1, "me"),
        VacantShard("b", 2, "w2"),  # handed to a peer
        VacantShard("c", 3, "me"),  # not ours to run (removed from our config)
        VacantShard("d", 4, ""),  # released to anyone: the reconcile round decides
    ]
    assert handoff_takes(vacant, "me", {"a", "b", "d"}) == [VacantShard("a", 1, "me")]


def test_where_a_take_came_from():
    assert take_source("", "me") == "unowned"
    assert take_source("w2", "me") == "dead-owner"
    assert take_source("me", "me") == "own"  # our id's earlier incarnation


def test_the_hand_off_requests_a_worker_answers():
    requests = [
        HandoffRequest("a", 3, "me"),
        HandoffRequest("b", 1, "w2"),  # for another
        HandoffRequest("c", 1, "me"),  # not runnable here
        HandoffRequest("d", 1, "me"),  # held here already
        HandoffRequest("e", 1, "me"),  # being answered
    ]
    answers = handoff_answers(requests, "me", {"a", "b", "d", "e"}, {"d": 1}, {"e"})
    assert answers == [HandoffRequest("a", 3, "me")]


def test_a_request_found_twice_is_answered_once():
    notice, listed = HandoffRequest("a", 3, "me"), HandoffRequest("a", 3, "me")
    assert handoff_answers([notice, listed], "me", {"a"}, {}, set()) == [notice]


def test_the_handoff_roster_is_read_only_while_a_peer_may_ask_without_a_notice():
    def peer(wid, features, state="running"):
        return WorkerItem(wid, "s", 1, state, 0.0, 0.0, features=frozenset(features))

    new = {FEATURE_MBB, FEATURE_HANDOVER, FEATURE_HANDOFF_NOTICE}
    assert asked_without_notice(None, "me")  # peers not read yet: ask the roster
    assert not asked_without_notice([peer("me", {FEATURE_MBB}), peer("w2", new)], "me")
    assert asked_without_notice([peer("w2", new), peer("w3", {FEATURE_MBB})], "me")
    assert asked_without_notice([peer("w3", {FEATURE_MBB}, "draining")], "me")
    assert not asked_without_notice([peer("w3", {FEATURE_MBB}, "stopped")], "me")
    assert not asked_without_notice([peer("w3", set())], "me")  # asks nobody


def test_a_promotion_is_a_failover_only_for_a_dead_owners_shard():
    assert [promotion_kind(s) for s in ("dead-owner", "unowned", "own", HANDOVER)] == [
        "failover",
        "handoff",
        "handoff",
        "handoff",
    ]


def test_the_next_round_comes_when_a_peers_lease_falls_due_if_that_is_sooner():
    assert next_round_in(100.0, 2.0, None) == 2.0
    assert next_round_in(100.0, 2.0, 105.0) == 2.0  # due after the next round anyway
    assert next_round_in(100.0, 2.0, 100.5) == pytest.approx(0.5 + DUE_SLACK)
    assert next_round_in(100.0, 2.0, 99.0) == 0.0  # overdue: at once


def test_a_failed_take_is_retried_at_once_only_for_the_same_owner_at_a_later_epoch():
    def retake(item, owner="dead", epoch=3):
        return round_policy.retake_epoch(item, expected_owner=owner, expected_epoch=epoch, me="me")

    # The dead owner promoted or took it after our last scan: same owner, later epoch.
    assert retake(ShardItem("s", "dead", 5)) == 5
    assert retake(ShardItem("s", "other", 5)) is None  # someone took it: not ours
    assert retake(ShardItem("s", "dead", 3)) is None  # nothing moved: a real conflict
    assert retake(ShardItem("s", "dead", 5, retired_at=1.0)) is None
    assert retake(None) is None
    assert retake(ShardItem("s", "me", 5), owner="me") is None  # our earlier incarnation
    # Vacant again at a later epoch: ours to take, unless released to another by name.
    assert retake(ShardItem("s", "", 6), owner="") == 6
    assert retake(ShardItem("s", "", 6, successor="me"), owner="") == 6
    assert retake(ShardItem("s", "", 6, successor="w2"), owner="") is None
