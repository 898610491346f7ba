"""Warm standbys on plain data: placement, the standby-first rule for a dead owner's shard, the
planner's part in it, and successors that already run a ready standby.

Rendezvous ranks of these ids, highest first (pinned in the first test):
s1: w2 w1 w4 w3 | s2: w1 w2 w3 w4 | s3: w4 w1 w2 w3 | s4: w1 w4 w3 w2
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.items import ShardItem, WorkerItem
from supervisor.core.lease import PeerTracker
from supervisor.core.planner import plan_round, rendezvous_rank
from supervisor.core.standby import (
    FreeWatch,
    Placement,
    Rankings,
    StandbyPriority,
    UnplacedReports,
    covers,
    holder,
    left_to_standbys,
    place_standbys,
    standby_priority,
)
from supervisor.core.successor import pick_successors

W = ["w1", "w2", "w3", "w4"]


def ranked(shard: str) -> list[str]:
    return sorted(W, key=lambda w: rendezvous_rank(w, shard), reverse=True)


def test_the_ranks_these_tests_rely_on():
    assert {s: ranked(s) for s in ("s1", "s2", "s3", "s4")} == {
        "s1": ["w2", "w1", "w4", "w3"],
        "s2": ["w1", "w2", "w3", "w4"],
        "s3": ["w4", "w1", "w2", "w3"],
        "s4": ["w1", "w4", "w3", "w2"],
    }


def owned(**owners: str) -> list[ShardItem]:
    return [ShardItem(sid, owner, 1) for sid, owner in owners.items()]


def test_each_shard_gets_the_top_ranked_live_peers_but_its_owner():
    shards = owned(s1="w1", s2="w1", s3="w2", s4="w3")
    placement = place_standbys(
        shards=shards, wanted=dict.fromkeys(["s1", "s2", "s3", "s4"], 1), live=W
    )
    assert placement == Placement({"s1": ("w2",), "s2": ("w2",), "s3": ("w4",), "s4": ("w1",)})
    two = place_standbys(shards=shards, wanted={"s1": 2, "s3": 2}, live=W)
    assert dict(two.by_shard) == {"s1": ("w2", "w4"), "s3": ("w4", "w1")}
    assert (two.mine("w4"), two.mine("w3"), two.first("s3"), two.first("s2")) == (
        {"s1", "s3"},
        frozenset(),
        "w4",
        "",
    )


def test_only_live_members_are_placed_and_the_rest_is_reported_unplaced():
    shards = owned(s1="w1", s2="w2")
    placement = place_standbys(shards=shards, wanted={"s1": 3, "s2": 1}, live=["w1", "w2", "w3"])
    assert placement == Placement({"s1": ("w2", "w3"), "s2": ("w1",)}, unplaced={"s1": 1})
    alone = place_standbys(shards=shards, wanted={"s1": 1}, live=["w1"])
    assert alone == Placement({}, unplaced={"s1": 1})


def test_a_cap_skips_a_full_worker_counting_shards_in_id_order():
    shards = owned(s1="w3", s2="w3", s4="w3")  # w1 ranks first for s2 and s4, second for s1
    capped = place_standbys(
        shards=shards, wanted={"s1": 1, "s2": 1, "s4": 1}, live=W, caps={"w1": 1, "w2": 0}
    )
    assert dict(capped.by_shard) == {"s1": ("w2",), "s2": ("w1",), "s4": ("w4",)}


def test_no_standby_for_a_shard_without_holder_or_count():
    shards = [ShardItem("s1", "", 3), ShardItem("s2", "", 3, successor="w2"), *owned(s3="w1")]
    placement = place_standbys(shards=shards, wanted={"s1": 1, "s2": 1, "s3": 0}, live=W)
    # s2 is on its way to w2 (released naming it): w2 counts as its owner already.
    assert placement == Placement({"s2": ("w1",)})
    assert [holder(s) for s in shards] == ["", "w2", "w1"]


def test_a_dead_owners_shard_keeps_its_standbys_and_a_hand_off_does_not_move_them():
    before = place_standbys(shards=owned(s3="w2"), wanted={"s3": 2}, live=W)
    dead = place_standbys(shards=owned(s3="w2"), wanted={"s3": 2}, live=["w1", "w3", "w4"])
    assert before.by_shard == dead.by_shard == {"s3": ("w4", "w1")}


def test_a_shard_released_by_a_last_will_keeps_its_standbys():
    """Its supervisor died: the shard is vacant (released by its child), its owner no live
    member any more, and its standbys stay where they were."""
    before = place_standbys(shards=owned(s3="w4"), wanted={"s3": 2}, live=W)
    will = [ShardItem("s3", "", 1, state="last-will")]
    after = place_standbys(shards=will, wanted={"s3": 2}, live=["w1", "w2", "w3"])
    assert before.by_shard == after.by_shard == {"s3": ("w1", "w2")}
    released = [ShardItem("s3", "", 1, state="released")]  # a graceful release: no holder
    assert place_standbys(shards=released, wanted={"s3": 2}, live=W) == Placement()


def test_unplaced_standbys_are_reported_once_per_change():
    reports = UnplacedReports()
    assert reports.new({"s1": 1, "s2": 2}) == {"s1": 1, "s2": 2}
    assert reports.new({"s1": 1, "s2": 2}) == {}
    assert reports.new({"s1": 1, "s2": 1}) == {"s2": 1}
    assert reports.new({}) == {}
    assert reports.new({"s1": 1}) == {"s1": 1}


# --- the standby-first rule -----------------------------------------------------------------


def worker(wid: str, counter: int) -> WorkerItem:
    return WorkerItem(wid, "sess", counter, "running", 0.0, 0.0)


def tracker_with_dead(dead: str, now: float) -> PeerTracker:
    tracker = PeerTracker(10.0)
    tracker.observe([worker(w, 1) for w in W], now=0.0)
    tracker.observe([worker(w, 2) for w in W if w != dead], now=now)
    return tracker


def priority(me: str, tracker: PeerTracker, watch: FreeWatch, now: float) -> StandbyPriority:
    shards = owned(s1="w3", s3="w2", s4="w2")
    placement = Placement({"s1": ("w2", "w1"), "s3": ("w4",)})  # s4: no standby
    return standby_priority(
        me=me,
        shards=shards,
        placement=placement,
        tracker=tracker,
        watch=watch,
        now=now,
        wait=2.0,
    )


def test_a_restarted_worker_leaves_its_earlier_shards_to_ready_standbys():
    """w2 restarted: s3 and s4 still carry its id. s3's first standby (w4) is ready and live:
    handed to it. s4 has no standby, s1 is running here: retaken or kept as before; s2's
    standby is placed but not ready yet (not advertised): retaken too."""
    tracker = tracker_with_dead("w3", now=10.0)
    shards = owned(s1="w2", s2="w2", s3="w2", s4="w2")
    placement = Placement({"s2": ("w1",), "s3": ("w4",)})
    kw = {"shards": shards, "placement": placement, "tracker": tracker, "now": 10.0}
    ready = {"w4": ("s3",), "w1": ()}
    assert left_to_standbys(me="w2", running={"s1"}, ready=ready, **kw) == {"s3": "w4"}
    dead = Placement({"s3": ("w3",)})  # a standby on a dead peer holds nothing any more
    kw["placement"] = dead
    assert left_to_standbys(me="w2", running=(), ready={"w3": ("s3",)}, **kw) == {}
    assert (
        left_to_standbys(me="w1", running=(), ready=ready, **{**kw, "placement": placement}) == {}
    )


def test_a_dead_owners_shard_is_claimed_by_its_first_standby_and_left_by_the_others():
    tracker = tracker_with_dead("w2", now=10.0)
    assert priority("w4", tracker, FreeWatch(), now=9.0) == StandbyPriority()  # not dead yet
    assert priority("w4", tracker, FreeWatch(), now=10.0) == StandbyPriority(claims={"s3"})
    watch = FreeWatch()
    assert priority("w1", tracker, watch, now=10.0) == StandbyPriority(waiting={"s3"})
    assert priority("w1", tracker, watch, now=11.9) == StandbyPriority(waiting={"s3"})
    assert priority("w1", tracker, watch, now=12.0) == StandbyPriority()  # one interval on


def test_the_wait_counts_from_when_this_worker_first_saw_the_shard_free():
    watch = FreeWatch()
    watch.observe(["s3"], now=5.0)
    watch.observe(["s3", "s1"], now=6.0)
    assert (watch.since("s3", 7.0), watch.since("s1", 7.0)) == (5.0, 6.0)
    watch.observe(["s1"], now=8.0)  # s3 taken meanwhile: forgotten
    assert watch.since("s3", 9.0) == 9.0


def test_a_shard_released_by_a_last_will_is_claimed_by_its_standby_at_once():
    tracker = tracker_with_dead("w9", now=1.0)  # nobody is dead: the owner left a will
    shards = [ShardItem("s3", "", 1, state="last-will"), ShardItem("s1", "", 1)]
    placement = Placement({"s3": ("w4",), "s1": ("w2",)})
    kw = dict(shards=shards, placement=placement, tracker=tracker, now=1.0, wait=2.0)
    assert standby_priority(me="w4", watch=FreeWatch(), **kw) == StandbyPriority(claims={"s3"})
    assert standby_priority(me="w1", watch=FreeWatch(), **kw) == StandbyPriority(waiting={"s3"})


def test_a_second_standby_does_not_claim_while_the_first_lives():
    tracker = tracker_with_dead("w3", now=10.0)
    assert priority("w2", tracker, FreeWatch(), now=10.0) == StandbyPriority(claims={"s1"})
    assert priority("w1", tracker, FreeWatch(), now=10.0) == StandbyPriority(waiting={"s1"})


def plan(me: str, tracker: PeerTracker, shards: list[ShardItem], held=None, **kw):
    return plan_round(
        me=me,
        held=held or {},
        held_since={},
        shards=shards,
        configured=[s.id for s in shards],
        tracker=tracker,
        now=10.0,
        accepting=True,
        min_dwell=10.0,
        **kw,
    )


def test_the_planner_takes_a_claimed_shard_beyond_its_share_and_leaves_a_waiting_one():
    tracker = tracker_with_dead("w2", now=10.0)
    shards = owned(s1="w1", s2="w3", s3="w2", s4="w4")  # w1 holds its share (1 of 4 / 3)
    plain = plan("w1", tracker, shards, held={"s1": 1})
    assert [t.shard_id for t in plain.take] == ["s3"]  # w1 is dealt the dead owner's shard
    waiting = plan("w1", tracker, shards, held={"s1": 1}, standby_waiting={"s3"})
    assert waiting.take == ()
    full = plan("w4", tracker, shards, held={"s4": 1}, standby_claims={"s3"})  # at its target
    assert [(t.shard_id, t.expected_owner, t.expected_epoch) for t in full.take] == [
        ("s3", "w2", 1)
    ]
    assert plan("w4", tracker, shards, held={"s4": 1}).take == ()  # without the claim: none


# --- successors -----------------------------------------------------------------------------


def test_a_peer_with_a_ready_standby_is_the_successor_whatever_its_load():
    shards = owned(m0="me", m1="me", a0="a", a1="a", a2="a")
    chosen = pick_successors(["m0", "m1"], "me", ["me", "a", "b"], shards, {"m0": ["a"]})
    assert chosen == {"m0": "a", "m1": "b"}
    many = pick_successors(["m0"], "me", ["me", "a", "b"], shards, {"m0": ["a", "b", "gone"]})
    assert many == {"m0": "b"}  # the least loaded of those with a standby; live ones only
    assert pick_successors(["m0"], "me", ["me", "a"], shards, {"m0": ["me"]}) == {"m0": "a"}


def test_a_standby_covers_once_the_checkpoint_reaches_the_record_before_its_first():
    assert covers({"a": 9, "b": 3}, {"a": 10})
    assert not covers({"a": 8}, {"a": 10})
    assert not covers({}, {"a": 10})
    assert covers({"a": 0}, {})  # no record held yet on any stream: nothing to bridge


# --- Rankings kept across rounds: the same placement, without ranking every worker each round --

pool = st.sampled_from([f"w{i}" for i in range(12)])
rounds = st.lists(
    st.tuples(
        st.sets(pool, max_size=9),  # the live workers of the round
        st.dictionaries(st.sampled_from(["s1", "s2", "s3", "s4", "s5"]), pool | st.just("")),
        st.dictionaries(pool, st.integers(0, 2), max_size=4),  # caps
    ),
    min_size=1,
    max_size=8,
)


@given(rounds, st.integers(1, 3), st.integers(1, 3))
def test_kept_rankings_place_exactly_as_ranking_afresh(rounds, depth, k):
    """Workers join, leave and come back, caps skip workers: the kept rankings (shallow here,
    so they are deepened and rebuilt) place every round as ranking every worker would."""
    ranks = Rankings(depth=depth)
    for live, owners, caps in rounds:
        shards = [ShardItem(sid, owner, 1) for sid, owner in owners.items()]
        wanted = dict.fromkeys(owners, k)
        kept = place_standbys(shards=shards, wanted=wanted, live=live, caps=caps, ranks=ranks)
        assert kept == place_standbys(shards=shards, wanted=wanted, live=live, caps=caps)


def test_kept_rankings_rank_only_the_workers_that_are_new():
    ranks = Rankings(depth=2)
    live = {f"w{i}" for i in range(50)}
    ranks.see(live)
    assert len(list(ranks.walk("s1", live))) == 50  # deepened to the end: every worker
    first = list(ranks.walk("s2", live))[:2]
    ranks.see(live | {"joiner"})
    assert list(ranks.walk("s2", live | {"joiner"}))[:2] == ranked_among(live | {"joiner"}, "s2")
    assert list(ranks.walk("s2", live))[:2] == first  # the joiner is skipped where not live
    assert ranks._prefixes["s2"].seen == 51


def test_kept_rankings_start_afresh_once_departed_workers_outnumber_the_live():
    ranks = Rankings(depth=1)
    ranks.see({f"old{i}" for i in range(10)})
    ranks.see({"new"})
    assert ranks._known == {"new"}
    assert list(ranks.walk("s1", {"new"})) == ["new"]


def ranked_among(workers, shard):
    return sorted(workers, key=lambda w: rendezvous_rank(w, shard), reverse=True)[:2]


def test_kept_rankings_forget_shards_no_longer_wanted():
    ranks = Rankings()
    shards = [ShardItem("s1", "w1", 1), ShardItem("s2", "w1", 1)]
    place_standbys(shards=shards, wanted={"s1": 1, "s2": 1}, live=W, ranks=ranks)
    assert set(ranks._prefixes) == {"s1", "s2"}
    place_standbys(shards=shards[:1], wanted={"s1": 1}, live=W, ranks=ranks)  # s2 removed
    assert set(ranks._prefixes) == {"s1"}
