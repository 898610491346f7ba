"""Lease decisions as pure code: observations and ``now`` in, decisions out (no I/O, no clock).

* ``PeerTracker`` judges peers alive or dead the way KCL judges leases: by watching their
  heartbeat counter change on *our* monotonic clock. Wall clocks of other hosts are never compared.
* ``OwnLease`` measures our own validity from when we *sent* our last successful heartbeat, so we
  stop before any peer can possibly declare us dead.
* ``plan_round`` decides, for one reconcile round, which shards to take, which we have lost and
  which to hand back so the fleet stays balanced.
See docs/lease-protocol.md for the argument why this never lets two workers write one shard.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence

import attrs

from supervisor.store import ShardItem, WorkerItem

_NEVER = float("-inf")


@attrs.define
class _Seen:
    counter: int | None
    changed_at: float  # our monotonic time when the counter last changed (or was first seen)
    state: str


@attrs.define
class PeerTracker:
    """Peer liveness from heartbeat counters watched on the local monotonic clock."""

    duration: float
    _seen: dict[str, _Seen] = attrs.field(factory=dict)

    def observe(self, workers: Iterable[WorkerItem], now: float) -> None:
        for worker in workers:
            seen = self._seen.get(worker.id)
            if seen is None or seen.counter != worker.counter:
                self._seen[worker.id] = _Seen(worker.counter, now, worker.state)
            else:
                seen.state = worker.state

    def observe_owner(self, owner: str, now: float) -> None:
        """An owner with no worker item at all: start its clock at first sight."""
        if owner and owner not in self._seen:
            self._seen[owner] = _Seen(None, now, "")

    def is_dead(self, worker_id: str, now: float) -> bool:
        seen = self._seen.get(worker_id)
        if seen is None:
            return False  # never observed: give it a full duration from first sight
        if seen.state == "stopped":
            return True  # retired cleanly: its children are gone
        return now - seen.changed_at >= self.duration

    def is_live_member(self, worker_id: str, now: float) -> bool:
        """Alive and taking shards (a draining worker is alive but takes nothing)."""
        seen = self._seen.get(worker_id)
        return seen is not None and seen.state == "running" and not self.is_dead(worker_id, now)

    def known(self) -> list[str]:
        return sorted(self._seen)


@attrs.define
class OwnLease:
    """Our own lease: valid until (last successful heartbeat *sent* + duration - safety margin)."""

    duration: float
    safety_margin: float
    valid_until: float = _NEVER

    def heartbeat_succeeded(self, sent_at: float) -> None:
        self.valid_until = max(self.valid_until, sent_at + self.duration - self.safety_margin)

    def is_valid(self, now: float) -> bool:
        return now < self.valid_until

    def invalidate(self) -> None:
        self.valid_until = _NEVER


@attrs.frozen
class Take:
    shard_id: str
    expected_owner: str  # "" = unowned
    expected_epoch: int


@attrs.frozen
class Plan:
    take: tuple[Take, ...] = ()
    lost: tuple[str, ...] = ()  # held by us, but the table says another owner or epoch
    shed: tuple[str, ...] = ()  # held by us, to hand back gracefully for balance


def rendezvous_rank(worker_id: str, shard_id: str) -> bytes:
    """Highest-random-weight order: each worker prefers different shards, so takes rarely race."""
    return hashlib.blake2b(f"{worker_id}\0{shard_id}".encode(), digest_size=8).digest()


def fair_target(shard_count: int, live_workers: int) -> int:
    return math.ceil(shard_count / max(live_workers, 1))


def plan_round(
    *,
    me: str,
    held: Mapping[str, int],
    held_since: Mapping[str, float],
    shards: Sequence[ShardItem],
    configured: Iterable[str],
    tracker: PeerTracker,
    now: float,
    accepting: bool,
    min_dwell: float,
    recently_shed: Mapping[str, float] | None = None,
) -> Plan:
    """One reconcile round. ``held`` maps shard -> epoch for shards with a running child here.

    ``recently_shed`` maps shard -> when we handed it back: we do not take it again within
    ``min_dwell``, so a shed shard goes to the peer that needs it instead of bouncing back.
    """
    wanted = set(configured)
    items = {s.id: s for s in shards if s.id in wanted}
    for item in items.values():
        tracker.observe_owner(item.owner, now)
    lost = tuple(
        sid
        for sid, epoch in sorted(held.items())
        if sid not in items or items[sid].owner != me or items[sid].epoch != epoch
    )
    keeping = [sid for sid in held if sid not in lost]
    live = {w for w in tracker.known() if tracker.is_live_member(w, now)}
    if accepting:
        live.add(me)
    target = fair_target(len(items), len(live))
    take: list[Take] = []
    if accepting:
        room = target - len(keeping)
        cooling = {sid for sid, at in (recently_shed or {}).items() if now - at < min_dwell}
        found = _candidates(me, items.values(), held, tracker, now)
        for item in [i for i in found if i.id not in cooling][: max(room, 0)]:
            take.append(Take(item.id, item.owner, item.epoch))
    shed = _shed(me, keeping, held_since, items.values(), live, target, now, min_dwell)
    return Plan(take=tuple(take), lost=lost, shed=shed)


def _candidates(
    me: str,
    items: Iterable[ShardItem],
    held: Mapping[str, int],
    tracker: PeerTracker,
    now: float,
) -> list[ShardItem]:
    """Takeable shards, ours from an earlier incarnation first, then by rendezvous rank."""
    found = [
        item
        for item in items
        if item.id not in held
        and (not item.owner or item.owner == me or tracker.is_dead(item.owner, now))
    ]
    found.sort(key=lambda item: (item.owner != me, rendezvous_rank(me, item.id)))
    return found


def _shed(
    me: str,
    keeping: Sequence[str],
    held_since: Mapping[str, float],
    items: Iterable[ShardItem],
    live: set[str],
    target: int,
    now: float,
    min_dwell: float,
) -> tuple[str, ...]:
    """Hand back one shard per round while we hold two more than the least-loaded live peer.

    Only shards held for ``min_dwell`` move, and only one per round: balance without flapping.
    The least-preferred shard (highest rendezvous rank) goes first.
    """
    peers = {peer: 0 for peer in live if peer != me}
    if not peers:
        return ()
    for item in items:
        if item.owner in peers:
            peers[item.owner] += 1
    if len(keeping) <= target and len(keeping) < min(peers.values()) + 2:
        return ()
    settled = [sid for sid in keeping if now - held_since.get(sid, now) >= min_dwell]
    if not settled:
        return ()
    return (max(settled, key=lambda sid: rendezvous_rank(me, sid)),)
