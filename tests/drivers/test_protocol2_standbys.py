"""Warm standbys on protocol 2 (issues 14 and 16), on a virtual clock: placed from the ring
(``core.standby_ring``) with no scan, a dead owner's shard routed to its first standby, the
holder's marker naming the extra candidate, graceful moves to the standby. Fake children on a
modelled live feed, as in test_standby_driver.py; the same on real processes, both DynamoDB
servers and the live-only feed in tests/e2e/test_e2e_standby.py."""

from __future__ import annotations

import attrs
import pytest
import trio
from test_standby_driver import (
    DURATION,
    RECONCILE,
    Doomed,
    Harness,
    config,
    continuity,
    metric,
    wait_for,
)

from shard_worker.contract import pipe as p
from shard_worker.contract.pipe import StreamSpec
from supervisor.config.model import ShardConfig, WorkerConfig
from supervisor.config.shard_spec import encode_spec
from supervisor.core.standby_ring import Ring, first_standby
from supervisor.drivers.daemon import Supervisor
from supervisor.drivers.ring_standbys import RingStandbys

PROTOCOL_1_READS = ("snapshot", "vacancies", "worker_ids", "read_workers", "handoff_requests")
WORKERS = ("w1", "w2", "w3")


def flipped(shard_ids: tuple[str, ...], standbys: int = 1, **sup) -> Harness:
    base = config(shards=1, standbys=standbys, **sup)
    shards = tuple(
        ShardConfig(sid, (StreamSpec(sid, "ws://127.0.0.1:1/x", sequence="seq"),))
        for sid in shard_ids
    )
    h = Harness(attrs.evolve(base, shards=shards))
    h.store.set_protocol(2)
    return h


def standby_workers(sups: dict[str, Supervisor]) -> dict[str, set[str]]:
    """shard -> the workers running a standby of it now."""
    found: dict[str, set[str]] = {}
    for worker, sup in sups.items():
        for shard in sup.keeper.runners:
            found.setdefault(shard, set()).add(worker)
    return found


async def start_fleet(h: Harness, nursery: trio.Nursery, w1) -> dict[str, Supervisor]:
    """w1 takes every shard alone, then w2 and w3 join; w2 and w3."""
    await nursery.start(w1.run)
    await trio.sleep(5.0)
    sups = {}
    for worker in WORKERS[1:]:
        sups[worker] = h.supervisor(worker, h.store.peer())
        await nursery.start(sups[worker].run)
    return sups


@pytest.mark.parametrize(
    "shard, path",
    [
        ("s0", "w1 is not among its first candidates: they know they stand by"),
        ("s5", "w1 is its first candidate: w1's marker names the second"),
    ],
)
async def test_a_dead_owners_shard_is_routed_to_its_ring_standby_and_loses_nothing(
    autojump_clock, shard, path
):
    h = flipped((shard,))
    ring = Ring.build(WORKERS, (shard,), 1)
    expected = first_standby(ring, shard, "w1", 1)
    marker_path = ring.candidates(shard)[0] == "w1"
    assert marker_path == (shard == "s5"), path  # the case this parameter is for
    w1 = Doomed(h)
    async with trio.open_nursery() as nursery:
        sups = await start_fleet(h, nursery, w1)
        await wait_for(lambda: _true(standby_workers(sups) == {shard: {expected}}))
        await wait_for(lambda: _advertised(h, shard, expected))  # covers the checkpoint
        if marker_path:
            named = await h.store.fleet().wanted_of(expected)
            assert [(m.shard, m.holder) for m in named] == [(shard, "w1")]
        w1.die()
        died = trio.current_time()
        await wait_for(lambda: _owner_is(h, shard, expected))
        took = trio.current_time() - died
        await trio.sleep(3.0)
        nursery.cancel_scope.cancel()
    assert took <= DURATION + 1.0  # declared at the lease, routed, taken within a poll
    standby = sups[expected]
    assert metric(standby, "shardvisor_promotions_total", kind="failover") == 1
    assert len(h.children[expected]) == 1  # the standby's child, promoted: no spawn
    missing, _twice = continuity(h.writes, shard)
    assert missing == []  # its buffer bridged the outage on the live feed
    for worker, sup in sups.items():
        used = {op for op in PROTOCOL_1_READS if sup.store.request_counts[op]}
        assert used == set(), f"{worker} made protocol 1's reads: {used}"


async def test_a_rebalance_and_a_sigterm_move_each_shard_to_its_standby_by_promotion(
    autojump_clock,
):
    """Two workers: each is a candidate of every shard, so w2 stands by for both shards w1
    took alone. The rebalance's move and the SIGTERM's are hand-offs to that standby: each
    a promotion (no spawn, no connect), nothing lost or written twice."""
    h = flipped(("s0", "s1"))
    async with trio.open_nursery() as nursery:
        w1 = h.supervisor("w1")
        await nursery.start(w1.run)
        await trio.sleep(5.0)
        w2 = h.supervisor("w2", h.store.peer())
        await nursery.start(w2.run)
        await wait_for(lambda: _true(set(w2.keeper.runners) == {"s0", "s1"}))
        await wait_for(lambda: _true(len(w2.runners) == 1))  # the rebalance's move
        await trio.sleep(2 * RECONCILE)
        asked = trio.current_time()
        w1.request_shutdown()
        await wait_for(lambda: _owners(h, {"s0": "w2", "s1": "w2"}))
        took = trio.current_time() - asked
        nursery.cancel_scope.cancel()
    assert took < 1.0
    assert metric(w1, "shardvisor_handoffs_total", mode="make_before_break") == 2
    assert metric(w2, "shardvisor_promotions_total", kind="handoff") == 2
    assert len(h.children["w2"]) == 2  # the two standbys' children: no spawn
    for shard in ("s0", "s1"):
        assert continuity(h.writes, shard) == ([], []), shard
    assert [bool(s.min_cut) for s in h.sent("w1", p.Stop)] == [True, True]


async def test_a_registered_shard_gets_its_standby_from_the_arcs_read(autojump_clock):
    """`shards add` on a running fleet: the shard is in no TOML, so its candidates find it by
    reading the registrations of their arcs (when ``shardgen`` moved), learn its definition,
    and the one that does not hold it runs its standby."""
    h = flipped(())
    sups = {w: h.supervisor(w, h.store.peer()) for w in ("w1", "w2")}
    async with trio.open_nursery() as nursery:
        for sup in sups.values():
            await nursery.start(sup.run)
        await trio.sleep(DURATION)
        spec = encode_spec(ShardConfig("reg", (StreamSpec("reg", "ws://127.0.0.1:1/x"),)))
        await h.store.add_shard("reg", spec, 0.0)
        await wait_for(lambda: _owned(h, "reg"))
        owner = (await h.owners())["reg"][0]
        other = "w2" if owner == "w1" else "w1"
        await wait_for(lambda: _true("reg" in sups[other].keeper.runners))
        assert "reg" not in sups[owner].keeper.runners
        nursery.cancel_scope.cancel()
    assert sups[other].store.request_counts["registered_in"] > 0


async def test_max_standbys_leaves_the_rest_uncovered_and_says_so(autojump_clock, caplog):
    h = flipped(("s0", "s1", "s2", "s3"), standbys=1)
    h.config = attrs.evolve(h.config, worker=WorkerConfig(max_standbys=1))
    sups = {w: h.supervisor(w, h.store.peer()) for w in ("w1", "w2")}
    async with trio.open_nursery() as nursery:
        for sup in sups.values():
            await nursery.start(sup.run)
        await trio.sleep(4 * DURATION)
        for sup in sups.values():
            assert len(sup.keeper.runners) <= 1
        assert sum(len(sup.keeper.runners) for sup in sups.values()) == 2
        nursery.cancel_scope.cancel()
    assert "at its max_standbys" in caplog.text


async def _true(value: bool) -> bool:
    return value


async def _owned(h: Harness, shard: str) -> bool:
    return (await h.owners()).get(shard, ("", 0))[0] != ""


async def _owner_is(h: Harness, shard: str, worker: str) -> bool:
    return (await h.owners()).get(shard, ("", 0))[0] == worker


async def _owners(h: Harness, expected: dict[str, str]) -> bool:
    return {s: o for s, (o, _) in (await h.owners()).items()} == expected


async def _advertised(h: Harness, shard: str, worker: str) -> bool:
    workers = {w.id: w for w in await h.store.read_workers()}
    return worker in workers and shard in workers[worker].standbys


async def test_more_standbys_than_peers_is_a_warning_and_the_rest_are_not_placed(
    autojump_clock, caplog
):
    h = flipped(("s0",), standbys=2)
    sups = {w: h.supervisor(w, h.store.peer()) for w in ("w1", "w2")}
    async with trio.open_nursery() as nursery:
        for sup in sups.values():
            await nursery.start(sup.run)
        await wait_for(lambda: _owned(h, "s0"))
        owner = (await h.owners())["s0"][0]
        other = "w2" if owner == "w1" else "w1"
        await wait_for(lambda: _true(set(sups[other].keeper.runners) == {"s0"}))
        await trio.sleep(2 * RECONCILE)
        assert sups[owner].keeper.runners == {}
        nursery.cancel_scope.cancel()
    assert "2 standby(s) per shard wanted, 1 other live worker(s) can run one" in caplog.text


async def test_the_ring_keeps_what_it_read_when_the_store_fails_and_reads_again_after(
    autojump_clock, caplog
):
    """A failed read of the arcs' registrations or of the markers costs nothing but that
    round's update: no exception reaches the round, and the next refresh reads again."""
    h = flipped(())
    store = h.store.peer()
    spec = encode_spec(ShardConfig("reg", (StreamSpec("reg", "ws://127.0.0.1:1/x"),)))
    await h.store.add_shard("reg", spec, 0.0)
    ring = RingStandbys("w1", store.fleet(), 1)
    store.unavailable = True
    found = await ring.refresh(
        live={"w1", "w2"}, configured=(), shardgen=1, now=0.0, marker_period=10.0
    )
    assert found == frozenset() and ring.marked == frozenset()
    assert "registered shards of our arcs not read" in caplog.text
    assert "standby-wanted markers not read" in caplog.text
    store.unavailable = False
    found = await ring.refresh(
        live={"w1", "w2"}, configured=(), shardgen=1, now=1.0, marker_period=10.0
    )
    assert found == {"reg"}  # two members, k = 1: each is a candidate of every shard
    assert ring.first("reg", "w2") == "w1"
