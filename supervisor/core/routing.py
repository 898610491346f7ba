"""Protocol 2's routing of a dead worker's shards, and its sweeper, as pure code.

The writer of a death notice names a successor on each of the victim's shards (owned by it,
or addressed to it and not yet taken); the named worker's hand-off poll finds the shard and
takes it with the usual conditional take (docs/lease-protocol.md, *Liveness: a watch ring*).
A sweeper, one member a period, routes whatever both watchers missed. Routing only decides
*who looks first*: every routing write and every take stays conditional on the owner and the
epoch observed, so a stale view here costs a slower failover, never a second writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from supervisor.core.items import ShardItem
from supervisor.core.membership import Member
from supervisor.core.planner import rendezvous_rank

SWEEP_PERIOD = 300.0  # s: how often one member of the fleet sweeps the table


def route(
    shards: Iterable[ShardItem],
    *,
    dead: str,
    live: Sequence[str],
    caps: Mapping[str, int],
    held: Mapping[str, int],
    first_standby: Callable[[str], str] = lambda shard: "",
) -> dict[str, str]:
    """A successor for each shard (by id): its first standby if that one is live (the
    standby-first rule: it promotes, nothing lost), else the live member of highest
    rendezvous rank for the shard that has room under its cap (``caps``: 0 or absent is
    none) counting what it holds (``held``) and what this routing gave it. A shard for which
    no member has room is left out (the sweeper, or the members' own rounds, find it later)."""
    members = [m for m in live if m != dead]
    given: dict[str, int] = {}
    chosen: dict[str, str] = {}

    def has_room(member: str) -> bool:
        cap = caps.get(member, 0)
        return not cap or held.get(member, 0) + given.get(member, 0) < cap

    for item in sorted(shards, key=lambda s: s.id):
        standby = first_standby(item.id)
        if standby in members and has_room(standby):
            to = standby
        else:
            to = next((m for m in _ranked(members, item.id) if has_room(m)), "")
        if to:
            chosen[item.id] = to
            given[to] = given.get(to, 0) + 1
    return chosen


def _ranked(members: Sequence[str], shard: str) -> list[str]:
    """The members in the shard's rendezvous order, its first choice first."""
    return sorted(members, key=lambda member: rendezvous_rank(member, shard), reverse=True)


def sweeper(live: Sequence[str], now: float, period: float = SWEEP_PERIOD) -> str:
    """The member that sweeps in the period ``now`` falls in ("" with no live member): every
    member computes the same one from the same view, and the duty moves each period."""
    turn = f"sweep#{int(now // period)}"
    return max(live, key=lambda m: rendezvous_rank(m, turn), default="")


def unrouted_orphans(shards: Iterable[ShardItem], members: Mapping[str, Member]) -> list[str]:
    """The shards a sweep routes: owned by a worker that has no item or is ``dead``, and named
    for no successor yet (a routed one is its successor's to take)."""
    return sorted(
        item.id
        for item in shards
        if item.owner
        and not item.successor
        and (item.owner not in members or members[item.owner].state == "dead")
    )


__all__ = ["SWEEP_PERIOD", "route", "sweeper", "unrouted_orphans"]
