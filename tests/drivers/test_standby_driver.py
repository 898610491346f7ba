"""Make-before-break hand-offs and warm standbys on a virtual clock: in-memory store, fake
children on a modelled live feed (``helpers.fake_child``), exact times.

The same paths run with real processes, real servers and the live-only feed in
tests/e2e/test_e2e_standby.py.
"""

from __future__ import annotations

from collections import Counter

import attrs
import pytest
import trio
import trio.testing
from helpers.fake_child import FakeChild, Write

from shard_worker.contract import pipe as p
from shard_worker.contract.pipe import StreamSpec
from shard_worker.contract.table import FEATURE_MBB
from supervisor.adapters.lease_store.base import StoreUnavailable
from supervisor.adapters.lease_store.memory import MemoryLeaseStore
from supervisor.config.model import (
    Config,
    LeaseConfig,
    ShardConfig,
    StandbyConfig,
    SupervisorConfig,
)
from supervisor.core.items import HandoffRequest, ShardItem
from supervisor.core.make_before_break import release_wait
from supervisor.core.runner_state import RunnerState
from supervisor.core.standby import covers
from supervisor.drivers.daemon import Supervisor
from supervisor.drivers.handoff import Answer

DURATION, HEARTBEAT, RECONCILE = 10.0, 2.0, 2.0
RATE = 100  # messages per second on each modelled feed


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


def feed() -> int:
    return int(trio.current_time() * RATE)


def config(shards: int = 1, *, standbys: int = 0, sequenced: bool = True, **sup) -> Config:
    sequence = "seq" if sequenced else ""
    return Config(
        lease=LeaseConfig(DURATION, HEARTBEAT, RECONCILE),
        supervisor=SupervisorConfig(
            **{"shutdown_timeout": 20.0, "checkpoint_interval": 1.0, **sup}
        ),
        standby=StandbyConfig(count=standbys, buffer=30.0),
        shards=tuple(
            ShardConfig(f"s{i}", (StreamSpec(f"s{i}", "ws://127.0.0.1:1/x", sequence=sequence),))
            for i in range(shards)
        ),
    )


@attrs.define
class Harness:
    config: Config
    store: MemoryLeaseStore = attrs.field(factory=lambda: MemoryLeaseStore(table_exists=True))
    writes: list[Write] = attrs.field(factory=list)
    children: dict[str, list[FakeChild]] = attrs.field(factory=dict)  # by worker
    never_ready: set[str] = attrs.field(factory=set)  # workers whose standbys never get ready
    standby_crashes: Counter = attrs.field(factory=Counter)  # (worker, shard) -> crashes left
    linger: float = 0.0  # every child's exit after its last message (FakeChild.linger)

    def supervisor(self, worker: str, store: MemoryLeaseStore | None = None) -> Supervisor:
        async def spawn(shard_id: str):
            def crash() -> bool:  # a budget of standby crashes per worker and shard
                if self.standby_crashes[worker, shard_id] <= 0:
                    return False
                self.standby_crashes[worker, shard_id] -= 1
                return True

            child = FakeChild(
                shard_id,
                self.writes,
                feed=feed,
                crash_as_standby=crash,
                never_ready=worker in self.never_ready,
                linger=self.linger,
            )
            self.children.setdefault(worker, []).append(child)
            return child, []

        return Supervisor(
            self.config, worker, store or self.store, spawn=spawn, now=trio.current_time
        )

    async def owners(self) -> dict[str, tuple[str, int]]:
        return {s.id: (s.owner, s.epoch) for s in (await self.store.snapshot()).shards}

    def sent(self, worker: str, kind: type) -> list[p.Message]:
        return [m for c in self.children.get(worker, []) for m in c.received if isinstance(m, kind)]


def continuity(writes: list[Write], shard: str) -> tuple[list[int], list[int]]:
    """(sequence numbers missing, written twice) among the writes of ``shard``, by epoch order."""
    seen: Counter[int] = Counter()
    for w in writes:
        if w.shard == shard:
            seen.update(range(w.first, w.seq + 1))
    top = max(seen)
    start = min(seen)
    missing = [n for n in range(start, top + 1) if n not in seen]
    twice = sorted(n for n, c in seen.items() if c > 1)
    return missing, twice


def metric(sup: Supervisor, name: str, **labels: str) -> float:
    value = sup.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def wait_for(condition, timeout: float = 60.0, step: float = 0.01) -> None:
    with trio.fail_after(timeout):
        while not await condition():
            await trio.sleep(step)


async def test_sigterm_hands_off_make_before_break_without_loss_or_duplicates(autojump_clock):
    h = Harness(config(shards=2))
    async with trio.open_nursery() as nursery:
        w1, w2 = await owner_then_peer(h, nursery)
        assert set((await h.owners()).values()) == {("w1", 1)}
        asked = trio.current_time()
        w1.request_shutdown()
        await wait_for(lambda: _owned_by(h, "w2", epoch=2))
        took = trio.current_time() - asked
        await trio.sleep(3.0)
        nursery.cancel_scope.cancel()
    # The successor's standby connected first: the hand-off took its connect and a few polls.
    assert took < 1.0
    stops = h.sent("w1", p.Stop)
    assert [bool(s.min_cut) for s in stops] == [True, True]  # every child stopped at a cut
    promotes = h.sent("w2", p.Promote)
    assert sorted(m.epoch for m in promotes) == [2, 2]
    assert [len(c.received) for c in h.children["w2"]] and len(h.children["w2"]) == 2  # no spawn
    for shard in ("s0", "s1"):
        assert continuity(h.writes, shard) == ([], []), shard
        epochs = [w.epoch for w in h.writes if w.shard == shard]
        assert epochs == sorted(epochs)  # never an older writer after a newer one
    assert metric(w1, "shardvisor_handoffs_total", mode="make_before_break") == 2
    assert metric(w1, "shardvisor_handoff_fallbacks_total", reason="timeout") == 0
    assert metric(w2, "shardvisor_promotions_total", kind="handoff") == 2
    assert all(not c.gaps for c in h.children["w2"])


async def test_the_owner_hands_the_lease_over_and_the_successor_adopts_it_without_a_take(
    autojump_clock,
):
    """At the cut the owner makes the successor owner (epoch + 1) in one write; the successor
    sees itself owner and promotes its standby: no release, no take, nothing lost."""
    h = Harness(config(shards=2))
    w2_store = h.store.peer()
    async with trio.open_nursery() as nursery:
        w1, w2 = await owner_then_peer(h, nursery, w2_store)
        w1.request_shutdown()
        await wait_for(lambda: _owned_by(h, "w2", epoch=2))
        await trio.sleep(3.0)
        assert sorted(w2.runners) == ["s0", "s1"]
        nursery.cancel_scope.cancel()
    assert w2_store.request_counts["take"] == 0
    assert h.store.request_counts["hand_over"] == 2 and h.store.request_counts["release"] == 0
    assert metric(w2, "shardvisor_epoch_changes_total", source="handover") == 2
    assert metric(w2, "shardvisor_promotions_total", kind="handoff") == 2
    assert sorted(m.epoch for m in h.sent("w2", p.Promote)) == [2, 2]
    for shard in ("s0", "s1"):
        assert continuity(h.writes, shard) == ([], []), shard


async def test_a_successor_without_the_handover_feature_gets_a_release_and_takes(
    autojump_clock,
):
    """Rolling deploys mix versions: an older successor never adopts, so it gets the
    release it knows, and takes."""
    h = Harness(config(shards=1))
    w2_store = h.store.peer()
    async with trio.open_nursery() as nursery:
        w1, w2 = await owner_then_peer(h, nursery, w2_store, frozenset({FEATURE_MBB}))
        w1.request_shutdown()
        await wait_for(lambda: _owned_by(h, "w2", epoch=2))
        nursery.cancel_scope.cancel()
    assert h.store.request_counts["hand_over"] == 0 and h.store.request_counts["release"] == 1
    assert w2_store.request_counts["take"] == 1
    assert metric(w2, "shardvisor_epoch_changes_total", source="unowned") == 1
    assert metric(w1, "shardvisor_handoffs_total", mode="make_before_break") == 1
    assert continuity(h.writes, "s0") == ([], [])


@pytest.mark.parametrize("older_owner", [False, True])
async def test_a_request_is_found_by_its_notice_and_an_older_owners_by_the_roster(
    autojump_clock, older_owner
):
    """This version's successor finds requests among the vacancies its poll reads anyway;
    while a peer of an older version (no notices) may ask, it reads the ``handoff`` roster
    too, so a rolling deploy from that version still hands off make-before-break."""
    h = Harness(config(shards=1))
    w2_store = h.store.peer()
    request = h.store.request_handoff

    async def without_notice(shard, me, epoch, to, wall_now):
        await request(shard, me, epoch, to, wall_now)
        del h.store._table.notices[shard]

    async with trio.open_nursery() as nursery:
        w1, _w2 = await owner_then_peer(h, nursery, w2_store)
        if older_owner:
            workers = h.store._table.workers
            workers["w1"] = attrs.evolve(workers["w1"], features=frozenset({FEATURE_MBB}))
            h.store.request_handoff = without_notice  # type: ignore[method-assign]
            await trio.sleep(RECONCILE)  # w2 reads the worker items again
        w1.request_shutdown()
        await wait_for(lambda: _owned_by(h, "w2", epoch=2))
        await wait_for(lambda: _no_notices(h))  # cleared once answered
        nursery.cancel_scope.cancel()
    assert metric(w1, "shardvisor_handoffs_total", mode="make_before_break") == 1
    assert continuity(h.writes, "s0") == ([], [])
    assert (w2_store.request_counts["handoff_requests"] > 0) is older_owner


async def _no_notices(h: Harness) -> bool:
    return not (await h.store.vacancies()).requests


async def test_a_shard_handed_over_to_a_successor_that_stops_taking_is_released_at_once(
    autojump_clock,
):
    """The successor answered, then got its SIGTERM before the hand-over landed: it must not
    sit on a shard it will never run until its lease lapses. It releases it, fenced."""
    h = Harness(config(shards=1))
    w2_store = h.store.peer()
    async with trio.open_nursery() as nursery:
        w1, w2 = await owner_then_peer(h, nursery, w2_store)
        after_ready(w2_store, w2.request_shutdown)
        w1.request_shutdown()
        await wait_for(lambda: _released_at(h, "s0", 2))
        nursery.cancel_scope.cancel()
    assert h.store.request_counts["hand_over"] == 1
    assert metric(w2, "shardvisor_epoch_changes_total", source="handover") == 0
    assert h.sent("w2", p.Promote) == []


async def test_a_hand_over_the_successor_did_not_see_is_not_left_without_a_child(
    autojump_clock,
):
    """The successor's polls fail throughout the hand-off's wait, so it never sees the shard
    handed over: by the end of that wait, or a round after it, it runs it (adopted by the
    wait's last read, or retaken by a round that read the whole table)."""
    h = Harness(config(shards=1))
    w2_store = h.store.peer()
    async with trio.open_nursery() as nursery:
        w1, w2 = await owner_then_peer(h, nursery, w2_store)

        def fail_polls() -> None:
            for _ in range(10_000):  # every poll of the wait (each 20 ms)
                w2_store.fail_next("read_shards", StoreUnavailable("injected"))

        after_ready(w2_store, fail_polls)
        w1.request_shutdown()
        await wait_for(lambda: _owned_by(h, "w2", epoch=2))
        handed = trio.current_time()
        assert w2.runners == {}  # not seen
        await wait_for(lambda: _runs(w2, "s0"))
        adopted = trio.current_time() - handed
        await trio.sleep(RECONCILE)
        assert (await h.owners())["s0"][0] == "w2" and "s0" in w2.runners
        nursery.cancel_scope.cancel()
    wait = release_wait(max(0.25, h.config.supervisor.shutdown_timeout / 2))
    assert adopted <= wait + RECONCILE + 1.0


@pytest.mark.parametrize("last_read_fails", [False, True])
async def test_an_answer_whose_polls_failed_looks_once_more_before_it_gives_up(
    autojump_clock, last_read_fails
):
    store = MemoryLeaseStore(table_exists=True)
    await store.ensure_shard("s0")
    await store.take("s0", "w1", "", 0, 1.0)
    await store.request_handoff("s0", "w1", 1, "w2", 2.0)
    adopted: list[tuple[ShardItem, str]] = []

    async def failing_read(shard: str) -> ShardItem | None:
        await trio.sleep(0.02)
        raise StoreUnavailable("injected")

    async def ready(item: ShardItem) -> dict[str, int]:
        return {"s0": 5}

    async def take(shard: str, epoch: int) -> None:
        raise AssertionError("handed over, never released")

    async def adopt(item: ShardItem, previous: str) -> bool:
        adopted.append((item, previous))
        return True

    answer = Answer(store, failing_read, "w2", HandoffRequest("s0", 1, "w2"), 5.0, 3.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer.run, ready, take, adopt, lambda: True)
        await wait_for(lambda: _stage_is(store, "s0", "ready"), step=0.001)
        await store.hand_over("s0", "w1", 1, "w2", {"s0": 4}, 3.0)
        if last_read_fails:
            store.fail_next("read_shard", StoreUnavailable("injected"))
    if last_read_fails:
        assert adopted == []  # the supervisor's next full scan finds it (the test above)
    else:
        [(item, previous)] = adopted
        assert (item.owner, item.epoch, item.checkpoint, previous) == ("w2", 2, {"s0": 4}, "w1")


async def test_the_owner_releases_on_its_childs_stopped_not_on_its_exit(autojump_clock):
    """A child reports ``stopped`` after its last write and its sink's close; its exit
    (interpreter teardown) may take a while on a busy host: the successor's take, and so the
    writer gap, does not wait for it."""
    h = Harness(config(shards=1), linger=5.0)
    w1, took = await sigterm_w1(h)
    assert took < 1.0
    assert continuity(h.writes, "s0") == ([], [])
    assert metric(w1, "shardvisor_handoffs_total", mode="make_before_break") == 1


async def owner_then_peer(
    h: Harness,
    nursery: trio.Nursery,
    w2_store: MemoryLeaseStore | None = None,
    w2_features: frozenset[str] | None = None,
) -> tuple[Supervisor, Supervisor]:
    """w1 takes every shard, then w2 joins (the successor of w1's hand-offs); ``w2_features``
    replaces what w2 advertises (an older version's)."""
    w1, w2 = h.supervisor("w1"), h.supervisor("w2", w2_store or h.store.peer())
    await nursery.start(w1.run)
    await trio.sleep(5.0)
    await nursery.start(w2.run)
    if w2_features is not None:
        workers = h.store._table.workers
        workers["w2"] = attrs.evolve(workers["w2"], features=w2_features)
    await trio.sleep(3.0)
    return w1, w2


async def sigterm_w1(h: Harness) -> tuple[Supervisor, float]:
    """``owner_then_peer``, then w1's SIGTERM: w1, and how long until w2 owned every shard."""
    async with trio.open_nursery() as nursery:
        w1, _w2 = await owner_then_peer(h, nursery)
        asked = trio.current_time()
        w1.request_shutdown()
        await wait_for(lambda: _owned_by(h, "w2", epoch=2))
        took = trio.current_time() - asked
        nursery.cancel_scope.cancel()
    return w1, took


async def _owned_by(h: Harness, worker: str, epoch: int | None = None) -> bool:
    owners = await h.owners()
    return all(o == worker and (epoch is None or e == epoch) for o, e in owners.values())


async def test_a_successor_that_never_gets_ready_falls_back_within_the_timeout(autojump_clock):
    h = Harness(config(shards=1))
    h.never_ready.add("w2")
    w1, took = await sigterm_w1(h)
    timeout = h.config.lease.handoff_timeout
    assert timeout <= took < timeout + 1.0  # waited the timeout, then broke before making
    assert [s.min_cut for s in h.sent("w1", p.Stop)] == [{}]
    assert metric(w1, "shardvisor_handoff_fallbacks_total", reason="timeout") == 1
    assert metric(w1, "shardvisor_handoffs_total", mode="break_before_make") == 1
    assert await h.store.handoff_requests() == ()  # withdrawn


async def test_a_successor_that_stops_taking_meanwhile_is_not_waited_for(autojump_clock):
    """An operator's release names w2; w2 is shut down before its standby gets ready. w1 sees
    it draining at its next round and falls back then (not after handoff_timeout), releases
    to anyone rather than to w2, and, with no live peer left, takes the shard back at once
    instead of leaving it unowned while it cools down."""
    h = Harness(config(shards=1))
    h.never_ready.add("w2")
    async with trio.open_nursery() as nursery:
        w1, w2 = await owner_then_peer(h, nursery)
        await h.store.request_release("s0", 1.0)
        await wait_for(lambda: _waiting_for(w1, "w2"))
        asked = trio.current_time()
        w2.request_shutdown()
        await wait_for(lambda: _owned_by(h, "w1", epoch=2))
        back = trio.current_time() - asked
        nursery.cancel_scope.cancel()
    assert back < h.config.lease.handoff_timeout
    assert metric(w1, "shardvisor_handoff_fallbacks_total", reason="successor_left") == 1
    assert metric(w1, "shardvisor_handoff_fallbacks_total", reason="timeout") == 0
    assert await h.store.handoff_requests() == ()  # withdrawn


async def _waiting_for(sup: Supervisor, successor: str) -> bool:
    return any(r.handing_off_to == successor for r in sup.runners.values())


async def test_an_unsequenced_shard_moves_break_before_make_and_says_why(autojump_clock):
    h = Harness(config(shards=1, sequenced=False))
    async with trio.open_nursery() as nursery:
        w1, _w2 = await owner_then_peer(h, nursery)
        w1.request_shutdown()
        await wait_for(lambda: _owned_by(h, "w2", epoch=2))
        nursery.cancel_scope.cancel()
    assert metric(w1, "shardvisor_handoff_fallbacks_total", reason="unsequenced") == 1
    assert h.sent("w2", p.Promote) == []


async def test_a_sigterm_whose_budget_cannot_wait_falls_back(autojump_clock):
    # drain budget 0.9 x 8 s = 7.2 s < handoff_timeout 5 s + stop grace 4 s
    h = Harness(config(shards=1, shutdown_timeout=8.0))
    async with trio.open_nursery() as nursery:
        w1, _w2 = await owner_then_peer(h, nursery)
        w1.request_shutdown()
        await wait_for(lambda: _owned_by(h, "w2", epoch=2))
        nursery.cancel_scope.cancel()
    assert metric(w1, "shardvisor_handoff_fallbacks_total", reason="shutdown_budget") == 1


async def test_a_second_sigterm_cuts_a_waiting_hand_off_short(autojump_clock):
    h = Harness(config(shards=1))
    h.never_ready.add("w2")
    async with trio.open_nursery() as nursery:
        w1, _w2 = await owner_then_peer(h, nursery)
        w1.request_shutdown()
        await trio.sleep(1.0)
        assert w1.runners["s0"].state is RunnerState.HANDING_OFF
        w1.request_shutdown()
        await trio.sleep(0.5)
        assert w1.runners == {}
        nursery.cancel_scope.cancel()
    assert metric(w1, "shardvisor_handoff_fallbacks_total", reason="fast_shutdown") == 1
    assert await h.store.handoff_requests() == ()


async def test_a_warm_standby_takes_a_dead_owners_shard_first_and_loses_nothing(autojump_clock):
    h = Harness(config(shards=1, standbys=1))
    w1 = Doomed(h)
    w2, w3 = h.supervisor("w2", h.store.peer()), h.supervisor("w3", h.store.peer())
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await trio.sleep(5.0)
        await nursery.start(w2.run)
        await nursery.start(w3.run)
        # s0's standby runs where the placement says (w2 ranks above w3), and is advertised.
        await wait_for(lambda: _advertised(h, {"s0": ["w2"]}))
        w1.die()
        died = trio.current_time()
        await wait_for(lambda: _owners_are(h, {"s0": "w2"}))
        took = trio.current_time() - died
        await trio.sleep(3.0)
        assert (await h.owners())["s0"] == ("w2", 2)  # the standby's take; w3 left it alone
        nursery.cancel_scope.cancel()
    assert DURATION - HEARTBEAT <= took <= DURATION + RECONCILE + 1.0
    assert metric(w2, "shardvisor_promotions_total", kind="failover") == 1
    assert len([c for c in h.children["w2"] if c.received]) == 1  # promoted: no spawn
    missing, twice = continuity(h.writes, "s0")
    assert missing == []  # the standby's buffer covered the outage
    last = max(w.seq for w in h.writes if w.epoch == 1)
    assert twice == [] or max(twice) <= last  # only what the dead owner wrote last
    assert all(not c.gaps for c in h.children["w2"])


@attrs.define
class Doomed:
    """w1, whose host dies on ``die``: cut off from the store (nothing it does lands any
    more), its loops stopped, its children killed."""

    h: Harness
    store: MemoryLeaseStore = attrs.field(init=False)
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)

    def __attrs_post_init__(self) -> None:
        self.store = self.h.store.peer()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with self._scope:
            await self.h.supervisor("w1", self.store).run(task_status=task_status)

    def die(self) -> None:
        self.store.unavailable = True
        self._scope.cancel()
        for child in self.h.children["w1"]:
            child.signal(9)


async def _advertised(h: Harness, expected: dict[str, list[str]]) -> bool:
    workers = (await h.store.snapshot()).workers
    found: dict[str, list[str]] = {}
    for w in workers:
        for shard in w.standbys:
            found.setdefault(shard, []).append(w.id)
    return found == expected


async def _owners_are(h: Harness, expected: dict[str, str]) -> bool:
    return {s: o for s, (o, _) in (await h.owners()).items()} == expected


async def test_with_count_zero_no_standby_runs_and_a_dead_owners_shard_starts_afresh(
    autojump_clock,
):
    """Today's behaviour: the new owner spawns a child that connects at the present (on a
    live feed what was generated meanwhile is gone: the real child counts it as a gap)."""
    h = Harness(config(shards=1, standbys=0))
    w1 = Doomed(h)
    w2 = h.supervisor("w2", h.store.peer())
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await trio.sleep(5.0)
        await nursery.start(w2.run)
        await trio.sleep(3.0)
        assert w2.keeper.runners == {}
        w1.die()
        await wait_for(lambda: _owners_are(h, {"s0": "w2"}))
        nursery.cancel_scope.cancel()
    assert h.sent("w2", p.Promote) == []
    assert metric(w2, "shardvisor_promotions_total", kind="failover") == 0


async def test_a_crashing_standby_is_restarted_and_the_owner_never_notices(autojump_clock):
    h = Harness(config(shards=1, standbys=1))
    h.standby_crashes["w2", "s0"] = 2
    w1, w2 = h.supervisor("w1"), h.supervisor("w2", h.store.peer())
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await trio.sleep(5.0)
        await nursery.start(w2.run)
        await wait_for(lambda: _advertised(h, {"s0": ["w2"]}))
        owner_children = len(h.children["w1"])
        await trio.sleep(3.0)
        assert len(h.children["w1"]) == owner_children == 1  # the owner's child never moved
        assert w1.runners["s0"].restarts == 0
        assert w2.keeper.runners["s0"].state is RunnerState.STANDBY_READY
        assert w2.keeper.runners["s0"].restarts >= 1
        nursery.cancel_scope.cancel()


async def test_a_crash_looping_standby_is_stopped_and_not_placed_again_for_a_while(
    autojump_clock,
):
    h = Harness(config(shards=1, standbys=1, max_restarts=2))
    h.standby_crashes["w2", "s0"] = 100
    w1, w2 = h.supervisor("w1"), h.supervisor("w2", h.store.peer())
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await trio.sleep(5.0)
        await nursery.start(w2.run)
        await trio.sleep(20.0)
        assert "s0" not in w2.keeper.runners  # stopped after its crash loop
        assert w1.runners["s0"].state is RunnerState.RUNNING
        assert len(h.children["w1"]) == 1
        nursery.cancel_scope.cancel()


async def test_a_standby_is_advertised_once_its_owners_checkpoint_reaches_its_first_record(
    autojump_clock,
):
    """A connected standby bridges a host death only once the owner's checkpoint (where a
    new owner resumes) has reached its first buffered record; until then it is not
    advertised (nor shown ready by ``status``), and it is read for once a round only."""
    h = Harness(config(shards=1, standbys=1))
    w1_store, w2_store = h.store.peer(), h.store.peer()
    write = w1_store.checkpoint
    held_back = True

    async def slow_owner(*args, **kwargs):  # its checkpoints do not land for a while
        if not held_back:
            await write(*args, **kwargs)

    w1_store.checkpoint = slow_owner  # type: ignore[method-assign]
    w1, w2 = h.supervisor("w1", w1_store), h.supervisor("w2", w2_store)
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await trio.sleep(5.0)
        await nursery.start(w2.run)
        await wait_for(lambda: _standby_connected(w2, "s0"))
        first = w2.keeper.runners["s0"].first_seq
        reads = w2_store.request_counts["read_shards"]
        await trio.sleep(5 * RECONCILE)
        assert await _advertised(h, {})
        assert w2_store.request_counts["read_shards"] - reads <= 6  # once a round
        held_back = False
        await wait_for(lambda: _advertised(h, {"s0": ["w2"]}))
        assert covers((await h.store.read_shard("s0")).checkpoint, first)
        reads = w2_store.request_counts["read_shards"]
        await trio.sleep(5 * RECONCILE)
        assert w2_store.request_counts["read_shards"] == reads  # covered: read no more
        nursery.cancel_scope.cancel()


async def test_a_standby_gone_while_its_owners_checkpoint_is_read_is_skipped(autojump_clock):
    """The coverage read is an await: a standby promoted or stopped meanwhile is no longer
    the keeper's, and the round goes on (it once raised KeyError and ended the supervisor)."""
    h = Harness(config(shards=1, standbys=1))
    w2_store = h.store.peer()
    w1, w2 = h.supervisor("w1"), h.supervisor("w2", w2_store)
    read = w2_store.read_shards
    gone: list[str] = []

    async def read_while_it_goes(shard_ids):
        found = await read(shard_ids)
        for shard_id in shard_ids:
            runner = w2.keeper.runners.pop(shard_id)
            runner.request_stop("gone during the read", 0.0)
            gone.append(shard_id)
        return found

    w2_store.read_shards = read_while_it_goes  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await trio.sleep(5.0)
        await nursery.start(w2.run)
        await wait_for(lambda: _true(gone))
        w2_store.read_shards = read  # type: ignore[method-assign]
        await wait_for(lambda: _advertised(h, {"s0": ["w2"]}))  # placed again, then covered
        nursery.cancel_scope.cancel()


async def _true(found: list[str]) -> bool:
    return bool(found)


async def _standby_connected(sup: Supervisor, shard: str) -> bool:
    runner = sup.keeper.runners.get(shard)
    return runner is not None and runner.state is RunnerState.STANDBY_READY


async def test_the_status_of_a_supervisor_shows_its_standbys(autojump_clock):
    h = Harness(config(shards=2, standbys=1))
    w1, w2 = h.supervisor("w1"), h.supervisor("w2", h.store.peer())
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await trio.sleep(5.0)
        await nursery.start(w2.run)
        await wait_for(lambda: _advertised(h, {"s0": ["w2"], "s1": ["w2"]}))
        status = w2.local_status()
        assert {s: v["state"] for s, v in status["standbys"].items()} == {
            "s0": "standby-ready",
            "s1": "standby-ready",
        }
        exposition = w2.metrics.exposition().decode()
        assert "shardvisor_standby_children 2.0" in exposition
        assert 'shardvisor_standby_buffered_records{shard="s0"}' in exposition
        nursery.cancel_scope.cancel()


async def test_a_shard_removed_at_a_reload_moves_make_before_break(autojump_clock):
    h = Harness(config(shards=2))
    async with trio.open_nursery() as nursery:
        w1, _w2 = await owner_then_peer(h, nursery)
        await w1.reload(attrs.evolve(h.config, shards=h.config.shards[:1]))  # s1 left w1's file
        await wait_for(lambda: _owners_are(h, {"s0": "w1", "s1": "w2"}))
        changed = attrs.evolve(h.config.shards[0], streams=(StreamSpec("s0", "ws://h/new", "seq"),))
        await w1.reload(attrs.evolve(h.config, shards=(changed,)))  # s0 restarts here
        await wait_for(lambda: _owned_epoch(h, "s0", "w1", 2))
        nursery.cancel_scope.cancel()
    assert metric(w1, "shardvisor_handoffs_total", mode="make_before_break") == 1
    assert metric(w1, "shardvisor_handoffs_total", mode="break_before_make") == 0  # not to a peer
    assert continuity(h.writes, "s1") == ([], [])


async def _runs(sup: Supervisor, shard: str) -> bool:
    return shard in sup.runners


async def _stage_is(store: MemoryLeaseStore, shard: str, stage: str) -> bool:
    item = await store.read_shard(shard)
    return item is not None and item.handoff_stage == stage


def after_ready(store: MemoryLeaseStore, then) -> None:
    """Call ``then()`` right after the successor's ``handoff_ready`` write lands."""
    write = store.handoff_ready

    async def ready_then(*args) -> None:
        await write(*args)
        then()

    store.handoff_ready = ready_then  # type: ignore[method-assign]


async def _released_at(h: Harness, shard: str, epoch: int) -> bool:
    item = await h.store.read_shard(shard)
    return item is not None and (item.owner, item.epoch, item.state) == ("", epoch, "released")


async def _owned_epoch(h: Harness, shard: str, owner: str, epoch: int) -> bool:
    return (await h.owners())[shard] == (owner, epoch)
