"""Make-before-break hand-off as pure code: whether a graceful move may use it, what each side
does with the shard item it reads, and how long each waits (docs/lease-protocol.md).

The owner O asks its successor N (``request_handoff``); N gets a standby child connected to
every stream and answers with the first sequence it holds per stream (``handoff_ready``); O
stops its child at the cut (``min_cut``: one before N's first) and hands the lease over to N
in one write (``hand_over``: N owns it at epoch + 1; to a successor without the ``handover``
feature, O releases naming N and N takes it); N adopts it (``adoption``) and promotes its
standby child, which writes its buffer after the cut. Never two writers: O's child stopped
before the hand-over (or the release). Whatever goes wrong, a side falls back to
break-before-make, which is the protocol as it was before.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping

import attrs

from shard_worker.contract.pipe import StreamSpec
from shard_worker.contract.table import (
    FEATURE_HANDOVER,
    FEATURE_MBB,
    HANDOFF_READY,
    HANDOFF_REQUESTED,
)
from supervisor.core.items import ShardItem

OWNER_POLL = 0.05  # the owner reads the item this often while it waits for the successor
SUCCESSOR_POLL = 0.01  # the successor reads it this often while it waits for the release
RELEASE_SLACK = 2.0  # after the stop's grace: the child's SIGTERM grace and the release write


class Mode(enum.StrEnum):
    """How a shard moved to a peer (the value is the handoffs metric's ``mode`` label)."""

    MAKE_BEFORE_BREAK = "make_before_break"
    BREAK_BEFORE_MAKE = "break_before_make"


class Fallback(enum.StrEnum):
    """Why a move to a peer was break-before-make (the value is the fallbacks metric's
    ``reason`` label, and is logged)."""

    FAST_SHUTDOWN = "fast_shutdown"  # a second SIGTERM: no waiting
    UNSEQUENCED = "unsequenced"  # a stream without a sequence has no exact cut
    OLD_SUCCESSOR = "successor_without_mbb"  # an older version: it would never answer
    NOT_RUNNING = "child_not_running"  # no ready child to write up to a cut
    SHUTDOWN_BUDGET = "shutdown_budget"  # shutdown_timeout cannot hold the wait and the stop
    TIMEOUT = "timeout"  # the successor's standby was not connected within handoff_timeout
    CANCELLED = "cancelled"  # the request was gone from the item (retired, or overwritten)
    STORE = "store_unavailable"  # the request or a read failed
    CHILD_EXITED = "child_exited"  # the child died while it waited: released as it was
    SUCCESSOR_LEFT = "successor_left"  # it stopped taking (draining, stopped, dead) meanwhile


@attrs.frozen
class HandoffPlan:
    """``mode`` None: not a move to a peer (no successor, or handed back to ourselves).
    ``hand_over``: at the cut, the owner makes the successor owner in one write instead of
    releasing (the successor advertises ``handover``: it adopts what it is handed)."""

    mode: Mode | None
    fallback: Fallback | None = None
    hand_over: bool = False


def plan_handoff(
    *,
    me: str,
    successor: str,
    streams: Iterable[StreamSpec],
    successor_features: Collection[str],
    child_ready: bool,
    fast: bool,
    budget: float | None,
    handoff_timeout: float,
    stop_grace: float,
) -> HandoffPlan:
    """Whether a graceful move of a shard goes make-before-break. ``budget``: the seconds a
    SIGTERM's drain has left (None: no deadline, as for a rebalance or an operator's move)."""
    if not successor or successor == me:
        return HandoffPlan(None)
    why = _fallback(
        streams, successor_features, child_ready, fast, budget, handoff_timeout, stop_grace
    )
    if why is not None:
        return HandoffPlan(Mode.BREAK_BEFORE_MAKE, why)
    return HandoffPlan(Mode.MAKE_BEFORE_BREAK, hand_over=FEATURE_HANDOVER in successor_features)


def _fallback(
    streams: Iterable[StreamSpec],
    features: Collection[str],
    child_ready: bool,
    fast: bool,
    budget: float | None,
    handoff_timeout: float,
    stop_grace: float,
) -> Fallback | None:
    if fast:
        return Fallback.FAST_SHUTDOWN
    if not all(stream.sequence for stream in streams):
        return Fallback.UNSEQUENCED
    if FEATURE_MBB not in features:
        return Fallback.OLD_SUCCESSOR
    if not child_ready:
        return Fallback.NOT_RUNNING
    if budget is not None and budget < handoff_timeout + stop_grace:
        return Fallback.SHUTDOWN_BUDGET
    return None


def min_cut(first: Mapping[str, int]) -> dict[str, int]:
    """What the owner's child must have written before it stops: everything before the
    successor's first buffered message, per stream (streams it did not name: no bound)."""
    return {stream: seq - 1 for stream, seq in sorted(first.items())}


# --- what each side makes of the item it reads ----------------------------------------------


class OwnerSees(enum.Enum):
    WAIT = "wait"  # still requested: read again
    READY = "ready"  # the successor's standby holds every stream: stop at the cut
    CANCELLED = "cancelled"  # the request is gone, or names someone else
    LOST = "lost"  # the item has another owner or epoch: the lease is gone


def owner_sees(item: ShardItem | None, *, me: str, epoch: int, successor: str) -> OwnerSees:
    if item is None or item.owner != me or item.epoch != epoch:
        return OwnerSees.LOST
    if item.successor != successor:
        return OwnerSees.CANCELLED
    if item.handoff_stage == HANDOFF_READY:
        return OwnerSees.READY
    if item.handoff_stage == HANDOFF_REQUESTED:
        return OwnerSees.WAIT
    return OwnerSees.CANCELLED


class SuccessorSees(enum.Enum):
    WAIT = "wait"  # the owner still runs it, our answer stands: read again
    TAKE = "take"  # released, naming us: take it (epoch + 1) and promote the standby
    # Ours at a later epoch: the owner handed it over to us (or a take here got it first):
    # adopt it (``adoption``), no write.
    HANDED_OVER = "handed over"
    GIVE_UP = "give up"  # cancelled, taken by another, or released to someone else


def successor_sees(item: ShardItem | None, *, me: str, epoch: int) -> SuccessorSees:
    """``epoch``: the owner's, as the request listed it."""
    if item is None:
        return SuccessorSees.GIVE_UP
    if item.owner == me and item.epoch > epoch:
        return SuccessorSees.HANDED_OVER
    if item.epoch != epoch:
        return SuccessorSees.GIVE_UP
    if not item.owner:
        return SuccessorSees.TAKE if item.successor == me else SuccessorSees.GIVE_UP
    asked = item.successor == me and item.handoff_stage in (HANDOFF_REQUESTED, HANDOFF_READY)
    return SuccessorSees.WAIT if asked else SuccessorSees.GIVE_UP


class Adoption(enum.Enum):
    """What the successor does with a shard handed over to it (owned by it already)."""

    ADOPT = "adopt"  # run it at the item's epoch: promote the standby, or spawn from the item
    RELEASE = "release"  # we stop taking, or may not run it: give it up at once (owner+epoch)
    HELD = "held"  # a runner here, or a take in flight, has it: nothing to do
    NOT_OURS = "not ours"  # someone else's by now: nothing to do


def adoption(
    item: ShardItem | None, *, me: str, held: bool, runnable: bool, accepting: bool
) -> Adoption:
    """The successor's answer to ``SuccessorSees.HANDED_OVER``. ``held``: a runner (or a take
    in flight) here has the shard. A shard we may not run now is released at once rather than
    left owned by us with no child (peers would wait for our lease to lapse)."""
    if item is None or item.owner != me:
        return Adoption.NOT_OURS
    if held:
        return Adoption.HELD
    if not accepting or not runnable:
        return Adoption.RELEASE
    return Adoption.ADOPT


def release_wait(stop_grace: float) -> float:
    """How long a successor that answered waits for the release (or the hand-over): the
    owner's stop (its grace, then SIGTERM) and that write."""
    return stop_grace + RELEASE_SLACK


__all__ = [
    "OWNER_POLL",
    "SUCCESSOR_POLL",
    "Adoption",
    "Fallback",
    "HandoffPlan",
    "Mode",
    "OwnerSees",
    "SuccessorSees",
    "adoption",
    "min_cut",
    "owner_sees",
    "plan_handoff",
    "release_wait",
    "successor_sees",
]
