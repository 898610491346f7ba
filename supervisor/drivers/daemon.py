"""The supervisor's driver: heartbeat, reconcile, lease watchdog and drain, as trio loops.

Only this module (and the runners) read the clock or sleep. Each loop observes (the store, its
runners, the clock), asks a pure core, and acts: ``core.planner`` and ``core.round_policy``
(what a round takes, sheds, loses; when it scans), ``core.handoff`` (why a held shard leaves,
to whom) and ``core.make_before_break`` (how), ``core.shard_set`` (what may run; reloads),
``core.health`` (readiness, the host quarantine, status and metrics). Standby runners and
the successor's side of a hand-off are ``drivers.standbys``; the peers' liveness (the round's
read of the workers, watch reads, death notices, announcements) is ``drivers.liveness``. One
``Supervisor`` per process.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence

import attrs
import trio

from shard_worker.contract.table import (
    FEATURE_HANDOFF_NOTICE,
    FEATURE_HANDOVER,
    FEATURE_MBB,
    FEATURE_P2,
)
from supervisor import exit_codes
from supervisor.adapters.http_endpoint import Response
from supervisor.adapters.lease_store.base import (
    DeclaredDead,
    LeaseConflict,
    LeaseStore,
    LeaseStoreError,
    StoreUnavailable,
    TableMissing,
    WorkerIdTaken,
)
from supervisor.adapters.metrics import Metrics
from supervisor.adapters.sd_notify import Notifier
from supervisor.adapters.spawn import Spawn, fresh_spawner
from supervisor.config.loading import ConfigError
from supervisor.config.model import Config, ShardConfig
from supervisor.config.shard_spec import decode_spec
from supervisor.core import (
    fleet_round,
    handoff,
    health,
    make_before_break,
    planner,
    round_policy,
    routing,
    shard_set,
)
from supervisor.core.handoff import LeaveReason
from supervisor.core.health import SupervisorState
from supervisor.core.items import HandoffRequest, ShardItem, Snapshot, WorkerItem
from supervisor.core.lease import OwnLease
from supervisor.core.make_before_break import Adoption
from supervisor.core.membership import worker_of
from supervisor.core.partition_keys import VACANT_BUCKETS, start_spot, vacant_buckets
from supervisor.core.planner import Take, plan_round
from supervisor.core.runner_state import RunnerState
from supervisor.core.standby import StandbyPriority
from supervisor.core.standby_ring import RingPlacement
from supervisor.drivers.handoff import TAKEN, ShardWatch
from supervisor.drivers.liveness import STORE_WRITE_TIMEOUT, Liveness
from supervisor.drivers.reporting import Reporter
from supervisor.drivers.ring_standbys import RingStandbys
from supervisor.drivers.shard_runner import RunnerContext, ShardRunner
from supervisor.drivers.standbys import StandbyKeeper
from supervisor.drivers.together import both

log = logging.getLogger("shardvisor.supervisor")

# A round's takes run this many at once: a cold start of many shards waits one request per
# batch rather than per shard (each take is its own conditional write; the client bounds the
# requests in flight anyway).
TAKES_AT_ONCE = 8
MEMBERS_READ_TIMEOUT = 1.0  # a drain's fresh read of the worker items (at most a tenth of it)
RELEASE_HANDED_OVER_TIMEOUT = 5.0  # releasing a shard handed over while we stop taking
NOTICE_CLEAR_TIMEOUT = 2.0  # clearing an answered request's notice: best effort
VACANT_READS_AT_ONCE = 16  # protocol 2: a short worker's vacant buckets, read side by side


class Supervisor:
    def __init__(
        self,
        config: Config,
        worker_id: str,
        store: LeaseStore,
        *,
        spawn: Spawn | None = None,
        now: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        notifier: Notifier | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self.store = store
        self.session = uuid.uuid4().hex
        self.now, self.wall = now, wall
        lease = config.lease
        self.lease = OwnLease(lease.duration, lease.effective_safety_margin)
        spawn = spawn or fresh_spawner(config.supervisor.worker_command)
        self.metrics = metrics or Metrics()
        self.liveness = Liveness(lease, worker_id, store, self.metrics, now)
        self.tracker = self.liveness.tracker
        self.metrics.info.labels(worker_id).set(1)
        self.metrics.watch(self.metrics_state)
        if hasattr(store, "observer"):
            store.observer = self.metrics.observe_store
        self.watch = ShardWatch(store)  # the hand-offs' shard reads, batched
        self.fleet = store.fleet()  # protocol 2's requests
        self.protocol = 1  # the table's, from the meta item (start-up, then every round)
        self._own_read_at: float | None = None  # protocol 2: our items' last consistent read
        self._mailbox_seen = 0  # our item's mailbox as of that read
        self._own_unheld = False  # it showed items of ours we do not run: read again
        self._short_scan_at = float("-inf")  # protocol 2: when we last read every bucket
        self._sweep_at = float("-inf")  # protocol 2: our last sweep of dead members' shards
        self._addressed: tuple[tuple[ShardItem, ...], float] | None = None  # the poll's last
        self._unrunnable: dict[str, float] = {}  # listed for us, no definition to run: since
        self.ctx = RunnerContext(
            config,
            worker_id,
            store,
            self.lease,
            spawn,
            now,
            self.session,
            self.metrics,
            wall,
            self.watch,
        )
        self.keeper = StandbyKeeper(self.ctx, self._start_standby)
        self.ring = RingStandbys(  # protocol 2's standby placement
            worker_id, self.fleet, config.standby.count, _standby_overrides(config.shards)
        )
        self.liveness.first_standby = self.ring.first
        self._advertised: tuple[str, ...] | None = None  # standbys our item shows
        self._announced_state = ""  # our item's state as last announced (membership)
        self._advertised_held: int | None = None  # the shard count our item shows
        self.heartbeat_problem: str | None = "no heartbeat yet"  # None: the last one landed
        # Held around each heartbeat write, and by the drain's retire: once our item says
        # "stopped", no heartbeat (sent a moment earlier, still in flight) overwrites it.
        self._heartbeat_lock = trio.Lock()
        self._retired = False
        self.runners: dict[str, ShardRunner] = {}
        self.recently_shed: dict[str, float] = {}
        self.quarantined_at: dict[str, float] = {}  # released for another host to try
        self.state = SupervisorState.STARTING
        self.exit_code = exit_codes.OK
        self._shutdown = trio.Event()
        self._fast = False
        self._nursery: trio.Nursery | None = None
        self._shards = {s.id: s for s in config.shards}  # from the TOML file (SIGHUP reloads)
        # Every shard this worker may run: the TOML ones, and the ones registered in the
        # table (`shardvisor shards add`), as of the last full scan.
        self._runnable: dict[str, ShardConfig] = dict(self._shards)
        self._spec_reports = shard_set.SpecReports()  # invalid registered specs, logged once
        self.notifier = notifier if notifier is not None else Notifier()  # $NOTIFY_SOCKET
        self._ready_sent = False
        self.operator_drain = False  # `shardvisor drain`: hand everything off, take nothing
        self._snapshot: Snapshot | None = None  # the last full scan (workers: last round's)
        self._scans = round_policy.ScanSchedule(lease.full_scan_interval)
        self._taking: set[str] = set()
        self._registered_at = float("inf")
        self._host = health.HostQuarantine(config.supervisor.restart_window)
        # The fleet page (/ and /fleet) and CloudWatch EMF: built from what rounds read.
        self.reporter = Reporter(
            config,
            worker_id,
            self.metrics,
            now=now,
            wall=wall,
            snapshot=lambda: self._snapshot,
            local=self.local_status,
            runners=lambda: self.runners,
            read_ago=lambda: {w: self.now() - at for w, at in self.liveness.item_read_at.items()},
        )

    # --- control -------------------------------------------------------------------------------

    def request_shutdown(self) -> None:
        """First call drains gracefully; a second call takes the fast path."""
        if self._shutdown.is_set():
            if not self._fast:
                log.warning("second stop signal: fast shutdown")
                self._fast = True
                for runner in list(self.runners.values()):
                    runner.request_stop(LeaveReason.FAST_SHUTDOWN, 0.0)
                self.keeper.stop_all(LeaveReason.FAST_SHUTDOWN)
            return
        self._shutdown.set()

    async def reload(self, config: Config) -> None:
        """SIGHUP: take the shard list of a re-read config file. Only shards whose definition
        changed restart (handed back to ourselves: a new epoch, resumed from the checkpoint);
        removed ones are handed off; added ones are registered. Other settings need a restart."""
        diff = shard_set.diff_reload(self.config, self._shards, config)
        if diff.ignored:
            log.warning(
                "reload: [%s] changed; those settings apply at the next restart",
                "] [".join(diff.ignored),
            )
        log.info(
            "reload: %d shards added, %d removed, %d changed, %d unchanged",
            len(diff.added),
            len(diff.removed),
            len(diff.changed),
            diff.unchanged,
        )
        for shard_id in diff.added:
            await self.store.ensure_shard(shard_id)
        configured, self._shards = self._shards, dict(diff.shards)
        self.ring.overrides = _standby_overrides(self._shards.values())
        if self.protocol == 2:  # registered shards' definitions as learned, not from a scan
            learned = {s: c for s, c in self._runnable.items() if s not in configured}
            self._runnable = {**learned, **self._shards}
            self._unrunnable.clear()
        elif self._snapshot is not None:
            self._refresh_runnable(self._snapshot)
        else:
            self._runnable = dict(diff.shards)
        for shard_id in shard_set.restart_on_reload(diff.changed, self.runners):
            log.info("reload: definition changed, restarting", extra={"shard": shard_id})
            self.runners[shard_id].request_stop(
                LeaveReason.DEFINITION_CHANGED, self._stop_grace(), successor=self.worker_id
            )
        # Standbys of changed shards hold the old streams: the next round starts them anew.
        self.keeper.stop(diff.changed, LeaveReason.DEFINITION_CHANGED)
        self._scans.invalidate()  # removed shards are handed off by the next round

    # --- main ----------------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> int:
        try:
            await self._start_up()
        except TableMissing as exc:
            log.error("%s", exc)
            return exit_codes.STORE_UNAVAILABLE
        except StoreUnavailable as exc:
            log.error("lease store unreachable at start-up: %s", exc)
            return exit_codes.STORE_UNAVAILABLE
        self.state = SupervisorState.RUNNING
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._heartbeat_loop)
            nursery.start_soon(self._reconcile_loop)
            nursery.start_soon(self._lease_watchdog)
            await nursery.start(self.liveness.run)
            nursery.start_soon(self.watch.run)
            if self.config.lease.handoff_poll_interval > 0:
                nursery.start_soon(self._handoff_poll_loop)
            if self.config.cloudwatch.emf:
                nursery.start_soon(self.reporter.emf_loop)
            if self.notifier.watchdog_interval:
                nursery.start_soon(self._systemd_watchdog, self.notifier.watchdog_interval)
            task_status.started()
            await self._shutdown.wait()
            await self._drain()
            nursery.cancel_scope.cancel()
        self.state = SupervisorState.STOPPED
        self.notifier.close()
        return self.exit_code

    async def _start_up(self) -> None:
        # An outage shorter than a lease is ridden out; a longer one exits 75 (retry later).
        deadline = self.now() + self.config.lease.duration
        delay = 0.2
        while True:
            try:
                await self._register()
                return
            except StoreUnavailable as exc:
                if self.now() + delay > deadline:
                    raise
                log.warning("lease store unreachable, retrying in %.1fs: %s", delay, exc)
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _register(self) -> None:
        created = await self.store.ensure_table(self.config.dynamodb.create_table)
        if created:
            log.info("created table %s", self.config.dynamodb.table)
        for shard_id in self._shards:
            await self.store.ensure_shard(shard_id)
        self._use_protocol((await self.fleet.read_meta()).protocol)
        sent = self.now()
        await self._write_own_item("join")
        await self.liveness.clear_death_marker(self.worker_id)  # our earlier incarnation's
        self._registered_at = sent
        self.lease.heartbeat_succeeded(sent)
        log.info(
            "registered worker %s with %d configured shards",
            self.worker_id,
            len(self._shards),
            extra={"worker": self.worker_id},
        )

    def _worker_item(self) -> WorkerItem:
        """Our item as registration writes it (the counter goes on from the stored one's)."""
        wall = self.wall()
        return WorkerItem(
            id=self.worker_id,
            session=self.session,
            counter=0,
            state="running",
            heartbeat_at=wall,
            started_at=wall,
            host=socket.gethostname(),
            pid=os.getpid(),
            max_shards=self.config.worker.max_shards,
            max_standbys=self.config.worker.max_standbys,
            features=self._features(),
        )

    def _features(self) -> frozenset[str]:
        """What this version does; ``p2``: it runs protocol 2, so `init-table --protocol 2`
        may flip the fleet."""
        return frozenset({FEATURE_MBB, FEATURE_HANDOVER, FEATURE_HANDOFF_NOTICE, FEATURE_P2})

    def _use_protocol(self, protocol: int) -> None:
        """Switch at a round's boundary when the meta item's ``protocol`` moved (a flip by
        `init-table --protocol 2`, or its rollback)."""
        protocol = 2 if protocol >= 2 else 1
        if protocol == self.protocol:
            return
        log.warning("the fleet runs protocol %d from now on", protocol)
        self.protocol = protocol
        self.liveness.protocol = protocol
        self._own_read_at = None  # protocol 2 starts with a consistent read of our items
        self._scans.invalidate()  # protocol 1 starts with a scan

    async def _rejoin(self, why: str) -> None:
        """Our item says ``dead`` (protocol 2): a watcher declared us dead while our lease had
        lapsed. Every child stops; the item is written afresh (``running``, our session) and
        the change announced; shards come back only through conditional takes."""
        log.error("%s: stopping every shard and joining again", why)
        self._lose_all(why)
        self._own_read_at = None
        await self._write_own_item("rejoin")

    async def _write_own_item(self, why: str) -> None:
        """Our item written afresh (registration), what it advertises noted, the change
        announced."""
        item = self._worker_item()
        await self.store.register_worker(item)
        self._advertised = item.standbys
        self._announced_state = item.state
        self._advertised_held = 0
        await self._announce_own(why)

    # --- loops ---------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.config.lease.heartbeat_interval
        while True:
            sent = self.now()
            await self._heartbeat_once(sent)
            await trio.sleep(max(0.0, sent + interval - self.now()))

    async def _heartbeat_once(self, sent: float) -> None:
        state = health.heartbeat_state(
            shutting_down=self._shutdown.is_set(), operator_drain=self.operator_drain
        )
        ready = self.keeper.ready()
        standbys = ready if ready != self._advertised else None  # written only when changed
        count = sum(1 for runner in self.runners.values() if runner.state.holds_lease)
        held = count if count != self._advertised_held else None  # likewise
        try:
            async with self._heartbeat_lock:
                if self._retired:
                    return
                with trio.fail_after(self.config.lease.duration / 2):
                    self.liveness.own = await self.store.heartbeat(
                        self.worker_id,
                        self.session,
                        state,
                        self.wall(),
                        standbys,
                        held,
                        # Protocol 2: a heartbeat rewrites our state only when it changed
                        # (the fleet index projects it; an unchanged one costs an index write).
                        # Protocol 1 writes it every time: a late heartbeat must undo a
                        # death notice there, and nothing projects it.
                        not_dead=self.protocol == 2,
                        write_state=self.protocol != 2 or state != self._announced_state,
                    )
                self._advertised = ready
                self._advertised_held = count
            if standbys is not None or state != self._announced_state:
                self._announced_state = state
                await self._announce_own("state")  # peers re-read every worker item
        except (StoreUnavailable, trio.TooSlowError) as exc:
            log.warning("heartbeat failed: %s", str(exc) or "timed out")
            self.metrics.heartbeat_failures.inc()
            self.heartbeat_problem = str(exc) or "timed out"
            return
        except DeclaredDead:
            try:
                with trio.fail_after(self.config.lease.duration / 2):
                    await self._rejoin("our item says we were declared dead")
            except (LeaseStoreError, trio.TooSlowError) as exc:
                log.warning("could not join again: %s (next heartbeat)", str(exc) or "timeout")
            self.heartbeat_problem = "declared dead; joining again"
            return
        except WorkerIdTaken:
            log.error(
                "worker id %s is now used by another process: stopping all shards", self.worker_id
            )
            self._lose_all("worker id taken over by another process")
            self.exit_code = exit_codes.CONFIG
            self.request_shutdown()
            return
        self.metrics.heartbeat.observe(self.now() - sent)
        self.heartbeat_problem = None
        if not self.lease.is_valid(sent):
            # Our lease lapsed before this heartbeat was sent (a freeze, a long outage):
            # peers may own our shards now. Never extend a fence across that gap.
            self._lose_all("own lease lapsed before the heartbeat")
            await self._announce_own("rejoin")  # a watcher may have declared us dead meanwhile
        self.lease.heartbeat_succeeded(sent)
        deadline = self.lease.valid_until
        for runner in list(self.runners.values()):
            await runner.fence(deadline)
        if not self._ready_sent:
            self._ready_sent = True
            self.notifier.notify(ready=1, status=self._status_line())

    async def _announce_own(self, why: str) -> None:
        """Announce a change of our own item, then record on it the generation that announced
        it (``mgen``, for protocol 2's readers of the member list). Both bounded, best
        effort: a lost announcement is made by our watchers; a lost record costs a
        protocol-2 reader one more read of the member list."""
        generation = await self.liveness.announce(why)
        if generation is None:
            return
        with trio.move_on_after(STORE_WRITE_TIMEOUT):
            try:
                await self.store.record_membership(self.worker_id, self.session, generation)
            except LeaseConflict:
                pass  # a later change was recorded meanwhile, or our session is gone
            except LeaseStoreError as exc:
                log.warning("membership change (%s) not recorded on our item: %s", why, exc)

    async def _advertise_state(self, timeout: float) -> None:
        """A heartbeat now, not at the next beat: peers stop counting us as a taker (a drain)
        or count us again (its undo) within one write. Bounded; the loop's beats go on."""
        with trio.move_on_after(timeout):
            await self._heartbeat_once(self.now())

    async def _lease_watchdog(self) -> None:
        while True:
            remaining = self.lease.valid_until - self.now()
            if remaining <= 0:
                if self.runners:
                    self._lose_all("own lease expired: heartbeats are failing")
                await trio.sleep(self.config.lease.heartbeat_interval / 4)
            else:
                await trio.sleep(remaining)

    async def _systemd_watchdog(self, interval: float) -> None:
        """WATCHDOG=1 while ``health.watchdog_ok``: loop on time, lease valid."""
        while True:
            before = self.now()
            await trio.sleep(interval)
            lag = self.now() - before - interval
            if health.watchdog_ok(
                lag=lag, interval=interval, lease_valid=self.lease.is_valid(self.now())
            ):
                self.notifier.notify(watchdog=1)
            else:
                log.warning(
                    "withholding the systemd watchdog: lag %.3fs, lease valid %s",
                    lag,
                    self.lease.is_valid(self.now()),
                )

    def _status_line(self) -> str:
        return health.status_line(self.state, self.runners)

    def _lose_all(self, reason: str) -> None:
        """Every child stops; its shard items may still name us (our lease lapsed and nobody
        took them: a freeze shorter than the peers' lease). On protocol 2 nothing else would
        put them back in a round's view before the backstop: the next round reads our own
        items, and takes them back or leaves them to their standbys."""
        for runner in list(self.runners.values()):
            runner.lose(reason)
        self._own_unheld = True

    async def _reconcile_loop(self) -> None:
        while True:
            try:
                await self._reconcile_once()
                if self._scans.deferred:  # a death's round planned on the last scan: now scan
                    await self._reconcile_once()
            except StoreUnavailable as exc:
                log.warning("reconcile skipped: %s", exc)
            await self.liveness.next_round(self.config.lease.reconcile_interval)

    async def _reconcile_once(self) -> None:
        """One round: observe (protocol 1: the workers, the vacancies, now and then the whole
        table; protocol 2: what concerns this worker), then plan and act alike."""
        if self.protocol == 2:
            snapshot, requests, scan, shard_count = await self._observe_fleet()
        else:
            snapshot, requests, scan = await self._observe_table()
            shard_count = None
        read = self.liveness.last_read
        if read is not None and read.consistent:
            self._use_protocol(read.protocol)  # a flip (or its rollback) from the next round
        now = self.now()
        for runner in self.runners.values():
            successor = runner.handing_off_to
            if successor and not self.tracker.is_live_member(successor, now):
                runner.successor_left()  # it will not answer: fall back now, not at the timeout
        await self._plan_and_act(snapshot, requests, scan, shard_count)

    async def _observe_table(self) -> tuple[Snapshot, tuple[HandoffRequest, ...], bool]:
        """Protocol 1: reads the worker items and the vacant shards; scans the whole table only
        when ``round_policy.ScanSchedule`` says so: a steady fleet reads O(workers) per round."""
        workers, listing = await both(self.liveness.read_members, self.store.vacancies)
        now = self.now()
        vacant = listing.shards
        scan = self._scans.due(self._signature(workers, vacant, now), now)
        if scan:
            # Eventually consistent: half the read units of protocol 1's largest read. A
            # stale item only shows an older state (an earlier epoch, a shard not created
            # yet): takes stay conditional on what was seen, a lost lease is confirmed by a
            # consistent read before its child stops (``_confirm_lost``), and the workers are
            # the round's own consistent read, not the scan's.
            snapshot = attrs.evolve(await self.store.snapshot(consistent=False), workers=workers)
            now = self.now()
            self._scans.scanned(now)
            self._refresh_runnable(snapshot)
            listed = {item.id for item in snapshot.shards}
            if any(shard.id not in listed for shard in vacant):
                # The vacancies (read just before) list a shard the scan does not: it read a
                # replica that lags, and a shard registered since would wait for the next
                # periodic scan to become runnable. Scan again next round instead.
                self._scans.invalidate()
        else:
            assert self._snapshot is not None
            snapshot = attrs.evolve(self._snapshot, workers=workers)
        self._snapshot = snapshot
        self._scans.saw(self._signature(workers, vacant, now))
        return snapshot, listing.requests, scan

    async def _plan_and_act(
        self,
        snapshot: Snapshot,
        requests: Sequence[HandoffRequest],
        scan: bool,
        shard_count: int | None,
    ) -> None:
        now = self.now()
        draining = self.operator_drain
        self._apply_operator_requests(snapshot, now)
        if self.operator_drain != draining:
            await self._advertise_state(MEMBERS_READ_TIMEOUT)
        accepting = self._accepting(now)
        if self.protocol == 2:
            priority = await self._place_on_ring(snapshot, accepting, now)
        else:
            priority = await self.keeper.place(
                snapshot,
                tracker=self.tracker,
                runnable=self._runnable,
                accepting=accepting,
                now=now,
            )
        active = {sid: r for sid, r in self.runners.items() if r.state.holds_lease}
        plan = plan_round(
            me=self.worker_id,
            held={sid: r.epoch for sid, r in active.items()},
            held_since={sid: r.taken_at for sid, r in active.items()},
            shards=snapshot.shards,
            configured=self._runnable,
            tracker=self.tracker,
            now=now,
            accepting=accepting,
            min_dwell=self.config.lease.duration,
            recently_shed=self.recently_shed,
            quarantined=self.quarantined_at,
            max_shards=self.config.worker.max_shards,
            peer_caps={w.id: w.max_shards for w in snapshot.workers},
            standby_claims=priority.claims,
            standby_waiting=priority.waiting,
            shard_count=shard_count,
        )
        warm = round_policy.warmed_up(now, self._registered_at, self.config.lease.duration)
        actions = round_policy.act_on_plan(
            plan, me=self.worker_id, scanned=scan, warm=warm, held=self.runners
        )
        for shard_id in await self._confirm_lost(actions.lose):
            self.runners[shard_id].lose("the table shows another owner or epoch")
        shed = actions.shed
        if shed and self.protocol == 2:  # name successors from current counts
            await self._observe_members(MEMBERS_READ_TIMEOUT)
            shed = tuple(sid for sid in shed if sid in self.runners)  # not ended meanwhile
        successors = self._successors(shed)
        for shard_id in shed:
            log.info("handing off for balance", extra={"shard": shard_id})
            self.recently_shed[shard_id] = now
            self._leave(shard_id, LeaveReason.REBALANCE, successors.get(shard_id, ""))
        running = self.runners.keys() | self._taking
        handed = await self._hand_back(snapshot, running, now) if warm else set()
        async with trio.open_nursery() as nursery:  # a cold start's takes side by side
            limiter = trio.CapacityLimiter(TAKES_AT_ONCE)
            for take in actions.take:
                if take.shard_id not in handed:
                    nursery.start_soon(self._take_when_valid, take, limiter)
        owned = self.runners.keys() | self._taking
        if self.protocol == 2:
            items = await self._standby_items(owned)
            held = {sid: r.epoch for sid, r in self.runners.items() if r.state.holds_lease}
            await self.ring.write_markers(held)
        else:
            items = {item.id: item for item in snapshot.shards}
        self.keeper.apply(items, self._runnable, owned, self.now())
        try:
            await self.keeper.check_coverage()
        except StoreUnavailable as exc:
            log.debug("standby coverage not read: %s", exc)
        if self.config.lease.handoff_poll_interval == 0 and accepting:
            await self._answer_handoff_requests(requests)
        self.notifier.notify(status=self._status_line())

    async def _hand_back(self, snapshot: Snapshot, running, now: float) -> set[str]:
        """``StandbyKeeper.hand_back``; on protocol 2 the first standbys' readiness is read
        from their items (strongly consistent, only while our name is on shards we do not run:
        after a restart under our own id)."""
        ready = None
        if self.protocol == 2:
            firsts = self.keeper.firsts_of_ours(snapshot.shards, running)
            ready = {}
            if firsts:
                read = await self.store.read_worker_items(firsts)
                ready = {worker.id: worker.standbys for worker in read.workers}
        return await self.keeper.hand_back(
            snapshot, running=running, tracker=self.tracker, now=now, ready=ready
        )

    # --- protocol 2's round ----------------------------------------------------------------------

    async def _place_on_ring(
        self, snapshot: Snapshot, accepting: bool, now: float
    ) -> StandbyPriority:
        """Protocol 2's standby placement (``drivers.ring_standbys``): the ring of the running
        members (us while we take shards), our arcs' registered shards (their definitions
        read once), the markers naming us."""
        me = self.worker_id
        if self.ring.widest() <= 0:  # no standby wanted: no ring, no reads
            return self.keeper.place_on_ring(RingPlacement(), {})
        live = {m.id for m in self.liveness.members if m.state == "running"}
        live = live | {me} if accepting else live - {me}
        read = self.liveness.last_read
        registered = await self.ring.refresh(
            live=live,
            configured=self._shards,
            shardgen=read.shardgen if read is not None else 0,
            now=now,
            marker_period=self.config.lease.duration,
        )
        unknown = sorted(s for s in registered if s not in self._runnable)
        await self._learn_definitions([ShardItem(s, "", 0) for s in unknown])
        holding = self.runners.keys() | self._taking
        cap = self.config.worker.max_standbys
        placement = self.ring.place(self._runnable, holding, cap) if accepting else None
        held = {
            item.id: self.ring.standbys_of(item.id, me)
            for item in snapshot.shards
            if item.owner == me
        }
        return self.keeper.place_on_ring(placement or RingPlacement(), held)

    async def _standby_items(self, owned) -> dict[str, ShardItem]:
        """Protocol 2: the items of the shards whose standby starts now (their epoch and
        checkpoint), one consistent batch; unread, they start next round."""
        starting = self.keeper.to_start(self._runnable, owned, self.now())
        if not starting:
            return {}
        try:
            return await self.store.read_shards(starting)
        except StoreUnavailable as exc:
            log.warning("standbys not started this round: %s", exc)
            return {}

    async def _observe_fleet(self) -> tuple[Snapshot, tuple[HandoffRequest, ...], bool, int]:
        """Protocol 2: no scan. The round plans on what concerns us (``core.fleet_round``): the
        shards we run, those addressed to us, a page of our vacant buckets while we are short
        of our target, and our own items read strongly consistently when our mailbox moved
        (``release``, ``shards remove``), at the first round and every ``OWN_BACKSTOP``; the
        targets count the fleet's shards (the configured ones and the meta item's count of
        registered ones)."""
        workers = await self.liveness.read_members()
        read = self.liveness.last_read
        members = self.liveness.members
        me, now = self.worker_id, self.now()
        own = next((w for w in workers if w.id == me), None)
        mailbox = own.mailbox if own is not None else 0
        held = {sid: r.epoch for sid, r in self.runners.items() if r.state.holds_lease}
        consistent: dict[str, ShardItem] = {}
        if fleet_round.own_read_due(
            read_at=self._own_read_at,
            mailbox_seen=self._mailbox_seen,
            mailbox=mailbox,
            now=now,
            backstop=fleet_round.OWN_BACKSTOP,
            unheld=self._own_unheld,
        ):
            listed = await self.fleet.owned_by(me)
            consistent = await self.store.read_shards({*held, *(item.id for item in listed)})
            self._own_read_at, self._mailbox_seen = now, mailbox
            self._own_unheld = any(
                item.owner == me and sid not in held for sid, item in consistent.items()
            )
        addressed = await self._addressed_to_me(now)
        shard_count = len(self._shards) + (read.registered_count if read is not None else 0)
        vacant: list[ShardItem] = []
        if self._accepting(now):
            cap = self.config.worker.max_shards
            target = fleet_round.targets(members, shard_count, me, cap, True).get(me, 0)
            if len(held) + len(self._taking) < target:
                vacant = await self._read_vacant(members, now, bool(addressed))
        await self._learn_definitions([*consistent.values(), *addressed, *vacant])
        shards = fleet_round.shard_view(
            vacant=vacant, addressed=addressed, held=held, me=me, consistent=consistent
        )
        self._snapshot = Snapshot(workers=workers, shards=shards)
        busy = self.runners.keys() | self._taking
        requests = fleet_round.poll_actions(addressed, me, self._runnable, busy).requests
        await self._sweep(now)
        return self._snapshot, requests, bool(consistent), shard_count

    async def _addressed_to_me(self, now: float) -> tuple[ShardItem, ...]:
        """``successor = <me>``: the hand-off poll's last answer when it is at most two polls
        old (it reads the same every 250 ms), else a query of our own."""
        poll = self.config.lease.handoff_poll_interval
        if self._addressed is not None and poll > 0 and now - self._addressed[1] <= 2 * poll:
            return self._addressed[0]
        return await self.fleet.addressed_to(self.worker_id)

    async def _read_vacant(self, members, now: float, addressed: bool) -> list[ShardItem]:
        """Our vacant buckets (dealt alike by every member from the view), each read from our
        own starting point; still short with nothing found and nothing addressed to us, every
        bucket at most once a lease (a shard left in a bucket whose readers are full)."""
        live = [m.id for m in members if m.state == "running"]
        turn = int(now / self.config.lease.reconcile_interval)
        found = await self._read_buckets(vacant_buckets(self.worker_id, live), turn)
        if not found and not addressed and now - self._short_scan_at >= self.config.lease.duration:
            self._short_scan_at = now
            found = await self._read_buckets(range(VACANT_BUCKETS), turn)
        return list({item.id: item for item in found}.values())

    async def _read_buckets(self, numbers, turn: int) -> list[ShardItem]:
        found: list[ShardItem] = []
        limiter = trio.CapacityLimiter(VACANT_READS_AT_ONCE)

        async def read(number: int) -> None:
            async with limiter:
                found.extend(
                    await self.fleet.vacant_in(number, start_spot(self.worker_id, number, turn))
                )

        async with trio.open_nursery() as nursery:
            for number in numbers:
                nursery.start_soon(read, number)
        return found

    async def _learn_definitions(self, items: Sequence[ShardItem]) -> None:
        """The definitions of registered shards listed for us that we do not know yet (`shards
        add` writes them on the shard item, which no index projects): one consistent read of
        those items. A shard with no definition we can run is looked at again after a while
        (it may be registered again)."""
        now = self.now()
        forget = self.config.lease.duration * 6
        self._unrunnable = {s: at for s, at in self._unrunnable.items() if now - at < forget}
        unknown = {
            item.id: item
            for item in items
            if item.id not in self._runnable and item.id not in self._unrunnable
        }
        if not unknown:
            return
        found = dict(unknown)
        missing = [sid for sid, item in unknown.items() if not item.spec]
        if missing:
            found.update(await self.store.read_shards(missing))
        for shard_id in sorted(unknown):
            item = found.get(shard_id)
            if item is None or not item.spec or item.retired_at:
                self._unrunnable[shard_id] = now
                continue
            shard = self._decode_registered(item)
            if shard is None:
                self._unrunnable[shard_id] = now
            else:
                self._runnable[shard_id] = shard

    async def _sweep(self, now: float) -> None:
        """Protocol 2's backstop: one member per period (``routing.sweeper``, alike from the
        same view) routes the shards still owned by members that are gone (a death whose
        watchers died too, a drain that overran): ``Liveness.route``, which confirms each is
        still gone before it writes."""
        members = self.liveness.members
        live = [m.id for m in members if m.state == "running"]
        if now - self._sweep_at < routing.SWEEP_PERIOD:
            return
        if routing.sweeper(live, self.wall()) != self.worker_id:
            return
        self._sweep_at = now
        for member in members:
            if member.state in ("stopped", "dead") and member.id != self.worker_id:
                await self.liveness.route(member.id, unrouted_only=True)

    async def _confirm_lost(self, shard_ids: Sequence[str]) -> list[str]:
        """The shards the scan showed lost that a strongly consistent read confirms: owned by
        another, at a later epoch, or gone. A replica may lag (a shard registered and taken
        since shows no item yet); the read costs nothing while nothing was lost. Unread
        (the store failed), nothing is lost this round: our fenced writes find out anyway."""
        if not shard_ids:
            return []
        try:
            items = await self.store.read_shards(shard_ids)
        except StoreUnavailable as exc:
            log.warning("a lost lease not confirmed, checked next round: %s", exc)
            return []
        held = {sid: self.runners[sid].epoch for sid in shard_ids if sid in self.runners}
        return list(planner.lost_leases(held, items, self.worker_id))

    def _accepting(self, now: float) -> bool:
        return round_policy.accepting(
            shutting_down=self._shutdown.is_set(),
            operator_drain=self.operator_drain,
            lease_valid=self.lease.is_valid(now),
        )

    def _leave(
        self, shard_id: str, why: LeaveReason, successor: str, *, budget: float | None = None
    ) -> None:
        """Ask a runner to hand its shard off gracefully: make-before-break where it applies
        (``make_before_break.plan_handoff``: ``budget`` is what a SIGTERM's drain has left)."""
        runner = self.runners[shard_id]
        self.reporter.events.leaving(shard_id, successor, self.now())
        grace = 0.0 if self._fast else self._stop_grace()
        workers = self._snapshot.workers if self._snapshot is not None else ()
        features = next((w.features for w in workers if w.id == successor), frozenset())
        plan = make_before_break.plan_handoff(
            me=self.worker_id,
            successor=successor,
            streams=runner.shard.streams,
            successor_features=features,
            child_ready=runner.state is RunnerState.RUNNING,
            fast=self._fast,
            budget=budget,
            handoff_timeout=self.config.lease.handoff_timeout,
            stop_grace=grace,
        )
        runner.request_stop(why, grace, successor=successor, plan=plan)

    def _signature(self, workers, vacant, now: float) -> tuple[object, ...]:
        return round_policy.round_signature(
            self.worker_id, self.tracker.membership(now), vacant, workers
        )

    def _refresh_runnable(self, snapshot: Snapshot) -> None:
        """TOML shards, plus the registered ones (``shard_set.registered_candidates``). A
        registered shard the scan does not list at all stays runnable: the scan is
        eventually consistent, a shard's item is never deleted (``shards remove`` retires it,
        which the scan shows), so an absent item is one registered too recently to show."""
        listed = {item.id for item in snapshot.shards}
        runnable = {
            sid: shard
            for sid, shard in self._runnable.items()
            if sid not in self._shards and sid not in listed
        }
        runnable.update(self._shards)
        for item in shard_set.registered_candidates(self._shards, snapshot.shards):
            shard = self._decode_registered(item)
            if shard is not None:
                runnable[item.id] = shard
        self._runnable = runnable

    def _decode_registered(self, item: ShardItem) -> ShardConfig | None:
        """A registered shard's definition (`shards add`), or None when its spec is invalid
        (logged once per spec)."""
        try:
            return decode_spec(item.id, item.spec)
        except ConfigError as exc:
            if self._spec_reports.first_time(item.id, item.spec):
                log.error(
                    "registered shard %s has an invalid spec, not running it: %s",
                    item.id,
                    "; ".join(exc.problems),
                )
            return None

    async def _handoff_poll_loop(self) -> None:
        """Shards handed to us by name (drain, rebalance, `release`) and make-before-break
        requests naming us: found within one poll rather than at the next reconcile. One
        small index query per poll (its vacancies list both)."""
        interval = self.config.lease.handoff_poll_interval
        while True:
            await trio.sleep(interval)
            if not self._accepting(self.now()):
                continue
            try:
                if self.protocol == 2:
                    await self._poll_fleet()
                else:
                    await self._poll_table()
            except StoreUnavailable as exc:
                log.debug("hand-off poll skipped: %s", exc)

    async def _poll_table(self) -> None:
        """Protocol 1: the ``vacant`` roster lists vacant shards, notices and death markers."""
        listing = await self.store.vacancies()
        self.liveness.deaths_listed(listing.deaths)  # a round now, if a peer died
        for shard in round_policy.handoff_takes(listing.shards, self.worker_id, self._runnable):
            # Checked per take: a SIGTERM or drain may arrive while a take is in flight.
            if self._accepting(self.now()):
                await self._take(shard.id, "", shard.epoch)
        await self._answer_handoff_requests(listing.requests)

    async def _poll_fleet(self) -> None:
        """Protocol 2: ``successor = <me>`` lists what is addressed to us alone: shards
        released to us, a dead owner's shards routed to us, make-before-break requests."""
        addressed = await self.fleet.addressed_to(self.worker_id)
        self._addressed = (addressed, self.now())
        await self._learn_definitions(addressed)
        busy = self.runners.keys() | self._taking
        actions = fleet_round.poll_actions(addressed, self.worker_id, self._runnable, busy)
        for take in actions.takes:
            now = self.now()
            if self._accepting(now) and self.lease.is_valid(now):  # checked per take
                await self._take(take.shard_id, take.expected_owner, take.expected_epoch)
        await self._answer_handoff_requests(actions.requests)

    async def _answer_handoff_requests(self, noticed: Sequence[HandoffRequest]) -> None:
        """Make-before-break requests naming us, found by their notices (and, while a peer of
        an older version may ask without one, by the ``handoff`` roster): each answered by
        its own task (the standby may take a moment to connect), at most one per shard."""
        requests = list(noticed)
        workers = self._snapshot.workers if self._snapshot is not None else None
        if round_policy.asked_without_notice(workers, self.worker_id):
            try:
                requests += await self.store.handoff_requests()
            except StoreUnavailable as exc:
                log.debug("hand-off requests not read: %s", exc)
        answers = round_policy.handoff_answers(
            requests, self.worker_id, self._runnable, self.runners, self.keeper.answering
        )
        assert self._nursery is not None
        for request in answers:
            if self._accepting(self.now()):
                self.keeper.answering.add(request.id)
                self._nursery.start_soon(self._answer, request)

    async def _answer(self, request: HandoffRequest) -> None:
        try:
            ended = await self.keeper.answer(
                request,
                self._runnable,
                self._take_handed_off,
                self._adopt,
                lambda: self._accepting(self.now()),
            )
        except StoreUnavailable as exc:  # its first read or its answer: the owner times out
            log.warning("hand-off request not answered: %s", exc, extra={"shard": request.id})
            ended = "store unavailable"
        await self._clear_notice(request)
        if ended != TAKEN:
            # A hand-over this answer could not adopt (it never saw it, or its release at
            # once failed) leaves the shard ours with no child: the next round reads the
            # whole table and retakes it (epoch + 1) instead of waiting for a periodic scan.
            self._scans.invalidate()

    async def _clear_notice(self, request: HandoffRequest) -> None:
        """Whatever the answer's outcome, its notice goes (the owner's withdrawal also clears
        it); one that stays is answered once more and found withdrawn, then cleared."""
        with trio.move_on_after(NOTICE_CLEAR_TIMEOUT):
            try:
                await self.store.clear_handoff_notice(request.id, request.successor, request.epoch)
            except LeaseStoreError as exc:  # unavailable, or refused (a policy): not fatal
                log.warning("hand-off notice not cleared: %s", exc, extra={"shard": request.id})

    async def _take_handed_off(self, shard_id: str, epoch: int) -> None:
        await self._take(shard_id, "", epoch)

    async def _adopt(self, item: ShardItem, previous: str) -> bool:
        """A shard its owner handed over to us (``make_before_break.adoption``): a take's
        bookkeeping without the take's write, the owner made it. True: it runs here now."""
        shard_id = item.id
        verdict = make_before_break.adoption(
            item,
            me=self.worker_id,
            held=shard_id in self.runners or shard_id in self._taking,
            runnable=shard_id in self._runnable,
            accepting=self._accepting(self.now()),
        )
        if verdict is Adoption.RELEASE:
            await self._release_handed_over(item)
        elif verdict is Adoption.ADOPT:
            shard = self._runnable[shard_id]
            await self._run_taken(shard, item, round_policy.HANDOVER, previous or "its owner")
        return verdict in (Adoption.ADOPT, Adoption.HELD)

    async def _release_handed_over(self, item: ShardItem) -> None:
        """Handed over while we stop taking (or may no longer run it): give it up at once,
        fenced on owner and epoch, so that it is not ours with no child until our lease
        lapses. If this fails the next full scan finds it (``_answer``)."""
        extra = {"shard": item.id, "epoch": item.epoch}
        try:
            with trio.fail_after(RELEASE_HANDED_OVER_TIMEOUT):
                await self.store.release(item.id, self.worker_id, item.epoch, dict(item.checkpoint))
        except LeaseConflict:
            log.info("handed over to us but no longer ours: nothing to release", extra=extra)
            return
        except (StoreUnavailable, trio.TooSlowError) as exc:
            log.warning("could not release a shard handed over to us: %s", exc, extra=extra)
            return
        self._scans.invalidate()
        log.info("handed over to us while we stop taking: released at once", extra=extra)

    def _successors(self, shard_ids: Sequence[str]) -> dict[str, str]:
        if self.protocol == 2:
            read = self.liveness.last_read
            registered = read.registered_count if read is not None else 0
            holding = sum(1 for runner in self.runners.values() if runner.state.holds_lease)
            return fleet_round.successors(
                shard_ids,
                me=self.worker_id,
                members=self.liveness.members,
                holding=holding,
                shard_count=len(self._shards) + registered,
                accepting=self._accepting(self.now()),
                my_cap=self.config.worker.max_shards,
                prefer=lambda shard: self.ring.standbys_of(shard, self.worker_id),
            )
        snapshot = self._snapshot
        return handoff.successors(
            shard_ids,
            me=self.worker_id,
            tracker=self.tracker,
            shards=snapshot.shards if snapshot is not None else None,
            now=self.now(),
            workers=snapshot.workers if snapshot is not None else (),
        )

    def _apply_operator_requests(self, snapshot: Snapshot, now: float) -> None:
        """`shardvisor drain` / `release` / `shards remove` leave marks in the table; the
        owner acts on them (``handoff.operator_requests``). A shard gone from the config is
        handed off the same way."""
        requests = handoff.operator_requests(
            me=self.worker_id,
            session=self.session,
            workers=snapshot.workers,
            shards=snapshot.shards,
            held=self.runners,
            runnable=self._runnable,
        )
        if requests.drain != self.operator_drain:
            self.operator_drain = requests.drain
            drain = requests.drain
            log.warning("operator %s", "drain: handing off every shard" if drain else "undrain")
            self.state = SupervisorState.DRAINING if drain else SupervisorState.RUNNING
        successors = self._successors([s for s, why in requests.leaving if why.names_successor])
        for shard_id, why in requests.leaving:
            log.info("handing off: %s", why, extra={"shard": shard_id})
            if why.cools_down:
                self.recently_shed[shard_id] = now
            self._leave(shard_id, why, successors.get(shard_id, ""))

    async def _take_when_valid(self, take: Take, limiter: trio.CapacityLimiter) -> None:
        async with limiter:
            if self.lease.is_valid(self.now()):  # never take on a lease that lapsed meanwhile
                await self._take(take.shard_id, take.expected_owner, take.expected_epoch)

    async def _take(self, shard_id: str, expected_owner: str, expected_epoch: int) -> None:
        shard = self._runnable.get(shard_id)
        if shard is None or shard_id in self.runners or shard_id in self._taking:
            return
        self._taking.add(shard_id)
        try:
            item = await self._take_or_retake(shard_id, expected_owner, expected_epoch)
        finally:
            self._taking.discard(shard_id)
        if item is None:
            return
        source = round_policy.take_source(expected_owner, self.worker_id)
        if source == "dead-owner":
            self._note_failover(shard_id, expected_owner)
        await self._run_taken(shard, item, source, expected_owner or "nobody")

    async def _take_or_retake(
        self, shard_id: str, expected_owner: str, expected_epoch: int
    ) -> ShardItem | None:
        """The conditional take; if its condition fails, one consistent read of the item and,
        when it shows the same owner at a later epoch (``round_policy.retake_epoch``: a death
        planned on a scan older than the dead owner's last take), the take at that epoch at
        once rather than a round later. None: not ours (the next round scans)."""
        me = self.worker_id
        try:
            return await self.store.take(shard_id, me, expected_owner, expected_epoch, self.wall())
        except LeaseConflict:
            log.debug("lost the race for %s", shard_id)
        self._scans.invalidate()  # what we planned on was stale
        try:
            item = await self.store.read_shard(shard_id)
        except StoreUnavailable:
            return None
        epoch = round_policy.retake_epoch(
            item, expected_owner=expected_owner, expected_epoch=expected_epoch, me=me
        )
        if epoch is None or not self.lease.is_valid(self.now()):
            return None
        try:
            return await self.store.take(shard_id, me, expected_owner, epoch, self.wall())
        except LeaseConflict:
            return None

    async def _run_taken(
        self, shard: ShardConfig, item: ShardItem, source: str, previous: str
    ) -> None:
        """What follows a shard becoming ours (a take, or a hand-over to us): counted, logged,
        and run, by promoting our standby of it (no spawn, no connect) or by a fresh child
        from the item's checkpoint. The caller checked that no runner here has it."""
        shard_id = shard.id
        self._scans.invalidate()
        self.metrics.takes.labels(source).inc()
        log.info(
            "took shard from %s at epoch %d",
            previous,
            item.epoch,
            extra={"shard": shard_id, "epoch": item.epoch, "checkpoint": item.checkpoint},
        )
        standby = self.keeper.promotable(shard_id)
        if standby is not None:
            # No spawn, no connect: the standby child writes its buffer after the checkpoint.
            self.runners[shard_id] = standby
            kind = round_policy.promotion_kind(source)
            self.metrics.promotions.labels(kind).inc()
            log.info(
                "promoting the standby child (%s)",
                kind,
                extra={"shard": shard_id, "epoch": item.epoch, "checkpoint": item.checkpoint},
            )
            await standby.promote(item.epoch, dict(item.checkpoint), self.now())
            return
        runner = ShardRunner(self.ctx, shard, item.epoch, dict(item.checkpoint), self.now())
        self.runners[shard_id] = runner
        assert self._nursery is not None
        self._nursery.start_soon(self._run_runner, runner)

    def _start_standby(self, runner: ShardRunner) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._run_runner, runner)

    async def _run_runner(self, runner: ShardRunner) -> None:
        """Owner and standby runners alike (a standby may be promoted while it runs)."""
        try:
            await runner.run()
        finally:
            self._scans.invalidate()
            self.keeper.ended(runner, self.now())
            if self.runners.get(runner.shard_id) is runner:
                del self.runners[runner.shard_id]
            if not runner.is_standby:  # a hand-off ends here (its duration, for /fleet, EMF)
                released = runner.state is RunnerState.STOPPED
                self.reporter.events.ended(
                    runner.shard_id,
                    released=released,
                    me=self.worker_id,
                    now=self.now(),
                    wall=self.wall(),
                )
            if runner.crash_looped and not runner.is_standby:
                # Released for another host to try; we keep our hands off it for a while.
                self.quarantined_at[runner.shard_id] = self.now()
                self._note_quarantine()

    def _note_failover(self, shard_id: str, owner: str) -> None:
        """For the fleet page and EMF: the dead owner's last heartbeat (wall) to our take."""
        workers = self._snapshot.workers if self._snapshot is not None else ()
        last = next((w.heartbeat_at for w in workers if w.id == owner), 0.0)
        self.reporter.events.failover(
            shard_id, owner=owner, me=self.worker_id, last_heartbeat=last, wall=self.wall()
        )

    def _note_quarantine(self) -> None:
        """Exit 70 when most of this host's shards crash-loop (``health.HostQuarantine``)."""
        verdict = self._host.crash_looped(self.now(), len(self.runners))
        if verdict.unhealthy:
            log.error(
                "%d of %d shards crash-looped within %ss: this host is unhealthy, exiting",
                verdict.recent,
                verdict.total,
                self._host.window,
            )
            self.exit_code = exit_codes.INTERNAL
            self.request_shutdown()

    # --- drain ---------------------------------------------------------------------------------

    async def _observe_members(self, timeout: float) -> None:
        """Read the worker items once more before naming successors for a drain. The last
        round's view may be a reconcile interval old: a peer that retired since (a rolling
        deploy stops hosts one after another) would be named, and each of its shards would wait
        out ``handoff_timeout`` for an answer that never comes, then move break-before-make.
        Bounded; if the read fails or is late, the last round's view stands."""
        with trio.move_on_after(timeout):
            try:
                if self.protocol == 2:  # the member list (the counts deal_excess needs)
                    self.liveness.members = await self.fleet.read_members()
                    workers = tuple(worker_of(m) for m in self.liveness.members)
                else:
                    workers = await self.store.read_workers()
            except StoreUnavailable as exc:
                log.warning("names successors from the last round's view: %s", exc)
                return
            if self.protocol != 2:  # a listed member shows no counter: the tracker keeps its own
                self.tracker.observe(workers, self.now())
            if self._snapshot is not None:
                self._snapshot = attrs.evolve(self._snapshot, workers=workers)

    def _stop_grace(self) -> float:
        return handoff.stop_grace(self.config.supervisor.shutdown_timeout)

    def _busy(self) -> bool:
        """What the drain waits for: our runners, our standbys, and the hand-off requests we
        answered (each bounded by its own wait): an owner that saw our answer may still hand
        its shard over to us, and we release it at once rather than leave it ours."""
        return bool(self.runners or self.keeper.runners or self.keeper.answering)

    async def _drain(self) -> None:
        self.state = SupervisorState.DRAINING
        started = self.now()
        log.info("draining %d shards", len(self.runners))
        budget = self.config.supervisor.shutdown_timeout
        self.notifier.notify(stopping=1, status=self._status_line())
        self.keeper.stop_all(LeaveReason.SHUTDOWN)
        timeout = min(MEMBERS_READ_TIMEOUT, budget / 10)
        async with trio.open_nursery() as nursery:
            # Advertise ``draining`` before the hand-offs: a peer that still read us running
            # after receiving our shards would shed them straight back to a worker going away.
            nursery.start_soon(self._advertise_state, timeout)
            await self._observe_members(timeout)
        successors = self._successors(list(self.runners))
        for shard_id in list(self.runners):
            self._leave(
                shard_id,
                LeaveReason.SHUTDOWN,
                successors.get(shard_id, ""),
                budget=handoff.drain_budget(budget),
            )
        with trio.move_on_after(handoff.drain_budget(budget)) as scope:
            while self._busy():
                left = budget - (self.now() - started)
                self.notifier.notify(extend_timeout_usec=int(max(left, 1.0) * 1e6))
                with trio.move_on_after(1.0):
                    while self._busy():
                        await trio.sleep(0.02)
        if scope.cancelled_caught:
            log.error("drain overran shutdown_timeout; %d shards left", len(self.runners))
            self.exit_code = self.exit_code or exit_codes.INTERNAL
        try:
            with trio.move_on_after(2.0):
                async with self._heartbeat_lock:
                    self._retired = True
                    await self.store.retire_worker(self.worker_id, self.session, self.wall())
                await self._announce_own("stop")
        except LeaseStoreError as exc:
            log.warning("could not mark the worker stopped: %s", exc)
        await self.liveness.clear_death_markers()
        log.info("drained in %.2fs", self.now() - started)

    # --- health and metrics ----------------------------------------------------------------------

    def http_routes(self) -> dict[str, Callable[[], Response]]:
        routes = {"/healthz": self._healthz, "/readyz": self._readyz, "/metrics": self._metrics}
        return {**routes, **self.reporter.routes()}

    def _healthz(self) -> Response:
        """Answering at all proves the event loop runs; a blocked loop makes the probe time out."""
        return _json(200, {"status": "ok", "worker": self.worker_id, "state": self.state})

    def _readyz(self) -> Response:
        """Ready: registered, heartbeats reaching the store, own lease valid, not stopping."""
        problems = health.readiness_problems(
            state=self.state,
            heartbeat_problem=self.heartbeat_problem,
            lease_valid=self.lease.is_valid(self.now()),
            shutting_down=self._shutdown.is_set(),
        )
        body = {"ready": not problems, "worker": self.worker_id, "problems": problems}
        return _json(503 if problems else 200, body)

    def _metrics(self) -> Response:
        return Response(200, self.metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8")

    def metrics_state(self) -> dict:
        now = self.now()
        state = health.metrics_state(
            runners=self.runners, lease_valid_for=self.lease.valid_until - now, now=now
        )
        return {**state, "standbys": self.keeper.metrics_state()}

    # --- status --------------------------------------------------------------------------------

    def local_status(self) -> dict:
        status = health.local_status(
            worker=self.worker_id,
            state=self.state,
            lease_valid_for=self.lease.valid_until - self.now(),
            runners=self.runners,
        )
        return {**status, "standbys": self.keeper.local_status()}


def _standby_overrides(shards) -> dict[str, int]:
    """The configured shards' own ``standbys`` settings (the others follow standby.count)."""
    return {s.id: s.standbys for s in shards if s.standbys is not None}


def _json(status: int, body: dict) -> Response:
    return Response(status, (json.dumps(body) + "\n").encode())


__all__ = ["Supervisor"]
