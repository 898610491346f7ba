"""Liveness read without O(W²) (issue 16): each round reads our own item and the K peers the
watch ring gives us; every worker item only after an announced membership change.

A fleet on the in-memory store under trio's MockClock: how many items a round reads, a death
declared by its watchers and learnt by everyone else from the notice, a change nobody
announced (a worker of an older version) announced by its watchers, and a frozen worker that
comes back. The same rules run on real processes and both DynamoDB servers in the end-to-end
fleet tests (host deaths, the chaos test, the fence under freezes).
"""

from __future__ import annotations

from collections.abc import Collection

import trio
from test_supervisor_driver import DURATION, HEARTBEAT, RECONCILE, Harness, doomed_run

from supervisor.adapters.lease_store.memory import MemoryLeaseStore
from supervisor.config.model import LeaseConfig
from supervisor.core import watch_ring
from supervisor.core.items import WorkerItem, WorkerRead
from supervisor.core.peer_watch import PROBE_EVERY, Seen, Standing, watch_poll

WORKERS = ("w1", "w2", "w3", "w4", "w5")


class CountsItemsRead(MemoryLeaseStore):
    """A worker's store handle that records how many worker items each read asked for."""

    def __init__(self, shared: MemoryLeaseStore) -> None:
        super().__init__()
        self._table = shared._table
        self.asked: list[int] = []

    async def read_worker_items(self, worker_ids: Collection[str]) -> WorkerRead:
        self.asked.append(len(worker_ids))
        return await super().read_worker_items(worker_ids)


async def owners_of(h: Harness) -> set[str]:
    return {owner for owner, _ in (await h.owners()).values()}


async def test_a_round_reads_its_own_item_and_a_death_reaches_every_worker_within_a_poll(
    autojump_clock,
):
    h = Harness(shards=10)
    stores = {w: CountsItemsRead(h.store) for w in WORKERS}
    sups = {w: h.supervisor(w, stores[w]) for w in WORKERS}
    victim = "w3"
    doomed = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        for w in WORKERS:
            if w == victim:
                await nursery.start(doomed_run, sups[w], doomed)
            else:
                await nursery.start(sups[w].run)
        await trio.sleep(6 * DURATION)  # joined, announced, balanced
        for store in stores.values():
            store.asked.clear()
            store.request_counts.clear()
        await trio.sleep(20 * RECONCILE)
        # A steady round: the generation and our own item, never the whole fleet (a watched
        # peer is read strongly consistently only when its lease is about to fall due).
        for w, store in stores.items():
            assert store.asked and max(store.asked) == 1, (w, store.asked)
            # Between rounds: each watched peer once a heartbeat, when it should have landed,
            # and one more every PROBE_EVERY-th (a look a poll early), never once a poll.
            beats = 20 * RECONCILE / HEARTBEAT
            per_beat = store.request_counts["watch_read"] / (2 * beats)
            assert 1.0 <= per_beat <= 1 + 1 / PROBE_EVERY + 0.1, (w, per_beat)
        held = {s for s, (o, _) in (await h.owners()).items() if o == victim}
        assert held, "the victim owns shards to lose"
        last_heartbeat = (
            sups[victim].lease.valid_until - DURATION + sups[victim].lease.safety_margin
        )
        stores[victim].unavailable = True  # a dead host: nothing it sends lands
        doomed.cancel()
        with trio.fail_after(4 * DURATION):
            while victim in await owners_of(h):
                await trio.sleep(0.01)
        took = trio.current_time() - last_heartbeat
        # Its watchers declared it a lease after its last heartbeat (plus a watch poll); the
        # others saw the death marker at their next hand-off poll, not at their next round.
        poll = LeaseConfig().handoff_poll_interval
        assert DURATION <= took <= DURATION + watch_poll(HEARTBEAT) + poll + 0.1
        item = (await h.store.read_worker_items([victim])).workers[0]
        assert item.state == "dead"
        notices = [
            sups[w].metrics.registry.get_sample_value("shardvisor_peers_declared_dead_total")
            for w in WORKERS
            if w != victim
        ]
        assert sum(notices) == 1  # one watcher's notice landed; the other's condition failed
        survivors = [w for w in WORKERS if w != victim]
        watchers = set(watch_ring.watchers_of(victim, WORKERS))
        assert watchers < set(survivors)  # two of four watch it; all four must know
        await trio.sleep(RECONCILE)
        for w in survivors:
            assert sups[w].tracker.is_dead(victim, trio.current_time()), w
        new_owners = {o for s, (o, _) in (await h.owners()).items() if s in held}
        assert new_owners <= set(survivors)
        nursery.cancel_scope.cancel()


async def test_a_change_nobody_announced_is_announced_by_its_watchers(autojump_clock):
    """A worker of an older version announces nothing: its watchers see it drain in their
    round's read, raise the generation, and every worker re-reads every item."""
    h = Harness(shards=4)
    sups = {w: h.supervisor(w, h.store.peer()) for w in ("w1", "w2", "w3", "w4")}
    older = h.store.peer()
    await older.register_worker(WorkerItem("w0", "old-session", 0, "running", 0.0, 0.0))
    state = ["running"]

    async def heartbeats_of_an_older_version() -> None:
        while True:
            await older.heartbeat("w0", "old-session", state[0], 0.0)
            await trio.sleep(HEARTBEAT)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeats_of_an_older_version)
        for sup in sups.values():
            await nursery.start(sup.run)
        await trio.sleep(3 * DURATION)
        before = (await h.store.read_worker_items(())).generation
        state[0] = "draining"
        # Its next heartbeat, a watch read, the watcher's next round (it announces), everyone's
        # next round (they re-read every item).
        await trio.sleep(HEARTBEAT + 3 * RECONCILE)
        assert (await h.store.read_worker_items(())).generation > before
        for w, sup in sups.items():
            assert sup.liveness.roster is not None
            seen = {worker.id: worker.state for worker in sup.liveness.roster.workers}
            assert seen["w0"] == "draining", w
        nursery.cancel_scope.cancel()


async def test_a_frozen_worker_declared_dead_comes_back_and_is_counted_again(autojump_clock):
    h = Harness(shards=4)
    w1_store = h.store.peer()
    w1, w2 = h.supervisor("w1", w1_store), h.supervisor("w2", h.store.peer())
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await nursery.start(w2.run)
        await trio.sleep(4 * DURATION)
        assert await owners_of(h) == {"w1", "w2"}
        w1_store.unavailable = True  # frozen, as far as the table can tell
        await trio.sleep(DURATION + 2 * RECONCILE)
        assert await owners_of(h) == {"w2"}
        assert (await h.store.read_worker_items(["w1"])).workers[0].state == "dead"
        w1_store.unavailable = False  # back: its next heartbeat finds its lease lapsed
        await trio.sleep(4 * DURATION)
        now = trio.current_time()
        assert w2.tracker.is_live_member("w1", now)
        assert await owners_of(h) == {"w1", "w2"}  # balanced again
        nursery.cancel_scope.cancel()


async def test_a_watcher_sees_each_heartbeat_within_a_poll_and_acts_a_lease_after_the_last(
    autojump_clock,
):
    """Between rounds a watcher reads its peers about when their heartbeats land (issue 16,
    detection at the lease): the victim's shards move a lease after its last heartbeat plus
    at most one watch poll (a quarter heartbeat), not up to a round later."""
    h = Harness(shards=4)
    w1_store, doomed = h.store.peer(), trio.CancelScope()
    w1, w2 = h.supervisor("w1", w1_store), h.supervisor("w2", h.store.peer())
    async with trio.open_nursery() as nursery:
        await nursery.start(doomed_run, w1, doomed)
        await trio.sleep(3.0)
        await nursery.start(w2.run)
        await trio.sleep(2 * DURATION + RECONCILE * 0.3)  # off the rounds' rhythm
        assert await owners_of(h) == {"w1", "w2"}
        last_heartbeat = w1.lease.valid_until - DURATION + w1.lease.safety_margin
        w1_store.unavailable = True
        doomed.cancel()
        with trio.fail_after(3 * DURATION):
            while "w1" in await owners_of(h):
                await trio.sleep(0.001)
        taken = trio.current_time()
        nursery.cancel_scope.cancel()
    assert DURATION <= taken - last_heartbeat <= DURATION + watch_poll(HEARTBEAT) + 0.1


async def test_an_announced_change_is_not_announced_again_by_its_watchers(autojump_clock):
    """A worker that drains announces it itself; its watchers, whose reads see the new state
    before their next round, do not raise the generation a second time (each raise costs
    every worker a read of every item)."""
    h = Harness(shards=4)
    stores = {w: h.store.peer() for w in ("w1", "w2", "w3", "w4")}
    async with trio.open_nursery() as nursery:
        for w, store in stores.items():
            await nursery.start(h.supervisor(w, store).run)
        await trio.sleep(3 * DURATION)
        for store in stores.values():
            store.request_counts.clear()
        await h.store.request_drain("w1", 1.0)
        await trio.sleep(HEARTBEAT + 4 * RECONCILE)
        items = {w.id: w.state for w in (await h.store.read_worker_items(list(stores))).workers}
        assert items["w1"] == "draining"
        assert [s.request_counts["announce"] for s in stores.values()] == [1, 0, 0, 0]
        nursery.cancel_scope.cancel()


class FrozenWatchReads(MemoryLeaseStore):
    """A store handle whose eventually consistent watch reads keep returning one old value
    while ``frozen`` is set (a replica stuck behind), like a lagging DynamoDB replica."""

    def __init__(self, shared: MemoryLeaseStore) -> None:
        super().__init__()
        self._table = shared._table
        self.frozen: Seen | None = None

    async def watch_read(self, worker_id: str) -> Seen | None:
        seen = await super().watch_read(worker_id)
        return self.frozen if self.frozen is not None else seen


async def test_a_peer_the_watch_reads_saw_stand_still_is_confirmed_alive_and_watched_again(
    autojump_clock,
):
    """Stale watch reads can make a live peer look still for a lease: the round's strongly
    consistent read then finds it alive (no death is declared on those reads), and its clock
    starts over, so the watch reads go on rather than leave it to the rounds."""
    h = Harness(shards=2)
    w2_store = FrozenWatchReads(h.store)
    w1, w2 = h.supervisor("w1", h.store.peer()), h.supervisor("w2", w2_store)
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await nursery.start(w2.run)
        await trio.sleep(3 * DURATION)
        w2_store.frozen = await h.store.watch_read("w1")
        await trio.sleep(DURATION + 2 * RECONCILE)  # w2's watch reads see nothing move
        assert not w2.tracker.is_dead("w1", trio.current_time())
        assert (await h.store.read_worker_items(["w1"])).workers[0].state == "running"
        w2_store.frozen = None
        reads = w2_store.request_counts["watch_read"]
        await trio.sleep(4 * HEARTBEAT)
        clock = w2.liveness.book.clocks["w1"]
        assert clock.standing(trio.current_time()) is Standing.ALIVE
        assert w2_store.request_counts["watch_read"] - reads >= 4  # read on its rhythm again
        nursery.cancel_scope.cancel()


class LogsRequests(MemoryLeaseStore):
    """A worker's store handle that records the order of its requests."""

    def __init__(self, shared: MemoryLeaseStore) -> None:
        super().__init__()
        self._table = shared._table
        self.log: list[str] = []

    async def _enter(self, op: str, *, needs_table: bool = True):
        self.log.append(op)
        return await super()._enter(op, needs_table=needs_table)


async def test_a_death_is_taken_over_before_the_table_is_scanned(autojump_clock):
    """The round that finds a peer dead plans on the last scan (its takes are conditional on
    owner and epoch), so the takes do not wait for a Scan; the next round scans."""
    h = Harness(shards=6)
    stores = {w: LogsRequests(h.store) for w in ("w1", "w2", "w3")}
    sups = {w: h.supervisor(w, store) for w, store in stores.items()}
    doomed = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        await nursery.start(doomed_run, sups["w3"], doomed)
        for w in ("w1", "w2"):
            await nursery.start(sups[w].run)
        await trio.sleep(4 * DURATION)
        assert await owners_of(h) == {"w1", "w2", "w3"}
        stores["w3"].unavailable = True
        doomed.cancel()
        for store in stores.values():
            store.log.clear()
        with trio.fail_after(3 * DURATION):
            while "w3" in await owners_of(h):
                await trio.sleep(0.01)
        await trio.sleep(2 * RECONCILE)
        nursery.cancel_scope.cancel()
    takers = [w for w in ("w1", "w2") if "take" in stores[w].log]
    assert takers
    for w in takers:
        log = stores[w].log
        first_take = log.index("take")
        assert "snapshot" not in log[:first_take], (w, log[:first_take])
        assert "snapshot" in log[first_take:], w  # the deferred scan came after
