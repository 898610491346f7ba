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

    @property
    def serving(self) -> bool:
        """A child runs or will run again: the runner holds the lease and was not told to go.
        Only a serving runner is asked to stop or declared lost by the supervisor's round."""
        return self in _SERVING

    @property
    def holds_lease(self) -> bool:
        """The runner still counts the shard as ours (it may be on its way out)."""
        return self not in (RunnerState.LOST, RunnerState.STOPPED)

    @property
    def leaving(self) -> bool:
        """No new child will start: the runner is stopping, lost, quarantined or done."""
        return self not in _SERVING


_SERVING = frozenset({RunnerState.STARTING, RunnerState.RUNNING, RunnerState.BACKOFF})


class RunnerEvent(enum.Enum):
    CHILD_READY = "child_ready"  # the child's Ready message
    CHILD_EXITED = "child_exited"  # the child died unasked; the policy allows a restart
    RESTART = "restart"  # the backoff delay is over: start the next child
    CRASH_LOOP = "crash_loop"  # the child died unasked, once too often: give the shard up
    STOP_REQUESTED = "stop_requested"  # hand the shard off (drain, rebalance, operator, reload)
    LEASE_LOST = "lease_lost"  # the table or our own lease says the shard is not ours
    RELEASED = "released"  # the runner ended and released the lease (or tried to)


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
        E.LEASE_LOST: S.LOST,
        E.RELEASED: S.STOPPED,  # cancelled: the supervisor's drain overran its budget
    },
    S.BACKOFF: {
        E.RESTART: S.STARTING,
        E.STOP_REQUESTED: S.STOPPING,
        E.LEASE_LOST: S.LOST,
        E.RELEASED: S.STOPPED,  # our own lease ran out during the delay
    },
    S.STOPPING: {
        E.CHILD_READY: S.STOPPING,  # the child got ready as the stop was sent
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
