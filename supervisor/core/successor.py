"""Who should take a shard we hand off: the least-loaded live peer (pure, no I/O).

Naming a successor in the released item turns a hand-off into a directed move: that peer takes
the shard at its next reconcile even when it is already at its fair share, instead of the
shard waiting unowned until some peer has room (or bouncing back to us).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from supervisor.core.items import ShardItem


def pick_successors(
    releasing: Sequence[str],
    me: str,
    live_peers: Iterable[str],
    shards: Iterable[ShardItem],
    standbys: Mapping[str, Collection[str]] | None = None,
) -> dict[str, str]:
    """A successor per shard in ``releasing``, spreading them over the least-loaded peers.
    A peer that already runs a ready standby of the shard (``standbys``: shard -> peers) comes
    first: the hand-off is then a promotion, no spawn, no connect. Empty when there is no
    live peer (the shards are then simply released)."""
    load = {peer: 0 for peer in live_peers if peer != me}
    if not load:
        return {}
    for item in shards:
        if item.owner in load:
            load[item.owner] += 1
    chosen = {}
    for shard_id in sorted(releasing):
        ready = [p for p in (standbys or {}).get(shard_id, ()) if p in load]
        peer = min(ready or load, key=lambda p: (load[p], p))
        chosen[shard_id] = peer
        load[peer] += 1
    return chosen
