"""A fleet on protocol 2, round by round: the cores, the real planner, the billed memory store.

Each simulated supervisor does what docs/lease-protocol.md (*Protocol 2*) says, through
``MemoryLeaseStore.fleet`` (every request billed as DynamoDB would): heartbeat; read the meta
item and re-read the members when the generation moved; read the peers the watch ring gives it
when ``WatchBook`` says, confirm and write the death notice when one falls due, route the dead
worker's shards; poll the shards addressed to it; plan with ``plan_round`` on only what concerns
it, take from its vacant buckets while short, shed by name through ``deal_excess``. With
``standbys`` (``[standby] count``), protocol 2's standby placement: candidates from the ring
(``core.standby_ring``), a dead owner's shard routed to its first standby, and each holder's
standby-wanted marker written when it names someone, read by the named worker every lease and
after a membership change. Time moves one
round (``R``) at a time; within a round the watch reads keep their own times. The hand-off poll
runs every ``POLL``: one real query per round and the rest billed as the empty queries they are
(nothing is addressed between two rounds here).
"""

from __future__ import annotations

import attrs

from supervisor.adapters.lease_store.base import LeaseConflict
from supervisor.adapters.lease_store.billing import PARTITION_RCU, PARTITION_WCU, Meter
from supervisor.adapters.lease_store.memory import MemoryLeaseStore
from supervisor.adapters.lease_store.memory_fleet import MemoryFleet
from supervisor.core.items import ShardItem, WorkerItem
from supervisor.core.lease import PeerTracker
from supervisor.core.membership import MembershipView, deal_excess, view_tracker
from supervisor.core.partition_keys import VACANT_BUCKETS, start_spot, vacant_buckets
from supervisor.core.peer_watch import WatchBook
from supervisor.core.planner import fair_targets, plan_round
from supervisor.core.routing import route
from supervisor.core.standby_ring import Ring, standbys, wants_extra
from supervisor.core.watch_ring import watched_by

D, H, R, POLL = 10.0, 2.0, 2.0, 0.25  # lease duration, heartbeat, round, hand-off poll
SHORT_SCAN = D  # how often a short worker whose buckets are empty may read every bucket
MAX_TAKES = 50  # per worker per round: its own# key at 2.5 %, a vacant bucket at 10 %


@attrs.define
class Worker:
    id: str
    fleet: MemoryFleet
    book: WatchBook
    session: str = ""
    started: float = 0.0
    state: str = "running"
    alive: bool = True
    view: MembershipView | None = None
    held: dict[str, int] = attrs.field(factory=dict)
    held_since: dict[str, float] = attrs.field(factory=dict)
    seen_generation: int = -1
    scanned_at: float = float("-inf")  # when it last read every vacant bucket
    markers_read_at: float = float("-inf")  # when it last read the markers naming it
    markers_generation: int = -2  # the view's generation at that read


@attrs.define
class Simulation:
    shard_ids: list[str]
    store: MemoryLeaseStore = attrs.field(factory=lambda: MemoryLeaseStore(table_exists=True))
    meter: Meter = attrs.field(factory=Meter)
    workers: dict[str, Worker] = attrs.field(factory=dict)
    now: float = 0.0
    hottest: tuple[float, str] = (0.0, "")  # the largest share of a partition limit, and key
    deaths: dict[str, float] = attrs.field(factory=dict)  # victim -> when it died
    failovers: list[float] = attrs.field(factory=list)  # death -> take, per shard
    moves: int = 0
    standbys: int = 0  # [standby] count (0: no standby placement simulated)
    markers: dict[str, str] = attrs.field(factory=dict)  # shard -> whom its holder named
    marker_peak: int = 0  # the most markers one worker's read found
    _ring: tuple[tuple[int, float], Ring] | None = None
    _candidates: dict[str, tuple[str, ...]] = attrs.field(factory=dict)  # for _ring
    _trackers: dict[tuple[int, float], PeerTracker] = attrs.field(factory=dict)
    _target_cache: dict[tuple[int, float, str], dict[str, int]] = attrs.field(factory=dict)

    # --- the fleet's changes ----------------------------------------------------------------

    async def create_table(self) -> None:
        """``init-table``: the configured shards' items, vacant, before any worker starts. Paced
        in production (2,500 items/s keeps each ``v#`` bucket at 4 % of its write limit); here
        at once, and left out of the fleet's per-key load."""
        await self.store.fleet(self.meter).ensure_shards(self.shard_ids)
        self.meter.window()

    async def start(self, worker_id: str) -> None:
        fleet = self.store.fleet(self.meter)
        worker = self.workers.get(worker_id) or Worker(worker_id, fleet, WatchBook(D, H))
        session = f"{worker_id}@{self.now}"
        item = WorkerItem(worker_id, session, 0, "running", 0.0, 0.0)
        await fleet.join(item)
        self.workers[worker_id] = attrs.evolve(
            worker,
            session=session,
            started=self.now,
            state="running",
            alive=True,
            view=None,
            held={},
            held_since={},
            book=WatchBook(D, H),
        )

    def kill(self, worker_id: str) -> None:
        self.workers[worker_id].alive = False
        self.deaths[worker_id] = self.now

    def drain(self, worker_id: str) -> None:
        self.workers[worker_id].state = "draining"

    # --- a round ----------------------------------------------------------------------------

    async def round(self) -> None:
        live = [w for w in self.workers.values() if w.alive]
        for worker in live:
            await self._heartbeat(worker)
        for worker in live:
            await self._refresh(worker)
        for worker in live:
            await self._watch(worker)
        for worker in live:
            await self._poll_and_plan(worker)
        if self.standbys:
            for worker in live:
                if worker.alive:
                    await self._standby_markers(worker)
        reads, writes = self.meter.window()
        for key, units in reads.items():
            self.hottest = max(self.hottest, (units / R / PARTITION_RCU, key))
        for key, units in writes.items():
            self.hottest = max(self.hottest, (units / R / PARTITION_WCU, key))
        self.now += R

    async def _heartbeat(self, worker: Worker) -> None:
        if worker.state == "draining" and not worker.held and worker.seen_generation >= 0:
            await worker.fleet.heartbeat(worker.id, worker.session, "stopped", 0)
            worker.alive = False  # a clean exit: stopped, announced
            return
        try:
            await worker.fleet.heartbeat(worker.id, worker.session, worker.state, len(worker.held))
        except LeaseConflict:  # declared dead: its lease had lapsed; drop all, join again
            await self.start(worker.id)

    async def _refresh(self, worker: Worker) -> None:
        generation = await worker.fleet.read_generation()
        if worker.view is None or worker.view.needs_reread(generation, self.now, 300.0):
            members = await worker.fleet.read_members()
            worker.view = MembershipView.read(generation, members, self.now, worker.view)
            worker.book.watch(watched_by(worker.id, worker.view.on_ring()))

    async def _watch(self, worker: Worker) -> None:
        end = self.now + R
        while (at := worker.book.next_wake(self.now)) < end:
            for peer in worker.book.to_read(at):
                seen = await worker.fleet.watch_read(peer, consistent=False)
                clock = worker.book.clocks[peer]
                clock.read_failed(at) if seen is None else clock.observe(seen, at)
            for peer in worker.book.to_confirm(at):
                seen = await worker.fleet.watch_read(peer, consistent=True)
                clock = worker.book.clocks[peer]
                if seen is None:
                    clock.read_failed(at)
                elif clock.confirm(seen, at) and await worker.fleet.death_notice(
                    peer, seen.counter, seen.session
                ):
                    await self._route(worker, peer)
            if worker.book.next_wake(at) <= at:
                break  # only gone peers or past events left: nothing more this round

    async def _route(self, worker: Worker, dead: str) -> None:
        view = worker.view
        assert view is not None
        addressed = await worker.fleet.addressed_to(dead)  # handed to it, not yet taken
        items = (*await worker.fleet.owned_by(dead), *addressed)

        def first_standby(shard: str) -> str:  # the standby-first rule (with standbys)
            if not self.standbys:
                return ""
            found = standbys(self._candidates_of(view, shard), dead, self.standbys)
            return found[0] if found else ""

        chosen = route(
            items,
            dead=dead,
            live=view.live(),
            caps=view.caps(),
            held={m.id: m.held for m in view.members},
            first_standby=first_standby,
        )
        for item in items:
            if item.id in chosen:
                await worker.fleet.route(
                    item.id, item.owner, item.epoch, chosen[item.id], dead=dead
                )

    async def _poll_and_plan(self, worker: Worker) -> None:
        addressed = await worker.fleet.addressed_to(worker.id)
        for _ in range(int(R / POLL) - 1):
            self.meter.query("addressed_to", f"successor:{worker.id}", [])
        view = worker.view
        assert view is not None
        running = worker.state == "running"
        targets = self._targets(view, worker.id if running else "")
        target = targets.get(worker.id, 0)
        changed = view.generation != worker.seen_generation
        worker.seen_generation = view.generation
        if not (changed or addressed or len(worker.held) != target):
            return
        vacant: list[ShardItem] = []
        if running and len(worker.held) < target:  # short: look in its vacant buckets
            turn = int(self.now / R)
            for number in vacant_buckets(worker.id, view.live()):
                vacant += await worker.fleet.vacant_in(number, start_spot(worker.id, number, turn))
            if not vacant and not addressed and self.now - worker.scanned_at >= SHORT_SCAN:
                worker.scanned_at = self.now  # still short, its buckets empty: all of them
                for number in range(VACANT_BUCKETS):
                    vacant += await worker.fleet.vacant_in(
                        number, start_spot(worker.id, number, turn)
                    )
            vacant = list({item.id: item for item in vacant}.values())
        items = [ShardItem(s, worker.id, e) for s, e in worker.held.items()]
        items += [i for i in (*addressed, *vacant) if i.id not in worker.held]
        plan = plan_round(
            me=worker.id,
            held=worker.held,
            held_since=worker.held_since,
            shards=items,
            configured=[i.id for i in items],
            tracker=self._tracker(view),
            now=self.now,
            accepting=running,
            min_dwell=D,
            shard_count=len(self.shard_ids),
            peer_caps=view.caps(),
            standby_claims=[i.id for i in addressed if i.owner],
        )
        for take in plan.take[:MAX_TAKES]:
            new = await worker.fleet.take(
                take.shard_id, worker.id, take.expected_owner, take.expected_epoch
            )
            if new is not None:
                worker.held[new.id], worker.held_since[new.id] = new.epoch, self.now
                self.moves += 1
                if take.expected_owner in self.deaths:
                    self.failovers.append(self.now - self.deaths[take.expected_owner])
        shed = list(plan.shed) if running else sorted(worker.held)
        await self._shed(worker, shed, targets)

    async def _shed(self, worker: Worker, shed: list[str], targets: dict[str, int]) -> None:
        if not shed:
            return
        # Name successors from current counts: a view read at the last membership change
        # would deal to workers that have filled up since (one re-read per shedding round).
        members = await worker.fleet.read_members()
        held = {m.id: m.held for m in members if m.state in ("running", "draining")}
        held[worker.id] = len(worker.held)
        names = deal_excess(targets, held).get(worker.id, ())
        for index, shard in enumerate(shed):
            successor = names[index] if index < len(names) else ""
            epoch = worker.held[shard]
            if await worker.fleet.release(shard, worker.id, epoch, successor):
                del worker.held[shard]
                worker.held_since.pop(shard, None)
                await self._set_marker(worker, shard, epoch, "")  # its marker goes too

    # --- standbys on protocol 2 ---------------------------------------------------------------

    async def _standby_markers(self, worker: Worker) -> None:
        """The holder's part: a marker naming the (k+1)-th candidate of each shard it holds
        while it is among the first k. The named worker's part: its markers read every lease
        and after a membership change."""
        view = worker.view
        assert view is not None
        for shard, epoch in list(worker.held.items()):
            named = wants_extra(self._candidates_of(view, shard), worker.id, self.standbys)
            await self._set_marker(worker, shard, epoch, named)
        moved = worker.seen_generation != worker.markers_generation
        if moved or self.now - worker.markers_read_at >= D:
            worker.markers_read_at, worker.markers_generation = self.now, worker.seen_generation
            mine = await worker.fleet.wanted_of(worker.id)
            self.marker_peak = max(self.marker_peak, len(mine))

    async def _set_marker(self, worker: Worker, shard: str, epoch: int, named: str) -> None:
        """The holder writes (``named`` "": removes) the shard's marker when whom it names
        changed (``MemoryFleet.want_standby``, billed); a later holder's stands."""
        old = self.markers.get(shard, "")
        if old == named or not self.standbys:
            return
        if await worker.fleet.want_standby(shard, worker.id, epoch, named):
            if named:
                self.markers[shard] = named
            else:
                del self.markers[shard]

    def _candidates_of(self, view: MembershipView | None, shard: str) -> tuple[str, ...]:
        """The shard's candidates in ``view`` (one ring per view, shared: every worker would
        build the same)."""
        assert view is not None
        key = (view.generation, view.read_at)
        if self._ring is None or self._ring[0] != key:
            self._ring = (key, Ring.build(view.live(), self.shard_ids, self.standbys))
            self._candidates = {}
        if shard not in self._candidates:
            self._candidates[shard] = self._ring[1].candidates(shard)
        return self._candidates[shard]

    def _targets(self, view: MembershipView, me: str) -> dict[str, int]:
        """Every worker computes the same targets from one view: computed once per view here."""
        key = (view.generation, view.read_at, me if me not in view.live() else "")
        if key not in self._target_cache:
            live = set(view.live()) | ({me} if me else set())
            self._target_cache[key] = fair_targets(len(self.shard_ids), live, view.caps())
        return self._target_cache[key]

    def _tracker(self, view: MembershipView) -> PeerTracker:
        key = (view.generation, self.now)
        if key not in self._trackers:
            self._trackers = {key: view_tracker(view, D, self.now)}
        return self._trackers[key]

    # --- what the test checks ---------------------------------------------------------------

    def balanced(self) -> bool:
        """Every shard owned by a live worker, loads within one of each other."""
        live = [w for w in self.workers.values() if w.alive and w.state == "running"]
        loads = [len(w.held) for w in live]
        owned = sum(loads) + sum(
            len(w.held) for w in self.workers.values() if w.alive and w.state != "running"
        )
        return owned == len(self.shard_ids) and max(loads) - min(loads) <= 1

    def check_single_owner(self) -> None:
        """What each live worker believes it holds matches the table, and no shard twice."""
        seen: set[str] = set()
        table = self.store._table.shards
        for worker in self.workers.values():
            if not worker.alive:
                continue
            for shard, epoch in worker.held.items():
                assert shard not in seen, f"{shard} held twice"
                seen.add(shard)
                assert (table[shard].owner, table[shard].epoch) == (worker.id, epoch)

    async def until_balanced(self, limit: int = 40) -> int:
        for rounds in range(1, limit + 1):
            await self.round()
            self.check_single_owner()
            if self.balanced():
                return rounds
        raise AssertionError(f"not balanced after {limit} rounds")
