"""A shard runner's lifecycle as one transition table (in the manner of h11's ``_state.py``).

Every change of a runner's state is an event looked up in ``TRANSITIONS``; an event the table
does not list for the current state is a bug in the runner and raises ``IllegalTransition``.
Entries that map a state to itself say "this can happen here, and changes nothing" (a child's
``ready`` already in the pipe when its lease was lost). Pure: no trio, no clock.

::

    taken -> STARTING --child_ready--> RUNNING --child_exited--> BACKOFF --restart--> STARTING
                 |                        |                          |
                 +------ crash_loop ------+---> QUARANTINED (released as "quarantined")
                 +----- stop_requested ---+-------------+---> STOPPING --released--> STOPPED
                 +------ lease_lost ------+-------------+---> LOST (child killed, nothing written)
                                          |
                                          +--hand_off--> HANDING_OFF --successor_ready--> STOPPING
                                                         (child writes  --handoff_fallback->  "
                                                          on; issue 14)

    placed -> STANDBY --standby_ready--> STANDBY_READY --promote--> PROMOTING --child_ready-->
                 |  ^---restart--- STANDBY_BACKOFF <--child_exited--+     RUNNING (an owner now)
                 +--promote--> PROMOTING (a dead owner's shard, before the standby was ready)
                 +--- crash_loop / stop_requested ---> QUARANTINED / STOPPING --released--> STOPPED

A standby runner holds no lease: its child is connected and buffers, writing nothing, and its
``released`` means "ended" (nothing to release). Promotion makes it an owner runner in place.
The state's ``value`` is the public string (``status``, logs, metrics): keep them as they are.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

import attrs


class RunnerState(enum.Enum):
    STARTING = "starting"  # a child is being started, or started and not ready yet
    RUNNING = "running"  # the child said ready
    BACKOFF = "backoff"  # the child crashed; waiting for the restart policy's delay
    STOPPING = "stopping"  # asked to hand the shard off: stop the child, then release
    STOPPED = "stopped"  # released (or the release was attempted): the runner is done
    LOST = "lost"  # the lease is gone: child killed, nothing more written, no release
    QUARANTINED = "quarantined"  # crash loop: released as "quarantined" for another host
    # Make-before-break (issue 14): asked to leave; the child writes on while the successor's
    # standby connects; then STOPPING (the stop carries the cut), or a fallback to a plain stop.
    HANDING_OFF = "handing-off"
    # Warm standbys (issue 14): a standby child is starting or connecting (STANDBY), holds
    # every stream (STANDBY_READY), or crashed and waits for its restart (STANDBY_BACKOFF).
    STANDBY = "standby"
    STANDBY_READY = "standby-ready"
    STANDBY_BACKOFF = "standby-backoff"
    # The lease was taken and the standby child told to promote: waiting for its ready.
    PROMOTING = "promoting"

    @property
    def serving(self) -> bool:
        """A child runs or will run again: the runner holds the lease and was not told to go.
        Only a serving runner is asked to stop or declared lost by the supervisor's round."""
        return self in _SERVING

    @property
    def standing_by(self) -> bool:
        """A standby runner: its child runs or will run again, writing nothing, no lease."""
        return self in _STANDING_BY

    @property
    def holds_lease(self) -> bool:
        """The runner still counts the shard as ours (it may be on its way out). (A standby
        runner's stopping and stopped states are not kept among the held shards.)"""
        return self not in _NO_LEASE

    @property
    def leaving(self) -> bool:
        """No new child will start: the runner is handing off, stopping, lost, quarantined or
        done."""
        return self not in _SERVING and self not in _STANDING_BY

    @property
    def stops_child(self) -> bool:
        """The child is to stop now (a hand-off first waits for its successor)."""
        return self.leaving and self is not RunnerState.HANDING_OFF

    @property
    def backing_off(self) -> bool:
        """Waiting for the restart policy's delay: no child runs."""
        return self in (RunnerState.BACKOFF, RunnerState.STANDBY_BACKOFF)


_SERVING = frozenset(
    {RunnerState.STARTING, RunnerState.RUNNING, RunnerState.BACKOFF, RunnerState.PROMOTING}
)
_STANDING_BY = frozenset(
    {RunnerState.STANDBY, RunnerState.STANDBY_READY, RunnerState.STANDBY_BACKOFF}
)
_NO_LEASE = _STANDING_BY | {RunnerState.LOST, RunnerState.STOPPED}


class RunnerEvent(enum.Enum):
    CHILD_READY = "child_ready"  # the child's Ready message
    CHILD_EXITED = "child_exited"  # the child died unasked; the policy allows a restart
    RESTART = "restart"  # the backoff delay is over: start the next child
    CRASH_LOOP = "crash_loop"  # the child died unasked, once too often: give the shard up
    STOP_REQUESTED = "stop_requested"  # hand the shard off (drain, rebalance, operator, reload)
    LEASE_LOST = "lease_lost"  # the table or our own lease says the shard is not ours
    RELEASED = "released"  # the runner ended and released the lease (or tried to)
    # Make-before-break (issue 14).
    HAND_OFF = "hand_off"  # leave, but only once the successor's standby holds every stream
    SUCCESSOR_READY = "successor_ready"  # it does: stop the child at the cut
    HANDOFF_FALLBACK = "handoff_fallback"  # it did not in time (or cannot): a plain stop
    # Warm standbys (issue 14).
    STANDBY_READY = "standby_ready"  # the standby child's StandbyReady message
    PROMOTE = "promote"  # the lease was taken: the standby child becomes the owner child


S, E = RunnerState, RunnerEvent

TRANSITIONS: dict[RunnerState, dict[RunnerEvent, RunnerState]] = {
    S.STARTING: {
        E.CHILD_READY: S.RUNNING,
        E.CHILD_EXITED: S.BACKOFF,
        E.CRASH_LOOP: S.QUARANTINED,
        E.STOP_REQUESTED: S.STOPPING,
        E.LEASE_LOST: S.LOST,
        E.RELEASED: S.STOPPED,  # our own lease ran out (or we were cancelled) before a stop
    },
    S.RUNNING: {
        E.CHILD_READY: S.RUNNING,  # a second ready from one child changes nothing
        E.CHILD_EXITED: S.BACKOFF,
        E.CRASH_LOOP: S.QUARANTINED,
        E.STOP_REQUESTED: S.STOPPING,
        E.HAND_OFF: S.HANDING_OFF,  # only a running child can write on until the cut
        E.LEASE_LOST: S.LOST,
        E.RELEASED: S.STOPPED,  # cancelled: the supervisor's drain overran its budget
    },
    S.HANDING_OFF: {
        E.CHILD_READY: S.HANDING_OFF,
        E.STOP_REQUESTED: S.HANDING_OFF,  # the first request stands (a fast one cuts it short)
        E.SUCCESSOR_READY: S.STOPPING,
        E.HANDOFF_FALLBACK: S.STOPPING,
        E.LEASE_LOST: S.LOST,
        E.RELEASED: S.STOPPED,  # the child died meanwhile: released to the successor as is
    },
    S.BACKOFF: {
        E.RESTART: S.STARTING,
        E.STOP_REQUESTED: S.STOPPING,
        E.LEASE_LOST: S.LOST,
        E.RELEASED: S.STOPPED,  # our own lease ran out during the delay
    },
    S.STOPPING: {
        E.CHILD_READY: S.STOPPING,  # the child got ready as the stop was sent
        E.STANDBY_READY: S.STOPPING,  # a standby child got ready as its stop was sent
        E.STOP_REQUESTED: S.STOPPING,  # the first stop's reason and successor stand
        E.LEASE_LOST: S.LOST,
        E.RELEASED: S.STOPPED,
    },
    S.QUARANTINED: {
        E.STOP_REQUESTED: S.QUARANTINED,  # already on its way out, as "quarantined"
        E.LEASE_LOST: S.QUARANTINED,  # the release write will find out; still a crash loop
        E.RELEASED: S.QUARANTINED,
    },
    S.LOST: {
        E.CHILD_READY: S.LOST,  # read from the pipe after the lease was lost
        E.STOP_REQUESTED: S.LOST,
        E.LEASE_LOST: S.LOST,
        E.RELEASED: S.LOST,  # lost while the release was being written: it is refused
    },
    S.STOPPED: {
        E.STOP_REQUESTED: S.STOPPED,
        E.LEASE_LOST: S.STOPPED,
    },
    S.STANDBY: {
        E.STANDBY_READY: S.STANDBY_READY,
        E.PROMOTE: S.PROMOTING,  # a dead owner's shard: promoted before it was ready
        E.CHILD_EXITED: S.STANDBY_BACKOFF,
        E.CRASH_LOOP: S.QUARANTINED,  # stopped; nothing to release, the owner is untouched
        E.STOP_REQUESTED: S.STOPPING,
        E.RELEASED: S.STOPPED,  # cancelled: the supervisor ends
    },
    S.STANDBY_READY: {
        E.STANDBY_READY: S.STANDBY_READY,
        E.PROMOTE: S.PROMOTING,
        E.CHILD_EXITED: S.STANDBY_BACKOFF,
        E.CRASH_LOOP: S.QUARANTINED,
        E.STOP_REQUESTED: S.STOPPING,
        E.RELEASED: S.STOPPED,
    },
    S.STANDBY_BACKOFF: {
        E.RESTART: S.STANDBY,
        E.STOP_REQUESTED: S.STOPPING,
        E.RELEASED: S.STOPPED,
    },
    S.PROMOTING: {
        E.CHILD_READY: S.RUNNING,
        E.STANDBY_READY: S.PROMOTING,  # sent before it read the promote
        E.CHILD_EXITED: S.BACKOFF,  # an owner now: the next child starts active
        E.CRASH_LOOP: S.QUARANTINED,
        E.STOP_REQUESTED: S.STOPPING,
        E.LEASE_LOST: S.LOST,
        E.RELEASED: S.STOPPED,
    },
}

del S, E


class IllegalTransition(Exception):
    """The runner did something its lifecycle does not allow (a bug, like h11's
    ``LocalProtocolError``): ``state`` and ``event`` say what."""

    def __init__(self, state: RunnerState, event: RunnerEvent) -> None:
        super().__init__(f"runner cannot handle {event.value} in state {state.value}")
        self.state = state
        self.event = event


@attrs.define
class RunnerLifecycle:
    """One runner's state; ``process`` is the only way to change it."""

    state: RunnerState = RunnerState.STARTING

    def process(self, event: RunnerEvent) -> bool:
        """Apply ``event``; True if the state changed. Raises IllegalTransition."""
        try:
            new = TRANSITIONS[self.state][event]
        except KeyError:
            raise IllegalTransition(self.state, event) from None
        changed = new is not self.state
        self.state = new
        return changed


class HeldShard(Protocol):
    """What the supervisor's policies read of one shard runner (``ShardRunner`` is one)."""

    @property
    def epoch(self) -> int: ...

    @property
    def state(self) -> RunnerState: ...

    @property
    def taken_at(self) -> float: ...

    @property
    def restarts(self) -> int: ...

    def checkpoint_metrics(self, now: float) -> dict[str, Any]: ...


__all__ = [
    "TRANSITIONS",
    "HeldShard",
    "IllegalTransition",
    "RunnerEvent",
    "RunnerLifecycle",
    "RunnerState",
]
