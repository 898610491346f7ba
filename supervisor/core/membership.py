"""The membership view of protocol 2: who is in the fleet, re-read only when it changed.

Protocol 1 learned the members by reading every worker item every round. Here a fleet meta
item carries a ``generation`` that every membership change raises; each round a worker reads
that one small item and re-reads the member list (the ``w#NN`` buckets of the ``fleet`` index)
only when the generation moved, when the list it has looks incomplete (an item's ``mgen`` not
yet in the index), or when ``refresh`` has passed. The view decides targets, the watch ring,
standby placement and who a shedder names; never whether a write is allowed (every lease
write stays conditional), so a stale view costs balance, not safety.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

import attrs

from supervisor.core.items import WorkerItem
from supervisor.core.lease import PeerTracker
from supervisor.core.peer_watch import GONE_STATES
from supervisor.core.planner import fair_targets

MEMBERSHIP_REFRESH = 300.0  # s: the backstop re-read when no generation change is seen


@attrs.frozen
class Member:
    """A worker item as the ``fleet`` index projects it: what the planner, the ring and the
    standby placement need, and nothing that a heartbeat changes every time."""

    id: str
    state: str  # running | draining | orphaned | stopped | dead
    max_shards: int = 0
    max_standbys: int = 0
    features: frozenset[str] = frozenset()
    held: int = 0  # shards it owns, as of its last heartbeat that changed the count
    mgen: int = 0  # the generation of its last membership change


def member_of(worker: WorkerItem, *, held: int, mgen: int) -> Member:
    """The member a worker item shows in the ``fleet`` index."""
    return Member(
        id=worker.id,
        state=worker.state,
        max_shards=worker.max_shards,
        max_standbys=worker.max_standbys,
        features=worker.features,
        held=held,
        mgen=mgen,
    )


def worker_of(member: Member) -> WorkerItem:
    """A listed member as a worker item for the views built on items: what the index shows
    (state, caps, features), no counter and no session (it judges nothing by counter)."""
    return WorkerItem(
        member.id,
        "",
        0,
        member.state,
        0.0,
        0.0,
        max_shards=member.max_shards,
        max_standbys=member.max_standbys,
        features=member.features,
    )


def announces(old: Member | None, new: Member) -> bool:
    """Whether going from ``old`` to ``new`` is a membership change (the generation must move):
    a join, a state change, a new cap or feature set; not a change of ``held``."""
    if old is None:
        return True
    keep = ("state", "max_shards", "max_standbys", "features")
    return any(getattr(old, name) != getattr(new, name) for name in keep)


@attrs.frozen
class MembershipView:
    generation: int  # of the meta item, as read just before the member list
    members: tuple[Member, ...]  # every worker item listed, in id order
    read_at: float  # our monotonic time of the re-read
    retried: bool = False  # a second read for the same generation: taken as it is

    @classmethod
    def read(
        cls,
        generation: int,
        members: Iterable[Member],
        at: float,
        previous: MembershipView | None = None,
    ) -> MembershipView:
        retried = previous is not None and previous.generation == generation
        return cls(generation, tuple(sorted(members, key=lambda m: m.id)), at, retried)

    def by_id(self) -> dict[str, Member]:
        return {member.id: member for member in self.members}

    def live(self) -> tuple[str, ...]:
        """The members that take shards (``running``), in id order."""
        return tuple(m.id for m in self.members if m.state == "running")

    def on_ring(self) -> tuple[str, ...]:
        """The workers someone must watch: alive ones, taking shards or not (a draining or an
        orphaned worker may still own shards until its lease runs out)."""
        return tuple(m.id for m in self.members if m.state not in GONE_STATES)

    def caps(self) -> dict[str, int]:
        return {m.id: m.max_shards for m in self.members if m.max_shards}

    def complete(self) -> bool:
        """False when a change the generation counts may not have reached the index yet (the
        highest ``mgen`` listed is below the generation read)."""
        return max((m.mgen for m in self.members), default=0) >= self.generation

    def needs_reread(self, generation: int, now: float, refresh: float) -> bool:
        """The generation moved, the view looks incomplete (read once more, the next round: a
        bump whose item write never came, a writer that died between the two, would otherwise
        keep every worker re-reading), or ``refresh`` has passed."""
        incomplete = not self.complete() and not self.retried
        return generation != self.generation or incomplete or now - self.read_at >= refresh


@attrs.frozen
class RosterView:
    """Protocol 1's table, read without the O(W²) of reading every worker item every round.

    Each round reads the ``roster`` index (the worker ids) and, strongly consistently in one
    ``BatchGetItem``, the meta item, our own item and the K peers the watch ring gives us; every
    item only when the view may be out of date: the generation moved since the last full read,
    the ids changed (a worker of an older version joins without announcing), a watched peer
    shows a change nobody announced, or ``refresh`` has passed. Every full read follows the
    read that showed the generation it is recorded for, and every change is written before it
    is announced, so a full read never records a generation whose change it missed.
    """

    generation: int  # as read in the round that decided the full read; -1: not yet known
    ids: frozenset[str]
    read_at: float
    workers: tuple[WorkerItem, ...]  # as last read, fully or in part, in id order

    @classmethod
    def full(
        cls, generation: int, ids: Iterable[str], workers: Iterable[WorkerItem], at: float
    ) -> RosterView:
        return cls(generation, frozenset(ids), at, tuple(sorted(workers, key=lambda w: w.id)))

    def needs_full(self, generation: int, ids: Iterable[str], now: float, refresh: float) -> bool:
        return (
            generation != self.generation
            or frozenset(ids) != self.ids
            or (now - self.read_at >= refresh)
        )

    def updated(self, fresh: Iterable[WorkerItem]) -> RosterView:
        """The view with some items read again (ours, the watched peers')."""
        by_id = dict(self.by_id())
        by_id.update((worker.id, worker) for worker in fresh if worker.id in self.ids)
        return attrs.evolve(self, workers=tuple(by_id[k] for k in sorted(by_id)))

    def unannounced(self, fresh: Iterable[WorkerItem]) -> tuple[str, ...]:
        """Peers whose fresh item differs from the view in what the view is for (a change
        whose announcement was lost, a child's ``orphaned`` mark, a worker of an older
        version): the watcher announces it for them."""
        by_id = self.by_id()
        return tuple(
            worker.id
            for worker in fresh
            if worker.id in by_id and _membership_of(by_id[worker.id]) != _membership_of(worker)
        )

    def on_ring(self) -> tuple[str, ...]:
        """Who someone must watch: every worker not gone (a draining or orphaned one may
        still own shards until its lease runs out)."""
        return tuple(w.id for w in self.workers if w.state not in GONE_STATES)

    def by_id(self) -> Mapping[str, WorkerItem]:
        """Built once per view: the watch loop looks peers up on every read."""
        return self._by_id

    @functools.cached_property
    def _by_id(self) -> dict[str, WorkerItem]:
        return {worker.id: worker for worker in self.workers}


def _membership_of(worker: WorkerItem) -> tuple[object, ...]:
    return (worker.state, worker.max_shards, worker.max_standbys, worker.features, worker.standbys)


def deal_excess(targets: Mapping[str, int], held: Mapping[str, int]) -> dict[str, tuple[str, ...]]:
    """Name a successor for each shard a worker sheds, alike on every worker from one view.

    The fleet's excess (each worker over its target, in id order, one slot per extra shard) is
    dealt to the members short of their target (in id order, as many slots as each lacks), so
    every shedder names the workers that need shards, without reading their items, and no
    two shedders overfill one worker. Returns shedder -> successors, one per shard it sheds;
    an excess beyond what the short members lack gets no name ("").
    """
    short = [
        (w, targets[w] - held.get(w, 0)) for w in sorted(targets) if targets[w] > held.get(w, 0)
    ]
    dealt: dict[str, tuple[str, ...]] = {}
    at, used = 0, 0  # the short member being filled, and how much of its lack is dealt
    for worker in sorted(held):
        excess = held[worker] - targets.get(worker, 0)
        if excess <= 0:
            continue
        names: list[str] = []
        while len(names) < excess and at < len(short):
            name, lack = short[at]
            count = min(excess - len(names), lack - used)
            names += [name] * count
            used += count
            if used == lack:
                at, used = at + 1, 0
        dealt[worker] = tuple(names) + ("",) * (excess - len(names))
    return dealt


def view_targets(view: MembershipView, shard_count: int, me: str, my_cap: int) -> dict[str, int]:
    """Every live member's fair share of ``shard_count`` (plus us while we accept), with the caps
    the members advertise: the same targets every worker computes from the same view."""
    live = set(view.live()) | {me}
    return fair_targets(shard_count, live, {**view.caps(), me: my_cap})


def view_tracker(view: MembershipView, duration: float, now: float) -> PeerTracker:
    """A ``PeerTracker`` that judges as the view says, for the planner: in protocol 2 the watch
    ring and the death notices judge liveness, so a listed worker is alive for ``duration``
    from ``now`` unless its item says it is gone (``dead`` counts as ``stopped``: its shards
    are taken only through a routing or a take conditional on owner and epoch)."""
    tracker = PeerTracker(duration)
    tracker.observe(
        (
            WorkerItem(m.id, "", 0, "stopped" if m.state in GONE_STATES else m.state, 0.0, 0.0)
            for m in view.members
        ),
        now,
    )
    return tracker
