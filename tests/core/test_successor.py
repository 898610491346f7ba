"""Choosing successors for a hand-off, on plain data."""

from supervisor.core.items import ShardItem
from supervisor.core.successor import pick_successors


def owned(owner: str, n: int, prefix: str) -> list[ShardItem]:
    return [ShardItem(f"{prefix}{i}", owner, 1) for i in range(n)]


def test_least_loaded_peer_first_and_spread_over_peers():
    shards = owned("me", 4, "m") + owned("a", 3, "a") + owned("b", 1, "b")
    chosen = pick_successors(["m0", "m1", "m2", "m3"], "me", ["me", "a", "b"], shards)
    assert chosen == {"m0": "b", "m1": "b", "m2": "a", "m3": "b"}


def test_no_live_peer_means_no_successor():
    assert pick_successors(["m0"], "me", ["me"], owned("me", 1, "m")) == {}
