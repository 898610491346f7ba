"""The lease decisions, on plain numbers: no store, no clock, no processes."""

import hypothesis.strategies as st
from hypothesis import given

from supervisor.core.items import ShardItem, WorkerItem
from supervisor.core.lease import OwnLease, PeerTracker
from supervisor.core.planner import Plan, fair_targets, plan_round, rendezvous_rank


def worker(wid: str, counter: int, state: str = "running", session: str = "s") -> WorkerItem:
    return WorkerItem(wid, session, counter, state, 0.0, 0.0)


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


def test_the_next_due_is_the_first_lease_that_would_lapse_of_peers_not_dead_yet():
    tracker = PeerTracker(10.0)
    assert tracker.next_due(0.0) is None
    tracker.observe([worker("a", 5), worker("b", 1), worker("c", 1, "stopped")], now=100.0)
    tracker.observe([worker("b", 2)], now=103.0)
    assert tracker.next_due(104.0) == 110.0  # a's counter stood still since 100
    assert tracker.next_due(110.0) == 113.0  # a is dead: not due again; b next
    tracker.observe([worker("b", 3)], now=112.0)
    assert tracker.next_due(112.0) == 122.0
    assert tracker.next_due(122.0) is None  # the stopped one is never due


def test_owner_without_worker_item_gets_a_duration_from_first_sight():
    tracker = PeerTracker(10.0)
    tracker.observe_owner("ghost", 50.0)
    assert not tracker.is_dead("ghost", 59.0)
    assert tracker.is_dead("ghost", 60.0)


def test_watching_a_few_peers_judges_only_their_counters_and_the_rest_by_their_items():
    """A worker reads only its watched peers every round; a counter it no longer reads proves
    nothing, so the others are dead only when their item says so (a watcher's notice)."""
    tracker = PeerTracker(10.0)
    tracker.observe([worker("a", 5), worker("b", 5), worker("c", 5)], now=100.0)
    tracker.watch(["a"])
    tracker.observe([worker("a", 5)], now=110.0)
    assert tracker.is_dead("a", 110.0)
    assert not tracker.is_dead("b", 500.0)  # not read since 100: not judged
    assert tracker.is_live_member("b", 500.0)
    tracker.observe([worker("c", 5, state="dead")], now=111.0)  # its watchers' notice
    assert tracker.is_dead("c", 111.0) and not tracker.is_live_member("c", 111.0)
    assert tracker.next_due(105.0) == 110.0 and tracker.next_due(110.0) is None  # b: never
    tracker.observe_owner("ghost", 120.0)  # an owner with no item has no watcher
    assert tracker.is_dead("ghost", 130.0)
    # Watched from now on: every counter here came from a consistent read, so b's, still
    # the same 410 s later, is a death, with no fresh clock needed.
    tracker.watch(["a", "b"])
    tracker.observe([worker("b", 5)], now=510.0)
    assert tracker.is_dead("b", 510.0)
    assert tracker.due_at("a") == 110.0  # fell due: read again until its notice
    tracker.observe([worker("a", 6)], now=515.0)
    assert tracker.due_at("a") == 525.0 and tracker.due_at("c") == float("inf")  # c: dead
    tracker.watch(None)  # everyone read every round, as protocol 1 was first built
    assert tracker.is_dead("b", 510.0) and tracker.next_due(510.0) == 525.0  # a's


def test_a_read_that_started_before_a_newer_one_does_not_move_the_clock():
    """A round's consistent read sent before the peer's heartbeat landed can arrive after a
    watch read showed that heartbeat: the older counter it shows is past, not a change (it
    would restart the clock late, and the next watch read later still: a host death seen
    a second late, found in the failover benchmark)."""
    tracker = PeerTracker(10.0)
    tracker.observe([worker("a", 5)], now=100.0)
    tracker.saw_counter("a", 6, "s", now=101.0)  # the watch read: heartbeat 6
    tracker.observe([worker("a", 5)], now=101.2)  # the round's read, sent before it landed
    assert tracker.next_due(101.2) == 111.0
    tracker.saw_counter("a", 6, "s", now=103.0)  # the same counter again: nothing new
    tracker.saw_counter("a", 5, "s", now=103.5)  # a stale replica
    assert tracker.is_dead("a", 111.0)
    tracker.saw_counter("a", 9, "other", now=112.0)  # another incarnation: the round's job
    assert tracker.is_dead("a", 112.0)
    tracker.observe([worker("a", 0, session="other")], now=112.5)  # a new session: alive
    assert not tracker.is_dead("a", 122.4) and tracker.is_dead("a", 122.5)


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


def test_workers_that_see_the_same_table_take_disjoint_shards():
    shards = [shard(f"s{i:02d}") for i in range(13)]
    tracker = PeerTracker(10.0)
    tracker.observe([worker(w, 1) for w in "abc"], now=0.0)
    picks = [{t.shard_id for t in plan(w, shards=shards, tracker=tracker).take} for w in "abc"]
    assert [len(p) for p in picks] == [5, 4, 4]  # the larger share to the lowest id
    assert set.union(*picks) == {s.id for s in shards}  # dealt out: no two takes race


def test_beyond_its_dealt_share_a_worker_fills_up_by_rendezvous_rank():
    """A peer counted live may never take its share (hung, or dead and not yet known): then
    the others may take it, in rendezvous order, rather than wait for a whole lease duration."""
    tracker = PeerTracker(10.0)
    tracker.observe([worker("a", 1), worker("b", 1), worker("d", 1, "draining")], now=0.0)
    shards = [shard("s1"), shard("s2"), shard("s3"), shard("s4", "d", 1)]
    assert [t.shard_id for t in plan("a", shards=shards, tracker=tracker).take] == ["s1", "s2"]
    first_choice = min(["s1", "s2"], key=lambda sid: rendezvous_rank("b", sid))
    taken = [t.shard_id for t in plan("b", shards=shards, tracker=tracker).take]
    assert taken == ["s3", first_choice]  # its share (one, as a took two), then by rank


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


def test_shards_of_our_earlier_incarnation_are_taken_back_even_beyond_the_target():
    """Peers may not take a shard carrying the id of a live worker: left alone it would strand."""
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("b", 1)], now=0.0)
    shards = [shard(f"s{i}", "me", 2) for i in range(4)] + [shard("s8"), shard("s9")]
    taken = plan("me", shards=shards, tracker=tracker).take
    assert sorted(t.shard_id for t in taken) == ["s0", "s1", "s2", "s3"]  # target is 3


def test_a_held_shard_with_another_owner_or_epoch_is_lost():
    shards = [shard("s1", "other", 5), shard("s2", "me", 9), shard("s3", "me", 2)]
    result = plan("me", held={"s1": 4, "s2": 8, "s3": 2}, shards=shards)
    assert result.lost == ("s1", "s2")


def test_an_item_read_before_our_own_take_is_not_a_lost_lease():
    """A round's scan can predate a take made beside it (a hand-off answer, the hand-off
    poll): the item then shows the epoch before ours. Only another owner at our epoch, or a
    later epoch, is a loss."""
    shards = [shard("s1", "", 3), shard("s2", "dead", 6), shard("s3", "", 4), shard("s4", "x", 5)]
    result = plan("me", held={"s1": 4, "s2": 7, "s3": 4, "s4": 4}, shards=shards)
    assert result.lost == ("s3", "s4")  # released at our epoch; taken after us


def test_a_draining_worker_takes_nothing():
    assert plan("me", shards=[shard("s1")], accepting=False).take == ()


def test_not_configured_shards_are_ignored():
    assert (
        plan("me", shards=[shard("s1"), shard("other")], configured=["s1"]).take[0].shard_id == "s1"
    )
    assert len(plan("me", shards=[shard("s1"), shard("other")], configured=["s1"]).take) == 1


def test_a_draining_worker_sheds_nothing_either():
    """Its drain stops every shard anyway; a lapsed lease loses them through the watchdog."""
    shards = [shard(f"s{i}", "me", 1) for i in range(4)]
    held = {s.id: 1 for s in shards}
    result = plan(
        "me", held=held, shards=shards, now=50.0, accepting=False, held_since=dict.fromkeys(held, 0)
    )
    assert result == Plan()


def test_over_target_worker_sheds_its_whole_excess_once_dwelt():
    shards = [shard(f"s{i}", "me", 1) for i in range(6)]
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("b", 1)], now=0.0)
    held = {s.id: 1 for s in shards}
    since = dict.fromkeys(held, 0.0) | {"s0": 5.0}  # s0 was taken later
    fresh = plan("me", held=held, shards=shards, tracker=tracker, now=9.0, held_since=since)
    assert fresh.shed == ()  # min dwell not reached yet
    tracker.observe([worker("me", 2), worker("b", 2)], now=9.0)  # both still heartbeating
    settled = plan("me", held=held, shards=shards, tracker=tracker, now=10.0, held_since=since)
    dwelt = sorted(set(held) - {"s0"}, key=lambda sid: rendezvous_rank("me", sid), reverse=True)
    assert settled.shed == tuple(dwelt[:3])  # target 3: all three at once, least preferred first
    assert settled.take == ()


def held_beside_b(count: int, epoch: int) -> tuple[list[ShardItem], PeerTracker, dict[str, int]]:
    """``count`` shards all ours at ``epoch``, beside one live peer b: half of them too many."""
    shards = [shard(f"s{i}", "me", epoch) for i in range(count)]
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("b", 1)], now=5.0)
    return shards, tracker, {s.id: epoch for s in shards}


def test_a_hand_off_under_way_is_chosen_again_rather_than_another_shard():
    """The daemon keeps a stopping shard until its release: it must not count as a new excess."""
    shards, tracker, held = held_beside_b(6, epoch=1)
    lowest = min(held, key=lambda sid: rendezvous_rank("me", sid))  # the last one rank would pick
    result = plan(
        "me",
        held=held,
        shards=shards,
        tracker=tracker,
        now=10.0,
        held_since=dict.fromkeys(held, 0.0),
        recently_shed={lowest: 9.0},
    )
    assert result.shed[0] == lowest and len(result.shed) == 3


def test_a_shard_shed_then_taken_back_must_dwell_again_before_it_is_shed():
    """An operator drain sheds s0 (it cools down); a peer's SIGTERM hands it back a second
    later. Counting it as a hand-off under way would shed it at once, to a peer that may be
    the one shutting down (a rolling deploy lost data that way): it must dwell like any take."""
    shards, tracker, held = held_beside_b(4, epoch=2)
    since = dict.fromkeys(held, 0.0) | {"s0": 9.5}  # taken back after the drain shed it
    result = plan(
        "me",
        held=held,
        shards=shards,
        tracker=tracker,
        now=10.0,
        held_since=since,
        recently_shed={"s0": 9.0},
    )
    assert "s0" not in result.shed and len(result.shed) == 2


def test_at_target_a_worker_never_sheds_even_if_a_peer_is_far_below():
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("b", 1), worker("c", 1)], now=45.0)
    shards = [shard(f"b{i}", "b", 1) for i in range(3)] + [
        shard(f"m{i}", "me", 1) for i in range(3)
    ]
    held = {f"m{i}": 1 for i in range(3)}
    # Targets b:2, c:2, me:2. We hold 3: one too many, shed one. b holds 3 as well; c holds none.
    result = plan(
        "me",
        held=held,
        shards=shards,
        tracker=tracker,
        now=50.0,
        held_since=dict.fromkeys(held, 0.0),
    )
    assert len(result.shed) == 1
    # Now at target while c still has nothing: we shed nothing; c gets what b and we hand back.
    held = {"m0": 1, "m1": 1}
    shards = [s for s in shards if s.id != "m2"] + [shard("m2")]
    result = plan(
        "me",
        held=held,
        shards=shards,
        tracker=tracker,
        now=50.0,
        held_since=dict.fromkeys(held, 0.0),
    )
    assert result.shed == () and result.take == ()


def test_balanced_fleet_does_not_shed():
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("b", 1), worker("c", 1)], now=45.0)
    shards = [
        shard("s1", "me", 1),
        shard("s2", "b", 1),
        shard("s3", "b", 1),
        shard("s4", "c", 1),
        shard("s5", "c", 1),
    ]
    result = plan(
        "me",
        held={"s1": 1},
        shards=shards,
        tracker=tracker,
        now=50.0,
        held_since={"s1": 0.0},
    )
    assert result.shed == () and result.take == ()


def test_a_recently_shed_shard_is_not_taken_back():
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("b", 1)], now=0.0)
    shards = [shard("s1")]
    result = plan("me", shards=shards, tracker=tracker, now=5.0, recently_shed={"s1": 0.0})
    assert result.take == ()
    again = plan("me", shards=shards, tracker=tracker, now=10.0, recently_shed={"s1": 0.0})
    assert again.take != ()


def test_a_shed_shard_with_no_live_peer_left_to_take_it_is_taken_back_at_once():
    """Shed to b, which started draining before it answered: the hand-off fell back and
    released the shard. Cooling it down would leave it unowned (on a live-only feed, lost)
    until the dwell ran out; nobody else can take it, so we do."""
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("b", 1, "draining")], now=0.0)
    result = plan("me", shards=[shard("s1")], tracker=tracker, now=3.0, recently_shed={"s1": 1.0})
    assert [t.shard_id for t in result.take] == ["s1"]


def test_max_shards_caps_our_target():
    shards = [shard(f"s{i}") for i in range(10)]
    assert len(plan("me", shards=shards, max_shards=4).take) == 4


def test_a_capped_peers_excess_comes_to_us_when_its_cap_is_known():
    tracker = PeerTracker(10.0)
    tracker.observe([worker("a", 1), worker("me", 1)], now=0.0)
    shards = [shard(f"s{i}") for i in range(10)]
    assert len(plan("me", shards=shards, tracker=tracker).take) == 5
    assert len(plan("me", shards=shards, tracker=tracker, peer_caps={"a": 2}).take) == 8


def test_fair_targets():
    assert fair_targets(6, ["a", "b", "c"]) == {"a": 2, "b": 2, "c": 2}
    assert fair_targets(7, ["c", "b", "a"]) == {"a": 3, "b": 2, "c": 2}
    assert fair_targets(1000, [f"w{i:02d}" for i in range(21)])["w12"] == 48
    assert fair_targets(1000, [f"w{i:02d}" for i in range(21)])["w13"] == 47
    assert fair_targets(10, ["a", "b", "c"], {"a": 2}) == {"a": 2, "b": 4, "c": 4}
    assert fair_targets(10, ["a", "b"], {"a": 3, "b": 3}) == {"a": 3, "b": 3}
    assert fair_targets(5, []) == {}


@given(
    shards=st.integers(0, 500),
    caps=st.dictionaries(
        st.text("abcdefgh", min_size=1, max_size=3), st.integers(0, 40), min_size=1
    ),
)
def test_fair_targets_fill_up_to_capacity_and_differ_by_at_most_one(shards, caps):
    targets = fair_targets(shards, caps, caps)
    capacity = sum(c for c in caps.values()) if all(caps.values()) else shards
    assert sum(targets.values()) == min(shards, capacity)
    assert all(targets[w] <= c for w, c in caps.items() if c)
    below_cap = [w for w in sorted(caps) if not caps[w] or targets[w] < caps[w]]
    loads = [targets[w] for w in below_cap]
    assert loads == sorted(loads, reverse=True)  # the larger shares to the lowest ids
    assert not loads or max(loads) - min(loads) <= 1
    at_cap = [w for w in caps if caps[w] and targets[w] == caps[w]]
    assert not loads or all(caps[w] <= max(loads) + 1 for w in at_cap)  # no needless cap


def test_a_shard_handed_to_a_live_peer_is_left_to_it():
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("b", 1)], now=0.0)
    handed = ShardItem("s1", "", 1, successor="b")
    assert plan("me", shards=[handed], tracker=tracker, now=1.0).take == ()
    assert [t.shard_id for t in plan("b", shards=[handed], tracker=tracker, now=1.0).take] == ["s1"]


def test_a_shard_handed_to_us_is_taken_even_at_our_fair_share():
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("b", 1)], now=0.0)
    shards = [
        shard("m1", "me", 1),
        ShardItem("b1", "", 1, successor="me"),  # b released it for us: an operator's release
    ]
    result = plan("me", held={"m1": 1}, shards=shards, tracker=tracker, now=1.0)
    assert [t.shard_id for t in result.take] == ["b1"]


def test_a_shard_handed_to_a_dead_peer_is_free_for_anyone():
    tracker = PeerTracker(10.0)
    tracker.observe([worker("me", 1), worker("gone", 1)], now=0.0)
    tracker.observe([worker("me", 2)], now=10.0)  # gone's counter stood still for the duration
    handed = ShardItem("s1", "", 1, successor="gone")
    assert [t.shard_id for t in plan("me", shards=[handed], tracker=tracker, now=10.0).take] == [
        "s1"
    ]
