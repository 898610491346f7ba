"""Why a held shard leaves this worker, to whom, and how long its child gets to flush.

A held shard leaves gracefully (final checkpoint, release, a named successor) for one of the
``LeaveReason``s; the operator's marks in the table (``shardvisor drain`` / ``release`` /
``shards remove``) are read here (``operator_requests``). A lost lease is not a hand-off: see
``round_policy.act_on_plan``. Pure: the driver passes the snapshot, its runners and ``now``.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs

from supervisor.core.items import ShardItem, WorkerItem
from supervisor.core.lease import PeerTracker
from supervisor.core.runner_state import HeldShard
from supervisor.core.successor import pick_successors


class LeaveReason(enum.StrEnum):
    """The value is the public string: logged, and the releases metric's ``reason`` label."""

    RETIRED = "retired"  # `shards remove`: never taken again
    REMOVED = "removed from the config"  # gone from [[shards]] (reload) and not registered
    OPERATOR_DRAIN = "operator drain"  # `shardvisor drain` of this worker
    OPERATOR_RELEASE = "operator release"  # `shardvisor release` of this shard
    REBALANCE = "rebalance"  # the planner's shed: we hold more than our fair share
    DEFINITION_CHANGED = "definition changed"  # reload: handed to ourselves, a new epoch
    SHUTDOWN = "shutdown"  # SIGTERM: the drain
    FAST_SHUTDOWN = "fast shutdown"  # a second SIGTERM: no grace

    @property
    def cools_down(self) -> bool:
        """We keep our hands off the shard for a while (the planner's ``recently_shed``), so
        that it goes elsewhere instead of bouncing back to us."""
        return self in _COOLING

    @property
    def names_successor(self) -> bool:
        """Handed to the least-loaded live peer (``pick_successors``) rather than to anyone;
        a retired shard has no next owner, a changed one goes back to ourselves."""
        return self in _TO_A_PEER


_COOLING = frozenset(
    {
        LeaveReason.REMOVED,
        LeaveReason.OPERATOR_DRAIN,
        LeaveReason.OPERATOR_RELEASE,
        LeaveReason.REBALANCE,
    }
)
_TO_A_PEER = _COOLING | {LeaveReason.SHUTDOWN}


@attrs.frozen
class OperatorRequests:
    """The operator's marks for this worker as of one snapshot."""

    drain: bool  # `shardvisor drain`: hand everything off, take nothing
    leaving: tuple[tuple[str, LeaveReason], ...] = ()  # (shard, why), in snapshot order


def operator_requests(
    *,
    me: str,
    session: str,
    workers: Iterable[WorkerItem],
    shards: Iterable[ShardItem],
    held: Mapping[str, HeldShard],
    runnable: Collection[str],
) -> OperatorRequests:
    """Which serving shards must leave, and why. A drain counts only when it was asked of this
    incarnation (``session``); a mark is acted on only for the epoch we hold (an older view, or
    a request for an earlier epoch, changes nothing). A shard gone from the config (and not
    registered in the table) leaves the same way."""
    mine = next((w for w in workers if w.id == me), None)
    drain = mine is not None and mine.session == session and mine.drain_requested > 0
    leaving: list[tuple[str, LeaveReason]] = []
    for item in shards:
        runner = held.get(item.id)
        if runner is None or not runner.state.serving or item.epoch != runner.epoch:
            continue
        why = _why_leave(item, me, drain, runnable)
        if why is not None:
            leaving.append((item.id, why))
    return OperatorRequests(drain=drain, leaving=tuple(leaving))


def _why_leave(
    item: ShardItem, me: str, drain: bool, runnable: Collection[str]
) -> LeaveReason | None:
    if item.retired_at:
        return LeaveReason.RETIRED
    if item.id not in runnable:
        return LeaveReason.REMOVED
    if drain:
        return LeaveReason.OPERATOR_DRAIN
    if item.release_requested > 0 and item.owner == me:
        return LeaveReason.OPERATOR_RELEASE
    return None


def successors(
    shard_ids: Sequence[str],
    *,
    me: str,
    tracker: PeerTracker,
    shards: Sequence[ShardItem] | None,
    now: float,
    workers: Iterable[WorkerItem] = (),
) -> dict[str, str]:
    """A successor per shard among the live peers: one with a ready standby of it first
    (``workers``' advertised standbys), else the least loaded; {} before the first scan
    (``shards`` None) or when there is nothing to hand off."""
    if shards is None or not shard_ids:
        return {}
    live = [w for w in tracker.known() if tracker.is_live_member(w, now)]
    ready: dict[str, list[str]] = {}
    for worker in workers:
        for shard in worker.standbys:
            ready.setdefault(shard, []).append(worker.id)
    return pick_successors(list(shard_ids), me, live, shards, ready)


def stop_grace(shutdown_timeout: float) -> float:
    """Time a child gets to flush. The rest of shutdown_timeout covers SIGTERM (a tenth of it,
    at most 1 s), SIGKILL, the release write and our own exit."""
    return max(0.25, shutdown_timeout / 2)


def drain_budget(shutdown_timeout: float) -> float:
    """How long the drain waits for every runner to finish before it gives up (exit 70)."""
    return max(shutdown_timeout * 0.9, 0.5)


__all__ = [
    "LeaveReason",
    "OperatorRequests",
    "drain_budget",
    "operator_requests",
    "stop_grace",
    "successors",
]
