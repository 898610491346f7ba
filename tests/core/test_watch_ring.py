"""The watch ring and the partition key rule (protocol 2), on plain ids."""

from collections import Counter

import hypothesis.strategies as st
from hypothesis import given

from supervisor.core.items import ShardItem
from supervisor.core.partition_keys import (
    BUCKETS,
    VACANT_BUCKETS,
    bucket_readers,
    owned_key,
    shard_fleet_key,
    shard_successor_key,
    vacant_buckets,
    vacant_key,
    worker_key,
    worker_keys,
)
from supervisor.core.watch_ring import ring, watched_by, watchers_of

ids = st.sets(st.text("abcdefgh0123456789-", min_size=1, max_size=12), min_size=1, max_size=40)


@given(ids)
def test_every_worker_is_watched_by_exactly_k_peers_and_watches_k(workers):
    k = min(2, len(workers) - 1)
    watching = Counter(peer for w in workers for peer in watched_by(w, workers))
    for worker in workers:
        assert len(watched_by(worker, workers)) == k
        assert worker not in watched_by(worker, workers)
        assert watching[worker] == k
        assert set(watchers_of(worker, workers)) == {
            w for w in workers if worker in watched_by(w, workers)
        }


def test_one_death_leaves_nobody_unwatched_once_the_ring_closes():
    workers = [f"w{i}" for i in range(10)]
    dead = ring(workers)[3]
    survivors = [w for w in workers if w != dead]
    # Before the view changes, the dead worker's peers keep their second watcher.
    for peer in watched_by(dead, workers):
        assert [w for w in watchers_of(peer, workers) if w != dead]
    # After it, each survivor has two live watchers again.
    for peer in survivors:
        assert len(watchers_of(peer, survivors)) == 2
        assert dead not in watchers_of(peer, survivors)


def test_a_joiner_not_yet_in_the_view_still_finds_its_peers():
    assert len(watched_by("new", ["a", "b", "c"])) == 2
    assert watched_by("alone", []) == ()


def test_worker_keys_spread_a_thousand_workers_evenly_over_64_buckets():
    per_key = Counter(worker_key(f"host-{i}") for i in range(1000))
    assert set(per_key) <= set(worker_keys()) and len(worker_keys()) == BUCKETS
    assert max(per_key.values()) <= 35  # ≈ 16 expected: still one page (≤ 4 KB) each


def test_a_shard_sits_under_its_owner_its_vacant_bucket_or_nowhere():
    assert shard_fleet_key(ShardItem("s1", "w1", 3)) == owned_key("w1") == "own#w1"
    assert shard_fleet_key(ShardItem("s1", "", 3)) == vacant_key("s1")
    assert shard_fleet_key(ShardItem("s1", "", 3, retired_at=5.0)) is None
    assert shard_fleet_key(ShardItem("s1", "", 3, successor="w2")) is None  # under w2 only
    assert shard_successor_key(ShardItem("s1", "w1", 3, successor="w2")) == "w2"
    assert shard_successor_key(ShardItem("s1", "", 3)) is None
    assert shard_successor_key(ShardItem("s1", "", 3, successor="w2", retired_at=1.0)) is None


@given(st.integers(1, 300))
def test_vacant_buckets_are_dealt_so_every_bucket_has_a_reader_and_nobody_reads_many(size):
    members = [f"m{i:04d}" for i in range(size)]
    reads = {m: vacant_buckets(m, members) for m in members}
    assert set().union(*map(set, reads.values())) == set(range(VACANT_BUCKETS))
    most = max(2, -(-VACANT_BUCKETS // size))
    assert all(1 <= len(b) <= most for b in reads.values())
    for number in (0, 17, VACANT_BUCKETS - 1):
        assert set(bucket_readers(number, members)) == {m for m, b in reads.items() if number in b}


def test_at_a_thousand_members_each_reads_two_buckets_and_each_bucket_has_about_8_readers():
    members = [f"m{i:04d}" for i in range(1000)]
    assert {len(vacant_buckets(m, members)) for m in members[:50]} == {2}
    assert {len(bucket_readers(b, members)) for b in range(VACANT_BUCKETS)} <= {7, 8}
