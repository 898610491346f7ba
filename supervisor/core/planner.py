"""One reconcile round's decisions as pure code: which shards to take, which we lost, which to shed.

Every worker derives the same per-worker targets from the same snapshot (``fair_targets``), so the
fleet balances without negotiation and each shard moves at most once per membership change
(tests/core/test_balance_simulation.py). Liveness comes from ``supervisor.core.lease``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs

from supervisor.core.items import ShardItem
from supervisor.core.lease import PeerTracker


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


def lost_leases(
    held: Mapping[str, int], items: Mapping[str, ShardItem], me: str
) -> tuple[str, ...]:
    """Held shards the table shows with another owner, or at a later epoch. An item at an
    earlier epoch than ours was read before our own take (takes run beside the round: the
    hand-off poll, a make-before-break answer) and says nothing of the lease: epochs only grow,
    and our conditional take wrote ours. Killing such a child (a standby just promoted, say)
    would stop the writer the hand-off was for, and on a live-only feed lose what it held."""
    return tuple(
        sid
        for sid, epoch in sorted(held.items())
        if sid not in items
        or items[sid].epoch > epoch
        or (items[sid].epoch == epoch and items[sid].owner != me)
    )


def fair_targets(
    shard_count: int, live: Iterable[str], caps: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Each live worker's share: loads differ by at most one, the larger shares to the lowest ids.

    A function of the snapshot alone, so every worker computes the same targets without talking.
    A worker capped below its share (``caps``, 0 = none) gets its cap and the others split the
    rest the same way; if all are capped, the shards beyond the total capacity stay unowned.
    """
    caps = caps or {}
    targets: dict[str, int] = {}
    remaining, open_ = shard_count, sorted(live)
    while open_:
        share, extra = divmod(remaining, len(open_))
        level = {w: share + (i < extra) for i, w in enumerate(open_)}
        capped = [w for w in open_ if 0 < caps.get(w, 0) < level[w]]
        if not capped:
            return targets | level
        for w in capped:
            targets[w] = caps[w]
            remaining -= caps[w]
        open_ = [w for w in open_ if w not in capped]
    return targets


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
    quarantined: Mapping[str, float] | None = None,
    max_shards: int = 0,
    peer_caps: Mapping[str, int] | None = None,
    standby_claims: Collection[str] = (),
    standby_waiting: Collection[str] = (),
    shard_count: int | None = None,
) -> Plan:
    """One reconcile round. ``held`` maps shard -> epoch for shards with a running child here.

    ``recently_shed`` maps shard -> when we handed it back: we do not take it again within
    ``min_dwell``, so a shed shard goes to the peer that needs it instead of bouncing back
    (unless no live peer is left to take it). ``quarantined`` maps shard -> when its crash
    loop made us release it: we keep off it for ``min_dwell`` even alone, so that a shard
    that crashes here does not loop through quarantine at once.
    ``max_shards`` caps us (0 = no cap); ``peer_caps`` holds the caps peers advertise (absent or
    0 = uncapped): without them a capped peer's excess stays unowned instead of moving to us.
    A worker that is not accepting (draining, or its lease lapsed) neither takes nor sheds: its
    shards leave through the drain or the lease watchdog. ``standby_claims`` and
    ``standby_waiting`` are the standby-first rule (``standby.standby_priority``): dead owners'
    shards we take first as their standby, and those we leave to another's standby for now.
    ``shard_count`` is the fleet's shard total when ``shards`` holds only what concerns us
    (protocol 2's bounded reads); by default the targets share ``shards`` itself.
    """
    wanted = set(configured)
    items = {s.id: s for s in shards if s.id in wanted}
    for item in items.values():
        tracker.observe_owner(item.owner, now)
    lost = lost_leases(held, items, me)
    if not accepting:
        return Plan(lost=lost)
    keeping = [sid for sid in held if sid not in lost]
    live = {w for w in tracker.known() if tracker.is_live_member(w, now)} | {me}
    total = len(items) if shard_count is None else shard_count
    targets = fair_targets(total, live, {**(peer_caps or {}), me: max_shards})
    # A shed shard cools down so that it goes to the peer that needs it rather than back to
    # us; with no live peer left (the one it was shed to is draining, say) it would stay
    # unowned, so it does not cool.
    cooling = (
        {sid for sid, at in (recently_shed or {}).items() if now - at < min_dwell}
        if live - {me}
        else set()
    )
    shunned = {sid for sid, at in (quarantined or {}).items() if now - at < min_dwell}
    leaving = _leaving(held_since, recently_shed or {}, cooling)
    pool = list(items.values())
    share = _dealt_share(me, pool, targets, tracker, now)
    found = _candidates(me, pool, held, share, tracker, now)
    found = [i for i in found if i.id not in cooling | shunned and i.id not in standby_waiting]
    room = targets[me] - len(keeping)
    return Plan(
        take=_takes(me, found, room, frozenset(standby_claims)),
        lost=lost,
        shed=_shed(me, keeping, held_since, -room, leaving, now, min_dwell),
    )


def _leaving(
    held_since: Mapping[str, float], recently_shed: Mapping[str, float], cooling: set[str]
) -> set[str]:
    """Held shards whose hand-off is still under way: shed since we took them. A shard we
    shed and have taken back since (an operator drain, then a peer's SIGTERM hand-off) is a
    fresh holding that must dwell: counting it as leaving would shed it the moment it came."""
    return {sid for sid in cooling if sid in held_since and recently_shed[sid] >= held_since[sid]}


def _dealt_share(
    me: str,
    items: Sequence[ShardItem],
    targets: Mapping[str, int],
    tracker: PeerTracker,
    now: float,
) -> set[str]:
    """Our part of the free shards, dealt alike by every worker from the same snapshot.

    Free shards (unowned, or a dead worker's) in shard-id order go to the workers short of
    their target in worker-id order, each as many as it lacks. Workers that saw the same table
    therefore take disjoint shards: their conditional takes do not race.
    """
    loads = Counter(item.owner for item in items)
    free = sorted(i.id for i in items if not i.owner or tracker.is_dead(i.owner, now))
    start = 0
    for worker in sorted(targets):
        need = max(targets[worker] - loads[worker], 0)
        if worker == me:
            return set(free[start : start + need])
        start += need
    return set()


def _candidates(
    me: str,
    items: Iterable[ShardItem],
    held: Mapping[str, int],
    share: set[str],
    tracker: PeerTracker,
    now: float,
) -> list[ShardItem]:
    """Takeable shards: ours from an earlier incarnation or named for us as successor, then our
    dealt share, then the rest by rendezvous rank (so that workers whose views differ still
    prefer different shards). A shard that names another live worker as its successor is left
    to that worker: a hand-off is a directed move, not a race."""
    found = [
        item
        for item in items
        if item.id not in held
        and (not item.owner or item.owner == me or tracker.is_dead(item.owner, now))
        and not (
            item.successor
            and item.successor != me
            and not item.owner
            and tracker.is_live_member(item.successor, now)
        )
    ]
    found.sort(key=lambda i: (not _claimed(me, i), i.id not in share, rendezvous_rank(me, i.id)))
    return found


def _claimed(me: str, item: ShardItem) -> bool:
    """Still ours from an earlier incarnation, or handed to us by name."""
    return item.owner == me or (not item.owner and item.successor == me)


def _takes(
    me: str, found: Sequence[ShardItem], room: int, claims: frozenset[str]
) -> tuple[Take, ...]:
    """Up to ``room`` candidates; shards still carrying our own id, handed to us by name
    (an operator's release, a drain), or claimed as a dead owner's standby, are taken
    regardless.

    Nobody else may take those while we are alive, so leaving them would strand them; any
    excess they cause is shed by the usual rule once they have dwelt.
    """
    own = [item for item in found if _claimed(me, item) or item.id in claims]
    others = [item for item in found if not (_claimed(me, item) or item.id in claims)]
    chosen = own + others[: max(room - len(own), 0)]
    return tuple(Take(item.id, item.owner, item.epoch) for item in chosen)


def _shed(
    me: str,
    keeping: Sequence[str],
    held_since: Mapping[str, float],
    excess: int,
    leaving: set[str],
    now: float,
    min_dwell: float,
) -> tuple[str, ...]:
    """Hand back exactly our excess over the target in one round, but only shards that dwelt.

    Only ``held > target`` sheds (never ``held == target``, whoever is short): the short peers
    fill up from the shards others shed, so each shard moves once per membership change. Shards
    whose hand-off is still under way (``leaving``) count first, so a slow stop is not doubled by
    a second pick; then the least-preferred settled shards (highest rendezvous rank).
    """
    if excess <= 0:
        return ()
    dwelt = [
        sid for sid in keeping if sid in leaving or now - held_since.get(sid, now) >= min_dwell
    ]
    dwelt.sort(key=lambda sid: (sid in leaving, rendezvous_rank(me, sid)), reverse=True)
    return tuple(dwelt[:excess])
