"""Protocol 2's round decisions (``core.fleet_round``), with plain values."""

from __future__ import annotations

from supervisor.core.fleet_round import (
    OWN_BACKSTOP,
    own_read_due,
    poll_actions,
    shard_view,
    successors,
    targets,
)
from supervisor.core.items import HandoffRequest, ShardItem
from supervisor.core.membership import Member
from supervisor.core.planner import Take


def test_the_poll_tells_a_release_a_routing_and_a_request_apart():
    addressed = [
        ShardItem("released", "", 4, successor="me"),
        ShardItem("routed", "dead", 7, successor="me"),
        ShardItem("asked", "owner", 2, successor="me", handoff_stage="requested"),
        ShardItem("answered", "owner", 3, successor="me", handoff_stage="ready"),
        ShardItem("other", "", 1, successor="someone"),  # a stale listing: not ours
        ShardItem("running", "", 5, successor="me"),  # we run it already
        ShardItem("registered", "", 1, successor="me"),  # no definition known yet
    ]
    runnable = {"released", "routed", "asked", "answered", "other", "running"}
    actions = poll_actions(addressed, "me", runnable, busy={"running"})
    assert actions.takes == (Take("released", "", 4), Take("routed", "dead", 7))
    assert actions.requests == (HandoffRequest("asked", 2, "me"),)
    assert actions.unknown == ("registered",)


def test_our_items_are_read_at_start_on_a_poke_while_unheld_and_as_a_backstop():
    due = dict(mailbox_seen=3, mailbox=3, now=100.0, backstop=OWN_BACKSTOP)
    assert own_read_due(read_at=None, **due)
    assert not own_read_due(read_at=90.0, **due)
    assert own_read_due(read_at=90.0, **{**due, "mailbox": 4})  # `release` poked us
    assert own_read_due(read_at=90.0, unheld=True, **due)
    assert own_read_due(read_at=100.0 - OWN_BACKSTOP, **due)


def test_the_view_prefers_a_consistent_read_then_our_holding_then_the_index():
    view = shard_view(
        vacant=[ShardItem("a", "", 1), ShardItem("b", "", 1)],
        addressed=[ShardItem("b", "", 2, successor="me")],
        held={"c": 3, "d": 5},
        me="me",
        consistent={"d": ShardItem("d", "me", 5, release_requested=9.0)},
    )
    assert view == (
        ShardItem("a", "", 1),
        ShardItem("b", "", 2, successor="me"),
        ShardItem("c", "me", 3),
        ShardItem("d", "me", 5, release_requested=9.0),
    )


def members(**held: int) -> list[Member]:
    return [Member(w, "running", held=n) for w, n in held.items()]


def test_targets_count_the_fleets_shards_over_the_running_members():
    fleet = [*members(a=0, b=0), Member("c", "draining"), Member("d", "dead")]
    assert targets(fleet, 10, "a", 0, accepting=True) == {"a": 5, "b": 5}
    assert targets(fleet, 10, "a", 0, accepting=False) == {"b": 10}


def test_successors_are_dealt_to_the_short_members_without_overfilling_one():
    fleet = members(me=6, b=0, c=3)

    def deal(shards: list[str], accepting: bool) -> dict[str, str]:
        return successors(
            shards,
            me="me",
            members=fleet,
            holding=6,
            shard_count=9,
            accepting=accepting,
            my_cap=0,
        )

    # Shedding: b lacks 3, c is at its target.
    assert deal(["s1", "s2", "s3", "s4"], True) == {"s1": "b", "s2": "b", "s3": "b"}
    # Draining: everything goes, targets 5 and 4 without us.
    assert sorted(deal([f"s{i}" for i in range(6)], False).values()) == ["b"] * 5 + ["c"]


def test_successors_prefer_a_standby_dealt_or_with_room_never_past_a_share():
    def deal(fleet, shards, prefer, accepting=False, holding=4, count=8):
        return successors(
            shards,
            me="me",
            members=fleet,
            holding=holding,
            shard_count=count,
            accepting=accepting,
            my_cap=0,
            prefer=lambda shard: prefer.get(shard, ()),
        )

    # Draining 4 of 8 shards to b (holding 2) and c (holding 2): targets 4 each.
    fleet = members(me=4, b=2, c=2)
    plain = deal(fleet, ["s1", "s2", "s3", "s4"], {})
    assert sorted(plain.values()) == ["b", "b", "c", "c"]
    # Each shard to its standby, the counts as dealt.
    prefer = {"s1": ("c",), "s2": ("c",), "s3": ("b",), "s4": ("b",)}
    assert deal(fleet, ["s1", "s2", "s3", "s4"], prefer) == prefer | {
        s: w[0] for s, w in prefer.items()
    }
    # A third shard whose standby is c: c would pass its share, so it goes to b.
    prefer = {"s1": ("c",), "s2": ("c",), "s3": ("c",), "s4": ("b",)}
    chosen = deal(fleet, ["s1", "s2", "s3", "s4"], prefer)
    assert sorted(chosen.values()) == ["b", "b", "c", "c"]
    assert chosen["s4"] == "b" and [chosen["s1"], chosen["s2"]] == ["c", "c"]
    # A standby with room that was not dealt takes the last dealt name's place.
    fleet = members(me=5, b=0, c=2)  # shedding one of 9 (shares 3): b lacks 3, c lacks 1
    assert deal(fleet, ["s1"], {}, accepting=True, holding=5, count=9) == {"s1": "b"}
    assert deal(fleet, ["s1"], {"s1": ("c",)}, accepting=True, holding=5, count=9) == {"s1": "c"}
    # Never ourselves, never past a share.
    assert deal(fleet, ["s1"], {"s1": ("me",)}, accepting=True, holding=5, count=9) == {"s1": "b"}
    full = members(me=5, b=0, c=3)
    assert deal(full, ["s1"], {"s1": ("c",)}, accepting=True, holding=5, count=9) == {"s1": "b"}
