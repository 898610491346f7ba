"""The supervisor's loops on a virtual clock: in-memory store, fake children, exact times.

These run instantly under pytest-trio's ``autojump_clock``; the same rules are exercised with
real processes and real servers in test_e2e_fleet.py.
"""

from __future__ import annotations

import attrs
import pytest
import trio
from helpers.fake_child import FakeChild, Write

from shard_worker.contract.pipe import Start, StreamSpec
from supervisor.adapters.lease_store.memory import MemoryLeaseStore
from supervisor.config.model import (
    Config,
    LeaseConfig,
    ShardConfig,
    SupervisorConfig,
    WorkerConfig,
)
from supervisor.config.shard_spec import encode_spec
from supervisor.core.items import ShardItem, Snapshot, WorkerItem
from supervisor.core.partition_keys import vacant_key
from supervisor.core.runner_state import RunnerEvent, RunnerLifecycle, RunnerState
from supervisor.drivers.daemon import TAKES_AT_ONCE, Supervisor
from supervisor.drivers.shard_runner import HELLO_TIMEOUT

DURATION, HEARTBEAT, RECONCILE = 10.0, 2.0, 2.0
MARGIN = DURATION / 5


def config(shards: int) -> Config:
    return Config(
        lease=LeaseConfig(DURATION, HEARTBEAT, RECONCILE),
        supervisor=SupervisorConfig(shutdown_timeout=20.0, checkpoint_interval=1.0),
        shards=tuple(
            ShardConfig(f"s{i}", (StreamSpec(f"s{i}", "ws://127.0.0.1:1/x"),))
            for i in range(shards)
        ),
    )


class Harness:
    def __init__(self, shards: int = 2) -> None:
        self.store = MemoryLeaseStore(table_exists=True)
        self.writes: list[Write] = []
        self.children: list[FakeChild] = []
        self.crashing: set[str] = set()
        self.silent: set[str] = set()
        self.config = config(shards)

    def supervisor(
        self, worker: str, store: MemoryLeaseStore | None = None, config: Config | None = None
    ) -> Supervisor:
        async def spawn(shard_id: str):
            child = FakeChild(
                shard_id,
                self.writes,
                crash_after_ready=shard_id in self.crashing,
                silent=shard_id in self.silent,
            )
            self.children.append(child)
            return child, []

        return Supervisor(
            config or self.config, worker, store or self.store, spawn=spawn, now=trio.current_time
        )

    def two(self) -> tuple[Supervisor, Supervisor]:
        """w1 and w2, each with a store client of its own."""
        return self.supervisor("w1", self.store.peer()), self.supervisor("w2", self.store.peer())

    async def owners(self) -> dict[str, tuple[str, int]]:
        return {s.id: (s.owner, s.epoch) for s in (await self.store.snapshot()).shards}


async def test_takes_every_shard_and_stores_checkpoints(autojump_clock):
    h = Harness(shards=2)
    sup = h.supervisor("w1")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await trio.sleep(5.0)
        assert await h.owners() == {"s0": ("w1", 1), "s1": ("w1", 1)}
        snapshot = await h.store.snapshot()
        assert all(s.checkpoint for s in snapshot.shards)
        sup.request_shutdown()
    snapshot = await h.store.snapshot()
    assert all(s.owner == "" and s.state == "released" for s in snapshot.shards)
    last = {s.id: s.checkpoint[s.id] for s in snapshot.shards}
    assert last == {sid: max(w.seq for w in h.writes if w.shard == sid) for sid in last}
    # Each child's last will carries its shard's vacant bucket (protocol 2's index key).
    starts = [m for c in h.children for m in c.received if isinstance(m, Start)]
    assert {m.shard: m.last_will.fleet for m in starts} == {
        "s0": vacant_key("s0"),
        "s1": vacant_key("s1"),
    }


async def test_the_member_list_shows_each_worker_as_it_is(autojump_clock):
    """Protocol 2's member list, kept by today's writes (compatibility mode): each worker's
    shard count as of its last heartbeat, the generation of its last change, a clean stop."""
    h = Harness(shards=4)
    fleet = h.store.fleet()
    w1, w2 = h.two()
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await trio.sleep(3.0)
        await nursery.start(w2.run)
        joined = await fleet.read_generation()
        with trio.fail_after(60):
            while {m.held for m in await fleet.read_members()} != {2}:
                await trio.sleep(0.5)
        members = {m.id: m for m in await fleet.read_members()}
        assert [m.state for m in members.values()] == ["running", "running"]
        assert members["w2"].mgen == joined  # its join's generation, recorded on its item
        assert members["w1"].mgen < joined
        w2.request_shutdown()
        with trio.fail_after(60):
            while (await fleet.read_members())[1].state != "stopped":
                await trio.sleep(0.5)
        stopped = (await fleet.read_members())[1]
        assert (stopped.held, stopped.mgen) == (0, await fleet.read_generation())
        nursery.cancel_scope.cancel()


async def test_a_lagging_replica_neither_stops_nor_drops_a_shard_registered_since(
    autojump_clock,
):
    """Scans are eventually consistent. A replica one scan behind lists no item for a shard
    registered and taken since: that is no lost lease (a consistent read says so before any
    child stops) and no removed shard (it stays runnable)."""
    h = Harness(shards=1)
    store = h.store.peer()
    store.stale_scans = True
    sup = h.supervisor("w1", store)
    spec = encode_spec(ShardConfig("reg", (StreamSpec("reg", "ws://127.0.0.1:1/x"),)))
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await trio.sleep(3.0)
        await h.store.add_shard("reg", spec, 1.0)
        sup._scans.invalidate()  # as a `shards add` pokes the owners' mailboxes
        with trio.fail_after(30):
            while (await h.owners()).get("reg") != ("w1", 1):
                await trio.sleep(0.1)
        confirmed = store.request_counts["read_shards"]
        await trio.sleep(5 * RECONCILE)  # rounds and scans, the first of them stale
        assert (await h.owners())["reg"] == ("w1", 1)
        assert sup.runners["reg"].state is RunnerState.RUNNING
        assert [c.shard for c in h.children].count("reg") == 1  # never restarted
        assert store.request_counts["read_shards"] > confirmed  # the scan did show it lost
        nursery.cancel_scope.cancel()


async def test_lagging_replicas_through_a_death_and_a_drain_never_interleave_two_writers(
    autojump_clock,
):
    """Every supervisor's scans may read a lagging replica (``stale_scans``). Through a
    host death and a drain, a shard's writes never go back to an earlier epoch once a later
    one wrote (never two writers), and every shard ends with the one worker left."""
    h = Harness(shards=6)
    stores = {w: h.store.peer() for w in ("w1", "w2", "w3")}
    for store in stores.values():
        store.stale_scans = True
    sups = {w: h.supervisor(w, store) for w, store in stores.items()}
    doomed = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        await nursery.start(sups["w1"].run)
        await nursery.start(doomed_run, sups["w2"], doomed)
        await nursery.start(sups["w3"].run)
        await trio.sleep(15.0)  # balanced, hand-offs included
        stores["w2"].unavailable = True  # w2 dies: nothing it does lands any more
        doomed.cancel()
        await trio.sleep(20.0)
        sups["w3"].request_shutdown()  # w3 drains: everything to w1
        with trio.fail_after(60):
            while {o for o, _ in (await h.owners()).values()} != {"w1"}:
                await trio.sleep(0.5)
        await trio.sleep(3.0)
        nursery.cancel_scope.cancel()
    for shard in {w.shard for w in h.writes}:
        epochs = [w.epoch for w in sorted(h.writes, key=lambda w: w.at) if w.shard == shard]
        assert epochs == sorted(epochs), f"{shard}: epochs interleaved {epochs}"
    assert len({w.epoch for w in h.writes if w.shard == "s0"}) >= 2  # it did move


def test_a_registered_shard_stays_runnable_until_a_scan_shows_it_retired():
    """What may run comes from eventually consistent scans: a registered shard missing from
    one (a lagging replica) stays runnable; one the scan shows retired does not."""
    sup = Harness(shards=1).supervisor("w1")
    spec = encode_spec(ShardConfig("reg", (StreamSpec("reg", "ws://127.0.0.1:1/x"),)))
    registered = ShardItem("reg", "w1", 1, spec=spec)
    sup._refresh_runnable(Snapshot(workers=(), shards=(registered,)))
    assert sorted(sup._runnable) == ["reg", "s0"]
    sup._refresh_runnable(Snapshot(workers=(), shards=()))  # a replica that lags
    assert sorted(sup._runnable) == ["reg", "s0"]
    retired = attrs.evolve(registered, retired_at=5.0)
    sup._refresh_runnable(Snapshot(workers=(), shards=(retired,)))
    assert sorted(sup._runnable) == ["s0"]


async def test_store_outage_stops_every_child_before_a_peer_could_take_over(autojump_clock):
    h = Harness(shards=2)
    sup = h.supervisor("w1")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await trio.sleep(5.0)
        h.store.unavailable = True
        cut = trio.current_time()
        await trio.sleep(DURATION)
        # The last successful heartbeat was sent at most HEARTBEAT before the cut.
        assert sup.runners == {}
        assert all(c.returncode is not None for c in h.children)
        assert max(w.at for w in h.writes) < cut + DURATION - MARGIN
        h.store.unavailable = False
        await trio.sleep(HEARTBEAT + RECONCILE + 1.0)
        # Back: the shards still carry our id, so we retake them at a new epoch.
        assert await h.owners() == {"s0": ("w1", 2), "s1": ("w1", 2)}
        nursery.cancel_scope.cancel()


async def test_a_dead_supervisors_shards_move_after_the_lease_duration(autojump_clock):
    h = Harness(shards=4)
    w1_store, doomed = h.store.peer(), trio.CancelScope()
    async with trio.open_nursery() as nursery:
        await nursery.start(doomed_run, h.supervisor("w1", w1_store), doomed)
        await trio.sleep(3.0)
        await nursery.start(h.supervisor("w2").run)
        await trio.sleep(0.5)
        # w1 "dies": cut off from the store (so nothing it does lands), then its loops stop.
        w1_store.unavailable = True
        doomed.cancel()
        died = trio.current_time()
        with trio.fail_after(60):
            while {o for o, _ in (await h.owners()).values()} != {"w2"}:
                await trio.sleep(0.1)
        took = trio.current_time() - died
        assert DURATION - HEARTBEAT <= took <= DURATION + RECONCILE + 1.0
        assert {e for _, e in (await h.owners()).values()} == {2}
        nursery.cancel_scope.cancel()


async def death_off_round(h: Harness, settle: float, last_act=None) -> float:
    """w1 dies ``settle`` seconds after w2 started (after ``last_act(w2)``, if given), with a
    lease of ``LEASE_OFF_ROUND``: how long after w2's last sight of w1's counter w2 owned
    every shard."""
    lease = attrs.evolve(h.config.lease, duration=LEASE_OFF_ROUND)
    h.config = attrs.evolve(h.config, lease=lease)
    w1_store, doomed = h.store.peer(), trio.CancelScope()
    w2 = h.supervisor("w2")
    async with trio.open_nursery() as nursery:
        await nursery.start(doomed_run, h.supervisor("w1", w1_store), doomed)
        await trio.sleep(3.0)
        await nursery.start(w2.run)
        await trio.sleep(settle)
        if last_act is not None:
            await last_act(w2)
        w1_store.unavailable = True
        doomed.cancel()
        with trio.fail_after(60):
            while {o for o, _ in (await h.owners()).values()} != {"w2"}:
                await trio.sleep(0.001)
        taken = trio.current_time()
        last_seen = w2.tracker._seen["w1"].changed_at
        nursery.cancel_scope.cancel()
    return taken - last_seen


async def test_a_dead_peer_is_acted_on_when_its_lease_falls_due_not_at_the_next_round(
    autojump_clock,
):
    """The survivor times the death from its first sight of the victim's last counter and
    runs a round right then (issue 16: detection at the lease, not at the round after). A
    lease of 11 s with 2 s rounds: the due time falls a second before a round."""
    h = Harness(shards=4)
    took = await death_off_round(h, RECONCILE * 1.3)  # between two of w2's rounds
    assert LEASE_OFF_ROUND <= took <= LEASE_OFF_ROUND + 0.1


async def test_a_dead_owners_shard_retaken_since_the_last_scan_is_taken_in_the_death_round(
    autojump_clock,
):
    """The round after a death plans on the last scan (the death alone does not call for
    one); a shard the dead owner took again since shows a later epoch, so the planned take
    fails its condition. It is read and taken at that epoch at once, not a round later (row
    9 measured such takes 2 s late)."""
    h = Harness(shards=4)
    before: dict[str, tuple[str, int]] = {}

    async def retake_one(w2: Supervisor) -> None:  # w1's last act: a take of its own, anew
        before.update(await h.owners())
        shard = next(s for s, (owner, _) in sorted(before.items()) if owner == "w1")
        await h.store.take(shard, "w1", "w1", before[shard][1], 0.0)
        before["retaken"] = (shard, before[shard][1])

    took = await death_off_round(h, 15.0, retake_one)  # balanced, w2's last scan behind it
    assert LEASE_OFF_ROUND <= took <= LEASE_OFF_ROUND + 0.1
    shard, epoch = before["retaken"]
    assert (await h.owners())[shard][1] == epoch + 2


LEASE_OFF_ROUND = 11.0  # not a multiple of RECONCILE


async def doomed_run(
    sup: Supervisor, doomed: trio.CancelScope, task_status=trio.TASK_STATUS_IGNORED
):
    """``sup.run`` inside ``doomed``: cancelling it stops the supervisor as a death would."""
    with doomed:
        await sup.run(task_status=task_status)


async def test_no_write_lands_after_the_fence_when_the_supervisor_is_frozen(autojump_clock):
    """A frozen supervisor sends no fence; its children stop on their own at the deadline."""
    h = Harness(shards=1)
    sup = h.supervisor("w1")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await trio.sleep(4.5)  # between heartbeats (they run at 0, 2, 4, ... s)
        (child,) = h.children
        # Frozen: from now on the supervisor neither renews (so sends no fence) nor kills.
        sup._heartbeat_once = _frozen
        sup._lose_all = lambda reason: None
        deadline = sup.lease.valid_until
        await trio.sleep(DURATION)
        assert child.returncode == 3  # it stopped by itself, at its fence
        assert h.writes and max(w.at for w in h.writes) < deadline
        nursery.cancel_scope.cancel()


async def _frozen(sent: float) -> None:
    await trio.lowlevel.checkpoint()


def record_lifecycles(monkeypatch) -> list[tuple[str, str]]:
    """(event, new state) of every runner's lifecycle table, in order."""
    steps: list[tuple[str, str]] = []
    process = RunnerLifecycle.process

    def recording(self: RunnerLifecycle, event: RunnerEvent) -> bool:
        changed = process(self, event)
        steps.append((event.value, self.state.value))
        return changed

    monkeypatch.setattr(RunnerLifecycle, "process", recording)
    return steps


async def test_a_crash_looping_shard_is_released_and_left_alone(autojump_clock, monkeypatch):
    steps = record_lifecycles(monkeypatch)
    h = Harness(shards=1)
    h.crashing.add("s0")
    sup = h.supervisor("w1")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        with trio.fail_after(30):
            while (await h.owners())["s0"] != ("", 1):
                await trio.sleep(0.01)
        released = trio.current_time()
        assert len(h.children) == 6  # the first start and 5 restarts, then released
        crash = [("child_ready", "running"), ("child_exited", "backoff"), ("restart", "starting")]
        last = [("child_ready", "running"), ("crash_loop", "quarantined")]
        assert steps == crash * 5 + last + [("released", "quarantined")]
        assert (await h.store.snapshot()).shards[0].state == "quarantined"
        steps.clear()
        await trio.sleep(DURATION - RECONCILE - 0.1)
        assert (await h.owners())["s0"] == ("", 1)  # cooling down here: another host may try
        with trio.fail_after(2 * RECONCILE + 0.2):
            while (await h.owners())["s0"][1] != 2:
                await trio.sleep(0.01)
        # Nobody else did: after the cool-down we try again, at a fresh epoch.
        assert trio.current_time() - released <= DURATION + RECONCILE + 0.1
        nursery.cancel_scope.cancel()


async def test_a_child_that_never_says_hello_is_restarted_not_fatal(autojump_clock):
    h = Harness(shards=2)
    h.silent.add("s0")
    sup = h.supervisor("w1")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await trio.sleep(3 * HELLO_TIMEOUT)
        silent = [c for c in h.children if c.shard == "s0"]
        assert len(silent) >= 2, "the silent child was killed and started again"
        assert all(c.returncode is not None for c in silent[:-1])
        # The other shard kept writing all along: one slow child does not take the host down.
        assert max(w.at for w in h.writes if w.shard == "s1") >= 3 * HELLO_TIMEOUT - 2
        assert (await h.owners())["s1"][0] == "w1"
        nursery.cancel_scope.cancel()


async def test_second_signal_takes_the_fast_path(autojump_clock):
    h = Harness(shards=2)
    sup = h.supervisor("w1")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await trio.sleep(3.0)
        started = trio.current_time()
        sup.request_shutdown()
        sup.request_shutdown()
    assert trio.current_time() - started < 1.0
    assert all(s.owner == "" for s in (await h.store.snapshot()).shards)


async def test_a_capped_worker_runs_at_most_its_cap_and_peers_take_the_rest(autojump_clock):
    h = Harness(shards=5)
    capped = attrs.evolve(h.config, worker=WorkerConfig(max_shards=1))
    async with trio.open_nursery() as nursery:
        await nursery.start(h.supervisor("w1", config=capped).run)
        await nursery.start(h.supervisor("w2", h.store.peer()).run)
        await trio.sleep(4 * DURATION)  # past every dwell: balanced for good
        owners = [o for o, _ in (await h.owners()).values()]
        assert sorted(owners) == ["w1", "w2", "w2", "w2", "w2"]
        nursery.cancel_scope.cancel()


async def test_a_steady_round_reads_the_workers_and_vacant_shards_not_every_shard(
    autojump_clock,
):
    h = Harness(shards=8)
    stores = {w: h.store.peer() for w in ("w1", "w2")}
    sups = [h.supervisor(w, store) for w, store in stores.items()]
    async with trio.open_nursery() as nursery:
        for sup in sups:
            await nursery.start(sup.run)
        await trio.sleep(60.0)  # taken and balanced (the dwell time is one lease duration)
        owners = await h.owners()
        assert sorted(o for o, _ in owners.values()) == ["w1"] * 4 + ["w2"] * 4
        counts = stores["w1"].request_counts
        counts.clear()
        await trio.sleep(120.0)
        assert await h.owners() == owners
        rounds = 120.0 / RECONCILE
        # The worker ids and, in one read, the meta item, our own item and the watched peers'
        # (every item only after an announced change: none in a steady fleet).
        assert counts["worker_ids"] == pytest.approx(rounds, abs=1)
        assert counts["read_worker_items"] == pytest.approx(rounds, abs=1)
        assert counts["announce"] == counts["read_workers"] == 0
        assert counts["heartbeat"] == pytest.approx(120.0 / HEARTBEAT, abs=1)
        # One full scan per full_scan_interval (60 s), not one per round.
        assert counts["snapshot"] <= 120.0 / LeaseConfig().full_scan_interval + 1
        polls = 120.0 / LeaseConfig().handoff_poll_interval
        assert counts["vacancies"] == pytest.approx(rounds + polls, rel=0.05)
        # Make-before-break requests are found by their notices among the vacancies: a fleet
        # of this version makes no second query per poll (issue 14: row 6's 350 -> 562).
        assert counts["handoff_requests"] == 0
        assert counts["take"] == counts["release"] == 0
        for sup in sups:
            sup.request_shutdown()


async def test_a_named_successor_takes_a_released_shard_within_one_poll(autojump_clock):
    h = Harness(shards=2)
    w1, w2 = h.two()
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await trio.sleep(5.0)
        await nursery.start(w2.run)
        await trio.sleep(DURATION + 3 * RECONCILE)  # w2 got one shard through a rebalance
        owners = await h.owners()
        shard = next(s for s, (o, _) in owners.items() if o == "w1")
        assert await h.store.request_release(shard, 1.0) == "w1"
        await h.store.poke("w1")  # as `shardvisor release` does
        released_at = taken_at = None
        with trio.fail_after(RECONCILE + 5):
            while taken_at is None:
                item = next(s for s in (await h.store.snapshot()).shards if s.id == shard)
                if released_at is None and not item.owner:
                    released_at = trio.current_time()
                if item.owner == "w2":
                    taken_at = trio.current_time()
                await trio.sleep(0.01)
        assert released_at is not None
        assert taken_at - released_at <= LeaseConfig().handoff_poll_interval + 0.02
        w1.request_shutdown()
        w2.request_shutdown()


async def test_reload_restarts_only_changed_shards_adds_and_hands_off_removed(autojump_clock):
    h = Harness(shards=3)
    sup = h.supervisor("w1")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await trio.sleep(5.0)
        before = await h.owners()
        assert before == {"s0": ("w1", 1), "s1": ("w1", 1), "s2": ("w1", 1)}
        changed = ShardConfig("s1", (StreamSpec("s1", "ws://127.0.0.1:1/changed"),))
        added = ShardConfig("s9", (StreamSpec("s9", "ws://127.0.0.1:1/new"),))
        shards = (h.config.shards[0], changed, added)  # s2 removed
        await sup.reload(attrs.evolve(h.config, shards=shards))
        await trio.sleep(3 * RECONCILE)
        after = await h.owners()
        assert after["s0"] == ("w1", 1)  # unchanged: not restarted
        assert after["s1"] == ("w1", 2)  # changed: handed to itself, a new epoch
        assert after["s9"] == ("w1", 1)  # added: registered and taken
        assert after["s2"] == ("", 1)  # removed: released, nobody here runs it
        assert sup.runners["s1"].shard == changed
        assert "s2" not in sup.runners
        sup.request_shutdown()


class SlowTakes(MemoryLeaseStore):
    """Every take takes 100 ms, as a request to a remote table does."""

    async def take(self, *args, **kwargs):
        await trio.sleep(0.1)
        return await super().take(*args, **kwargs)


async def test_a_cold_starts_takes_run_side_by_side(autojump_clock):
    """Sixteen vacant shards: the first round's takes go out TAKES_AT_ONCE (8) at a time, so
    all are ours after two take latencies, not sixteen."""
    h = Harness(shards=16)
    h.store = SlowTakes(table_exists=True)
    sup = h.supervisor("w1")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        started = trio.current_time()
        while len([o for o, _ in (await h.owners()).values() if o == "w1"]) < 16:
            await trio.sleep(0.01)
        took = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert TAKES_AT_ONCE >= 8
    assert took < 0.5  # one after another: 1.6 s


class SlowHeartbeats(MemoryLeaseStore):
    """Each heartbeat lands ``delay`` after it was sent, even when its caller gives up (as the
    DynamoDB store's abandoned request thread does)."""

    delay = 0.5

    async def heartbeat(
        self,
        worker_id: str,
        session: str,
        state: str,
        wall_now: float,
        standbys: tuple[str, ...] | None = None,
        held: int | None = None,
        *,
        not_dead: bool = False,
        write_state: bool = True,
    ) -> WorkerItem:
        with trio.CancelScope(shield=True):
            await trio.sleep(self.delay)
            return await super().heartbeat(
                worker_id,
                session,
                state,
                wall_now,
                standbys,
                held,
                not_dead=not_dead,
                write_state=write_state,
            )


async def test_a_heartbeat_in_flight_never_lands_after_the_drain_marked_us_stopped(autojump_clock):
    h = Harness(shards=1)
    h.store = SlowHeartbeats(table_exists=True)
    sup = h.supervisor("w1")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await trio.sleep(2 * HEARTBEAT + 0.1)  # the heartbeat sent at 4.0 lands at 4.5
        sup.request_shutdown()  # the drain ends (and retires us) well before 4.5
    assert [w.state for w in await h.store.read_workers()] == ["stopped"]


class SeesItsStateAtEachHandoff(MemoryLeaseStore):
    """Records what our own worker item advertised when each hand-off was requested."""

    def __init__(self, table) -> None:
        super().__init__()
        self._table = table
        self.states: list[str] = []

    async def request_handoff(self, shard_id, me, epoch, to, wall_now) -> None:
        self.states.append(next(w.state for w in await self.read_workers() if w.id == me))
        await super().request_handoff(shard_id, me, epoch, to, wall_now)

    async def release(self, shard_id, me, *args, **kwargs) -> None:
        self.states.append(next(w.state for w in await self.read_workers() if w.id == me))
        await super().release(shard_id, me, *args, **kwargs)


@pytest.mark.parametrize("how", ["sigterm", "operator drain"])
async def test_a_draining_worker_says_so_before_its_first_hand_off(autojump_clock, how):
    """A peer that received our shards and still read us ``running`` would shed them straight
    back to us as we go away (a rolling deploy's race: the shard then waited out
    handoff_timeout and moved break-before-make). The state is written before the hand-offs,
    not at the next heartbeat."""
    h = Harness(shards=2)
    w1_store = SeesItsStateAtEachHandoff(h.store._table)
    w1, w2 = h.supervisor("w1", w1_store), h.supervisor("w2", h.store.peer())
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await trio.sleep(5.0)
        await nursery.start(w2.run)
        await trio.sleep(0.1)
        if how == "sigterm":
            w1.request_shutdown()
        else:
            await h.store.request_drain("w1", wall_now=1.0)
        with trio.fail_after(DURATION / 2 - 0.2):  # before w1's shards dwelt: no rebalance
            while {o for o, _ in (await h.owners()).values()} != {"w2"}:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert w1_store.states and set(w1_store.states) == {"draining"}


async def test_a_drain_names_no_peer_that_retired_since_the_last_round(autojump_clock):
    """A rolling deploy stops hosts one after another: w2 retires between w1's last round and
    w1's SIGTERM. w1 reads the worker items again before naming successors, so it releases
    plainly at once instead of asking w2 and waiting out handoff_timeout for no answer."""
    h = Harness(shards=2)
    w1, w2 = h.two()
    async with trio.open_nursery() as nursery:
        await nursery.start(w1.run)
        await trio.sleep(5.0)
        async with trio.open_nursery() as second:
            await second.start(w2.run)
            await trio.sleep(1.5)  # w1's round at t = 6 saw w2 running
            assert w1.tracker.is_live_member("w2", trio.current_time())
            w2.request_shutdown()
        assert {s for s, (o, _) in (await h.owners()).items() if o == "w1"} == {"s0", "s1"}
        drain_started = trio.current_time()
        w1.request_shutdown()
    assert trio.current_time() - drain_started < LeaseConfig().handoff_timeout
    items = (await h.store.snapshot()).shards
    assert [(s.owner, s.successor) for s in items] == [("", ""), ("", "")]
