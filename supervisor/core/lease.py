"""Liveness as pure code: observations and ``now`` in, judgements out (no I/O, no clock).

* ``PeerTracker`` judges peers alive or dead the way KCL judges leases: by watching their
  heartbeat counter change on *our* monotonic clock. Wall clocks of other hosts are never compared.
  Given a watch list (``watch``), it judges by counter only those peers (the watch ring's, read
  between rounds and confirmed by a round's consistent read when due); the others are dead
  only when their item says so (a watcher's death notice).
* ``OwnLease`` measures our own validity from when we *sent* our last successful heartbeat, so we
  stop before any peer can possibly declare us dead.
See docs/lease-protocol.md for the argument why this never lets two workers write one shard.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from supervisor.core.items import WorkerItem
from supervisor.core.peer_watch import GONE_STATES  # a clean exit, or a death notice

_NEVER = float("-inf")


@attrs.define
class _Seen:
    counter: int | None
    changed_at: float  # our monotonic time when the counter last changed (or was first seen)
    state: str
    session: str = ""


def _older(seen: _Seen | None, counter: int, session: str) -> bool:
    """Whether ``counter`` is below the one we hold for the same incarnation (counters only
    rise within a session; a new session may start anywhere)."""
    return (
        seen is not None
        and seen.counter is not None
        and seen.session == session
        and counter < seen.counter
    )


@attrs.define
class PeerTracker:
    """Peer liveness from heartbeat counters watched on the local monotonic clock."""

    duration: float
    _seen: dict[str, _Seen] = attrs.field(factory=dict)
    # None: every peer is read every round, so every peer's counter is judged (protocol 1 as
    # first built). A set: only these are; a counter we no longer read proves nothing.
    _watched: frozenset[str] | None = None

    def watch(self, peers: Iterable[str] | None) -> None:
        """The peers judged by counter from now on (None: every peer, as when every round read
        every item). Judging a peer we have just started watching needs no fresh start: a
        death is declared only on a consistent read, and one that shows a counter unchanged
        since our first sight of it ``duration`` earlier is a death, however long ago that was."""
        self._watched = None if peers is None else frozenset(peers)

    def _judged(self, worker_id: str, seen: _Seen) -> bool:
        """Whether a still counter may declare this peer dead (an owner with no item at all
        has no counter and no watcher: always judged from first sight)."""
        return self._watched is None or worker_id in self._watched or seen.counter is None

    def observe(self, workers: Iterable[WorkerItem], now: float) -> None:
        for worker in workers:
            seen = self._seen.get(worker.id)
            if seen is None or seen.counter != worker.counter:
                if _older(seen, worker.counter, worker.session):
                    # A read that started before one we already have (a round's, slower
                    # than a watch read): what it shows is past, clock and state alike.
                    continue
                self._seen[worker.id] = _Seen(worker.counter, now, worker.state, worker.session)
            else:
                seen.state = worker.state

    def saw_counter(self, worker_id: str, counter: int, session: str, now: float) -> None:
        """A counter from an eventually consistent read of a peer we already know: a higher
        one starts its clock anew (a value seen at ``now`` was written no later than ``now``,
        so the clock can only start late, never early); a lower one is a stale replica and an
        equal one tells nothing new. A death is still declared only after a strongly
        consistent read (the reconcile round's) shows the counter unchanged."""
        seen = self._seen.get(worker_id)
        if (
            seen is not None
            and seen.counter is not None
            and seen.session == session
            and counter > seen.counter
        ):
            seen.counter, seen.changed_at = counter, now

    def observe_owner(self, owner: str, now: float) -> None:
        """An owner with no worker item at all: start its clock at first sight."""
        if owner and owner not in self._seen:
            self._seen[owner] = _Seen(None, now, "")

    def is_dead(self, worker_id: str, now: float) -> bool:
        seen = self._seen.get(worker_id)
        if seen is None:
            return False  # never observed: give it a full duration from first sight
        if seen.state in GONE_STATES:
            return True  # retired cleanly (its children are gone), or declared dead
        return self._judged(worker_id, seen) and now - seen.changed_at >= self.duration

    def due_at(self, worker_id: str) -> float:
        """When this peer's lease would fall due if its counter stays (inf: never, it is
        gone, unknown or not judged by counter)."""
        seen = self._seen.get(worker_id)
        if seen is None or seen.state in GONE_STATES or not self._judged(worker_id, seen):
            return float("inf")
        return seen.changed_at + self.duration

    def next_due(self, now: float) -> float | None:
        """When the first peer not judged dead yet would be, if its counter does not change
        before then (None: no such peer). The driver runs a round then, so a death is acted on
        at the lease rather than at the round after it."""
        dues = [
            seen.changed_at + self.duration
            for worker_id, seen in self._seen.items()
            if seen.state not in GONE_STATES
            and self._judged(worker_id, seen)
            and now - seen.changed_at < self.duration
        ]
        return min(dues, default=None)

    def is_live_member(self, worker_id: str, now: float) -> bool:
        """Alive and taking shards (a draining worker is alive but takes nothing)."""
        seen = self._seen.get(worker_id)
        return seen is not None and seen.state == "running" and not self.is_dead(worker_id, now)

    def known(self) -> list[str]:
        return sorted(self._seen)

    def membership(self, now: float) -> frozenset[tuple[str, str]]:
        """Who is live, alive but not taking (draining), or dead: a change means a rescan."""
        return frozenset(
            (
                worker,
                "live"
                if self.is_live_member(worker, now)
                else ("dead" if self.is_dead(worker, now) else "alive"),
            )
            for worker in self._seen
        )


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
