"""Protocol 2's standby candidates on plain data: a worker finds the shards it may stand by
for from its arcs of the ring alone, exactly the shards whose candidates name it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.partition_keys import registration_key, registration_reads, registration_spot
from supervisor.core.standby_ring import (
    Ring,
    candidates_of,
    first_standby,
    markers_wanted,
    place_on_ring,
    point,
    standbys,
    stands_by,
    wants_extra,
)

members = st.sets(st.sampled_from([f"w{i}" for i in range(30)]), min_size=1, max_size=12)
shard_ids = [f"s{i}" for i in range(200)]


@given(members, st.integers(1, 3), st.integers(1, 4))
def test_a_worker_is_candidate_for_exactly_the_shards_its_arcs_hold(live, k, vnodes):
    ring = Ring.build(live, shard_ids, k, vnodes)
    for me in sorted(live):
        named = {s for s in shard_ids if me in ring.candidates(s)}
        assert ring.candidate_for(me) == named
    assert ring.candidate_for("not-a-member") == frozenset()


def listed_by(reads: list[tuple[str, str, str]], shard: str) -> bool:
    """Whether one of the range queries lists the shard's registration item."""
    at = point("s", shard)
    key, spot = registration_key(at), registration_spot(at)
    return any(key == k and low <= spot <= high for k, low, high in reads)


@given(members, st.integers(1, 3), st.integers(1, 4))
def test_the_range_queries_of_a_workers_arcs_list_exactly_its_candidacies(live, k, vnodes):
    """Registered shards are read per arc (docs/lease-protocol.md, *Shards nobody lists*):
    the queries of a worker's arcs list the shards it is a candidate for, and no other."""
    ring = Ring.build(live, shard_ids, k, vnodes)
    for me in sorted(live):
        reads = [r for start, end in ring.arcs(me) for r in registration_reads(start, end)]
        assert {s for s in shard_ids if listed_by(reads, s)} == ring.candidate_for(me)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_the_range_queries_cover_an_arc_once_in_ring_order(start, end):
    reads = registration_reads(start, end)
    keys = [key for key, _, _ in reads]
    assert len(keys) == len(set(keys)) or start >= end  # a wrapping arc may meet its start key
    for _key, low, high in reads:
        assert low <= high and len(low) == len(high) == 16
    inside = start + (end - start) // 2 if start < end else start
    assert any(
        key == registration_key(inside) and low <= registration_spot(inside) <= high
        for key, low, high in reads
    )


@given(members, st.integers(1, 3))
def test_every_shard_has_k_plus_one_distinct_candidates_while_there_are_enough(live, k):
    ring = Ring.build(live, shard_ids, k)
    for shard in shard_ids[:50]:
        found = ring.candidates(shard)
        assert len(set(found)) == len(found) == min(k + 1, len(live))


def test_a_join_moves_few_candidacies():
    """Consistent hashing: the joiner takes part of its neighbours' arcs, the rest stays."""
    live = [f"w{i}" for i in range(20)]
    before = Ring.build(live, shard_ids, 1)
    after = Ring.build([*live, "joiner"], shard_ids, 1)
    moved = sum(before.candidates(s) != after.candidates(s) for s in shard_ids)
    assert 0 < moved <= len(shard_ids) * 0.25  # about (k + 1) / W of them: 10 %
    changed = {s for s in shard_ids if before.candidates(s) != after.candidates(s)}
    assert after.candidate_for("joiner") == changed  # it moved only what it now stands by


def test_the_holder_is_left_out_and_names_the_extra_standby_when_among_the_first_k():
    cands = ("a", "b", "c")
    assert standbys(cands, "x", 2) == ("a", "b")  # the holder is not a candidate
    assert standbys(cands, "a", 2) == ("b", "c")
    assert wants_extra(cands, "a", 2) == "c"
    assert wants_extra(cands, "c", 2) == ""  # the (k+1)-th holds it: the first k stand by
    assert wants_extra(cands, "x", 2) == ""
    assert wants_extra(("a",), "a", 1) == ""  # no one left to name


@given(st.sampled_from(["a", "b", "c", "x"]), st.integers(1, 2))
def test_each_candidate_decides_alone_what_the_shard_needs(holder, k):
    """From its own holdings and the holder's marker, every candidate reaches the standbys
    that the full view gives."""
    cands = ("a", "b", "c")[: k + 1]
    marked = {"s1"} if wants_extra(cands, holder, k) else set()
    chosen = {
        me
        for me in cands
        if stands_by(
            me,
            cands,
            holds=me == holder,
            marked=marked if me == wants_extra(cands, holder, k) else set(),
            shard="s1",
            k=k,
        )
    }
    assert chosen == set(standbys(cands, holder, k))


def test_the_range_queries_split_at_key_boundaries_and_wrap():
    edge = 1 << 56
    assert registration_reads(edge - 1, edge + 1) == [
        ("reg#00", f"{edge - 1:016x}", f"{edge - 1:016x}"),
        ("reg#01", f"{edge:016x}", f"{edge:016x}"),
    ]
    top = 2**64
    assert registration_reads(top - 1, 1) == [
        ("reg#ff", f"{top - 1:016x}", f"{top - 1:016x}"),
        ("reg#00", f"{0:016x}", f"{0:016x}"),
    ]
    whole = registration_reads(0, 0)  # every member a candidate of every shard
    assert [key for key, _, _ in whole] == [f"reg#{n:02x}" for n in range(256)]


@given(members, st.integers(1, 3), st.sampled_from(shard_ids))
def test_the_placement_runs_each_standby_on_exactly_the_workers_the_definition_names(
    live, k, shard
):
    """Every worker placing alone, from the ring, its holdings and the markers naming it:
    the shard's standbys are exactly ``standbys(candidates, holder, k)``, none on the holder."""
    ring = Ring.build(live, shard_ids, k)
    holder = sorted(live)[0]
    cands = ring.candidates(shard)
    names = markers_wanted(holder, ring, [shard], {shard: k})
    assert names == {shard: wants_extra(cands, holder, k)}
    running = {
        me
        for me in live
        if shard
        in place_on_ring(
            me,
            ring,
            {shard: k},
            holding={shard} if me == holder else set(),
            marked={shard} if names[shard] == me else set(),
        ).mine
    }
    assert running == set(standbys(cands, holder, k))
    assert first_standby(ring, shard, holder, k) == (standbys(cands, holder, k) or ("",))[0]


def test_a_shard_wanting_fewer_standbys_uses_a_prefix_of_its_candidates():
    ring = Ring.build([f"w{i}" for i in range(8)], shard_ids, 3)
    shard = "s1"
    assert candidates_of(ring, shard, 1) == ring.candidates(shard)[:2]
    holder = ring.candidates(shard)[3]  # not among the first two
    placed = {
        me
        for me in ring.members
        if shard in place_on_ring(me, ring, {shard: 1}, holding=(), marked=()).mine
    }
    assert placed == {ring.candidates(shard)[0]}
    assert first_standby(ring, shard, holder, 1) == ring.candidates(shard)[0]
    assert first_standby(ring, shard, holder, 0) == ""
    assert markers_wanted(holder, ring, [shard], {shard: 0}) == {}


def test_a_cap_keeps_the_shards_whose_candidates_we_lead():
    ring = Ring.build(["a", "b"], [f"s{i}" for i in range(6)], 1)  # both candidates of all
    wanted = {f"s{i}": 1 for i in range(6)}
    full = place_on_ring("a", ring, wanted, holding=(), marked=())
    led = {s for s in full.mine if ring.candidates(s)[0] == "a"}
    capped = place_on_ring("a", ring, wanted, holding=(), marked=(), cap=len(led))
    assert capped.mine == led
    assert capped.uncovered == full.mine - led
    assert place_on_ring("a", ring, {}, holding=(), marked=()).mine == frozenset()
