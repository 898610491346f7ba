"""Protocol 2's index keys as pure code: which partition key value each item sits under.

Protocol 1 listed every worker under one ``roster`` value and every vacant shard under
another, so at a thousand workers every poll of the fleet read one index partition. Here the
items spread over many values, each read only by the workers it concerns, and no value carries
more than a small share of its partition's limit (docs/lease-protocol.md, *Protocol 2*):

* ``fleet`` index: ``w#NN`` for worker items (64 buckets, re-read after a generation change),
  ``own#<worker>`` for owned shards (queried by a dead worker's watchers), ``v#NNN`` for
  unowned shards named for nobody (256 buckets, each dealt to a few members);
* ``successor`` index: the worker a shard is addressed to (its hand-off poll).

Every worker computes the same keys from the same ids: the rule is a function of the ids alone.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable

from supervisor.core.items import ShardItem

BUCKETS = 64  # worker buckets: ≈ 16 workers (≈ 2 KB, one page) at W = 1,000
# Vacant buckets: at a cold start of 1,000 workers each taking 50 shards a round, a bucket
# loses ≈ 195 index entries a round (98 WRU/s, 10 % of a partition); 64 gave 34 %.
VACANT_BUCKETS = 256
VACANT_READERS_PER_MEMBER = 2  # buckets each member reads when there are more members than buckets
WORKER_PREFIX, OWNED_PREFIX, VACANT_PREFIX = "w#", "own#", "v#"
REGISTRATION_PREFIX = "reg#"  # registered shards, by the top 8 bits of their ring point
_RING_BITS = 64  # the standby ring's points (core.standby_ring.point)


@functools.lru_cache(maxsize=4096)  # a fleet's ids, hashed once each
def bucket(name: str, buckets: int = BUCKETS) -> int:
    """A stable bucket in ``range(buckets)``: the same on every host and Python (no ``hash``)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % buckets


def worker_key(worker_id: str, buckets: int = BUCKETS) -> str:
    return f"{WORKER_PREFIX}{bucket(worker_id, buckets):02d}"


def worker_keys(buckets: int = BUCKETS) -> tuple[str, ...]:
    """Every worker bucket: what a member re-read queries (one page each)."""
    return tuple(f"{WORKER_PREFIX}{b:02d}" for b in range(buckets))


def owned_key(owner: str) -> str:
    return f"{OWNED_PREFIX}{owner}"


def vacant_key(shard_id: str, buckets: int = VACANT_BUCKETS) -> str:
    return vacant_bucket_key(bucket(shard_id, buckets))


def vacant_bucket_key(number: int) -> str:
    return f"{VACANT_PREFIX}{number:03d}"


def shard_fleet_key(item: ShardItem, buckets: int = VACANT_BUCKETS) -> str | None:
    """The ``fleet`` value a shard item carries: by owner, else its vacant bucket. An unowned
    shard addressed to a successor is listed only under that successor (a mass hand-off then
    writes no shared bucket; if the successor dies, its watchers re-route what is addressed to
    it); a retired shard carries none (it is never taken, so nobody needs to find it)."""
    if item.retired_at or (not item.owner and item.successor):
        return None
    return owned_key(item.owner) if item.owner else vacant_key(item.id, buckets)


def shard_successor_key(item: ShardItem) -> str | None:
    """The ``successor`` index value: the worker the shard is addressed to, if any. It is the
    ``successor`` attribute itself (released to it, routed to it, or a make-before-break
    request), so the index needs no attribute of its own."""
    if item.retired_at or not item.successor:
        return None
    return item.successor


def spot(name: str) -> str:
    """The ``fleet`` index's sort key (``spot``): a hash of the shard id, so each reader of a
    vacant bucket can start its one page at its own point (``spot >= start_spot(reader)``)
    and the bucket's readers take different shards instead of racing for the first page."""
    return hashlib.blake2b(f"spot\0{name}".encode(), digest_size=8).hexdigest()


def start_spot(reader: str, number: int, turn: int) -> str:
    """Where ``reader`` starts reading vacant bucket ``number`` at its ``turn``-th read."""
    return spot(f"{reader}\0{number}\0{turn}")


def vacant_buckets(
    me: str,
    members: Iterable[str],
    buckets: int = VACANT_BUCKETS,
    per_member: int = VACANT_READERS_PER_MEMBER,
) -> tuple[int, ...]:
    """The vacant buckets this member reads, dealt alike by every worker from the same view.

    Slots ``0 .. max(buckets, per_member * W) - 1`` go round-robin to the members in id order
    and to the buckets in number order: every bucket has a reader, each member reads at most
    ``max(per_member, ceil(buckets / W))`` buckets, and each bucket has about
    ``per_member * W / buckets`` readers (≈ 31 at W = 1,000).
    """
    order = sorted(set(members) | {me})
    count, mine = len(order), order.index(me)
    slots = max(buckets, per_member * count)
    return tuple(sorted({slot % buckets for slot in range(mine, slots, count)}))


def bucket_readers(
    number: int,
    members: Iterable[str],
    buckets: int = VACANT_BUCKETS,
    per_member: int = VACANT_READERS_PER_MEMBER,
) -> tuple[str, ...]:
    """The members that read vacant bucket ``number`` (the inverse of ``vacant_buckets``)."""
    order = sorted(set(members))
    if not order:
        return ()
    slots = max(buckets, per_member * len(order))
    return tuple(sorted({order[slot % len(order)] for slot in range(number, slots, buckets)}))


# --- registered shards, by their place on the standby ring -------------------------------------


def registration_key(ring_point: int) -> str:
    """The ``fleet`` value of a registered shard's registration item: 256 keys, by the top 8
    bits of its ring point, so that an arc of the ring is read by few range queries."""
    return f"{REGISTRATION_PREFIX}{ring_point >> (_RING_BITS - 8):02x}"


def registration_spot(ring_point: int) -> str:
    """Its ``spot``: the point as fixed-width hex, so the text order is the ring's order."""
    return f"{ring_point:016x}"


def registration_reads(start: int, end: int) -> list[tuple[str, str, str]]:
    """The range queries that list the registered shards whose ring point lies in ``[start,
    end)`` (wrapping past the top; ``start == end``: the whole ring), as (key, lowest spot,
    highest spot), both inclusive: one per registration key the arc touches."""
    top = 1 << _RING_BITS
    spans = [(start, end)] if start < end else [(start, top), (0, end)]
    reads = []
    for low, high in spans:
        if low >= high:
            continue
        shift = _RING_BITS - 8
        for number in range(low >> shift, ((high - 1) >> shift) + 1):
            first, last = max(low, number << shift), min(high - 1, ((number + 1) << shift) - 1)
            reads.append(
                (
                    f"{REGISTRATION_PREFIX}{number:02x}",
                    registration_spot(first),
                    registration_spot(last),
                )
            )
    return reads
