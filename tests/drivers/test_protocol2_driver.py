"""The daemon on protocol 2 (issue 16), on a virtual clock: no scan, no roster, each worker
reading what concerns it. The same fleets on real processes and both DynamoDB servers are in
tests/e2e/test_protocol2_e2e.py."""

from __future__ import annotations

import trio
from test_supervisor_driver import DURATION, HEARTBEAT, RECONCILE, Harness, doomed_run

from shard_worker.contract.pipe import StreamSpec
from supervisor.config.model import ShardConfig
from supervisor.config.shard_spec import encode_spec
from supervisor.core.routing import SWEEP_PERIOD
from supervisor.drivers.liveness import LATE_ROUTE_PASSES, META_CONSISTENT_EVERY

# Requests protocol 2 never makes: the full scan and every read of the `roster` index.
PROTOCOL_1_READS = ("snapshot", "vacancies", "worker_ids", "read_workers", "handoff_requests")


def flipped(shards: int) -> Harness:
    h = Harness(shards=shards)
    h.store.set_protocol(2)
    return h


async def settle(h: Harness, owners: set[str], timeout: float = 60.0) -> dict[str, int]:
    """Until every shard is owned, by exactly ``owners``; the count per owner."""
    with trio.fail_after(timeout):
        while True:
            table = await h.owners()
            counts: dict[str, int] = {}
            for owner, _ in table.values():
                counts[owner] = counts.get(owner, 0) + 1
            if set(counts) == owners:
                return counts
            await trio.sleep(0.25)


async def settled_pair(h: Harness, nursery: trio.Nursery) -> dict:
    """w1 and w2 running, every shard owned by them, and a lease more."""
    sups = {w: h.supervisor(w, h.store.peer()) for w in ("w1", "w2")}
    for sup in sups.values():
        await nursery.start(sup.run)
    await settle(h, {"w1", "w2"})
    await trio.sleep(DURATION)
    return sups


def no_two_writers(h: Harness) -> None:
    for shard in {w.shard for w in h.writes}:
        epochs = [w.epoch for w in sorted(h.writes, key=lambda w: w.at) if w.shard == shard]
        assert epochs == sorted(epochs), f"{shard}: epochs interleaved {epochs}"


async def test_a_fleet_balances_without_a_scan_or_the_roster(autojump_clock):
    h = flipped(shards=9)
    stores = {w: h.store.peer() for w in ("w1", "w2", "w3")}
    sups = {w: h.supervisor(w, store) for w, store in stores.items()}
    async with trio.open_nursery() as nursery:
        for sup in sups.values():
            await nursery.start(sup.run)
        counts = await settle(h, {"w1", "w2", "w3"})
        await trio.sleep(4 * DURATION)  # and it stays balanced
        counts = await settle(h, {"w1", "w2", "w3"})
        nursery.cancel_scope.cancel()
    assert sorted(counts.values()) == [3, 3, 3]
    assert all(sup.protocol == 2 for sup in sups.values())
    for worker, store in stores.items():
        used = {op: store.request_counts[op] for op in PROTOCOL_1_READS if store.request_counts[op]}
        assert used == {}, f"{worker} made protocol 1's reads: {used}"
    features = {w.id: w.features for w in await h.store.read_workers()}
    assert all("p2" in f for f in features.values())
    no_two_writers(h)


async def test_a_dead_workers_shards_are_routed_and_taken_at_the_lease(autojump_clock):
    h = flipped(shards=6)
    doomed_store, doomed = h.store.peer(), trio.CancelScope()
    sups = {w: h.supervisor(w, h.store.peer()) for w in ("w2", "w3")}
    async with trio.open_nursery() as nursery:
        await nursery.start(doomed_run, h.supervisor("w1", doomed_store), doomed)
        for sup in sups.values():
            await nursery.start(sup.run)
        await settle(h, {"w1", "w2", "w3"})
        await trio.sleep(DURATION)
        doomed_store.unavailable = True  # w1 dies: nothing it does lands any more
        doomed.cancel()
        died = trio.current_time()
        await settle(h, {"w2", "w3"})
        took = trio.current_time() - died
        nursery.cancel_scope.cancel()
    # Declared at the lease on the watcher's clock (its last sight of w1's counter, up to a
    # heartbeat before the death), routed, taken within a poll of the routing.
    assert DURATION - HEARTBEAT <= took <= DURATION + 1.0
    workers = {w.id: w for w in await h.store.read_workers()}
    assert workers["w1"].state == "dead"
    assert sum(sup.metrics.deaths_declared._value.get() for sup in sups.values()) == 1
    no_two_writers(h)


async def w3_died(h: Harness, nursery: trio.Nursery) -> None:
    """w1, w2 and w3 settled; then w3 dies, and its shards are routed to w1 and w2 and taken."""
    doomed_store, doomed = h.store.peer(), trio.CancelScope()
    await nursery.start(doomed_run, h.supervisor("w3", doomed_store), doomed)
    for worker in ("w1", "w2"):
        await nursery.start(h.supervisor(worker, h.store.peer()).run)
    await settle(h, {"w1", "w2", "w3"})
    await trio.sleep(DURATION)
    doomed_store.unavailable = True  # nothing w3 does lands any more
    doomed.cancel()
    await settle(h, {"w1", "w2"})


async def test_a_shard_released_to_a_worker_already_dead_is_routed_again(autojump_clock):
    """A drain names its successors from its last view: a SIGTERM a fraction of a second
    after a death notice (the newcomer check's e2e run caught one, 0.34 s after) releases a
    shard to the dead worker, whose mailbox only it reads. The watcher that declared the
    death routes the dead worker's shards again a lease later."""
    h = flipped(shards=6)
    async with trio.open_nursery() as nursery:
        await w3_died(h, nursery)
        shard, epoch = next((s, e) for s, (o, e) in (await h.owners()).items() if o == "w2")
        await h.store.peer().release(shard, "w2", epoch, {}, successor="w3")  # a stale view
        released = trio.current_time()
        await settle(h, {"w1", "w2"})
        took = trio.current_time() - released
        nursery.cancel_scope.cancel()
    assert took <= DURATION + RECONCILE
    no_two_writers(h)


async def test_the_sweeper_routes_what_was_released_to_a_dead_worker_later_still(
    autojump_clock,
):
    """The backstop, for a release to the dead worker after the late routings: the sweeper
    counted a shard addressed to it as routed (it names a successor) and left it."""
    h = flipped(shards=4)
    async with trio.open_nursery() as nursery:
        await w3_died(h, nursery)
        await trio.sleep((LATE_ROUTE_PASSES + 1) * DURATION)  # the late routings are over
        shard, epoch = next((s, e) for s, (o, e) in (await h.owners()).items() if o == "w2")
        await h.store.peer().release(shard, "w2", epoch, {}, successor="w3")
        await settle(h, {"w1", "w2"}, timeout=2 * SWEEP_PERIOD)
        nursery.cancel_scope.cancel()
    no_two_writers(h)


async def test_a_drain_hands_every_shard_to_the_others_by_name(autojump_clock):
    h = flipped(shards=6)
    sups = {w: h.supervisor(w, h.store.peer()) for w in ("w1", "w2", "w3")}
    async with trio.open_nursery() as nursery:
        for sup in sups.values():
            await nursery.start(sup.run)
        await settle(h, {"w1", "w2", "w3"})
        await trio.sleep(DURATION)
        sups["w3"].request_shutdown()
        started = trio.current_time()
        counts = await settle(h, {"w1", "w2"})
        moved = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert sorted(counts.values()) == [3, 3]
    assert moved < RECONCILE  # named successors take within a poll, not a round
    no_two_writers(h)


async def test_release_and_a_registered_shard_without_a_scan(autojump_clock):
    """`shardvisor release` (the mark and a poke) reaches the owner through its mailbox; a
    shard registered with `shards add` is counted in the targets and its definition read."""
    h = flipped(shards=4)
    async with trio.open_nursery() as nursery:
        sups = await settled_pair(h, nursery)
        owner = await h.store.request_release("s0", 1.0)
        await h.store.poke(owner)
        with trio.fail_after(30):
            while (await h.owners())["s0"][1] < 2:
                await trio.sleep(0.25)
        spec = encode_spec(ShardConfig("reg", (StreamSpec("reg", "ws://127.0.0.1:1/x"),)))
        await h.store.add_shard("reg", spec, 0.0)
        with trio.fail_after(30):
            while (await h.owners()).get("reg", ("", 0))[0] == "":
                await trio.sleep(0.25)
        assert any(w.shard == "reg" for w in h.writes)
        # A reload (SIGHUP) keeps what the owner learned of a registered shard: no scan
        # brings the definition back, so losing it would hand the shard off.
        await trio.sleep(2 * RECONCILE)  # rounds that plan on it as held, not as listed
        owner, epoch = (await h.owners())["reg"]
        await sups[owner].reload(h.config)
        await trio.sleep(3 * RECONCILE)
        assert (await h.owners())["reg"] == (owner, epoch)
        nursery.cancel_scope.cancel()
    no_two_writers(h)


async def test_a_fleet_flipped_while_running_switches_at_its_next_round(autojump_clock):
    h = Harness(shards=4)
    stores = {w: h.store.peer() for w in ("w1", "w2")}
    sups = {w: h.supervisor(w, store) for w, store in stores.items()}
    async with trio.open_nursery() as nursery:
        for sup in sups.values():
            await nursery.start(sup.run)
        await settle(h, {"w1", "w2"})
        assert {sup.protocol for sup in sups.values()} == {1}
        h.store.set_protocol(2)
        await trio.sleep(2 * RECONCILE + 0.5)
        assert {sup.protocol for sup in sups.values()} == {2}
        scans = {w: store.request_counts["snapshot"] for w, store in stores.items()}
        await trio.sleep(3 * DURATION)
        assert {w: store.request_counts["snapshot"] for w, store in stores.items()} == scans
        counts = await settle(h, {"w1", "w2"})
        h.store.set_protocol(1)  # the rollback: seen on a consistent read of the meta item
        await trio.sleep(META_CONSISTENT_EVERY * RECONCILE + 0.5)
        assert {sup.protocol for sup in sups.values()} == {1}
        await settle(h, {"w1", "w2"})
        nursery.cancel_scope.cancel()
    assert sorted(counts.values()) == [2, 2]
    no_two_writers(h)


async def test_a_worker_declared_dead_drops_everything_and_joins_again(autojump_clock):
    """Protocol 2's heartbeat is conditional on ``state <> dead``: a worker whose item got a
    death notice (its lease had lapsed, say frozen) stops every child and joins again."""
    h = flipped(shards=2)
    sup = h.supervisor("w1")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await settle(h, {"w1"})
        item = next(w for w in await h.store.read_workers() if w.id == "w1")
        assert await h.store.death_notice("w1", item.counter, item.session, "w9")
        await trio.sleep(HEARTBEAT + 0.1)
        states = [w.state for w in await h.store.read_workers()]
        assert states == ["running"]  # joined again
        assert all(c.returncode is not None for c in h.children[:2])  # every child stopped
        with trio.fail_after(30):  # and takes its shards back, at a new epoch
            while {epoch for _, epoch in (await h.owners()).values()} != {2}:
                await trio.sleep(0.25)
        assert {owner for owner, _ in (await h.owners()).values()} == {"w1"}
        nursery.cancel_scope.cancel()


async def test_shards_still_in_our_name_after_a_lapse_are_taken_back_at_once(autojump_clock):
    """Our lease lapsed (a freeze shorter than the peers' lease: nobody declared us dead or
    took anything) and every child stopped. The table still names us: the next round reads
    our own items and takes them back, not the 10-minute backstop."""
    h = flipped(shards=4)
    async with trio.open_nursery() as nursery:
        sups = await settled_pair(h, nursery)
        before = {s: e for s, (o, e) in (await h.owners()).items() if o == "w1"}
        sups["w1"]._lose_all("own lease lapsed (test)")
        lapsed = trio.current_time()
        with trio.fail_after(60):
            while True:
                table = await h.owners()
                back = all(table[s][1] > e for s, e in before.items())
                if back and all(s in sups[table[s][0]].runners for s in table):
                    break
                await trio.sleep(0.25)
        took = trio.current_time() - lapsed
        nursery.cancel_scope.cancel()
    assert took <= 3 * RECONCILE
    no_two_writers(h)
