"""The peers' liveness on protocol 1's table (issue 16): what a round knows of the workers.

Each worker judges by heartbeat counter only the peers the watch ring gives it
(``core.watch_ring``), reads them eventually consistently between rounds on their heartbeats'
rhythm (``core.peer_watch``), confirms a due one with the round's strongly consistent read, then
writes its death notice and a death marker; every membership change is written first and
announced after (the generation on the meta item), and a round re-reads every worker item only
when the generation moved (``core.membership.RosterView``). The pure decisions live in those
cores and in ``core.lease.PeerTracker``; this driver does the reads and writes, on the
supervisor's clock. docs/lease-protocol.md, *Liveness*.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence

import attrs
import trio

from supervisor.adapters.lease_store.base import LeaseStore, LeaseStoreError, StoreUnavailable
from supervisor.adapters.metrics import Metrics
from supervisor.config.model import LeaseConfig
from supervisor.core import peer_watch, round_policy, routing, watch_ring
from supervisor.core.items import DeathMarker, WorkerItem, WorkerRead
from supervisor.core.lease import PeerTracker
from supervisor.core.membership import MEMBERSHIP_REFRESH, Member, RosterView, worker_of
from supervisor.drivers.together import both

log = logging.getLogger("shardvisor.supervisor")

STORE_WRITE_TIMEOUT = 1.0  # an announcement, a death marker: best effort, bounded
DEATH_MARKER_ROUNDS = 2  # a death marker stays listed this many reconcile intervals
LATE_ROUTE_PASSES = 2  # protocol 2: route a dead worker's shards again, a lease apart
META_CONSISTENT_EVERY = 10  # protocol 2: one round in this many reads the meta item consistently


class Liveness:
    """One supervisor's view of its peers. ``run`` holds the watch reads and the notices'
    tasks; ``read_members`` is the round's read of the workers."""

    def __init__(
        self,
        lease: LeaseConfig,
        worker_id: str,
        store: LeaseStore,
        metrics: Metrics,
        now: Callable[[], float],
    ) -> None:
        self.lease, self.worker_id, self.store, self.metrics, self.now = (
            lease,
            worker_id,
            store,
            metrics,
            now,
        )
        self.tracker = PeerTracker(lease.duration)
        # When to read the watched peers between rounds (their heartbeats' rhythm).
        self.book = peer_watch.WatchBook(lease.duration, lease.heartbeat_interval)
        self.roster: RosterView | None = None  # the workers as last read (``read_members``)
        self.item_read_at: dict[str, float] = {}  # when each worker item was last read
        self.death_seen = trio.Event()  # a death marker newer than our view: a round now
        self._ring_moved = trio.Event()
        self._judged: set[str] = set()  # watched peers judged by counter
        self._announced: set[tuple[str, str]] = set()  # changes announced for a peer
        self._suspects: dict[str, str] = {}  # a watched peer's state our view lacks
        self._markers: set[str] = set()  # death markers we listed and will clear
        self._nursery: trio.Nursery | None = None
        # The table's protocol (the daemon sets it from the meta item each round), the
        # round's last consistent read, and protocol 2's member list as last read.
        self.protocol = 1
        self.last_read: WorkerRead | None = None
        self.members: tuple[Member, ...] = ()
        self._reread_for: int | None = None  # a generation whose member list is read again
        self.own: WorkerItem | None = None  # our item as our last heartbeat wrote it
        # Protocol 2's standby-first rule: (shard, its dead holder) -> its first standby.
        self.first_standby: Callable[[str, str], str] = lambda shard, holder: ""
        self._rounds = 0
        self.fleet = store.fleet()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The watch reads, and a nursery for the notices and markers rounds start."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self._watch_loop()

    # --- the round ---------------------------------------------------------------------------

    async def read_members(self) -> tuple[WorkerItem, ...]:
        """The round's view of the workers (``membership.RosterView``): the generation and our
        own item every round, strongly consistently, with the watched peers whose lease falls
        due before the next round (the confirmation the watch loop's reads cannot give) or
        that we do not judge yet; every item only when the view may be out of date. Declares
        the watched peers whose counter stood still for a lease (a death notice)."""
        view = self.roster
        watched = set(watch_ring.watched_by(self.worker_id, view.on_ring())) if view else set()
        horizon = self.now() + self.lease.reconcile_interval + round_policy.DUE_SLACK
        confirm = {
            peer
            for peer in watched
            if peer not in self._judged or self.tracker.due_at(peer) <= horizon
        }
        if self.protocol == 2:  # no roster: the member list when the generation moved
            fresh = await self._read_fleet_round(confirm)
            ids: Collection[str] = view.ids if view is not None else ()
        else:
            ids, fresh = await both(  # the roster's ids and the consistent read, side by side
                self.store.worker_ids,
                lambda: self.store.read_worker_items({self.worker_id, *confirm}),
            )
            listed = set(ids)
            fresh = attrs.evolve(fresh, workers=tuple(w for w in fresh.workers if w.id in listed))
        self.last_read = fresh
        now = self.now()
        if (
            view is None
            or view.needs_full(fresh.generation, ids, now, MEMBERSHIP_REFRESH)
            or self._reread_for == fresh.generation
        ):
            # Recorded for the generation read *before* it: every change is written first
            # and announced after, so this read holds every change that generation counts.
            if self.protocol == 2:
                everyone = await self._read_member_list(fresh, watched)
            else:
                everyone = await self.store.read_worker_items(ids)
            now = self.now()
            generation = fresh.generation if view is not None else -1  # -1: read again
            ids = [worker.id for worker in everyone.workers]
            view = RosterView.full(generation, ids, everyone.workers, now)
            fresh = everyone
            self._announced.clear()
            self._suspects.clear()
        else:
            missed = [w for w in view.unannounced(fresh.workers) if w != self.worker_id]
            # What the watch reads saw since the last round that no announcement explained (a
            # change nobody announced: an older version, a child's ``orphaned`` mark, a lost
            # announcement). Announced once, a round later: a change that was announced has
            # moved the generation by then, and a watcher's second bump would cost the fleet
            # another full read.
            by_id = view.by_id()
            missed += [
                peer
                for peer, state in self._suspects.items()
                if peer in by_id
                and by_id[peer].state != state
                and (peer, state) not in self._announced
            ]
            self._announced.update(self._suspects.items())
            self._suspects.clear()
            view = view.updated(fresh.workers)
            if missed:
                log.info("announcing a change nobody announced: %s", ", ".join(missed))
                await self.announce("unannounced")
        self.roster = view
        self.item_read_at = {w: self.item_read_at.get(w, now) for w in view.ids}
        self.item_read_at.update((worker.id, now) for worker in fresh.workers)
        # Judged by counter: the peers we watch, once a strongly consistent read backs their
        # counter (a peer the ring gave us only now is read this round or the next).
        read = {worker.id for worker in fresh.workers if worker.session}  # not a listed one
        judged = set(watch_ring.watched_by(self.worker_id, view.on_ring())) & (self._judged | read)
        self._judged = judged
        self.tracker.watch(judged)
        # A listed item (protocol 2's member list) shows no counter: it tells the state of a
        # peer we do not judge by counter, and nothing about one we do.
        self.tracker.observe((w for w in fresh.workers if w.session or w.id not in judged), now)
        if set(self.book.clocks) != judged:  # its own reads find each new peer's rhythm
            self.book.watch(judged)
            self._ring_moved.set()
        for worker in fresh.workers:  # a peer the watch loop left to this round, still alive
            seen = peer_watch.Seen(worker.counter, worker.session, worker.state)
            if self.book.confirmed(worker.id, seen, now):
                self._ring_moved.set()
        for worker in fresh.workers:
            gone = worker.state in peer_watch.GONE_STATES
            if worker.id in judged and not gone and self.tracker.is_dead(worker.id, now):
                # Beside this round's takes, not before them: the notice is for the peers
                # that do not watch it (and it is written at most once: its condition).
                assert self._nursery is not None, "Liveness.run is not running"
                self._nursery.start_soon(self._declare_dead, worker)
        return view.workers

    async def _read_fleet_round(self, confirm: set[str]) -> WorkerRead:
        """Protocol 2's per-round read: the watched peers falling due, strongly consistently
        with the meta item (as on protocol 1); with none, the meta item alone, eventually
        consistent (half a read unit: a replica that lags only delays a member re-read by a
        round), strongly consistent every ``META_CONSISTENT_EVERY`` rounds (the protocol
        switches only on such a read: a lagging replica must not flip a worker back). Our own
        item is the one our last heartbeat wrote (``own``): the write's response, no read."""
        self._rounds += 1
        if confirm:
            fresh = await self.store.read_worker_items(confirm)
        else:
            consistent = self._rounds % META_CONSISTENT_EVERY == 1
            meta = await self.fleet.read_meta(consistent=consistent)
            fresh = WorkerRead(
                meta.generation,
                (),
                meta.protocol,
                meta.registered_count,
                consistent,
                meta.shardgen,
            )
        if self.own is not None:
            workers = {worker.id: worker for worker in fresh.workers}
            workers[self.own.id] = self.own
            fresh = attrs.evolve(fresh, workers=tuple(workers[w] for w in sorted(workers)))
        return fresh

    async def _read_member_list(self, fresh: WorkerRead, watched: set[str]) -> WorkerRead:
        """Protocol 2: the member list from the ``fleet`` index (64 small queries), with our
        own item and the watched peers' as read strongly consistently (a listed item has no
        counter). A list whose highest ``mgen`` is below the generation may miss a change
        still on its way to the index: read once more at the next round, once."""
        members = await self.fleet.read_members()
        read = {worker.id: worker for worker in fresh.workers}
        unread = watched - read.keys()
        if unread:
            more = await self.store.read_worker_items(unread)
            read.update((worker.id, worker) for worker in more.workers)
        self.members = members
        complete = max((m.mgen for m in members), default=0) >= fresh.generation
        retried = self._reread_for == fresh.generation
        self._reread_for = None if complete or retried else fresh.generation
        listed = {m.id: read.get(m.id) or worker_of(m) for m in members}
        listed.update((w, item) for w, item in read.items() if w == self.worker_id)
        return attrs.evolve(fresh, workers=tuple(listed[w] for w in sorted(listed)))

    def deaths_listed(self, deaths: Sequence[DeathMarker]) -> None:
        """The hand-off poll's listing: a death marker newer than our view wakes the round."""
        view = self.roster
        if view is not None and any(d.generation > view.generation for d in deaths):
            self.death_seen.set()

    async def next_round(self, interval: float) -> None:
        """Sleep until the next round: the interval, sooner when a watched peer's lease falls
        due (``round_policy.next_round_in``) or a death marker was seen."""
        now = self.now()
        with trio.move_on_after(
            round_policy.next_round_in(now, interval, self.tracker.next_due(now))
        ):
            await self.death_seen.wait()
        if self.death_seen.is_set():
            self.death_seen = trio.Event()

    # --- between rounds ----------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        """Between rounds, read each watched peer eventually consistently about when its next
        heartbeat should land, then a little later while it has not (``peer_watch``): the
        lease's clock then starts within tens of ms of the heartbeat, not up to a round
        later, and the round that falls due (``PeerTracker.next_due``) confirms with its
        strongly consistent read. Half a read unit per read, K peers."""
        heartbeat = self.lease.heartbeat_interval
        while True:
            now = self.now()
            with trio.move_on_after(min(self.book.next_read(now), now + heartbeat) - now):
                await self._ring_moved.wait()  # a round watches other peers now
            if self._ring_moved.is_set():
                self._ring_moved = trio.Event()
            async with trio.open_nursery() as reads:  # the K peers side by side
                for peer in self.book.to_read(self.now()):
                    reads.start_soon(self._watch_read, peer)

    async def _watch_read(self, peer: str) -> None:
        try:
            with trio.fail_after(self.lease.heartbeat_interval):
                seen = await self.store.watch_read(peer)
        except (StoreUnavailable, trio.TooSlowError) as exc:
            log.debug("watch read of %s failed: %s", peer, str(exc) or "timeout")
            seen = None
        at = self.now()
        clock = self.book.clocks.get(peer)
        if clock is None:  # the ring moved on meanwhile
            return
        if seen is None:
            clock.read_failed(at)
            return
        clock.observe(seen, at)
        self.tracker.saw_counter(peer, seen.counter, seen.session, at)
        view = self.roster
        known = view.by_id().get(peer) if view is not None else None
        if known is not None and seen.counter >= known.counter and seen.state != known.state:
            # Its item says more than our view (and it is not a replica older than the view):
            # the next round announces it unless the generation moved meanwhile.
            self._suspects[peer] = seen.state

    # --- notices, markers, announcements -------------------------------------------------------

    async def _declare_dead(self, worker: WorkerItem) -> None:
        """A watched peer's counter stood still for a full lease on our clock, as this round's
        strongly consistent read confirms: write its death notice (conditional on exactly that
        counter and session) and announce it, so that peers not watching it learn it at
        their next round. A notice that fails was written by its other watcher, or the peer
        beat meanwhile; either way the next read tells."""
        try:
            with trio.fail_after(self.lease.reconcile_interval):
                written = await self.store.death_notice(
                    worker.id, worker.counter, worker.session, self.worker_id
                )
        except (LeaseStoreError, trio.TooSlowError) as exc:
            log.warning("death notice for %s not written: %s", worker.id, str(exc) or "timeout")
            return
        if written:
            self.metrics.deaths_declared.inc()
            log.warning(
                "declared worker %s dead: its heartbeat counter %d stood still for %ss",
                worker.id,
                worker.counter,
                self.lease.duration,
                extra={"worker": worker.id},
            )
            generation = await self.announce("death")  # after the write: peers read the table
            if self.protocol == 2:
                await self.route(worker.id)
                await self._route_late_arrivals(worker.id)
            elif generation is not None:
                await self._mark_death(worker.id, generation)

    async def route(self, dead: str, *, unrouted_only: bool = False) -> int:
        """Protocol 2: name a successor on each of a gone worker's shards (owned by it, or
        addressed to it and not taken), conditional on the owner and epoch listed; the named
        worker's hand-off poll takes it. ``core.routing.route`` chooses from our view: the
        shard's first standby on the ring (``first_standby``) if it is live and has room,
        else the highest-ranked live member with room.

        Listed first, then the worker read strongly consistently: only if it is still gone
        (``dead`` or ``stopped``) is anything routed. A worker that joined again in between
        may have taken shards at a new epoch; those the listing missed, and what it listed
        at an older epoch no routing write can match. So a live owner's shard is never
        routed. ``unrouted_only``: the sweeper's pass (a shard named for someone stays
        theirs). The number routed; both watchers may route, the writes are conditional."""
        try:
            with trio.fail_after(self.lease.reconcile_interval):
                owned, addressed = await both(
                    lambda: self.fleet.owned_by(dead), lambda: self.fleet.addressed_to(dead)
                )
                # Addressed to it: released to it (unowned), or routed to it (owned, no
                # hand-off stage); a live owner's make-before-break request is not ours.
                items = [*owned, *(i for i in addressed if not i.owner or not i.handoff_stage)]
                if unrouted_only:  # addressed to the dead worker itself: nobody else's
                    items = [item for item in items if item.successor in ("", dead)]
                if not items:
                    return 0
                seen = await self.fleet.watch_read(dead, consistent=True)
                if seen is not None and seen.state not in peer_watch.GONE_STATES:
                    log.info("%s is back (%s): its shards are its own again", dead, seen.state)
                    return 0
                live = [m.id for m in self.members if m.state == "running" and m.id != dead]
                chosen = routing.route(
                    items,
                    dead=dead,
                    live=live,
                    caps={m.id: m.max_shards for m in self.members if m.max_shards},
                    held={m.id: m.held for m in self.members},
                    first_standby=lambda shard: self.first_standby(shard, dead),
                )
                routed = 0
                for item in items:
                    if item.id in chosen and await self.fleet.route(
                        item.id, item.owner, item.epoch, chosen[item.id], dead=dead
                    ):
                        routed += 1
        except (LeaseStoreError, trio.TooSlowError) as exc:
            log.warning("shards of %s not routed: %s", dead, str(exc) or "timeout")
            return 0
        log.info("routed %d of %d shards of %s", routed, len(items), dead)
        return routed

    async def _route_late_arrivals(self, dead: str) -> None:
        """Protocol 2: route again, a lease and two leases on. A peer that had not heard of
        the death yet may still name the dead worker as a drain's or a release's successor
        (its view was a round old), and only the dead worker would ever read that: its
        shard would stay released and untaken. Every live peer hears of the death within a
        round; a release it decided before that lands within its child's stop."""
        for _ in range(LATE_ROUTE_PASSES):
            await trio.sleep(self.lease.duration)
            await self.route(dead)

    async def _mark_death(self, worker_id: str, generation: int) -> None:
        """List a death marker for a few rounds: every worker's hand-off poll (250 ms) sees it
        and runs a round at once, so the peers that do not watch the dead worker take their
        part of its shards within a poll of the notice rather than at their next round."""
        try:
            with trio.fail_after(STORE_WRITE_TIMEOUT):
                await self.store.mark_death(worker_id, generation)
        except (LeaseStoreError, trio.TooSlowError) as exc:
            log.warning("death marker for %s not written: %s", worker_id, str(exc) or "timeout")
            return
        self._markers.add(worker_id)
        await trio.sleep(DEATH_MARKER_ROUNDS * self.lease.reconcile_interval)
        await self.clear_death_marker(worker_id)

    async def clear_death_marker(self, worker_id: str) -> None:
        """Bounded, best effort: a marker left listed costs each poll a few dozen bytes until
        that worker id registers again (it clears its own)."""
        self._markers.discard(worker_id)
        with trio.move_on_after(STORE_WRITE_TIMEOUT):
            try:
                await self.store.clear_death_marker(worker_id)
            except LeaseStoreError as exc:
                log.warning("death marker for %s not cleared: %s", worker_id, exc)

    async def clear_death_markers(self) -> None:
        """At exit: the markers we listed, whose clearing rounds will not come."""
        for worker_id in list(self._markers):
            await self.clear_death_marker(worker_id)

    async def announce(self, why: str) -> int | None:
        """Raise the membership generation after writing a change (bounded, best effort: a
        lost announcement is made by the changed worker's watchers, who see the change).
        The new generation, or None."""
        with trio.move_on_after(STORE_WRITE_TIMEOUT):
            try:
                return await self.store.announce(why)
            except LeaseStoreError as exc:
                log.warning("membership change (%s) not announced: %s", why, exc)
        return None
