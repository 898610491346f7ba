"""Who watches whom (protocol 2): each worker watches its K successors on a hash ring.

Protocol 1 had every worker read every worker item every round, O(W²) reads for the fleet. Here
each worker reads only K peers, so its cost stays flat as the fleet grows, and each worker is
watched by its K predecessors: with K = 2 one death never leaves a peer unwatched (the dead
watcher's own watchers declare it, the view changes and the ring closes over the gap).

Views may differ for a moment between workers; that only adds or drops a watcher, never makes a
death happen sooner: the due time and the confirmation are each watcher's own
(docs/lease-protocol.md, *Protocol 2*).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable

WATCHERS = 2  # K: each worker watches this many peers and is watched by as many


@functools.lru_cache(maxsize=4096)  # a fleet's ids, hashed once each
def ring_position(worker_id: str) -> bytes:
    """A worker's place on the ring: a hash, so neighbours do not follow naming patterns
    (hosts of one rack or one deploy wave, likely to die together, end up apart)."""
    return hashlib.blake2b(f"ring\0{worker_id}".encode(), digest_size=8).digest()


def ring(workers: Iterable[str]) -> tuple[str, ...]:
    """The workers in ring order (ties, impossible in practice, broken by id)."""
    return tuple(sorted(set(workers), key=lambda w: (ring_position(w), w)))


def watched_by(me: str, workers: Iterable[str], k: int = WATCHERS) -> tuple[str, ...]:
    """The peers ``me`` watches: its next ``k`` on the ring (fewer in a smaller fleet).

    ``me`` counts as on the ring even when the view lacks it (a joiner not yet announced)."""
    order = ring(set(workers) | {me})
    at = order.index(me)
    count = min(k, len(order) - 1)
    return tuple(order[(at + step) % len(order)] for step in range(1, count + 1))


def watchers_of(peer: str, workers: Iterable[str], k: int = WATCHERS) -> tuple[str, ...]:
    """The workers that watch ``peer``: its previous ``k`` on the ring, nearest first."""
    order = ring(set(workers) | {peer})
    at = order.index(peer)
    count = min(k, len(order) - 1)
    return tuple(order[(at - step) % len(order)] for step in range(1, count + 1))
