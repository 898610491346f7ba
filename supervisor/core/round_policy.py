"""The reconcile round's policy: when to read the whole table, and which of the planner's
decisions to act on now (the warm-up gate). Also which hand-offs the hand-off poll takes.

The driver (``supervisor.drivers.daemon``) observes the store and its runners, asks these
functions, and acts. Pure and clock-injected: ``now`` is always a parameter.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs

from shard_worker.contract.table import FEATURE_HANDOFF_NOTICE, FEATURE_MBB, STOPPED
from supervisor.core.items import HandoffRequest, ShardItem, VacantShard, WorkerItem
from supervisor.core.planner import Plan, Take
from supervisor.core.runner_state import HeldShard


def accepting(*, shutting_down: bool, operator_drain: bool, lease_valid: bool) -> bool:
    """Whether this worker takes shards now: not stopping, not drained, its own lease valid."""
    return not shutting_down and not operator_drain and lease_valid


# --- when to scan the whole table ---------------------------------------------------------------


def round_signature(
    me: str,
    membership: frozenset[tuple[str, str]],
    vacant: Iterable[VacantShard],
    workers: Iterable[WorkerItem],
) -> tuple[object, ...]:
    """What a cheap round (worker items and vacant shards only) compares with the last one:
    who is live, alive or dead; which shards are vacant; our own mailbox (operator pokes);
    who advertises which ready standbys (they change when a shard moved between two other
    workers, which the vacant shards may not have shown: the standby placement needs the
    owners as they are)."""
    workers = list(workers)
    mine = next((w for w in workers if w.id == me), None)
    standbys = tuple((w.id, w.standbys) for w in workers if w.standbys)
    return (membership, tuple(vacant), mine.mailbox if mine else -1, standbys)


def only_members_lost(before: tuple[object, ...], after: tuple[object, ...]) -> bool:
    """Between two round signatures, nothing changed but live members ceasing to be live
    (no join, no vacancy, no poke, no standby moved)."""
    if len(before) != len(after) or before[1:] != after[1:]:
        return False
    old, new = dict(before[0]), dict(after[0])  # type: ignore[call-overload]
    if old.keys() != new.keys():
        return False
    changed = [worker for worker in new if new[worker] != old[worker]]
    return bool(changed) and all(old[w] == "live" for w in changed)


@attrs.define
class ScanSchedule:
    """Decides when a round reads the whole table instead of only the workers and vacant shards:
    at start, after our own takes and releases, when the signature changes (a worker joins,
    leaves or dies, the vacant shards change, someone pokes our mailbox), and at least every
    ``full_scan_interval``. A steady fleet then reads O(workers) per round."""

    full_scan_interval: float
    _rescan: bool = True  # nothing scanned yet
    _scanned_at: float = float("-inf")
    _seen: object = None
    # A round that only lost members planned on the last scan: the scan it deferred runs in a
    # second round at once (the dead owner may hold shards the last scan showed elsewhere).
    deferred: bool = False

    def invalidate(self) -> None:
        """Our own leases changed (a take, a runner ended, a reload): scan next round."""
        self._rescan = True

    def due(self, signature: tuple[object, ...], now: float) -> bool:
        """True: scan before planning. A round that only lost members (a death, a clean exit)
        plans on the last scan and sets ``deferred``: the driver runs a second round at once,
        which scans. The lost members' shards the last scan shows are taken a Scan sooner; a
        take planned on a view a change made stale only fails its condition (owner and
        epoch); and those the last scan showed elsewhere (the dead owner took them since) are
        taken a Scan later, not a round later."""
        if self._rescan or now - self._scanned_at >= self.full_scan_interval:
            return True
        if signature == self._seen:
            return False
        if isinstance(self._seen, tuple) and only_members_lost(self._seen, signature):
            self._rescan = self.deferred = True
            return False
        return True

    def scanned(self, now: float) -> None:
        """A full scan finished at ``now``."""
        self._scanned_at = now
        self._rescan = self.deferred = False

    def saw(self, signature: object) -> None:
        """The signature this round ended with (the next round compares against it)."""
        self._seen = signature


# --- which of the plan to act on --------------------------------------------------------------


def warmed_up(now: float, registered_at: float, lease_duration: float) -> bool:
    """A worker that has watched its peers for less than a lease duration may still count a
    dead one as live, so its target is too low: until then it takes, but sheds nothing, and it
    does not retake shards still owned by an earlier incarnation of its own id (whose child may
    be alive, frozen, and writing up to its fence: that fence ends within a lease duration of
    our registration, as for any dead owner's shards)."""
    return now - registered_at >= lease_duration


@attrs.frozen
class RoundActions:
    """What the driver does with one round's plan, in this order."""

    lose: tuple[str, ...] = ()  # kill the child at once, write nothing more
    shed: tuple[str, ...] = ()  # hand off gracefully, for balance
    take: tuple[Take, ...] = ()  # try, while our own lease stays valid


def act_on_plan(
    plan: Plan, *, me: str, scanned: bool, warm: bool, held: Mapping[str, HeldShard]
) -> RoundActions:
    """The plan, gated. "Lost" needs a fresh view of our own items, so only a round that scanned
    acts on it (between scans our fenced checkpoint writes find a lost lease anyway), and a shard
    already on its way out (retired, removed) stops gracefully instead. Sheds and retakes of our
    own earlier shards wait for the warm-up (``warmed_up``)."""
    lose = tuple(sid for sid in plan.lost if sid in held and held[sid].state.serving)
    return RoundActions(
        lose=lose if scanned else (),
        shed=plan.shed if warm else (),
        take=tuple(t for t in plan.take if warm or t.expected_owner != me),
    )


def retake_epoch(
    item: ShardItem | None, *, expected_owner: str, expected_epoch: int, me: str
) -> int | None:
    """After a take's condition failed: the epoch to take at once instead, or None (leave it
    to the next round, which scans). A round after a death plans on the last scan, which may
    predate the dead owner's last take or promotion of the shard (the epoch moved, the owner
    did not): the same owner, judged dead all the same, at the epoch a consistent read shows.
    Likewise a vacant shard released again since, unless to another worker by name. Never for
    another owner, nor our own id (an earlier incarnation waits for the warm-up, which the
    plan gated)."""
    if item is None or item.retired_at or expected_owner == me:
        return None
    if item.owner != expected_owner or item.epoch <= expected_epoch:
        return None
    if not item.owner and item.successor not in ("", me):
        return None  # released to someone by name since: a directed move, not ours
    return item.epoch


HANDOVER = "handover"  # the takes metric's label for a shard its owner handed over to us


def take_source(expected_owner: str, me: str) -> str:
    """The takes metric's label: from nobody, from a dead peer, or from our own earlier self
    (a shard handed over to us, which we adopt without a take, is counted as ``HANDOVER``)."""
    if expected_owner == me:
        return "own"
    return "dead-owner" if expected_owner else "unowned"


def promotion_kind(source: str) -> str:
    """The promotions metric's label: a dead owner's shard is a failover, else a hand-off."""
    return "failover" if source == "dead-owner" else "handoff"


def handoff_answers(
    requests: Sequence[HandoffRequest],
    me: str,
    runnable: Collection[str],
    held: Collection[str],
    answering: Collection[str],
) -> list[HandoffRequest]:
    """The make-before-break requests this worker answers now: naming it, for a shard it may
    run and does not hold, not answered already. (The driver checks that it accepts.)"""
    answers: dict[str, HandoffRequest] = {}  # one per shard: a notice and the roster agree
    for r in requests:
        if r.successor == me and r.id in runnable and r.id not in held and r.id not in answering:
            answers.setdefault(r.id, r)
    return list(answers.values())


DUE_SLACK = 0.01  # seconds past a peer's due time: the round then judges it dead, not alive


def next_round_in(now: float, interval: float, due: float | None) -> float:
    """How long the reconcile loop sleeps: ``interval``, or less when a peer's lease falls
    due sooner (``PeerTracker.next_due``). The round still reads the worker items first: a
    counter that moved meanwhile keeps the peer alive, so this only moves *when* a death is
    seen, never *whether* (issue 16, detection at the lease: up to one interval sooner)."""
    if due is None:
        return interval
    return max(0.0, min(interval, due + DUE_SLACK - now))


def asked_without_notice(workers: Sequence[WorkerItem] | None, me: str) -> bool:
    """Whether a peer may ask us for a hand-off without listing a notice (a version before
    ``FEATURE_HANDOFF_NOTICE``, or peers not read yet): then the ``handoff`` roster is read
    too, one query more per poll, until the fleet has rolled over."""
    if workers is None:
        return True
    return any(
        FEATURE_MBB in w.features and FEATURE_HANDOFF_NOTICE not in w.features
        for w in workers
        if w.id != me and w.state != STOPPED
    )


def handoff_takes(
    vacant: Sequence[VacantShard], me: str, runnable: Collection[str]
) -> list[VacantShard]:
    """The shards a hand-off poll takes: released naming us as successor, and ours to run.
    (The driver checks per take that it still accepts: a stop may land while a take runs.)"""
    return [shard for shard in vacant if shard.successor == me and shard.id in runnable]


__all__ = [
    "HANDOVER",
    "RoundActions",
    "ScanSchedule",
    "accepting",
    "act_on_plan",
    "asked_without_notice",
    "handoff_answers",
    "handoff_takes",
    "next_round_in",
    "promotion_kind",
    "retake_epoch",
    "round_signature",
    "take_source",
    "warmed_up",
]
