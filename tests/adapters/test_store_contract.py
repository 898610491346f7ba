"""One contract for every LeaseStore: the in-memory twin, and DynamoLeaseStore on moto's
in-process mock, on moto's server and on dynalite (both over HTTP).

The drivers are tested on the memory store only, so it must agree with DynamoDB here.
"""

from __future__ import annotations

import attrs
import boto3
import pytest
import trio
import trio.testing
from helpers.stores import REGION, StoreFactory, atomic_backends
from moto import mock_aws

from supervisor.adapters.lease_store.base import (
    DeclaredDead,
    LeaseConflict,
    LeaseStore,
    LeaseStoreError,
    StoreUnavailable,
    TableMissing,
    WorkerIdTaken,
)
from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore
from supervisor.adapters.lease_store.memory import MemoryLeaseStore
from supervisor.core.items import HandoffRequest, ShardItem, Vacancies, VacantShard, WorkerItem

RACE_ROUNDS = 20


@pytest.fixture
async def store(make_store: StoreFactory) -> LeaseStore:
    store = make_store()
    await store.ensure_table(create=True)
    return store


def worker(worker_id: str = "w1", session: str = "s1", counter: int = 0) -> WorkerItem:
    return WorkerItem(
        id=worker_id,
        session=session,
        counter=counter,
        state="running",
        heartbeat_at=1700000000.25,
        started_at=1700000000.0,
        host="host-a",
        pid=4242,
    )


async def stored_shard(store: LeaseStore, shard_id: str) -> ShardItem:
    (shard,) = [s for s in (await store.snapshot()).shards if s.id == shard_id]
    return shard


async def race_take(
    stores: dict[str, LeaseStore], shard_id: str
) -> dict[str, ShardItem | LeaseConflict]:
    """Every store takes the unowned shard at once; what each one got."""
    outcomes: dict[str, ShardItem | LeaseConflict] = {}
    go = trio.Event()

    async def attempt(me: str) -> None:
        await go.wait()
        try:
            outcomes[me] = await stores[me].take(shard_id, me, "", 0, 1.0)
        except LeaseConflict as exc:
            outcomes[me] = exc

    async with trio.open_nursery() as nursery:
        for me in stores:
            nursery.start_soon(attempt, me)
        await trio.sleep(0)
        go.set()
    return outcomes


async def test_ensure_table_creates_then_reports_existing(make_store: StoreFactory) -> None:
    first, second = make_store(), make_store()
    assert await first.ensure_table(create=True) is True
    assert await first.ensure_table(create=True) is False
    assert await second.ensure_table(create=False) is False


async def test_table_missing_without_create(make_store: StoreFactory) -> None:
    store = make_store()
    with pytest.raises(TableMissing, match="init-table"):
        await store.ensure_table(create=False)
    with pytest.raises(TableMissing):
        await store.snapshot()


async def test_a_heartbeat_may_leave_the_state_and_refuses_a_dead_item(store: LeaseStore) -> None:
    """Protocol 2's heartbeat: the state written only when it changed (``write_state``), and
    refused once a death notice is on the item (``not_dead``)."""
    await store.register_worker(worker(counter=1))
    await store.heartbeat("w1", "s1", "draining", 1.0)
    kept = await store.heartbeat("w1", "s1", "running", 2.0, write_state=False, not_dead=True)
    assert (kept.counter, kept.state) == (3, "draining")
    assert await store.death_notice("w1", 3, "s1", "w2")
    with pytest.raises(DeclaredDead):
        await store.heartbeat("w1", "s1", "running", 3.0, not_dead=True)
    (stored,) = (await store.snapshot()).workers
    assert (stored.counter, stored.state) == (3, "dead")


async def test_register_and_heartbeat_increment_the_counter(store: LeaseStore) -> None:
    registered = await store.register_worker(worker(counter=5))
    assert registered.counter == 5
    assert (await store.heartbeat("w1", "s1", "running", 1700000001.0)).counter == 6
    beat = await store.heartbeat("w1", "s1", "draining", 1700000002.5)
    assert (beat.counter, beat.state, beat.session) == (7, "draining", "s1")
    (stored,) = (await store.snapshot()).workers
    assert (stored.counter, stored.state, stored.heartbeat_at) == (7, "draining", 1700000002.5)
    # The daemon's scans are eventually consistent (these servers are never stale).
    assert (await store.snapshot(consistent=False)).workers == (stored,)


async def test_heartbeat_with_another_session_is_worker_id_taken(store: LeaseStore) -> None:
    await store.register_worker(worker(session="s1"))
    await store.register_worker(worker(session="s2"))  # a second process with our id
    with pytest.raises(WorkerIdTaken):
        await store.heartbeat("w1", "s1", "running", 1.0)
    with pytest.raises(WorkerIdTaken):
        await store.heartbeat("nobody", "s1", "running", 1.0)
    assert (await store.heartbeat("w1", "s2", "running", 1.0)).counter > 0


async def test_reregister_keeps_the_counter_rising(store: LeaseStore) -> None:
    await store.register_worker(worker(session="s1"))
    last = (await store.heartbeat("w1", "s1", "running", 1.0)).counter
    again = await store.register_worker(worker(session="s2", counter=0))
    assert again.counter == last + 1
    (stored,) = (await store.snapshot()).workers
    assert (stored.session, stored.counter) == ("s2", last + 1)


async def test_ensure_shard_is_idempotent(store: LeaseStore) -> None:
    await store.ensure_shard("a")
    assert await stored_shard(store, "a") == ShardItem(id="a", owner="", epoch=0)
    await store.take("a", "w1", "", 0, 10.0)
    await store.checkpoint("a", "w1", 1, {"s": 3})
    await store.ensure_shard("a")
    shard = await stored_shard(store, "a")
    assert (shard.owner, shard.epoch, shard.checkpoint) == ("w1", 1, {"s": 3})


@atomic_backends
async def test_racing_takes_exactly_one_wins(make_store: StoreFactory) -> None:
    stores = {"wa": make_store(), "wb": make_store()}
    await stores["wa"].ensure_table(create=True)
    winners: dict[str, str] = {}
    for round_no in range(RACE_ROUNDS):
        shard_id = f"race-{round_no:02d}"
        await stores["wa"].ensure_shard(shard_id)
        outcomes = await race_take(stores, shard_id)
        won = [o for o in outcomes.values() if isinstance(o, ShardItem)]
        lost = [o for o in outcomes.values() if isinstance(o, LeaseConflict)]
        assert (len(won), len(lost)) == (1, 1), outcomes
        assert won[0].epoch == 1
        winners[shard_id] = won[0].owner
    shards = (await stores["wb"].snapshot()).shards
    assert {s.id: s.owner for s in shards} == winners
    assert {s.epoch for s in shards} == {1}


async def test_take_from_a_dead_owner_bumps_the_epoch(store: LeaseStore) -> None:
    await store.ensure_shard("a")
    await store.take("a", "dead", "", 0, 10.0)
    with pytest.raises(LeaseConflict):
        await store.take("a", "w1", "", 1, 20.0)  # not unowned
    with pytest.raises(LeaseConflict):
        await store.take("a", "w1", "dead", 0, 20.0)  # stale epoch
    taken = await store.take("a", "w1", "dead", 1, 20.0)
    assert (taken.owner, taken.epoch, taken.owner_since, taken.state) == ("w1", 2, 20.0, "running")
    assert await stored_shard(store, "a") == taken


async def test_take_of_a_missing_shard_conflicts(store: LeaseStore) -> None:
    with pytest.raises(LeaseConflict):
        await store.take("nope", "w1", "", 0, 1.0)


async def test_checkpoint_with_a_stale_epoch_leaves_the_stored_one(store: LeaseStore) -> None:
    await store.ensure_shard("a")
    await store.take("a", "w1", "", 0, 1.0)
    await store.checkpoint("a", "w1", 1, {"trades": 10, "book": 7})
    await store.take("a", "w2", "w1", 1, 2.0)
    with pytest.raises(LeaseConflict):
        await store.checkpoint("a", "w1", 1, {"trades": 99})
    with pytest.raises(LeaseConflict):
        await store.checkpoint("a", "w1", 2, {"trades": 99})  # right epoch, not the owner
    assert (await stored_shard(store, "a")).checkpoint == {"trades": 10, "book": 7}


async def test_stream_states_are_published_by_the_owner_and_cleared_by_a_take(
    store: LeaseStore,
) -> None:
    """Stale streams and reconnects by reason: what `status` shows of the owner's streams."""
    await store.ensure_shard("a")
    await store.take("a", "w1", "", 0, 1.0)
    counts = {"book": {"idle": 2, "closed": 1}, "trades": {"ping_timeout": 1}}
    await store.publish_streams("a", "w1", 1, ("book", "trades"), counts)
    stored = await stored_shard(store, "a")
    assert (stored.stale, stored.reconnects) == (("book", "trades"), counts)
    await store.publish_streams("a", "w1", 1, ("trades",), {"book": {"idle": 3}})
    stored = await stored_shard(store, "a")
    assert (stored.stale, stored.reconnects) == (("trades",), {"book": {"idle": 3}})
    with pytest.raises(LeaseConflict):
        await store.publish_streams("a", "w2", 1, (), {})  # not the owner
    with pytest.raises(LeaseConflict):
        await store.publish_streams("a", "w1", 2, (), {})  # not its epoch
    await store.publish_streams("a", "w1", 1, (), {})
    stored = await stored_shard(store, "a")
    assert (stored.stale, stored.reconnects) == ((), {})
    await store.publish_streams("a", "w1", 1, ("book",), counts)
    taken = await store.take("a", "w2", "w1", 1, 2.0)
    for shard in (taken, await stored_shard(store, "a")):  # the new owner's own, from none
        assert (shard.stale, shard.reconnects) == ((), {})


async def test_release_keeps_the_epoch_and_removes_the_owner(store: LeaseStore) -> None:
    await store.ensure_shard("a")
    await store.take("a", "w1", "", 0, 1.0)
    with pytest.raises(LeaseConflict):
        await store.release("a", "w2", 1, {})
    await store.release("a", "w1", 1, {"trades": 5})
    released = await stored_shard(store, "a")
    assert (released.owner, released.epoch, released.state) == ("", 1, "released")
    assert released.checkpoint == {"trades": 5}
    with pytest.raises(LeaseConflict):
        await store.release("a", "w1", 1, {})  # no longer the owner
    taken = await store.take("a", "w2", "", 1, 2.0)
    assert (taken.owner, taken.epoch, taken.checkpoint) == ("w2", 2, {"trades": 5})


async def test_snapshot_returns_workers_and_shards_sorted(store: LeaseStore) -> None:
    for worker_id in ("w2", "w1"):
        await store.register_worker(worker(worker_id))
    for shard_id in ("b", "a", "c"):
        await store.ensure_shard(shard_id)
    await store.take("b", "w1", "", 0, 1700000003.5)
    snapshot = await store.snapshot()
    assert snapshot.workers == (worker("w1"), worker("w2"))
    assert [s.id for s in snapshot.shards] == ["a", "b", "c"]
    assert snapshot.shards[1] == ShardItem(
        id="b", owner="w1", epoch=1, owner_since=1700000003.5, state="running"
    )


async def test_retire_marks_the_worker_stopped(store: LeaseStore) -> None:
    await store.register_worker(worker())
    with pytest.raises(WorkerIdTaken):
        await store.retire_worker("w1", "other-session", 5.0)
    await store.retire_worker("w1", "s1", 5.0)
    (stored,) = (await store.snapshot()).workers
    assert (stored.state, stored.heartbeat_at, stored.counter) == ("stopped", 5.0, 1)


async def test_mock_aws_sees_requests_from_worker_threads(table_name: str) -> None:
    """The moto-mock variant is only meaningful if trio's worker threads hit the mock."""
    with mock_aws():
        assert await DynamoLeaseStore(table_name, REGION).ensure_table(create=True)
        tables = boto3.client("dynamodb", region_name=REGION).list_tables()["TableNames"]
    assert table_name in tables


# --- the memory store's knobs for driver tests (not part of the contract) -------------------


async def test_memory_knobs_inject_failures(autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryLeaseStore(table_exists=True)
    other = store.peer()
    await store.register_worker(worker())
    store.fail_next("heartbeat", StoreUnavailable("once"))
    store.fail_next("heartbeat", LeaseConflict("twice"))
    with pytest.raises(StoreUnavailable, match="once"):
        await store.heartbeat("w1", "s1", "running", 1.0)
    with pytest.raises(LeaseConflict, match="twice"):
        await store.heartbeat("w1", "s1", "running", 1.0)
    assert (await store.heartbeat("w1", "s1", "running", 1.0)).counter == 1
    store.unavailable = True
    with pytest.raises(StoreUnavailable):
        await store.snapshot()
    await trio.sleep(60)  # virtual time: the store itself never waits on the clock
    assert (await other.snapshot()).workers[0].counter == 1  # a peer keeps its own knobs
    assert store.request_counts["heartbeat"] == 3
    with pytest.raises(ValueError, match="unknown operation"):
        store.fail_next("heartbeats", StoreUnavailable("typo"))


async def test_drain_request_marks_the_worker_and_undo_clears_it(store: LeaseStore) -> None:
    with pytest.raises(LeaseConflict):
        await store.request_drain("nobody", 5.0)
    await store.register_worker(worker())
    await store.request_drain("w1", 5.0)
    (stored,) = (await store.snapshot()).workers
    assert stored.drain_requested == 5.0
    await store.heartbeat("w1", "s1", "draining", 6.0)  # heartbeats keep the mark
    assert (await store.snapshot()).workers[0].drain_requested == 5.0
    await store.request_drain("w1", 7.0, undo=True)
    assert (await store.snapshot()).workers[0].drain_requested == 0.0


async def test_release_request_needs_an_owner_and_clears_on_release_and_take(
    store: LeaseStore,
) -> None:
    await store.ensure_shard("a")
    with pytest.raises(LeaseConflict):
        await store.request_release("a", 1.0)  # unowned: nobody to ask
    await store.take("a", "w1", "", 0, 2.0)
    await store.request_release("a", 3.0)
    assert (await stored_shard(store, "a")).release_requested == 3.0
    await store.release("a", "w1", 1, {"s": 9})
    released = await stored_shard(store, "a")
    assert (released.owner, released.release_requested, released.state) == ("", 0.0, "released")
    await store.take("a", "w2", "", 1, 4.0)
    await store.request_release("a", 5.0)
    await store.take("a", "w3", "w2", 2, 6.0)  # a dead owner's shard taken over
    assert (await stored_shard(store, "a")).release_requested == 0.0


async def test_release_names_a_successor_and_the_next_take_clears_it(store: LeaseStore) -> None:
    await store.ensure_shard("a")
    await store.take("a", "w1", "", 0, 1.0)
    await store.release("a", "w1", 1, {"s": 4}, successor="w2")
    assert (await stored_shard(store, "a")).successor == "w2"
    await store.take("a", "w2", "", 1, 2.0)
    assert (await stored_shard(store, "a")).successor == ""
    await store.release("a", "w2", 2, {"s": 5})  # no successor named: none stored
    assert (await stored_shard(store, "a")).successor == ""


async def test_read_workers_lists_every_worker_without_reading_shards(store: LeaseStore) -> None:
    await store.register_worker(worker("w2", session="b"))
    await store.register_worker(worker("w1", session="a"))
    await store.ensure_shard("a")
    await store.heartbeat("w1", "a", "running", 2.0)
    workers = await store.read_workers()
    assert [(w.id, w.session, w.counter) for w in workers] == [("w1", "a", 1), ("w2", "b", 0)]


async def test_worker_items_are_read_by_id_beside_the_membership_generation(
    store: LeaseStore,
) -> None:
    for worker_id in ("w3", "w1", "w2"):
        await store.register_worker(worker(worker_id, session=worker_id))
    await store.ensure_shard("a")
    assert await store.worker_ids() == ("w1", "w2", "w3")
    first = await store.read_worker_items(["w3", "w1", "nobody"])
    assert first.generation == 0  # nothing announced yet: no meta item
    assert [w.id for w in first.workers] == ["w1", "w3"]
    assert await store.announce("join") == 1
    assert await store.announce("state") == 2
    assert (await store.read_worker_items([])).generation == 2


async def test_a_death_notice_needs_the_counter_and_session_it_was_confirmed_on(
    store: LeaseStore,
) -> None:
    await store.register_worker(worker("w1", session="a"))
    await store.heartbeat("w1", "a", "running", 1.0)  # counter 1
    assert not await store.death_notice("w1", 0, "a", "w2")  # it beat since: alive
    assert not await store.death_notice("w1", 1, "b", "w2")  # another incarnation
    assert await store.death_notice("w1", 1, "a", "w2")
    assert not await store.death_notice("w1", 1, "a", "w3")  # its other watcher: too late
    (item,) = (await store.read_worker_items(["w1"])).workers
    assert (item.state, item.counter) == ("dead", 1)
    # A protocol-1 heartbeat of the declared worker (it was frozen) lands and says running:
    # it finds its own lease lapsed and drops everything, as before (docs/lease-protocol.md).
    await store.heartbeat("w1", "a", "running", 2.0)
    assert [w.state for w in await store.read_workers()] == ["running"]


async def test_a_death_marker_is_listed_among_the_vacancies_until_cleared(
    store: LeaseStore,
) -> None:
    await store.ensure_shard("a")
    await store.mark_death("w2", 7)
    listing = await store.vacancies()
    assert [(d.worker, d.generation) for d in listing.deaths] == [("w2", 7)]
    assert [v.id for v in listing.shards] == ["a"]  # not a shard, not a hand-off notice
    assert listing.requests == ()
    await store.clear_death_marker("w2")
    await store.clear_death_marker("w2")  # twice, or never written: not an error
    await store.clear_death_marker("w9")
    assert (await store.vacancies()).deaths == ()
    assert [w.id for w in (await store.snapshot()).workers] == []  # no worker item made


async def test_vacant_shards_lists_exactly_the_unowned_ones(store: LeaseStore) -> None:
    for shard_id in ("a", "b", "c"):
        await store.ensure_shard(shard_id)
    await store.take("a", "w1", "", 0, 1.0)
    await store.take("b", "w1", "", 0, 1.0)
    assert [(v.id, v.epoch) for v in (await store.vacancies()).shards] == [("c", 0)]
    await store.release("b", "w1", 1, {}, successor="w2")
    vacant = (await store.vacancies()).shards
    assert [(v.id, v.epoch, v.successor) for v in vacant] == [("b", 1, "w2"), ("c", 0, "")]


async def test_poke_raises_the_mailbox_of_an_existing_worker(store: LeaseStore) -> None:
    await store.register_worker(worker("w1"))
    await store.poke("w1")
    await store.poke("w1")
    assert [w.mailbox for w in await store.read_workers()] == [2]
    with pytest.raises(LeaseConflict):
        await store.poke("nobody")


async def test_request_release_returns_the_owner(store: LeaseStore) -> None:
    await store.ensure_shard("a")
    await store.take("a", "w7", "", 0, 1.0)
    assert await store.request_release("a", 2.0) == "w7"


async def test_registered_shard_lifecycle(store: LeaseStore) -> None:
    spec = '{"streams":[{"id":"x","url":"ws://h/x"}]}'
    await store.add_shard("r", spec, 1.0)
    with pytest.raises(LeaseConflict):
        await store.add_shard("r", spec, 1.0)  # exists
    item = await stored_shard(store, "r")
    assert (item.spec, item.owner, item.epoch, item.retired_at) == (spec, "", 0, 0.0)
    assert [v.id for v in (await store.vacancies()).shards] == ["r"]
    await store.take("r", "w1", "", 0, 2.0)
    retired = await store.retire_shard("r", 3.0)
    assert (retired.owner, retired.retired_at) == ("w1", 3.0)  # the owner stops it
    with pytest.raises(LeaseConflict):
        await store.add_shard("r", spec, 3.5)  # still owned: not re-registered under it
    await store.release("r", "w1", 1, {"x": 5})
    with pytest.raises(LeaseConflict):
        await store.take("r", "w2", "", 1, 4.0)  # retired: never taken
    await store.add_shard("r", spec, 5.0)  # registered again: epoch kept, checkpoint anew
    again = await stored_shard(store, "r")
    assert (again.epoch, again.checkpoint, again.retired_at) == (1, {}, 0.0)
    await store.take("r", "w2", "", 1, 6.0)
    await store.ensure_shard("toml")
    with pytest.raises(LeaseConflict):
        await store.retire_shard("toml", 7.0)  # defined in a config file, not registered
    with pytest.raises(LeaseConflict):
        await store.retire_shard("missing", 7.0)


async def test_mark_orphaned_needs_the_session_and_a_heartbeat_undoes_it(
    store: LeaseStore,
) -> None:
    await store.register_worker(worker("w1", session="a"))
    with pytest.raises(LeaseConflict):
        await store.mark_orphaned("w1", "other", 1.0)
    await store.mark_orphaned("w1", "a", 1.0)
    assert [w.state for w in await store.read_workers()] == ["orphaned"]
    await store.heartbeat("w1", "a", "running", 2.0)  # it was alive after all
    assert [w.state for w in await store.read_workers()] == ["running"]
    await store.retire_worker("w1", "a", 3.0)
    with pytest.raises(LeaseConflict):
        await store.mark_orphaned("w1", "a", 4.0)  # a clean exit stays "stopped"


@pytest.mark.parametrize("server", ["moto_server", "dynalite_server"])
async def test_a_table_from_an_earlier_version_gets_the_roster_index(
    server: str, request: pytest.FixtureRequest, table_name: str
) -> None:
    url = request.getfixturevalue(server).url
    client = boto3.client(
        "dynamodb",
        region_name=REGION,
        endpoint_url=url,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    client.create_table(
        TableName=table_name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    store = DynamoLeaseStore(table_name, REGION, url)
    with pytest.raises(TableMissing, match="init-table"):
        await store.ensure_table(create=False)
    if server == "dynalite_server":  # accepts UpdateTable's index creation, then ignores it
        with pytest.raises(LeaseStoreError, match="recreate the table"):
            await store.ensure_table(create=True)
        return
    assert await store.ensure_table(create=True) is False  # not created: the index was added
    await store.ensure_shard("a")
    assert [v.id for v in (await store.vacancies()).shards] == ["a"]


# --- warm standbys and make-before-break hand-offs (issue 14) ------------------------------


async def test_a_worker_advertises_its_features_and_standby_cap(store: LeaseStore) -> None:
    me = attrs.evolve(worker(), max_standbys=3, features=frozenset({"mbb"}))
    await store.register_worker(me)
    (stored,) = await store.read_workers()
    assert (stored.max_standbys, stored.features, stored.standbys) == (3, {"mbb"}, ())
    await store.register_worker(worker("old", session="o"))  # an older version: none
    assert [(w.id, w.features) for w in await store.read_workers()] == [
        ("old", frozenset()),
        ("w1", frozenset({"mbb"})),
    ]


async def test_a_heartbeat_writes_the_standbys_only_when_given(store: LeaseStore) -> None:
    await store.register_worker(worker())
    await store.heartbeat("w1", "s1", "running", 1.0, standbys=("b", "a"))
    assert (await store.read_workers())[0].standbys == ("a", "b")
    await store.heartbeat("w1", "s1", "running", 2.0)  # unchanged: not written, kept
    assert (await store.read_workers())[0].standbys == ("a", "b")
    await store.heartbeat("w1", "s1", "running", 3.0, standbys=())
    assert (await store.read_workers())[0].standbys == ()
    await store.heartbeat("w1", "s1", "running", 4.0, standbys=("c",))
    await store.retire_worker("w1", "s1", 5.0)  # a clean exit runs no standby any more
    (stored,) = (await store.snapshot()).workers
    assert (stored.state, stored.standbys) == ("stopped", ())


async def test_read_shard_is_the_item_or_none(store: LeaseStore) -> None:
    assert await store.read_shard("a") is None
    await store.ensure_shard("a")
    await store.take("a", "w1", "", 0, 1.0)
    await store.checkpoint("a", "w1", 1, {"x": 4})
    assert await store.read_shard("a") == await stored_shard(store, "a")
    assert (await store.read_shard("a")).checkpoint == {"x": 4}


async def test_a_hand_off_request_is_fenced_and_listed_for_the_successor(
    store: LeaseStore,
) -> None:
    await store.ensure_shard("a")
    await store.ensure_shard("b")
    await store.take("a", "w1", "", 0, 1.0)
    await store.take("b", "w1", "", 0, 1.0)
    with pytest.raises(LeaseConflict):
        await store.request_handoff("a", "w2", 1, "w3", 2.0)  # not the owner
    with pytest.raises(LeaseConflict):
        await store.request_handoff("a", "w1", 2, "w3", 2.0)  # not its epoch
    assert await store.handoff_requests() == ()
    await store.request_handoff("a", "w1", 1, "w2", 2.0)
    assert await store.handoff_requests() == (HandoffRequest("a", 1, "w2"),)
    item = await store.read_shard("a")
    assert (item.owner, item.successor, item.handoff_stage) == ("w1", "w2", "requested")
    assert [v.id for v in (await store.vacancies()).shards] == []  # owned: not vacant
    await store.checkpoint("a", "w1", 1, {"x": 9})  # the owner's child keeps writing
    assert (await store.read_shard("a")).handoff_stage == "requested"


async def test_a_request_lists_its_notice_among_the_vacancies_until_cleared(
    store: LeaseStore,
) -> None:
    """The successor's one hand-off poll query finds what is released to it and what it is
    asked for; a notice is never mistaken for a vacant shard."""
    await store.ensure_shard("a")
    await store.ensure_shard("b")
    await store.take("a", "w1", "", 0, 1.0)
    await store.request_handoff("a", "w1", 1, "w2", 2.0)
    assert await store.vacancies() == Vacancies(
        (VacantShard("b", 0),), (HandoffRequest("a", 1, "w2"),)
    )
    assert (await store.vacancies()).shards == (VacantShard("b", 0),)
    assert not await store.clear_handoff_notice("a", "w3", 1)  # not the one asked
    assert not await store.clear_handoff_notice("a", "w2", 0)  # not its epoch
    assert await store.clear_handoff_notice("a", "w2", 1)
    assert (await store.vacancies()).requests == ()
    assert not await store.clear_handoff_notice("a", "w2", 1)  # gone already
    assert await store.handoff_requests() == (HandoffRequest("a", 1, "w2"),)  # still asked
    # The owner's withdrawal takes the notice of its epoch with it.
    await store.request_handoff("a", "w1", 1, "w3", 3.0)
    assert (await store.vacancies()).requests == (HandoffRequest("a", 1, "w3"),)
    await store.cancel_handoff("a", "w1", 1)
    assert await store.vacancies() == Vacancies((VacantShard("b", 0),), ())
    snapshot = await store.snapshot()
    assert sorted(s.id for s in snapshot.shards) == ["a", "b"]  # a notice is not a shard


async def test_only_the_named_successor_answers_a_pending_request(store: LeaseStore) -> None:
    await store.ensure_shard("a")
    await store.take("a", "w1", "", 0, 1.0)
    with pytest.raises(LeaseConflict):
        await store.handoff_ready("a", 1, "w2", {"x": 5})  # nothing requested
    await store.request_handoff("a", "w1", 1, "w2", 2.0)
    with pytest.raises(LeaseConflict):
        await store.handoff_ready("a", 1, "w3", {"x": 5})  # not the one asked
    with pytest.raises(LeaseConflict):
        await store.handoff_ready("a", 0, "w2", {"x": 5})  # another epoch
    await store.handoff_ready("a", 1, "w2", {"x": 5, "y": 1})
    item = await store.read_shard("a")
    assert (item.handoff_stage, item.handoff_first) == ("ready", {"x": 5, "y": 1})
    with pytest.raises(LeaseConflict):
        await store.handoff_ready("a", 1, "w2", {"x": 6})  # answered once


async def test_a_cancelled_request_is_gone_and_cannot_be_answered(store: LeaseStore) -> None:
    await store.ensure_shard("a")
    await store.take("a", "w1", "", 0, 1.0)
    await store.request_handoff("a", "w1", 1, "w2", 2.0)
    with pytest.raises(LeaseConflict):
        await store.cancel_handoff("a", "w2", 1)  # only the owner withdraws it
    await store.cancel_handoff("a", "w1", 1)
    item = await store.read_shard("a")
    assert (item.owner, item.successor, item.handoff_stage) == ("w1", "", "")
    assert await store.handoff_requests() == ()
    with pytest.raises(LeaseConflict):
        await store.handoff_ready("a", 1, "w2", {"x": 5})


async def test_the_release_and_the_take_end_a_hand_off(store: LeaseStore) -> None:
    await store.ensure_shard("a")
    await store.take("a", "w1", "", 0, 1.0)
    await store.request_handoff("a", "w1", 1, "w2", 2.0)
    await store.handoff_ready("a", 1, "w2", {"x": 5})
    await store.release("a", "w1", 1, {"x": 4}, successor="w2")
    released = await store.read_shard("a")
    assert (released.owner, released.successor, released.checkpoint) == ("", "w2", {"x": 4})
    assert (released.handoff_stage, released.handoff_first) == ("", {})
    assert await store.handoff_requests() == ()
    assert (await store.vacancies()).shards == (VacantShard("a", 1, "w2"),)
    taken = await store.take("a", "w2", "", 1, 3.0)
    assert (taken.owner, taken.epoch, taken.checkpoint, taken.successor) == ("w2", 2, {"x": 4}, "")
    # A dead owner's pending request ends with the take of its shard.
    await store.request_handoff("a", "w2", 2, "w3", 4.0)
    await store.handoff_ready("a", 2, "w3", {"x": 7})
    taken = await store.take("a", "w4", "w2", 2, 5.0)
    assert (taken.successor, taken.handoff_stage, taken.handoff_first) == ("", "", {})
    assert await store.handoff_requests() == ()


async def test_hand_over_makes_the_ready_successor_owner_in_one_write(store: LeaseStore) -> None:
    await store.ensure_shard("a")
    await store.take("a", "w1", "", 0, 1.0)
    await store.publish_streams("a", "w1", 1, ("x",), {"x": {"eof": 2}})
    await store.request_handoff("a", "w1", 1, "w2", 2.0)
    await store.handoff_ready("a", 1, "w2", {"x": 5})
    written = await store.hand_over("a", "w1", 1, "w2", {"x": 4}, 3.0)
    item = await store.read_shard("a")
    assert written == item
    assert (item.owner, item.epoch, item.checkpoint, item.owner_since) == ("w2", 2, {"x": 4}, 3.0)
    assert (item.successor, item.handoff_stage, item.handoff_first) == ("", "", {})
    assert (item.state, item.stale, item.reconnects) == ("running", (), {})
    assert await store.handoff_requests() == ()
    assert (await store.vacancies()).shards == ()  # never vacant: nobody else may take it
    await store.checkpoint("a", "w2", 2, {"x": 6})  # the new owner's fence holds
    with pytest.raises(LeaseConflict):
        await store.checkpoint("a", "w1", 1, {"x": 7})  # the old owner's does not


async def test_hand_over_needs_the_owner_its_epoch_the_successor_and_ready(
    store: LeaseStore,
) -> None:
    await store.ensure_shard("a")
    await store.take("a", "w1", "", 0, 1.0)
    with pytest.raises(LeaseConflict):
        await store.hand_over("a", "w1", 1, "w2", {"x": 4}, 2.0)  # nothing requested
    await store.request_handoff("a", "w1", 1, "w2", 2.0)
    with pytest.raises(LeaseConflict):
        await store.hand_over("a", "w1", 1, "w2", {"x": 4}, 2.0)  # requested, not ready
    await store.handoff_ready("a", 1, "w2", {"x": 5})
    with pytest.raises(LeaseConflict):
        await store.hand_over("a", "w3", 1, "w2", {"x": 4}, 2.0)  # not the owner
    with pytest.raises(LeaseConflict):
        await store.hand_over("a", "w1", 2, "w2", {"x": 4}, 2.0)  # not its epoch
    with pytest.raises(LeaseConflict):
        await store.hand_over("a", "w1", 1, "w3", {"x": 4}, 2.0)  # not the one that answered
    item = await store.read_shard("a")
    assert (item.owner, item.epoch, item.handoff_stage) == ("w1", 1, "ready")
    await store.cancel_handoff("a", "w1", 1)
    with pytest.raises(LeaseConflict):
        await store.hand_over("a", "w1", 1, "w2", {"x": 4}, 2.0)  # withdrawn
    await store.release("a", "w1", 1, {"x": 4}, successor="w2")
    with pytest.raises(LeaseConflict):
        await store.hand_over("a", "w1", 1, "w2", {"x": 4}, 2.0)  # released already
    assert (await store.read_shard("a")).owner == ""


async def test_read_shards_reads_many_at_once_and_leaves_out_the_missing(store: LeaseStore) -> None:
    for shard_id in ("a", "b", "c"):
        await store.ensure_shard(shard_id)
    await store.take("b", "w1", "", 0, 1.0)
    await store.request_handoff("b", "w1", 1, "w2", 2.0)
    found = await store.read_shards(["b", "a", "missing", "b"])
    assert sorted(found) == ["a", "b"]
    assert found["b"] == await store.read_shard("b")
    assert (found["b"].owner, found["b"].handoff_stage) == ("w1", "requested")
    assert await store.read_shards([]) == {}
    many = [f"m{i:03d}" for i in range(130)]  # more than one BatchGetItem holds
    for shard_id in many:
        await store.ensure_shard(shard_id)
    assert sorted(await store.read_shards(many)) == many
