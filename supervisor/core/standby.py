"""Warm standbys as pure code: where each shard's standbys run, and who claims a dead owner's
shard first.

Placement needs no negotiation: every worker computes it from the same snapshot (like the
planner's targets). For each owned shard, the live members other than its owner, ranked by
``rendezvous_rank(worker, shard)`` (highest first) and skipping workers at their
``max_standbys``, give its ``k`` standbys. A shard handed off by name and not yet taken counts
its successor as its owner, so a hand-off does not stir its other standbys; one released by a
dead supervisor's child (its last will) keeps its standbys. Too few peers: the rest is not
placed (a warning, never a crash). Pure: the driver passes the snapshot and ``now``.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping

import attrs

from shard_worker.contract.table import LAST_WILL
from supervisor.core.items import ShardItem
from supervisor.core.lease import PeerTracker
from supervisor.core.planner import rendezvous_rank


@attrs.frozen
class Placement:
    """Each shard's standby workers, the first one first; and what could not be placed."""

    by_shard: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    unplaced: Mapping[str, int] = attrs.field(factory=dict)  # shard -> standbys missing

    def mine(self, me: str) -> frozenset[str]:
        """The shards whose standby runs on ``me``."""
        return frozenset(shard for shard, workers in self.by_shard.items() if me in workers)

    def first(self, shard: str) -> str:
        """The standby that claims the shard first if its owner dies ("" = none)."""
        workers = self.by_shard.get(shard, ())
        return workers[0] if workers else ""


def holder(item: ShardItem) -> str:
    """Who runs the shard, or is about to: its owner, else the successor it was handed to."""
    return item.owner or item.successor


def orphaned(item: ShardItem) -> bool:
    """Released by the last will of a child whose supervisor died (and not yet retaken): its
    standbys stay where they were (the dead owner is no live member any more) and claim it
    first, as they would a dead owner's shard."""
    return not item.owner and not item.successor and item.state == LAST_WILL


def place_standbys(
    *,
    shards: Iterable[ShardItem],
    wanted: Mapping[str, int],
    live: Collection[str],
    caps: Mapping[str, int] | None = None,
    ranks: Rankings | None = None,
) -> Placement:
    """Standbys for every shard in ``wanted`` (shard -> k) that has a holder, from the
    ``live`` workers that can run standbys. ``caps`` holds each worker's ``max_standbys``
    (absent or 0 = no cap). Shards are placed in id order, so every worker counts the caps
    alike. ``ranks``, kept from round to round, makes a round O(shards) instead of
    O(shards x workers); the placement is the same with it or without."""
    caps = caps or {}
    ranks = Rankings() if ranks is None else ranks
    live = set(live)
    ranks.see(live)
    ranks.keep_only({sid for sid, k in wanted.items() if k > 0})
    used: Counter[str] = Counter()
    by_shard: dict[str, tuple[str, ...]] = {}
    unplaced: dict[str, int] = {}
    for item in sorted(shards, key=lambda i: i.id):
        k, owner = wanted.get(item.id, 0), holder(item)
        if k <= 0 or not (owner or orphaned(item)):
            continue
        candidates = (w for w in ranks.walk(item.id, live) if w != owner)
        eligible = (w for w in candidates if not 0 < caps.get(w, 0) <= used[w])
        chosen = tuple(itertools.islice(eligible, k))
        used.update(chosen)
        if chosen:
            by_shard[item.id] = chosen
        if len(chosen) < k:
            unplaced[item.id] = k - len(chosen)
    return Placement(by_shard, unplaced)


def _order(worker: str, shard: str) -> int:
    """Sorts best first: the rendezvous rank, highest first, as an int (cheap to compare)."""
    return -int.from_bytes(rendezvous_rank(worker, shard), "big")


@attrs.define
class _Prefix:
    """The exact best-first beginning of one shard's ranking of ``Rankings``' first ``seen``
    workers (all of them when ``complete``)."""

    seen: int
    top: list[tuple[int, str]]
    complete: bool


@attrs.define
class Rankings:
    """Each shard's workers in rendezvous order, kept across rounds. Ranking every live worker
    for every shard each round is O(shards x workers) hashes: 0.8 s of CPU a round at 100
    workers and 10,000 shards, with the event loop blocked meanwhile, and more as the fleet
    grows. Kept here: the best ``depth`` workers of each shard among every worker seen,
    brought up to date by ranking only the workers that appeared since; a round walks them,
    skipping workers not live, and ranks the shard again, deeper, only when they run out.
    Workers that left stay ranked until they outnumber the live ones, then all is ranked
    afresh, and shards no longer wanted are forgotten (bounded memory: a fleet whose worker
    ids change at every deploy, or whose shards come and go, does not grow it)."""

    depth: int = 4
    _workers: list[str] = attrs.field(factory=list)
    _known: set[str] = attrs.field(factory=set)
    _prefixes: dict[str, _Prefix] = attrs.field(factory=dict)

    def see(self, live: Collection[str]) -> None:
        """Adds the live workers not seen yet (in id order: the same on every worker)."""
        if len(self._known - set(live)) > len(live) + self.depth:
            self._workers, self._known, self._prefixes = [], set(), {}
        new = sorted(set(live) - self._known)
        self._workers += new
        self._known.update(new)

    def keep_only(self, shards: Collection[str]) -> None:
        """Forgets the rankings of shards not in ``shards`` (removed, or no standby wanted)."""
        if len(self._prefixes) > len(shards):
            self._prefixes = {s: p for s, p in self._prefixes.items() if s in shards}

    def prepare(self, shard: str) -> None:
        """Ranks the shard now (or brings it up to date), so that the next walk need not:
        the driver spreads a first round's ranking over many small steps this way."""
        self._current(shard)

    def walk(self, shard: str, live: Collection[str]) -> Iterator[str]:
        """The ``live`` workers (all seen already) in the shard's rendezvous order, best first."""
        prefix = self._current(shard)
        at = 0
        while True:
            for _, worker in prefix.top[at:]:
                if worker in live:
                    yield worker
            at = len(prefix.top)
            if prefix.complete:
                return
            prefix = self._rank(shard, 2 * len(prefix.top))

    def _current(self, shard: str) -> _Prefix:
        prefix = self._prefixes.get(shard)
        if prefix is None:
            return self._rank(shard, self.depth)
        for worker in self._workers[prefix.seen :]:
            entry = (_order(worker, shard), worker)
            if prefix.complete or entry < prefix.top[-1]:
                bisect.insort(prefix.top, entry)
                if not prefix.complete:
                    prefix.top.pop()
        prefix.seen = len(self._workers)
        return prefix

    def _rank(self, shard: str, depth: int) -> _Prefix:
        ranked = heapq.nsmallest(depth, ((_order(w, shard), w) for w in self._workers))
        prefix = _Prefix(len(self._workers), ranked, len(ranked) == len(self._workers))
        self._prefixes[shard] = prefix
        return prefix


@attrs.define
class FreeWatch:
    """When this worker first saw each shard free (its owner dead): the others leave it to
    its first standby for a while after that. A shard that is no longer free is forgotten."""

    _since: dict[str, float] = attrs.field(factory=dict)

    def observe(self, free: Iterable[str], now: float) -> None:
        free = set(free)
        self._since = {sid: self._since.get(sid, now) for sid in free}

    def since(self, shard: str, now: float) -> float:
        return self._since.get(shard, now)


@attrs.frozen
class StandbyPriority:
    """For the planner: dead owners' shards we claim as their first standby (taken even
    beyond our share, like a shard handed to us by name), and the ones we leave alone for
    now because another worker's standby claims them first."""

    claims: frozenset[str] = frozenset()
    waiting: frozenset[str] = frozenset()


def standby_priority(
    *,
    me: str,
    shards: Iterable[ShardItem],
    placement: Placement,
    tracker: PeerTracker,
    watch: FreeWatch,
    now: float,
    wait: float,
) -> StandbyPriority:
    """The standby-first rule. A shard whose owner is dead (or that the last will of its dead
    supervisor's child released) and which has a placed standby goes to that (first) standby:
    it holds the recent feed, so nothing between the last checkpoint and now is lost. The
    others wait ``wait`` (one reconcile interval) from when they first saw it free; then
    anyone may take it (the standby was not there after all). Updates ``watch`` with this
    snapshot's free shards."""
    free = [i.id for i in shards if (i.owner and tracker.is_dead(i.owner, now)) or orphaned(i)]
    watch.observe(free, now)
    claims, waiting = set(), set()
    for shard in free:
        first = placement.first(shard)
        if first == me:
            claims.add(shard)
        elif first and now - watch.since(shard, now) < wait:
            waiting.add(shard)
    return StandbyPriority(frozenset(claims), frozenset(waiting))


def left_to_standbys(
    *,
    me: str,
    shards: Iterable[ShardItem],
    running: Collection[str],
    placement: Placement,
    ready: Mapping[str, Collection[str]],
    tracker: PeerTracker,
    now: float,
) -> dict[str, str]:
    """Shards still in our name from an earlier incarnation of this worker (we run nothing
    for them: it died) whose first standby is ready on a live peer: shard -> that peer. We
    hand them to it instead of retaking them with a fresh child, which on a live-only feed
    would lose everything since the death; the standby holds it. ``ready`` maps each worker
    to the standbys its item advertises as ready. Only once warm (``round_policy.warmed_up``):
    the earlier incarnation's child may write up to its fence until then."""
    found = {}
    for item in shards:
        if item.owner != me or item.id in running:
            continue
        first = placement.first(item.id)
        waiting = first and first != me and item.id in ready.get(first, ())
        if waiting and tracker.is_live_member(first, now):
            found[item.id] = first
    return found


def covers(checkpoint: Mapping[str, int], first_seq: Mapping[str, int]) -> bool:
    """Whether a standby holding each stream from ``first_seq`` on bridges a death of the owner
    whose checkpoint is ``checkpoint``: a new owner resumes after the checkpoint, so the
    standby must hold the record after it (``first_seq[s] <= checkpoint[s] + 1``). Until then
    (about one checkpoint interval after the standby connects) a host death would lose what
    lies between, so the standby is not yet advertised as ready."""
    return all(checkpoint.get(stream, 0) >= first - 1 for stream, first in first_seq.items())


@attrs.define
class UnplacedReports:
    """A standby that cannot be placed is logged once, and again only when that changes."""

    _reported: dict[str, int] = attrs.field(factory=dict)

    def new(self, unplaced: Mapping[str, int]) -> dict[str, int]:
        """The entries of ``unplaced`` not reported as they are now."""
        fresh = {s: n for s, n in sorted(unplaced.items()) if self._reported.get(s) != n}
        self._reported = dict(unplaced)
        return fresh


__all__ = [
    "FreeWatch",
    "Placement",
    "Rankings",
    "StandbyPriority",
    "UnplacedReports",
    "covers",
    "holder",
    "left_to_standbys",
    "orphaned",
    "place_standbys",
    "standby_priority",
]
