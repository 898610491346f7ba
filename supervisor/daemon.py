"""The supervisor's driver: heartbeat, reconcile, lease watchdog and drain, as trio loops.

Only this module (and the runners) read the clock or sleep; every decision comes from
``lease_core`` and ``restart_policy``. One ``Supervisor`` per process.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence

import trio

from supervisor import exit_codes
from supervisor.child_process import spawn_child
from supervisor.config import Config, ShardConfig
from supervisor.lease_core import OwnLease, PeerTracker, plan_round
from supervisor.sd_notify import Notifier
from supervisor.shard_runner import RunnerContext, ShardRunner, Spawn
from supervisor.store import (
    LeaseConflict,
    LeaseStore,
    LeaseStoreError,
    Snapshot,
    StoreUnavailable,
    TableMissing,
    WorkerIdTaken,
    WorkerItem,
)
from supervisor.successor import pick_successors

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
        self.ctx = RunnerContext(config, worker_id, store, self.lease, spawn, now)
        self.runners: dict[str, ShardRunner] = {}
        self.recently_shed: dict[str, float] = {}
        self.state = "starting"  # starting | running | draining | stopped
        self.exit_code = exit_codes.OK
        self._shutdown = trio.Event()
        self._fast = False
        self._nursery: trio.Nursery | None = None
        self._shards = {s.id: s for s in config.shards}
        self.notifier = notifier if notifier is not None else Notifier()  # $NOTIFY_SOCKET
        self._ready_sent = False
        self.operator_drain = False  # `shardvisor drain`: hand everything off, take nothing
        self._snapshot: Snapshot | None = None  # the last one read, to pick successors from
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
            log.warning("heartbeat failed: %s", exc or "timed out")
            return
        except WorkerIdTaken:
            log.error(
                "worker id %s is now used by another process: stopping all shards", self.worker_id
            )
            self._lose_all("worker id taken over by another process")
            self.exit_code = exit_codes.CONFIG
            self.request_shutdown()
            return
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
        snapshot = await self.store.snapshot()
        now = self.now()
        self._snapshot = snapshot
        self.tracker.observe(snapshot.workers, now)
        self._apply_operator_requests(snapshot, now)
        accepting = (
            not self._shutdown.is_set() and not self.operator_drain and self.lease.is_valid(now)
        )
        active = {sid: r for sid, r in self.runners.items() if not r.lost}
        plan = plan_round(
            me=self.worker_id,
            held={sid: r.epoch for sid, r in active.items()},
            held_since={sid: r.taken_at for sid, r in active.items()},
            shards=snapshot.shards,
            configured=self._shards,
            tracker=self.tracker,
            now=now,
            accepting=accepting,
            min_dwell=self.config.lease.duration,
            recently_shed=self.recently_shed,
            max_shards=self.config.worker.max_shards,
            peer_caps={w.id: w.max_shards for w in snapshot.workers},
        )
        for shard_id in plan.lost:
            self.runners[shard_id].lose("the table shows another owner or epoch")
        successors = self._successors(plan.shed)
        for shard_id in plan.shed:
            log.info("handing off for balance", extra={"shard": shard_id})
            self.recently_shed[shard_id] = now
            self.runners[shard_id].request_stop(
                "rebalance", self._stop_grace(), successor=successors.get(shard_id, "")
            )
        for take in plan.take:
            if take.shard_id in self.runners or not self.lease.is_valid(self.now()):
                continue
            await self._take(self._shards[take.shard_id], take.expected_owner, take.expected_epoch)
        self.notifier.notify(status=self._status_line())

    def _successors(self, shard_ids) -> dict[str, str]:
        if self._snapshot is None or not shard_ids:
            return {}
        now = self.now()
        live = [w for w in self.tracker.known() if self.tracker.is_live_member(w, now)]
        return pick_successors(list(shard_ids), self.worker_id, live, self._snapshot.shards)

    def _apply_operator_requests(self, snapshot, now: float) -> None:
        """`shardvisor drain` / `release` leave marks in the table; the owner acts on them."""
        mine = next((w for w in snapshot.workers if w.id == self.worker_id), None)
        drain = mine is not None and mine.session == self.session and mine.drain_requested > 0
        if drain != self.operator_drain:
            self.operator_drain = drain
            log.warning("operator %s", "drain: handing off every shard" if drain else "undrain")
            self.state = "draining" if drain else "running"
        handing_off = []
        for item in snapshot.shards:
            runner = self.runners.get(item.id)
            wanted = drain or (item.release_requested > 0 and item.owner == self.worker_id)
            if runner is None or runner.lost or runner.state == "stopping" or not wanted:
                continue
            if item.epoch == runner.epoch:  # else: a request for an earlier epoch of ours
                handing_off.append(item.id)
        successors = self._successors(handing_off)
        for shard_id in handing_off:
            log.info("operator request: handing off", extra={"shard": shard_id})
            self.recently_shed[shard_id] = now
            self.runners[shard_id].request_stop(
                "operator drain" if drain else "operator release",
                self._stop_grace(),
                successor=successors.get(shard_id, ""),
            )

    async def _take(self, shard: ShardConfig, expected_owner: str, expected_epoch: int) -> None:
        try:
            item = await self.store.take(
                shard.id, self.worker_id, expected_owner, expected_epoch, self.wall()
            )
        except LeaseConflict:
            log.debug("lost the race for %s", shard.id)
            return
        previous = expected_owner or "nobody"
        log.info(
            "took shard from %s at epoch %d",
            previous,
            item.epoch,
            extra={"shard": shard.id, "epoch": item.epoch, "checkpoint": item.checkpoint},
        )
        runner = ShardRunner(self.ctx, shard, item.epoch, dict(item.checkpoint), self.now())
        self.runners[shard.id] = runner
        assert self._nursery is not None
        self._nursery.start_soon(self._run_runner, runner)

    async def _run_runner(self, runner: ShardRunner) -> None:
        try:
            await runner.run()
        finally:
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


__all__ = ["Supervisor", "default_spawn", "fresh_spawner"]
