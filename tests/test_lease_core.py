"""The lease decisions, on plain numbers: no store, no clock, no processes."""

from supervisor.lease_core import OwnLease, PeerTracker, fair_target, plan_round
from supervisor.store import ShardItem, WorkerItem


def worker(wid: str, counter: int, state: str = "running") -> WorkerItem:
    return WorkerItem(wid, "sess", counter, state, 0.0, 0.0)


def shard(sid: str, owner: str = "", epoch: int = 0) -> ShardItem:
    return ShardItem(sid, owner, epoch)


def plan(me, held=None, shards=(), tracker=None, now=0.0, accepting=True, **kw):
    tracker = tracker or PeerTracker(10.0)
    return plan_round(
        me=me,
        held=held or {},
        held_since=kw.pop("held_since", {}),
        shards=list(shards),
        configured=kw.pop("configured", [s.id for s in shards]),
        tracker=tracker,
        now=now,
        accepting=accepting,
        min_dwell=kw.pop("min_dwell", 10.0),
        **kw,
    )


def test_peer_is_dead_only_after_its_counter_stood_still_for_a_full_duration():
    tracker = PeerTracker(10.0)
    tracker.observe([worker("a", 5)], now=100.0)
    assert not tracker.is_dead("a", 109.9)
    tracker.observe([worker("a", 5)], now=109.9)  # unchanged counter does not reset the clock
    assert tracker.is_dead("a", 110.0)
    tracker.observe([worker("a", 6)], now=111.0)  # it moved: alive again, clock restarts
    assert not tracker.is_dead("a", 120.9)
    assert tracker.is_dead("a", 121.0)


def test_a_new_observer_waits_a_full_duration_before_declaring_anyone_dead():
    tracker = PeerTracker(10.0)
    # First sight of a long-dead worker: still alive for one duration from *our* first look.
    tracker.observe([worker("old", 1)], now=5000.0)
    assert not tracker.is_dead("old", 5009.0)
    assert tracker.is_dead("old", 5010.0)


def test_owner_without_worker_item_gets_a_duration_from_first_sight():
    tracker = PeerTracker(10.0)
    tracker.observe_owner("ghost", 50.0)
    assert not tracker.is_dead("ghost", 59.0)
    assert tracker.is_dead("ghost", 60.0)


def test_retired_worker_is_dead_at_once():
    tracker = PeerTracker(10.0)
    tracker.observe([worker("a", 3, state="stopped")], now=1.0)
    assert tracker.is_dead("a", 1.0)


def test_own_lease_runs_from_when_the_heartbeat_was_sent():
    lease = OwnLease(duration=10.0, safety_margin=2.0)
    assert not lease.is_valid(0.0)
    lease.heartbeat_succeeded(sent_at=100.0)
    assert lease.valid_until == 108.0
    assert lease.is_valid(107.99) and not lease.is_valid(108.0)
    lease.heartbeat_succeeded(sent_at=99.0)  # a late answer to an older heartbeat never shortens
    assert lease.valid_until == 108.0


def test_own_lease_always_ends_before_any_peer_can_declare_us_dead():
    """A peer sees our counter change no earlier than we sent it, then waits a full duration."""
    for duration, margin, sent in [(10.0, 2.0, 0.0), (3.0, 0.6, 12.5), (60.0, 12.0, 1e6)]:
        lease = OwnLease(duration, margin)
        lease.heartbeat_succeeded(sent)
        earliest_peer_observation = sent
        assert lease.valid_until < earliest_peer_observation + duration


def test_unowned_shards_are_taken_up_to_the_fair_target():
    shards = [shard(f"s{i}") for i in range(6)]
    tracker = PeerTracker(10.0)
    tracker.observe([worker("a", 1), worker("b", 1), worker("c", 1)], now=0.0)
    result = plan("a", shards=shards, tracker=tracker)
    assert len(result.take) == 2
    assert all(t.expected_owner == "" and t.expected_epoch == 0 for t in result.take)


def test_workers_prefer_different_shards_so_takes_rarely_race():
    shards = [shard(f"s{i}") for i in range(12)]
    tracker = PeerTracker(10.0)
    tracker.observe([worker(w, 1) for w in "abc"], now=0.0)
    picks = [{t.shard_id for t in plan(w, shards=shards, tracker=tracker).take} for w in "abc"]
    assert len(picks[0] & picks[1] & picks[2]) < 4


def test_shards_of_a_dead_owner_are_taken_with_its_observed_epoch():
    tracker = PeerTracker(10.0)
    tracker.observe([worker("dead", 7), worker("me", 1)], now=0.0)
    shards = [shard("s1", "dead", 4)]
    assert plan("me", shards=shards, tracker=tracker, now=9.0).take == ()
    tracker.observe([worker("me", 5)], now=10.0)
    taken = plan("me", shards=shards, tracker=tracker, now=10.0).take
    assert [(t.shard_id, t.expected_owner, t.expected_epoch) for t in taken] == [("s1", "dead", 4)]


def test_shards_of_our_earlier_incarnation_come_first():
    shards = [shard("a1", "x"), shard("z9", "me", 3), shard("b2")]
    taken = plan("me", shards=shards, configured=["a1", "z9", "b2"]).take
    assert taken[0].shard_id == "z9" and taken[0].expected_owner == "me"


def test_a_held_shard_with_another_owner_or_epoch_is_lost():
    shards = [shard("s1", "other", 5), shard("s2", "me", 9), shard("s3", "me", 2)]
    result = plan("me", held={"s1": 4, "s2": 8, "s3": 2}, shards=shards)
    assert result.lost == ("s1", "s2")


def test_a_draining_worker_takes_nothing():
    assert plan("me", shards=[shard("s1")], accepting=False).take == ()


def test_not_configured_shards_are_ignored():
    assert (
        plan("me", shards=[shard("s1"), shard("other")], configured=["s1"]).take[0].shard_id == "s1"
    )
    assert len(plan("me", shards=[shard("s1"), shard("other")], configured=["s1"]).take) == 1


def test_over_target_worker_sheds_one_settled_shard_per_round():
    shards = [shard(f"s{i}", "me", 1) for i in range(6)]
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("b", 1)], now=0.0)
    held = {s.id: 1 for s in shards}
    fresh = plan(
        "me",
        held=held,
        shards=shards,
        tracker=tracker,
        now=5.0,
        held_since=dict.fromkeys(held, 0.0),
    )
    assert fresh.shed == ()  # min dwell not reached yet
    tracker.observe([worker("me", 2), worker("b", 2)], now=9.0)  # both still heartbeating
    settled = plan(
        "me",
        held=held,
        shards=shards,
        tracker=tracker,
        now=10.0,
        held_since=dict.fromkeys(held, 0.0),
    )
    assert len(settled.shed) == 1


def test_balanced_fleet_does_not_shed():
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("b", 1), worker("c", 1)], now=45.0)
    shards = [
        shard("s1", "me", 1),
        shard("s2", "me", 1),
        shard("s3", "b", 1),
        shard("s4", "b", 1),
        shard("s5", "c", 1),
    ]
    result = plan(
        "me",
        held={"s1": 1, "s2": 1},
        shards=shards,
        tracker=tracker,
        now=50.0,
        held_since={"s1": 0.0, "s2": 0.0},
    )
    assert result.shed == () and result.take == ()


def test_a_recently_shed_shard_is_not_taken_back():
    result = plan("me", shards=[shard("s1")], now=5.0, recently_shed={"s1": 0.0})
    assert result.take == ()
    assert plan("me", shards=[shard("s1")], now=10.0, recently_shed={"s1": 0.0}).take != ()


def test_fair_target():
    assert fair_target(6, 3) == 2
    assert fair_target(7, 3) == 3
    assert fair_target(5, 0) == 5
