"""Protocol 2's requests on the memory store: their conditions and what each one is billed."""

import pytest
import trio

from supervisor.adapters.lease_store.base import LeaseConflict
from supervisor.adapters.lease_store.billing import Meter
from supervisor.adapters.lease_store.memory import MemoryLeaseStore
from supervisor.core.items import WorkerItem
from supervisor.core.partition_keys import bucket, start_spot


def fleet():
    return MemoryLeaseStore(table_exists=True).fleet(Meter())


def worker(wid, session="s1"):
    return WorkerItem(wid, session, 0, "running", 0.0, 0.0)


def run(fn):
    return trio.run(fn)


def test_a_join_and_a_state_change_move_the_generation_a_heartbeat_does_not():
    async def main():
        f = fleet()
        await f.join(worker("a"))
        assert await f.read_generation() == 1
        await f.heartbeat("a", "s1", "running", held=3)
        assert await f.read_generation() == 1
        await f.heartbeat("a", "s1", "draining", held=3)
        assert await f.read_generation() == 2
        (member,) = await f.read_members()
        assert (member.state, member.held, member.mgen) == ("draining", 3, 2)

    run(main)


def test_the_death_notice_needs_the_confirmed_counter_and_then_heartbeats_fail():
    async def main():
        f = fleet()
        await f.join(worker("a"))
        counter = await f.heartbeat("a", "s1", "running", held=0)
        assert not await f.death_notice("a", counter - 1, "s1")  # a heartbeat landed since
        assert not await f.death_notice("a", counter, "other")
        assert await f.death_notice("a", counter, "s1")
        assert not await f.death_notice("a", counter, "s1")  # only one notice wins
        with pytest.raises(LeaseConflict):
            await f.heartbeat("a", "s1", "running", held=0)
        (member,) = await f.read_members()
        assert member.state == "dead"

    run(main)


def test_routing_and_taking_a_dead_owners_shard_stay_conditional_on_owner_and_epoch():
    async def main():
        f = fleet()
        await f.ensure_shards(["s1"])
        taken = await f.take("s1", "a", "", 0)
        assert taken is not None and taken.epoch == 1
        assert await f.take("s1", "b", "", 0) is None  # stale observation
        assert not await f.route("s1", "a", 0, "b")  # wrong epoch
        assert await f.route("s1", "a", 1, "b")
        assert [i.id for i in await f.owned_by("a")] == ["s1"]  # still a's until the take
        assert [i.id for i in await f.addressed_to("b")] == ["s1"]
        new = await f.take("s1", "b", "a", 1)
        assert new is not None and (new.owner, new.epoch, new.successor) == ("b", 2, "")
        assert await f.addressed_to("b") == () and await f.owned_by("a") == ()

    run(main)


def test_a_shard_released_to_a_successor_is_listed_under_it_only():
    async def main():
        f = fleet()
        await f.ensure_shards(["s1"])
        await f.take("s1", "a", "", 0)
        assert await f.release("s1", "a", 1, successor="b")
        assert [i.id for i in await f.addressed_to("b")] == ["s1"]
        assert await f.vacant_in(bucket("s1")) == ()
        assert not await f.route("s1", "", 1, "c", dead="x")  # addressed to b, not to x
        assert await f.route("s1", "", 1, "c", dead="b")  # b died: re-routed
        assert [i.id for i in await f.addressed_to("c")] == ["s1"]
        assert await f.release("s1", "a", 1, successor="") is False  # not a's any more

    run(main)


def test_a_vacant_bucket_is_read_one_page_from_the_readers_spot_wrapping():
    async def main():
        f = fleet()
        ids = [f"s{i:05d}" for i in range(40_000)]  # ≈ 156 a bucket
        await f.ensure_shards(ids)
        number = bucket(ids[0])
        listed = [s for s in ids if bucket(s) == number]
        first = await f.vacant_in(number, start_spot("a", number, 0))
        other = await f.vacant_in(number, start_spot("b", number, 0))
        assert len(first) == len(other) == 100 and {i.id for i in first} <= set(listed)
        assert {i.id for i in first} != {i.id for i in other}
        assert len(await f.vacant_in(number, "g" * 16)) == 100  # past the end: wraps around

    run(main)


def test_each_request_is_billed_as_dynamodb_bills_it():
    async def main():
        meter = Meter()
        f = MemoryLeaseStore(table_exists=True).fleet(meter)
        await f.join(worker("a"))
        before = meter.read_units
        await f.read_generation()  # eventually consistent GetItem of a small item
        assert meter.read_units - before == 0.5
        await f.watch_read("a", consistent=True)
        assert meter.read_units - before == 1.5
        before = meter.read_units
        await f.read_members()  # 64 buckets, each at least one unit, eventually consistent
        assert meter.read_units - before == 32.0
        writes = meter.write_units
        await f.ensure_shards(["s1"])  # the put and its vacant-bucket index entry
        assert meter.write_units - writes == 2
        assert meter.requests["ensure_shards"] == 1

    run(main)


def test_a_standby_wanted_marker_is_billed_on_its_item_and_its_index_entries():
    async def main():
        meter = Meter()
        f = MemoryLeaseStore(table_exists=True).fleet(meter)
        meter.window()
        assert await f.want_standby("s1", "w1", 2, "w9")  # the put and its successor entry
        assert meter.window()[1] == {"want#s1": 1, "successor:want#w9": 1}
        assert await f.want_standby("s1", "w1", 2, "w8")  # renamed: the entry moves
        assert meter.window()[1] == {"want#s1": 1, "successor:want#w9": 1, "successor:want#w8": 1}
        assert not await f.want_standby("s1", "w0", 1, "")  # refused, billed all the same
        assert meter.window()[1] == {"want#s1": 1}
        assert [m.shard for m in await f.wanted_of("w8")] == ["s1"]  # one small query
        assert meter.window()[0] == {"successor:want#w8": 0.5}

    run(main)
