"""The standby runners of one supervisor: started and stopped as the placement says, answering
make-before-break requests, handed over to the supervisor when it takes their shard.

Placement and the standby-first rule are pure (``supervisor.core.standby``); the handshake is
``supervisor.drivers.handoff``. A standby runner is a ``ShardRunner`` in standby mode: it is
supervised like any child (restart, backoff, hang detection); one that crash-loops is stopped,
logged, and not placed here again for a ``restart_window``: it never touches the owner.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping

import attrs
import trio

from shard_worker.contract.table import FEATURE_MBB
from supervisor.adapters.lease_store.base import LeaseConflict
from supervisor.config.model import ShardConfig
from supervisor.core.items import HandoffRequest, ShardItem, Snapshot
from supervisor.core.lease import PeerTracker
from supervisor.core.make_before_break import release_wait
from supervisor.core.runner_state import RunnerState
from supervisor.core.standby import (
    FreeWatch,
    Placement,
    Rankings,
    StandbyPriority,
    UnplacedReports,
    covers,
    left_to_standbys,
    place_standbys,
    standby_priority,
)
from supervisor.core.standby_ring import RingPlacement
from supervisor.drivers.handoff import TAKEN, Adopt, Answer
from supervisor.drivers.shard_runner import RunnerContext, ShardRunner

log = logging.getLogger("shardvisor.standby")

NOT_PLACED = "no longer placed here"


WARM_STEP = 256  # shards ranked between two yields to the event loop


async def warm_rankings(ranks: Rankings, shard_ids: Iterable[str], live: Collection[str]) -> None:
    """Brings every shard's ranking up to date in steps, yielding between them. A supervisor's
    first round ranks every worker for every shard (0.8 s of CPU at 100 workers and 10,000
    shards, 2.9 s at 200): in one piece that would hold up its heartbeat and its children's
    pipes; in steps of ``WARM_STEP`` shards each waits a few tens of milliseconds at most.
    Later rounds find little to rank and pass through at once."""
    ranks.see(live)
    for done, shard in enumerate(shard_ids, 1):
        ranks.prepare(shard)
        if done % WARM_STEP == 0:
            await trio.lowlevel.checkpoint()


@attrs.define
class StandbyKeeper:
    """``start_task`` runs a runner in the supervisor's nursery; ``take`` is the supervisor's
    take (which promotes our standby through ``promotable``)."""

    ctx: RunnerContext
    start_task: Callable[[ShardRunner], None]
    runners: dict[str, ShardRunner] = attrs.field(factory=dict)
    answering: set[str] = attrs.field(factory=set)
    _cooling: dict[str, float] = attrs.field(factory=dict)  # shard -> when its standby looped
    placement: Placement = attrs.field(factory=Placement)  # as of the last round
    _free: FreeWatch = attrs.field(factory=FreeWatch)
    _unplaced: UnplacedReports = attrs.field(factory=UnplacedReports)
    _ranks: Rankings = attrs.field(factory=Rankings)  # each shard's workers, kept across rounds
    # shard -> the first_seq of the ready standby found covering its owner's checkpoint
    _covering: dict[str, dict[str, int]] = attrs.field(factory=dict)

    # --- placement ------------------------------------------------------------------------

    async def place(
        self,
        snapshot: Snapshot,
        *,
        tracker: PeerTracker,
        runnable: Mapping[str, ShardConfig],
        accepting: bool,
        now: float,
    ) -> StandbyPriority:
        """This round's placement (``core.standby``), from the snapshot every worker reads
        alike; standbys that cannot be placed are logged once. Returns the standby-first
        rule's verdict for the planner."""
        me, cfg = self.ctx.worker_id, self.ctx.config
        capable = {w.id for w in snapshot.workers if FEATURE_MBB in w.features}
        live = {w for w in tracker.known() if w in capable and tracker.is_live_member(w, now)}
        live = (live | {me}) if accepting else (live - {me})
        caps = {w.id: w.max_standbys for w in snapshot.workers}
        wanted = {sid: s.standby_count(cfg.standby.count) for sid, s in runnable.items()}
        await warm_rankings(self._ranks, [sid for sid, k in wanted.items() if k > 0], live)
        self.placement = place_standbys(
            shards=snapshot.shards,
            wanted=wanted,
            live=live,
            caps={**caps, me: cfg.worker.max_standbys},
            ranks=self._ranks,
        )
        for shard_id, missing in self._unplaced.new(self.placement.unplaced).items():
            log.warning(
                "%d standby(s) of %s not placed: too few live workers can run one",
                missing,
                shard_id,
                extra={"shard": shard_id},
            )
        return standby_priority(
            me=me,
            shards=snapshot.shards,
            placement=self.placement,
            tracker=tracker,
            watch=self._free,
            now=now,
            wait=cfg.lease.reconcile_interval,
        )

    def firsts_of_ours(self, shards: Iterable[ShardItem], running: Collection[str]) -> set[str]:
        """The first standbys of the shards in our name that we do not run (an earlier
        incarnation's): whose readiness ``hand_back`` needs."""
        me = self.ctx.worker_id
        found = (
            self.placement.first(item.id)
            for item in shards
            if item.owner == me and item.id not in running
        )
        return {first for first in found if first and first != me}

    def place_on_ring(
        self, placement: RingPlacement, held: Mapping[str, tuple[str, ...]]
    ) -> StandbyPriority:
        """Protocol 2's placement (``drivers.ring_standbys``): ours from the ring, and the
        standbys of the shards we hold (``held``: for ``hand_back``). A standby our
        ``max_standbys`` leaves out is logged once. No claims and no waiting: a dead
        owner's shard is routed to its first standby by name."""
        me = self.ctx.worker_id
        by_shard = dict(held)
        by_shard.update((shard_id, (me,)) for shard_id in placement.mine)
        self.placement = Placement(by_shard, {s: 1 for s in placement.uncovered})
        for shard_id in self._unplaced.new(self.placement.unplaced):
            log.warning(
                "standby of %s not run here: this worker is at its max_standbys",
                shard_id,
                extra={"shard": shard_id},
            )
        return StandbyPriority()

    def to_start(
        self, runnable: Mapping[str, ShardConfig], owned: Collection[str], now: float
    ) -> list[str]:
        """The shards placed here whose standby should start now: ``runnable``, not ``owned``
        by us or being taken, not running one already, not cooling down after a crash loop."""
        window = self.ctx.config.supervisor.restart_window
        self._cooling = {s: at for s, at in self._cooling.items() if now - at < window}
        return [
            shard_id
            for shard_id in sorted(self.placement.mine(self.ctx.worker_id))
            if shard_id not in self.runners
            and shard_id not in owned
            and shard_id not in self._cooling
            and shard_id in runnable
        ]

    def apply(
        self,
        items: Mapping[str, ShardItem],
        runnable: Mapping[str, ShardConfig],
        owned: Collection[str],
        now: float,
    ) -> None:
        """Run a standby for every shard ``to_start`` names (as ``items`` show it); stop the
        others (not while they answer a hand-off request, nor while a take will promote
        them)."""
        placed = self.placement.mine(self.ctx.worker_id)
        for shard_id in self.to_start(runnable, owned, now):
            item = items.get(shard_id)
            if item is not None:
                self.start(runnable[shard_id], item, now)
        for shard_id, runner in list(self.runners.items()):
            if shard_id not in placed and shard_id not in self.answering | set(owned):
                runner.request_stop(NOT_PLACED, self._grace())

    def start(self, shard: ShardConfig, item: ShardItem, now: float) -> ShardRunner:
        """A standby runner for ``shard`` as ``item`` shows it (its owner's epoch + 1)."""
        runner = ShardRunner.standby(self.ctx, shard, item.epoch + 1, item.checkpoint, now)
        self.runners[shard.id] = runner
        log.info("starting a standby", extra={"shard": shard.id, "owner": item.owner})
        self.start_task(runner)
        return runner

    def ended(self, runner: ShardRunner, now: float) -> None:
        """A standby runner's task returned (stopped, crash-looped, or promoted and done)."""
        if self.runners.get(runner.shard_id) is runner:
            del self.runners[runner.shard_id]
        if runner.is_standby and runner.crash_looped:
            self._cooling[runner.shard_id] = now
            log.error(
                "standby crash-looped: not placed here for %ss; the owner is not affected",
                self.ctx.config.supervisor.restart_window,
                extra={"shard": runner.shard_id},
            )

    def stop_all(self, reason: str) -> None:
        for runner in list(self.runners.values()):
            runner.request_stop(reason, self._grace())

    def stop(self, shard_ids: Collection[str], reason: str) -> None:
        for shard_id in shard_ids:
            if shard_id in self.runners:
                self.runners[shard_id].request_stop(reason, self._grace())

    def _grace(self) -> float:
        return min(2.0, self.ctx.config.supervisor.shutdown_timeout / 2)

    # --- taking over ----------------------------------------------------------------------

    def promotable(self, shard_id: str) -> ShardRunner | None:
        """Our standby of a shard we just took, ready to promote (then it is no longer ours
        to keep); one that cannot be promoted (no child now) is stopped: None."""
        runner = self.runners.pop(shard_id, None)
        if runner is None:
            return None
        if runner.promotable:
            return runner
        runner.request_stop("its shard was taken here", self._grace())
        return None

    async def hand_back(
        self,
        snapshot: Snapshot,
        *,
        running: Collection[str],
        tracker: PeerTracker,
        now: float,
        ready: Mapping[str, Collection[str]] | None = None,
    ) -> set[str]:
        """Shards an earlier incarnation of this worker held, released to their ready first
        standby (``core.standby.left_to_standbys``), which takes and promotes it: nothing
        lost on a live-only feed. Returns them all (those whose release was refused too:
        someone else moved them), so that this round does not retake them. ``ready``: each
        worker's advertised ready standbys (default: the snapshot's worker items)."""
        me = self.ctx.worker_id
        chosen = left_to_standbys(
            me=me,
            shards=snapshot.shards,
            running=running,
            placement=self.placement,
            ready=ready if ready is not None else {w.id: w.standbys for w in snapshot.workers},
            tracker=tracker,
            now=now,
        )
        items = {item.id: item for item in snapshot.shards}
        for shard_id, peer in sorted(chosen.items()):
            item = items[shard_id]
            try:
                await self.ctx.store.release(
                    shard_id, me, item.epoch, dict(item.checkpoint), successor=peer
                )
            except LeaseConflict:
                continue
            log.info(
                "left to %s's standby: an earlier incarnation of this worker held it",
                peer,
                extra={"shard": shard_id, "epoch": item.epoch},
            )
        return set(chosen)

    # --- answering a make-before-break request --------------------------------------------

    async def answer(
        self,
        request: HandoffRequest,
        runnable: Mapping[str, ShardConfig],
        take: Callable[[str, int], Awaitable[None]],
        adopt: Adopt,
        accepting: Callable[[], bool],
    ) -> str:
        """The successor's side of one request: our standby (started if we run none), then
        ``handoff_ready``, then the adoption once the owner handed the shard over (or the take
        once it released it) (``handoff.Answer``). Returns how it ended (``TAKEN``: ours)."""
        shard_id = request.id
        self.answering.add(shard_id)
        cfg = self.ctx.config
        watch = self.ctx.watch
        answer = Answer(
            self.ctx.store,
            watch.read if watch is not None else self.ctx.store.read_shard,
            self.ctx.worker_id,
            request,
            cfg.lease.handoff_timeout,
            release_wait(max(0.25, cfg.supervisor.shutdown_timeout / 2)),
        )

        async def standby_ready(item: ShardItem) -> dict[str, int] | None:
            runner = self.runners.get(shard_id)
            if runner is None or runner.state is RunnerState.STOPPING:
                if runner is not None or shard_id not in runnable or not accepting():
                    return None  # one on its way out, or we stop: start none
                runner = self.start(runnable[shard_id], item, self.ctx.now())
            return await runner.wait_standby_ready()

        ended = "cancelled"
        try:
            ended = await answer.run(standby_ready, take, adopt, accepting)
        finally:
            self.answering.discard(shard_id)
            # A take (ours, or the hand-off poll's in flight) promotes the standby or stops it.
            if ended != TAKEN and shard_id not in self.placement.mine(self.ctx.worker_id):
                self.stop([shard_id], NOT_PLACED)
        log.info("hand-off request answered: %s", ended, extra={"shard": shard_id})
        return ended

    # --- what others read -----------------------------------------------------------------

    def ready(self) -> tuple[str, ...]:
        """The shards whose standby child is ready here and bridges a death of the owner
        (``core.standby.covers``): advertised in heartbeats, shown by ``status``."""
        return tuple(
            sorted(s for s in self._connected() if self._covering.get(s) == self._first(s))
        )

    def _connected(self) -> list[str]:
        return [s for s, r in self.runners.items() if r.state is RunnerState.STANDBY_READY]

    def _first(self, shard_id: str) -> dict[str, int]:
        return self.runners[shard_id].first_seq

    async def check_coverage(self) -> None:
        """Read the owners' checkpoints of the standbys connected since the last look that do
        not cover them yet (one consistent batch read, only while there are such standbys:
        about one round after each connect). StoreUnavailable: next round."""
        self._covering = {s: f for s, f in self._covering.items() if s in self.runners}
        waiting = [s for s in self._connected() if self._covering.get(s) != self._first(s)]
        if not waiting:
            return
        items = await self.ctx.store.read_shards(waiting)
        connected = set(self._connected())  # not: a standby promoted or stopped meanwhile
        for shard_id in waiting:
            if shard_id not in connected:
                continue
            item, first = items.get(shard_id), self._first(shard_id)
            if item is not None and covers(item.checkpoint, first):
                self._covering[shard_id] = dict(first)
                log.info(
                    "standby ready for a failover: the owner's checkpoint has reached its "
                    "first record",
                    extra={"shard": shard_id, "first_seq": first},
                )

    def metrics_state(self) -> dict[str, dict[str, int]]:
        out = {}
        for shard_id, runner in sorted(self.runners.items()):
            stats = runner.standby_stats
            out[shard_id] = {
                "up": int(runner.state in (RunnerState.STANDBY, RunnerState.STANDBY_READY)),
                "buffered": stats.buffered if stats is not None else 0,
                "bytes": stats.bytes if stats is not None else 0,
            }
        return out

    def local_status(self) -> dict[str, dict[str, object]]:
        return {
            shard_id: {"state": r.state.value, "epoch": r.epoch, "restarts": r.restarts}
            for shard_id, r in sorted(self.runners.items())
        }


__all__ = ["StandbyKeeper"]
