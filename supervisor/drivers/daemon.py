"""The supervisor's driver: heartbeat, reconcile, lease watchdog and drain, as trio loops.

Only this module (and the runners) read the clock or sleep; every decision comes from
``lease_core`` and ``restart_policy``. One ``Supervisor`` per process.
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

from supervisor import exit_codes
from supervisor.adapters.http_endpoint import Response
from supervisor.adapters.lease_store.base import (
    LeaseConflict,
    LeaseStore,
    LeaseStoreError,
    StoreUnavailable,
    TableMissing,
    WorkerIdTaken,
)
from supervisor.adapters.metrics import Metrics
from supervisor.adapters.sd_notify import Notifier
from supervisor.adapters.spawn import spawn_child
from supervisor.config.loading import ConfigError
from supervisor.config.model import Config, ShardConfig
from supervisor.config.shard_spec import decode_spec
from supervisor.core.items import Snapshot, VacantShard, WorkerItem
from supervisor.core.lease import OwnLease, PeerTracker
from supervisor.core.planner import plan_round
from supervisor.core.successor import pick_successors
from supervisor.drivers.shard_runner import RunnerContext, ShardRunner, Spawn

log = logging.getLogger("shardvisor.supervisor")


def fresh_spawner(worker_command: Sequence[str] = ()) -> Spawn:
    """Each child a new interpreter (``python -m shard_worker`` unless a command is set)."""

    async def spawn(shard_id: str):
        child, out, err = await spawn_child(shard_id, argv=list(worker_command) or None)
        return child, [("stdout", out), ("stderr", err)]

    return spawn


default_spawn = fresh_spawner()


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
        self.tracker = PeerTracker(lease.duration)
        spawn = spawn or fresh_spawner(config.supervisor.worker_command)
        self.metrics = metrics or Metrics()
        self.metrics.info.labels(worker_id).set(1)
        self.metrics.watch(self.metrics_state)
        if hasattr(store, "observer"):
            store.observer = self.metrics.observe_store
        self.ctx = RunnerContext(
            config, worker_id, store, self.lease, spawn, now, self.session, self.metrics
        )
        self.heartbeat_ok = False  # the last heartbeat reached the store (for /readyz)
        self.heartbeat_problem = "no heartbeat yet"
        self.runners: dict[str, ShardRunner] = {}
        self.recently_shed: dict[str, float] = {}
        self.state = "starting"  # starting | running | draining | stopped
        self.exit_code = exit_codes.OK
        self._shutdown = trio.Event()
        self._fast = False
        self._nursery: trio.Nursery | None = None
        self._shards = {s.id: s for s in config.shards}  # from the TOML file (SIGHUP reloads)
        # Every shard this worker may run: the TOML ones, and the ones registered in the
        # table (`shardvisor shards add`), as of the last full scan.
        self._runnable: dict[str, ShardConfig] = dict(self._shards)
        self._bad_specs: dict[str, str] = {}  # shard -> spec already reported as invalid
        self.notifier = notifier if notifier is not None else Notifier()  # $NOTIFY_SOCKET
        self._ready_sent = False
        self.operator_drain = False  # `shardvisor drain`: hand everything off, take nothing
        self._snapshot: Snapshot | None = None  # the last full scan (workers: last round's)
        self._scanned_at = float("-inf")
        self._rescan = True  # our own leases changed: the next round scans the whole table
        self._seen_signature: object = None  # what the last cheap round saw (see _scan_due)
        self._taking: set[str] = set()
        self._registered_at = float("inf")
        self._quarantined_at: list[float] = []

    # --- control -------------------------------------------------------------------------------

    def request_shutdown(self) -> None:
        """First call drains gracefully; a second call takes the fast path."""
        if self._shutdown.is_set():
            if not self._fast:
                log.warning("second stop signal: fast shutdown")
                self._fast = True
                for runner in list(self.runners.values()):
                    runner.request_stop("fast shutdown", 0.0)
            return
        self._shutdown.set()

    async def reload(self, config: Config) -> None:
        """SIGHUP: take the shard list of a re-read config file. Only shards whose definition
        changed restart (handed back to ourselves: a new epoch, resumed from the checkpoint);
        removed ones are handed off; added ones are registered. Other settings need a restart."""
        ignored = [
            name
            for name in ("worker", "dynamodb", "lease", "supervisor", "sink", "log")
            if getattr(config, name) != getattr(self.config, name)
        ]
        if ignored:
            log.warning(
                "reload: [%s] changed; those settings apply at the next restart",
                "] [".join(ignored),
            )
        new = {shard.id: shard for shard in config.shards}
        old = self._shards
        added = sorted(new.keys() - old.keys())
        removed = sorted(old.keys() - new.keys())
        changed = sorted(sid for sid in new.keys() & old.keys() if new[sid] != old[sid])
        log.info(
            "reload: %d shards added, %d removed, %d changed, %d unchanged",
            len(added),
            len(removed),
            len(changed),
            len(new) - len(added) - len(changed),
        )
        for shard_id in added:
            await self.store.ensure_shard(shard_id)
        self._shards = new
        if self._snapshot is not None:
            self._refresh_runnable(self._snapshot)
        else:
            self._runnable = dict(new)
        for shard_id in changed:
            runner = self.runners.get(shard_id)
            if runner is not None and not runner.lost and runner.state != "stopping":
                log.info("reload: definition changed, restarting", extra={"shard": shard_id})
                runner.request_stop(
                    "definition changed", self._stop_grace(), successor=self.worker_id
                )
        self._rescan = True  # removed shards are handed off by the next round

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
        self.state = "running"
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._heartbeat_loop)
            nursery.start_soon(self._reconcile_loop)
            nursery.start_soon(self._lease_watchdog)
            if self.config.lease.handoff_poll_interval > 0:
                nursery.start_soon(self._handoff_poll_loop)
            if self.notifier.watchdog_interval:
                nursery.start_soon(self._systemd_watchdog, self.notifier.watchdog_interval)
            task_status.started()
            await self._shutdown.wait()
            await self._drain()
            nursery.cancel_scope.cancel()
        self.state = "stopped"
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
        sent = self.now()
        wall = self.wall()
        item = WorkerItem(
            id=self.worker_id,
            session=self.session,
            counter=0,
            state="running",
            heartbeat_at=wall,
            started_at=wall,
            host=socket.gethostname(),
            pid=os.getpid(),
            max_shards=self.config.worker.max_shards,
        )
        await self.store.register_worker(item)
        self._registered_at = sent
        self.lease.heartbeat_succeeded(sent)
        log.info(
            "registered worker %s with %d configured shards",
            self.worker_id,
            len(self._shards),
            extra={"worker": self.worker_id},
        )

    # --- loops ---------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.config.lease.heartbeat_interval
        while True:
            sent = self.now()
            await self._heartbeat_once(sent)
            await trio.sleep(max(0.0, sent + interval - self.now()))

    async def _heartbeat_once(self, sent: float) -> None:
        state = "draining" if self._shutdown.is_set() or self.operator_drain else "running"
        try:
            with trio.fail_after(self.config.lease.duration / 2):
                await self.store.heartbeat(self.worker_id, self.session, state, self.wall())
        except (StoreUnavailable, trio.TooSlowError) as exc:
            log.warning("heartbeat failed: %s", str(exc) or "timed out")
            self.metrics.heartbeat_failures.inc()
            self.heartbeat_ok, self.heartbeat_problem = False, str(exc) or "timed out"
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
        self.heartbeat_ok, self.heartbeat_problem = True, ""
        if not self.lease.is_valid(sent):
            # Our lease lapsed before this heartbeat was sent (a freeze, a long outage):
            # peers may own our shards now. Never extend a fence across that gap.
            self._lose_all("own lease lapsed before the heartbeat")
        self.lease.heartbeat_succeeded(sent)
        deadline = self.lease.valid_until
        for runner in list(self.runners.values()):
            await runner.fence(deadline)
        if not self._ready_sent:
            self._ready_sent = True
            self.notifier.notify(ready=1, status=self._status_line())

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
        """WATCHDOG=1 only while our loop runs on time and our lease is valid: systemd then
        restarts a supervisor that is stuck, not merely one that is busy."""
        while True:
            before = self.now()
            await trio.sleep(interval)
            lag = self.now() - before - interval
            if lag < interval and self.lease.is_valid(self.now()):
                self.notifier.notify(watchdog=1)
            else:
                log.warning(
                    "withholding the systemd watchdog: lag %.3fs, lease valid %s",
                    lag,
                    self.lease.is_valid(self.now()),
                )

    def _status_line(self) -> str:
        held = sorted(sid for sid, r in self.runners.items() if not r.lost)
        return f"{self.state}: {len(held)} shards" + (f" ({' '.join(held)})" if held else "")

    def _lose_all(self, reason: str) -> None:
        for runner in list(self.runners.values()):
            runner.lose(reason)

    async def _reconcile_loop(self) -> None:
        while True:
            try:
                await self._reconcile_once()
            except StoreUnavailable as exc:
                log.warning("reconcile skipped: %s", exc)
            await trio.sleep(self.config.lease.reconcile_interval)

    async def _reconcile_once(self) -> None:
        """One round. Reads the worker items and the vacant shards; scans the whole table only
        when something changed (see _scan_due), so a steady fleet reads O(workers) per round."""
        workers = await self.store.read_workers()
        now = self.now()
        self.tracker.observe(workers, now)
        vacant = await self.store.vacant_shards()
        scan = self._scan_due(workers, vacant, now)
        if scan:
            snapshot = await self.store.snapshot()
            now = self.now()
            self.tracker.observe(snapshot.workers, now)
            self._scanned_at = now
            self._rescan = False
            self._refresh_runnable(snapshot)
        else:
            assert self._snapshot is not None
            snapshot = attrs.evolve(self._snapshot, workers=workers)
        self._snapshot = snapshot
        self._seen_signature = self._signature(workers, vacant, now)
        self._apply_operator_requests(snapshot, now)
        accepting = self._accepting(now)
        active = {sid: r for sid, r in self.runners.items() if not r.lost}
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
            max_shards=self.config.worker.max_shards,
            peer_caps={w.id: w.max_shards for w in snapshot.workers},
        )
        # "Lost" needs a fresh view of our own items; between scans our checkpoint writes
        # (conditional on owner and epoch) find a lost lease anyway.
        for shard_id in plan.lost if scan else ():
            runner = self.runners[shard_id]
            if runner.state != "stopping":  # a retired or removed shard stops gracefully
                runner.lose("the table shows another owner or epoch")
        # A worker that has watched its peers for less than a lease duration may still count
        # a dead one as live, so its target is too low: it takes, but sheds nothing yet.
        warm = now - self._registered_at >= self.config.lease.duration
        shed = plan.shed if warm else ()
        successors = self._successors(shed)
        for shard_id in shed:
            log.info("handing off for balance", extra={"shard": shard_id})
            self.recently_shed[shard_id] = now
            self.runners[shard_id].request_stop(
                "rebalance", self._stop_grace(), successor=successors.get(shard_id, "")
            )
        for take in plan.take:
            if not self.lease.is_valid(self.now()):
                break
            if take.expected_owner == self.worker_id and not warm:
                # Still owned by an earlier incarnation of our worker id, whose child may be
                # alive (frozen, starved) and writing up to its fence: that fence ends within
                # a lease duration of our registration, as for any dead owner's shards.
                continue
            await self._take(take.shard_id, take.expected_owner, take.expected_epoch)
        self.notifier.notify(status=self._status_line())

    def _accepting(self, now: float) -> bool:
        return not self._shutdown.is_set() and not self.operator_drain and self.lease.is_valid(now)

    def _signature(self, workers, vacant, now: float) -> object:
        mine = next((w for w in workers if w.id == self.worker_id), None)
        return (self.tracker.membership(now), vacant, mine.mailbox if mine else -1)

    def _scan_due(
        self, workers: Sequence[WorkerItem], vacant: Sequence[VacantShard], now: float
    ) -> bool:
        """A full scan when our view may be stale: at start, after our own takes and
        releases, when a worker joins, leaves or dies, when the vacant shards change, when
        someone pokes our mailbox (operator requests), and every full_scan_interval."""
        return (
            self._snapshot is None
            or self._rescan
            or self._signature(workers, vacant, now) != self._seen_signature
            or now - self._scanned_at >= self.config.lease.full_scan_interval
        )

    def _refresh_runnable(self, snapshot: Snapshot) -> None:
        """TOML shards, plus the registered ones (a spec in the item, not retired)."""
        runnable = dict(self._shards)
        for item in snapshot.shards:
            if not item.spec or item.retired_at or item.id in runnable:
                continue
            try:
                runnable[item.id] = decode_spec(item.id, item.spec)
            except ConfigError as exc:
                if self._bad_specs.get(item.id) != item.spec:
                    self._bad_specs[item.id] = item.spec
                    log.error(
                        "registered shard %s has an invalid spec, not running it: %s",
                        item.id,
                        "; ".join(exc.problems),
                    )
        self._runnable = runnable

    async def _handoff_poll_loop(self) -> None:
        """Shards handed to us by name (drain, rebalance, `release`): taken within one poll
        rather than at the next reconcile. One small index query per poll."""
        interval = self.config.lease.handoff_poll_interval
        while True:
            await trio.sleep(interval)
            if not self._accepting(self.now()):
                continue
            try:
                vacant = await self.store.vacant_shards()
            except StoreUnavailable as exc:
                log.debug("hand-off poll skipped: %s", exc)
                continue
            for shard in vacant:
                # Checked per take: a SIGTERM or drain may arrive while a take is in flight.
                if (
                    shard.successor == self.worker_id
                    and shard.id in self._runnable
                    and self._accepting(self.now())
                    and self.lease.is_valid(self.now())
                ):
                    await self._take(shard.id, "", shard.epoch)

    def _successors(self, shard_ids) -> dict[str, str]:
        if self._snapshot is None or not shard_ids:
            return {}
        now = self.now()
        live = [w for w in self.tracker.known() if self.tracker.is_live_member(w, now)]
        return pick_successors(list(shard_ids), self.worker_id, live, self._snapshot.shards)

    def _apply_operator_requests(self, snapshot, now: float) -> None:
        """`shardvisor drain` / `release` / `shards remove` leave marks in the table; the
        owner acts on them. A shard gone from the config is handed off the same way."""
        mine = next((w for w in snapshot.workers if w.id == self.worker_id), None)
        drain = mine is not None and mine.session == self.session and mine.drain_requested > 0
        if drain != self.operator_drain:
            self.operator_drain = drain
            log.warning("operator %s", "drain: handing off every shard" if drain else "undrain")
            self.state = "draining" if drain else "running"
        leaving: list[tuple[str, str]] = []  # (shard, why)
        for item in snapshot.shards:
            runner = self.runners.get(item.id)
            if runner is None or runner.lost or runner.state == "stopping":
                continue
            if item.epoch != runner.epoch:
                continue  # the view predates our take, or a request for an earlier epoch
            if item.retired_at:
                why = "retired"  # `shards remove`
            elif item.id not in self._runnable:
                why = "removed from the config"
            elif drain:
                why = "operator drain"
            elif item.release_requested > 0 and item.owner == self.worker_id:
                why = "operator release"
            else:
                continue
            leaving.append((item.id, why))
        successors = self._successors([sid for sid, why in leaving if why != "retired"])
        for shard_id, why in leaving:
            log.info("handing off: %s", why, extra={"shard": shard_id})
            if why != "retired":
                self.recently_shed[shard_id] = now
            self.runners[shard_id].request_stop(
                why, self._stop_grace(), successor=successors.get(shard_id, "")
            )

    async def _take(self, shard_id: str, expected_owner: str, expected_epoch: int) -> None:
        shard = self._runnable.get(shard_id)
        if shard is None or shard_id in self.runners or shard_id in self._taking:
            return
        self._taking.add(shard_id)
        try:
            item = await self.store.take(
                shard_id, self.worker_id, expected_owner, expected_epoch, self.wall()
            )
        except LeaseConflict:
            log.debug("lost the race for %s", shard_id)
            return
        finally:
            self._taking.discard(shard_id)
        self._rescan = True
        source = "unowned" if not expected_owner else "dead-owner"
        self.metrics.takes.labels("own" if expected_owner == self.worker_id else source).inc()
        previous = expected_owner or "nobody"
        log.info(
            "took shard from %s at epoch %d",
            previous,
            item.epoch,
            extra={"shard": shard_id, "epoch": item.epoch, "checkpoint": item.checkpoint},
        )
        runner = ShardRunner(self.ctx, shard, item.epoch, dict(item.checkpoint), self.now())
        self.runners[shard_id] = runner
        assert self._nursery is not None
        self._nursery.start_soon(self._run_runner, runner)

    async def _run_runner(self, runner: ShardRunner) -> None:
        try:
            await runner.run()
        finally:
            self._rescan = True
            if self.runners.get(runner.shard_id) is runner:
                del self.runners[runner.shard_id]
            if runner.crash_looped:
                # Released for another host to try; we keep our hands off it for a while.
                self.recently_shed[runner.shard_id] = self.now()
                self._note_quarantine()

    def _note_quarantine(self) -> None:
        """Most of this host's shards crash-looping points at the host, not the shards: exit
        70 so systemd's start limit or ECS's circuit breaker can act. One poison shard (which
        would crash-loop anywhere) must not take every host down, so it takes at least two."""
        now = self.now()
        window = self.config.supervisor.restart_window
        self._quarantined_at = [t for t in self._quarantined_at if now - t <= window] + [now]
        recent = len(self._quarantined_at)
        if recent >= 2 and recent * 2 > recent + len(self.runners):
            log.error(
                "%d of %d shards crash-looped within %ss: this host is unhealthy, exiting",
                recent,
                recent + len(self.runners),
                window,
            )
            self.exit_code = exit_codes.INTERNAL
            self.request_shutdown()

    # --- drain ---------------------------------------------------------------------------------

    def _stop_grace(self) -> float:
        """Time a child gets to flush. The rest of shutdown_timeout covers SIGTERM (a tenth of
        it, at most 1 s), SIGKILL, the release write and our own exit."""
        return max(0.25, self.config.supervisor.shutdown_timeout / 2)

    async def _drain(self) -> None:
        self.state = "draining"
        started = self.now()
        log.info("draining %d shards", len(self.runners))
        budget = self.config.supervisor.shutdown_timeout
        self.notifier.notify(stopping=1, status=self._status_line())
        successors = self._successors(list(self.runners))
        for shard_id, runner in list(self.runners.items()):
            runner.request_stop(
                "shutdown",
                0.0 if self._fast else self._stop_grace(),
                successor=successors.get(shard_id, ""),
            )
        with trio.move_on_after(max(budget * 0.9, 0.5)) as scope:
            while self.runners:
                left = budget - (self.now() - started)
                self.notifier.notify(extend_timeout_usec=int(max(left, 1.0) * 1e6))
                with trio.move_on_after(1.0):
                    while self.runners:
                        await trio.sleep(0.02)
        if scope.cancelled_caught:
            log.error("drain overran shutdown_timeout; %d shards left", len(self.runners))
            self.exit_code = self.exit_code or exit_codes.INTERNAL
        try:
            with trio.move_on_after(2.0):
                await self.store.retire_worker(self.worker_id, self.session, self.wall())
        except LeaseStoreError as exc:
            log.warning("could not mark the worker stopped: %s", exc)
        log.info("drained in %.2fs", self.now() - started)

    # --- health and metrics ----------------------------------------------------------------------

    def http_routes(self) -> dict[str, Callable[[], Response]]:
        return {"/healthz": self._healthz, "/readyz": self._readyz, "/metrics": self._metrics}

    def _healthz(self) -> Response:
        """Answering at all proves the event loop runs; a blocked loop makes the probe time out."""
        return _json(200, {"status": "ok", "worker": self.worker_id, "state": self.state})

    def _readyz(self) -> Response:
        """Ready: registered, heartbeats reaching the store, own lease valid, not stopping."""
        now = self.now()
        problems = []
        if self.state not in ("running", "draining"):
            problems.append(f"state {self.state}")
        if not self.heartbeat_ok:
            problems.append(f"lease store: {self.heartbeat_problem}")
        if not self.lease.is_valid(now):
            problems.append("own lease not valid")
        if self._shutdown.is_set():
            problems.append("shutting down")
        body = {"ready": not problems, "worker": self.worker_id, "problems": problems}
        return _json(503 if problems else 200, body)

    def _metrics(self) -> Response:
        return Response(200, self.metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8")

    def metrics_state(self) -> dict:
        now = self.now()
        active = {sid: r for sid, r in self.runners.items() if not r.lost}
        valid = self.lease.valid_until - now
        return {
            "held": len(active),
            "up": sum(1 for r in active.values() if r.state == "running"),
            "lease_valid_s": max(valid, -1e9),
            "shards": {sid: r.checkpoint_metrics(now) for sid, r in sorted(active.items())},
        }

    # --- status --------------------------------------------------------------------------------

    def local_status(self) -> dict:
        return {
            "worker": self.worker_id,
            "state": self.state,
            "lease_valid_for_s": round(self.lease.valid_until - self.now(), 3),
            "shards": {
                sid: {"state": r.state, "epoch": r.epoch, "restarts": r.restarts}
                for sid, r in sorted(self.runners.items())
            },
        }


def _json(status: int, body: dict) -> Response:
    return Response(status, (json.dumps(body) + "\n").encode())


__all__ = ["Supervisor", "default_spawn", "fresh_spawner"]
