"""One contract for protocol 2's requests: ``MemoryFleet`` and ``DynamoFleet`` on moto's
in-process mock, on moto's server and on dynalite (both over HTTP on 127.0.0.1).

The behaviours of tests/adapters/test_memory_fleet.py that are not about billing, on every
store; then what only DynamoDB has: the items stay protocol 1's, and ``init-table --protocol
2``'s backfill and flip (admin.set_protocol; the command line is tests/e2e/test_cli.py's).
"""

from __future__ import annotations

import pytest
import trio
from helpers.stores import StoreFactory, atomic_backends

from shard_worker.contract import table as t
from supervisor.adapters.lease_store.base import LeaseConflict, LeaseStore, WorkerIdTaken
from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore, admin
from supervisor.adapters.lease_store.dynamodb.fleet import DynamoFleet
from supervisor.adapters.lease_store.memory_fleet import MemoryFleet
from supervisor.core.items import ShardItem, WorkerItem
from supervisor.core.partition_keys import bucket, spot, start_spot
from supervisor.core.standby_ring import point

Fleet = MemoryFleet | DynamoFleet
RACE_ROUNDS = 10


async def _table(store: LeaseStore) -> None:
    if isinstance(store, DynamoLeaseStore):
        await store.ensure_table(True, protocol=2)
    else:
        await store.ensure_table(True)


@pytest.fixture
async def store(make_store: StoreFactory) -> LeaseStore:
    store = make_store()
    await _table(store)
    return store


@pytest.fixture
def fleet(store: LeaseStore) -> Fleet:
    return store.fleet()  # type: ignore[attr-defined, no-any-return]


def worker(wid: str, session: str = "s1", features: frozenset[str] = frozenset()) -> WorkerItem:
    return WorkerItem(wid, session, 0, "running", 0.0, 0.0, max_shards=7, features=features)


def same_bucket(count: int, number: int = 7) -> list[str]:
    """``count`` shard ids in vacant bucket ``number`` (hashing is cheap, requests are not)."""
    found: list[str] = []
    index = 0
    while len(found) < count:
        shard_id = f"s{index:06d}"
        if bucket(shard_id, 256) == number:
            found.append(shard_id)
        index += 1
    return found


# --- protocol 1's writes keep protocol 2's indexes true -------------------------------------


async def ids(listing) -> list[str]:
    return sorted(s.id for s in await listing)


async def test_protocol_1_writes_keep_protocol_2_indexes_true(
    store: LeaseStore, fleet: Fleet
) -> None:
    """A fleet of today's version writes the keys protocol 2 reads (take, release, a named
    successor, a make-before-break hand-over, a shard registered and retired): at the flip,
    the indexes already say what the items say, whatever protocol 1 did since the backfill."""
    a, b, c = same_bucket(3, number=11)
    for shard_id in (a, b, c):
        await store.ensure_shard(shard_id)
    assert await ids(fleet.vacant_in(11)) == [a, b, c]
    await store.take(a, "w1", "", 0, 1.0)
    await store.take(b, "w1", "", 0, 1.0)
    await store.take(c, "w1", "", 0, 1.0)
    assert await ids(fleet.owned_by("w1")) == [a, b, c]
    assert await ids(fleet.vacant_in(11)) == []
    await store.release(a, "w1", 1, {"x": 1})
    assert await ids(fleet.vacant_in(11)) == [a]
    await store.release(b, "w1", 1, {"x": 1}, successor="w2")  # listed under w2 only
    assert await ids(fleet.addressed_to("w2")) == [b]
    assert await ids(fleet.vacant_in(11)) == [a]
    await store.request_handoff(c, "w1", 1, "w2", 2.0)  # its notice is no shard: left out
    assert await ids(fleet.addressed_to("w2")) == [b, c]
    await store.handoff_ready(c, 1, "w2", {"x": 5})
    await store.hand_over(c, "w1", 1, "w2", {"x": 4}, 3.0)
    assert await ids(fleet.owned_by("w1")) == []
    assert await ids(fleet.owned_by("w2")) == [c]
    assert await ids(fleet.addressed_to("w2")) == [b]
    await store.add_shard("reg", "{}", 4.0)
    assert "reg" in await ids(fleet.vacant_in(bucket("reg", 256)))
    await store.retire_shard("reg", 5.0)
    assert "reg" not in await ids(fleet.vacant_in(bucket("reg", 256)))


async def test_protocol_1_worker_writes_keep_the_member_list_true(store: LeaseStore) -> None:
    """Today's daemon registers with protocol 2's worker keys, writes ``held`` when its count
    changed and records the generation of each change it announces (``mgen``): at the flip,
    the member list already shows every worker as its item does."""
    fleet = store.fleet()  # type: ignore[attr-defined]
    await store.register_worker(worker("a"))
    (member,) = await fleet.read_members()
    assert (member.id, member.state, member.held, member.mgen) == ("a", "running", 0, 0)
    generation = await store.announce("join")
    await store.record_membership("a", "s1", generation)
    await store.heartbeat("a", "s1", "running", 1.0, held=3)
    await store.heartbeat("a", "s1", "running", 2.0)  # held not given: kept
    (member,) = await fleet.read_members()
    assert (member.held, member.mgen, member.max_shards) == (3, generation, 7)
    later = await store.announce("state")
    await store.heartbeat("a", "s1", "draining", 3.0, held=1)
    await store.record_membership("a", "s1", later)
    with pytest.raises(LeaseConflict):  # never lowered: an earlier record arriving late
        await store.record_membership("a", "s1", generation)
    with pytest.raises(LeaseConflict):  # not our session any more
        await store.record_membership("a", "other", later + 1)
    (member,) = await fleet.read_members()
    assert (member.state, member.held, member.mgen) == ("draining", 1, later)
    await store.retire_worker("a", "s1", 4.0)
    (member,) = await fleet.read_members()
    assert (member.state, member.held) == ("stopped", 0)
    await store.register_worker(worker("a", session="s2"))  # a restart starts anew
    (member,) = await fleet.read_members()
    assert (member.state, member.held, member.mgen) == ("running", 0, 0)


# --- membership ------------------------------------------------------------------------------


async def test_a_join_and_a_state_change_move_the_generation_a_heartbeat_does_not(
    fleet: Fleet,
) -> None:
    assert await fleet.read_generation() == 0
    await fleet.join(worker("a"))
    assert await fleet.read_generation() == 1
    assert await fleet.heartbeat("a", "s1", "running", held=3) == 1
    assert await fleet.read_generation() == 1
    assert await fleet.heartbeat("a", "s1", "draining", held=3) == 2
    assert await fleet.read_generation() == 2
    (member,) = await fleet.read_members()
    assert (member.id, member.state, member.held, member.mgen) == ("a", "draining", 3, 2)
    assert member.max_shards == 7


async def test_the_member_list_reads_every_bucket(fleet: Fleet) -> None:
    ids = [f"w{i:02d}" for i in range(12)]
    for wid in ids:
        await fleet.join(worker(wid, features=frozenset({"mbb"})))
    members = await fleet.read_members()
    assert [m.id for m in members] == ids
    assert {m.features for m in members} == {frozenset({"mbb"})}
    assert max(m.mgen for m in members) == await fleet.read_generation() == 12


async def test_a_heartbeat_of_another_session_is_worker_id_taken(fleet: Fleet) -> None:
    await fleet.join(worker("a", session="s1"))
    await fleet.join(worker("a", session="s2"))  # a second process with our id
    with pytest.raises(WorkerIdTaken):
        await fleet.heartbeat("a", "s1", "running", held=0)
    with pytest.raises(WorkerIdTaken):
        await fleet.heartbeat("nobody", "s1", "running", held=0)
    assert len(await fleet.read_members()) == 1


# --- liveness --------------------------------------------------------------------------------


async def test_the_death_notice_needs_the_confirmed_counter_and_then_heartbeats_fail(
    fleet: Fleet,
) -> None:
    await fleet.join(worker("a"))
    counter = await fleet.heartbeat("a", "s1", "running", held=0)
    seen = await fleet.watch_read("a", consistent=True)
    assert seen is not None and (seen.counter, seen.session, seen.state) == (
        counter,
        "s1",
        "running",
    )
    assert await fleet.watch_read("nobody", consistent=False) is None
    assert not await fleet.death_notice("a", counter - 1, "s1")  # a heartbeat landed since
    assert not await fleet.death_notice("a", counter, "other")
    before = await fleet.read_generation()
    assert await fleet.death_notice("a", counter, "s1", by="b")
    assert await fleet.read_generation() > before
    assert not await fleet.death_notice("a", counter, "s1")  # only one notice wins
    with pytest.raises(LeaseConflict):
        await fleet.heartbeat("a", "s1", "running", held=0)
    (member,) = await fleet.read_members()
    assert member.state == "dead" and member.mgen > before
    seen = await fleet.watch_read("a", consistent=True)
    assert seen is not None and (seen.counter, seen.state) == (counter, "dead")
    await fleet.join(worker("a", session="s3"))  # it registers again: a join
    assert await fleet.heartbeat("a", "s3", "running", held=0) > counter


# --- standby-wanted markers (docs/lease-protocol.md, *Standbys*) ------------------------------


async def test_a_marker_is_listed_under_the_worker_it_names_only(fleet: Fleet) -> None:
    assert await fleet.want_standby("s1", "w1", 3, "w9")
    assert await fleet.want_standby("s2", "w1", 1, "w9")
    assert await fleet.want_standby("s3", "w2", 2, "w8")
    assert [(m.shard, m.holder, m.epoch) for m in await fleet.wanted_of("w9")] == [
        ("s1", "w1", 3),
        ("s2", "w1", 1),
    ]
    assert [m.shard for m in await fleet.wanted_of("w8")] == ["s3"]
    assert await fleet.wanted_of("w1") == ()
    assert await fleet.addressed_to("w9") == ()  # no shard: the hand-off poll never sees one
    assert await fleet.want_standby("s1", "w1", 3, "w8")  # the candidates moved: renamed
    assert [m.shard for m in await fleet.wanted_of("w9")] == ["s2"]
    assert [m.shard for m in await fleet.wanted_of("w8")] == ["s1", "s3"]
    assert await fleet.want_standby("s2", "w1", 1, "")  # let go: withdrawn
    assert await fleet.wanted_of("w9") == ()


async def test_an_earlier_holder_neither_overwrites_nor_withdraws_a_later_ones_marker(
    fleet: Fleet,
) -> None:
    assert await fleet.want_standby("s1", "old", 4, "w9")
    assert await fleet.want_standby("s1", "new", 5, "w7")  # promoted: epoch + 1, its own
    assert not await fleet.want_standby("s1", "old", 4, "w9")  # a late write of the old one
    assert not await fleet.want_standby("s1", "old", 4, "")
    assert [(m.shard, m.holder, m.epoch) for m in await fleet.wanted_of("w7")] == [("s1", "new", 5)]
    assert await fleet.wanted_of("w9") == ()
    assert await fleet.want_standby("s1", "new", 5, "")
    assert await fleet.want_standby("s1", "new", 5, "")  # nothing left to withdraw: fine
    assert not await fleet.want_standby("s1", "old", 4, "w9")  # withdrawn, its epoch stands
    assert await fleet.wanted_of("w9") == () and await fleet.wanted_of("w7") == ()


async def test_markers_are_invisible_to_protocol_1(store: LeaseStore, fleet: Fleet) -> None:
    await store.ensure_shard("s1")
    assert await fleet.want_standby("s1", "w1", 1, "w2")
    snapshot = await store.snapshot()
    assert [s.id for s in snapshot.shards] == ["s1"] and snapshot.workers == ()
    assert [v.id for v in (await store.vacancies()).shards] == ["s1"]


# --- registered shards, read per arc of the standby ring ---------------------------------------


async def test_registered_shards_are_read_per_arc_of_the_ring(
    store: LeaseStore, fleet: Fleet
) -> None:
    """`shards add` and `remove` (protocol 1's writes) keep the registration items and the
    meta item's counters true; a stretch of the ring lists exactly the registered shards
    whose point lies in it, across registration keys and past the top of the ring."""
    ids = [f"r{i:02d}" for i in range(24)]
    for shard_id in ids:
        await store.add_shard(shard_id, '{"streams": []}', 1.0)
    await store.ensure_shard("toml")  # a configured shard: no registration item
    await store.retire_shard("r00", 2.0)
    await store.add_shard("r00", '{"streams": []}', 3.0)  # registered again
    await store.retire_shard("r01", 4.0)
    registered = sorted(set(ids) - {"r01"})
    meta = await fleet.read_meta()
    assert (meta.shardgen, meta.registered_count) == (27, 23)
    assert await fleet.registered_in(0, 0) == tuple(registered)  # the whole ring
    points = sorted((point("s", s), s) for s in registered)
    (a, _), (b, _) = points[3], points[15]
    inside = tuple(sorted(s for p, s in points if a <= p < b))
    assert await fleet.registered_in(a, b) == inside
    outside = tuple(sorted(s for p, s in points if not a <= p < b))
    assert await fleet.registered_in(b, a) == outside  # wrapping past the top
    assert not await fleet.register("r02")  # registered already: counted once
    assert not await fleet.unregister("r01")
    meta = await fleet.read_meta()
    assert (meta.generation, meta.protocol, meta.shardgen, meta.registered_count) == (0, 1, 27, 23)
    snapshot = await store.snapshot()  # protocol 1 never sees a registration item
    assert sorted(s.id for s in snapshot.shards) == sorted([*ids, "toml"])
    assert snapshot.workers == ()


@pytest.fixture
async def racers(make_store: StoreFactory) -> list[Fleet]:
    """Two workers' handles on one table, for a race (exactly one conditional write wins)."""
    stores = [make_store(), make_store()]
    await _table(stores[0])
    return [s.fleet() for s in stores]  # type: ignore[attr-defined]


@atomic_backends
async def test_racing_death_notices_exactly_one_wins(racers: list[Fleet]) -> None:
    fleets = racers
    for round_no in range(RACE_ROUNDS):
        victim = f"v{round_no}"
        await fleets[0].join(worker(victim))
        counter = await fleets[0].heartbeat(victim, "s1", "running", held=0)
        won: list[bool] = []

        async def notice(
            f: Fleet, victim: str = victim, counter: int = counter, won: list[bool] = won
        ) -> None:
            won.append(await f.death_notice(victim, counter, "s1"))

        async with trio.open_nursery() as nursery:
            for f in fleets:
                nursery.start_soon(notice, f)
        assert sorted(won) == [False, True], round_no


# --- shards ----------------------------------------------------------------------------------


async def test_routing_and_taking_a_dead_owners_shard_stay_conditional_on_owner_and_epoch(
    fleet: Fleet,
) -> None:
    await fleet.ensure_shards(["s1"])
    taken = await fleet.take("s1", "a", "", 0)
    assert taken is not None and (taken.owner, taken.epoch) == ("a", 1)
    assert await fleet.take("s1", "b", "", 0) is None  # stale observation
    assert not await fleet.route("s1", "a", 0, "b")  # wrong epoch
    assert not await fleet.route("s1", "x", 1, "b")  # wrong owner
    assert await fleet.route("s1", "a", 1, "b")
    assert [(i.id, i.owner, i.epoch) for i in await fleet.owned_by("a")] == [("s1", "a", 1)]
    assert [(i.id, i.successor) for i in await fleet.addressed_to("b")] == [("s1", "b")]
    new = await fleet.take("s1", "b", "a", 1)
    assert new is not None and (new.owner, new.epoch, new.successor) == ("b", 2, "")
    assert await fleet.addressed_to("b") == () and await fleet.owned_by("a") == ()
    assert [i.id for i in await fleet.owned_by("b")] == ["s1"]


async def test_a_shard_released_to_a_successor_is_listed_under_it_only(fleet: Fleet) -> None:
    await fleet.ensure_shards(["s1"])
    await fleet.take("s1", "a", "", 0)
    assert await fleet.release("s1", "a", 1, successor="b")
    assert [i.id for i in await fleet.addressed_to("b")] == ["s1"]
    assert await fleet.vacant_in(bucket("s1", 256)) == ()
    assert await fleet.owned_by("a") == ()
    assert not await fleet.route("s1", "", 1, "c", dead="x")  # addressed to b, not to x
    assert await fleet.route("s1", "", 1, "c", dead="b")  # b died: re-routed
    assert [i.id for i in await fleet.addressed_to("c")] == ["s1"]
    assert await fleet.addressed_to("b") == ()
    assert await fleet.release("s1", "a", 1, successor="") is False  # not a's any more


async def test_a_shard_released_to_nobody_is_back_in_its_vacant_bucket(fleet: Fleet) -> None:
    await fleet.ensure_shards(["s1"])
    await fleet.take("s1", "a", "", 0)
    assert await fleet.vacant_in(bucket("s1", 256)) == ()
    assert await fleet.release("s1", "a", 1, successor="")
    (listed,) = await fleet.vacant_in(bucket("s1", 256))
    assert (listed.id, listed.owner, listed.epoch) == ("s1", "", 1)
    assert await fleet.take("s1", "b", "", 1) is not None


async def test_a_vacant_bucket_is_read_one_page_from_the_readers_spot_wrapping(
    fleet: Fleet,
) -> None:
    ids = same_bucket(130)
    await fleet.ensure_shards(ids)
    number = bucket(ids[0], 256)
    by_spot = sorted(ids, key=spot)
    assert [i.id for i in await fleet.vacant_in(number)] == by_spot[:100]
    first = await fleet.vacant_in(number, start_spot("a", number, 0))
    other = await fleet.vacant_in(number, start_spot("b", number, 0))
    assert len(first) == len(other) == 100 and {i.id for i in first} <= set(ids)
    assert {i.id for i in first} != {i.id for i in other}
    # From the 101st-last entry on: the 30 after it, then the bucket's first 70, each once.
    middle = await fleet.vacant_in(number, spot(by_spot[100]))
    assert [i.id for i in middle] == by_spot[100:] + by_spot[:70]
    past = await fleet.vacant_in(number, "g" * 16)  # past the end: wraps around
    assert [i.id for i in past] == by_spot[:100]


async def test_ensure_shards_creates_only_the_missing_items(fleet: Fleet) -> None:
    await fleet.ensure_shards(["s000001"])
    await fleet.take("s000001", "a", "", 0)
    ids = [f"s{i:06d}" for i in range(130)]  # two BatchGetItem requests
    await fleet.ensure_shards(ids)
    (kept,) = await fleet.owned_by("a")
    assert (kept.id, kept.epoch) == ("s000001", 1)  # not reset to vacant
    vacant = set()
    for number in {bucket(s, 256) for s in ids}:
        vacant |= {i.id for i in await fleet.vacant_in(number)}
    assert vacant == set(ids) - {"s000001"}


async def test_the_index_reads_page_beyond_a_hundred_entries(fleet: Fleet) -> None:
    ids = [f"p{i:03d}" for i in range(105)]
    await fleet.ensure_shards(ids)
    for shard_id in ids:
        assert await fleet.take(shard_id, "a", "", 0) is not None
    assert [i.id for i in await fleet.owned_by("a")] == ids
    for shard_id in ids:
        assert await fleet.route(shard_id, "a", 1, "b")
    assert [i.id for i in await fleet.addressed_to("b")] == ids


@atomic_backends
async def test_racing_takes_exactly_one_wins(racers: list[Fleet]) -> None:
    fleets = racers
    ids = [f"race-{n:02d}" for n in range(RACE_ROUNDS)]
    await fleets[0].ensure_shards(ids)
    for shard_id in ids:
        won: list[ShardItem | None] = []

        async def take(
            f: Fleet, me: str, shard_id: str = shard_id, won: list[ShardItem | None] = won
        ) -> None:
            won.append(await f.take(shard_id, me, "", 0))

        async with trio.open_nursery() as nursery:
            for f, me in zip(fleets, ("wa", "wb"), strict=True):
                nursery.start_soon(take, f, me)
        assert sorted(w is None for w in won) == [False, True], shard_id


# --- DynamoDB only: protocol 1's items, and init-table's backfill and flip -------------------


# The memory store has no table to administer: these run on the three DynamoDB backends only.
dynamo_only = pytest.mark.parametrize(
    "backend", ["moto-mock", "moto-server", "dynalite"], indirect=True
)


@dynamo_only
async def test_protocol_1_reads_the_same_items(store: LeaseStore, fleet: Fleet) -> None:
    await fleet.join(worker("a"))
    await fleet.ensure_shards(["s1", "s2"])
    await fleet.take("s1", "a", "", 0, wall_now=5.0)  # type: ignore[call-arg]
    snapshot = await store.snapshot()
    assert [(w.id, w.state, w.max_shards) for w in snapshot.workers] == [("a", "running", 7)]
    assert [(s.id, s.owner, s.epoch) for s in snapshot.shards] == [("s1", "a", 1), ("s2", "", 0)]
    assert [v.id for v in (await store.vacancies()).shards] == ["s2"]
    assert [w.id for w in await store.read_workers()] == ["a"]
    await store.release("s1", "a", 1, {"x": 4})
    # Protocol 1's release keeps protocol 2's keys: back in its vacant bucket, where a
    # protocol-2 take finds it and lists it under its new owner.
    assert await fleet.owned_by("a") == ()
    assert "s1" in [s.id for s in await fleet.vacant_in(bucket("s1", 256))]
    assert await fleet.take("s1", "b", "", 1) is not None
    assert [s.id for s in await fleet.owned_by("b")] == ["s1"] and await fleet.owned_by("a") == ()


@dynamo_only
async def test_the_flip_refuses_a_fleet_of_todays_workers_and_backfills_the_keys(
    store: DynamoLeaseStore,
) -> None:
    # Today's daemon advertises these two features, not p2; it writes protocol 2's keys. Items
    # of an earlier version have none (the worker "gone" and s3, put as they were).
    today = frozenset({t.FEATURE_MBB, t.FEATURE_HANDOVER})
    await store.register_worker(worker("old", features=today))
    await store.register(worker("gone", session="g"), {})
    await store.retire_worker("gone", "g", 1.0)  # stopped: it does not count
    for shard_id in ("s1", "s2"):
        await store.ensure_shard(shard_id)
    await store.create_shard("ensure_shard", "s3", {})  # as an earlier version created it
    await store.take("s1", "old", "", 0, 1.0)
    await store.take("s2", "old", "", 0, 1.0)
    await store.release("s2", "old", 1, {}, successor="gone")
    change = await store.set_protocol(2)
    assert (change.created, change.protocol, change.refused) == (False, 1, ("old",))
    assert change.backfilled == 2  # the earlier version's worker item and s3
    fleet = store.fleet()
    assert [m.id for m in await fleet.read_members()] == ["gone", "old"]
    assert [s.id for s in await fleet.owned_by("old")] == ["s1"]
    assert [s.id for s in await fleet.addressed_to("gone")] == ["s2"]
    assert [s.id for s in await fleet.vacant_in(bucket("s3", 256))] == ["s3"]
    assert (await store.set_protocol(2)).backfilled == 0  # once is enough


@dynamo_only
async def test_the_backfill_makes_the_registration_items_match_the_registered_shards(
    store: DynamoLeaseStore,
) -> None:
    """A `shards add` that crashed between its two writes (r2: no registration item, the
    count short), a registration left listed for a retired shard (r3): `init-table
    --protocol 2` lists and unlists them and sets the count to what its scan found."""
    fleet = store.fleet()
    for shard_id in ("r1", "r2", "r3"):
        await store.add_shard(shard_id, '{"streams": []}', 1.0)
    await store.retire_shard("r3", 2.0)
    assert await fleet.unregister("r2")  # as if its registration had never been written
    assert await fleet.register("r3")  # as if its removal had stopped half-way
    assert await fleet.registered_in(0, 0) == ("r1", "r3")
    change = await store.set_protocol(2)
    assert (change.protocol, change.registrations) == (2, 2)  # no worker to refuse: flips
    assert await fleet.registered_in(0, 0) == ("r1", "r2")
    meta = await fleet.read_meta()
    assert (meta.protocol, meta.registered_count, meta.shardgen) == (2, 2, 7)  # 3 adds,
    # 1 retire, our 2 writes above, the repair
    assert (await store.set_protocol(2)).registrations == 0  # once is enough


@dynamo_only
async def test_the_flip_is_made_when_every_live_worker_advertises_p2(
    store: DynamoLeaseStore,
) -> None:
    fleet = store.fleet()
    await fleet.join(worker("new", features=frozenset({t.FEATURE_P2})))
    await fleet.join(worker("old"))
    counter = await fleet.heartbeat("old", "s1", "running", held=0)
    assert await fleet.death_notice("old", counter, "s1")  # dead: it does not count
    change = await store.set_protocol(2)
    assert (change.protocol, change.refused, change.backfilled) == (2, (), 0)
    assert (await store.set_protocol(1)).protocol == 1  # the rollback


@dynamo_only
async def test_a_backfill_write_on_an_item_changed_since_the_scan_reads_it_again(
    store: DynamoLeaseStore,
) -> None:
    """The backfill's write is conditional on what the keys were computed from: an item taken
    after the scan read it vacant gets the keys of its new state, not the stale ones."""
    await store.ensure_shard("s1")
    (scanned,) = (await store._db.request("t", "scan", TableName=store.table))["Items"]
    await store.take("s1", "a", "", 0, 1.0)  # protocol 1, after the scan
    await admin._write_keys(store._db, scanned)
    fleet = store.fleet()
    assert [s.id for s in await fleet.owned_by("a")] == ["s1"]
    assert await fleet.vacant_in(bucket("s1", 256)) == ()
