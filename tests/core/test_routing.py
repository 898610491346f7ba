"""Routing a dead worker's shards, and the sweeper, on plain data (``core.routing``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.items import ShardItem
from supervisor.core.membership import Member
from supervisor.core.planner import rendezvous_rank
from supervisor.core.routing import route, sweeper, unrouted_orphans

LIVE = ("w1", "w2", "w3", "w4")


def owned(count: int, owner: str = "dead") -> list[ShardItem]:
    return [ShardItem(f"s{i:03d}", owner, 3) for i in range(count)]


def test_each_shard_goes_to_its_live_first_standby_else_to_its_highest_ranked_member():
    shards = owned(40)
    standby = {"s000": "w2", "s001": "gone", "s002": "dead"}
    chosen = route(
        shards, dead="dead", live=(*LIVE, "dead"), caps={}, held={}, first_standby=standby.get
    )
    assert set(chosen) == {s.id for s in shards}
    assert chosen["s000"] == "w2"  # its standby promotes: nothing lost
    for item in shards[1:]:  # no live standby (gone, or the dead worker itself): by rank
        assert chosen[item.id] == max(LIVE, key=lambda m, s=item.id: rendezvous_rank(m, s))
    assert "dead" not in chosen.values()


@given(st.integers(0, 60), st.dictionaries(st.sampled_from(LIVE), st.integers(0, 20)))
def test_no_member_is_given_beyond_its_cap(count, caps):
    held = {"w1": 5, "w2": 0, "w3": 9, "w4": 1}
    chosen = route(owned(count), dead="dead", live=LIVE, caps=caps, held=held)
    room = sum(max(caps[m] - held[m], 0) if caps.get(m) else count for m in LIVE)
    assert len(chosen) == min(count, room)  # every shard routed while anyone has room
    for member, cap in caps.items():
        if cap:
            given = sum(1 for to in chosen.values() if to == member)
            assert given <= max(cap - held[member], 0)


def test_routing_is_the_same_whoever_computes_it():
    """Both watchers of the victim may route (the second finishes what the first left):
    from the same view they name the same successors, so their writes agree."""
    shards = owned(30)
    assert route(shards, dead="dead", live=LIVE, caps={}, held={}) == route(
        list(reversed(shards)), dead="dead", live=tuple(reversed(LIVE)), caps={}, held={}
    )


def test_one_sweeper_a_period_and_the_duty_moves():
    period = 300.0
    chosen = [sweeper(LIVE, t * period + 1.0, period) for t in range(40)]
    assert all(c in LIVE for c in chosen)
    assert sweeper(LIVE, 10.0, period) == sweeper(tuple(reversed(LIVE)), 290.0, period)
    assert len(set(chosen)) > 1  # not always the same member
    assert sweeper((), 0.0) == ""


def test_a_sweep_routes_the_unrouted_shards_of_workers_that_are_dead_or_gone():
    members = {"w1": Member("w1", "running"), "w2": Member("w2", "dead")}
    shards = [
        ShardItem("a", "w1", 1),  # a live owner
        ShardItem("b", "w2", 1),  # a dead owner: routed by the sweep
        ShardItem("c", "w2", 1, successor="w1"),  # routed already: w1 takes it
        ShardItem("d", "w9", 4),  # an owner with no item at all
        ShardItem("e", "", 2),  # vacant: the vacant buckets' business
    ]
    assert unrouted_orphans(shards, members) == ["b", "d"]
