"""The runner's lifecycle table: every (state, event) pair, legal or not, pinned here."""

from __future__ import annotations

import itertools

import pytest

from supervisor.core.runner_state import (
    TRANSITIONS,
    IllegalTransition,
    RunnerEvent,
    RunnerLifecycle,
    RunnerState,
)

S, E = RunnerState, RunnerEvent

# The whole table, written out again: a change to the module must change this too.
EXPECTED = {
    (S.STARTING, E.CHILD_READY): S.RUNNING,
    (S.STARTING, E.CHILD_EXITED): S.BACKOFF,
    (S.STARTING, E.CRASH_LOOP): S.QUARANTINED,
    (S.STARTING, E.STOP_REQUESTED): S.STOPPING,
    (S.STARTING, E.LEASE_LOST): S.LOST,
    (S.STARTING, E.RELEASED): S.STOPPED,
    (S.RUNNING, E.CHILD_READY): S.RUNNING,
    (S.RUNNING, E.CHILD_EXITED): S.BACKOFF,
    (S.RUNNING, E.CRASH_LOOP): S.QUARANTINED,
    (S.RUNNING, E.STOP_REQUESTED): S.STOPPING,
    (S.RUNNING, E.LEASE_LOST): S.LOST,
    (S.RUNNING, E.RELEASED): S.STOPPED,
    (S.BACKOFF, E.RESTART): S.STARTING,
    (S.BACKOFF, E.STOP_REQUESTED): S.STOPPING,
    (S.BACKOFF, E.LEASE_LOST): S.LOST,
    (S.BACKOFF, E.RELEASED): S.STOPPED,
    (S.STOPPING, E.CHILD_READY): S.STOPPING,
    (S.STOPPING, E.STOP_REQUESTED): S.STOPPING,
    (S.STOPPING, E.LEASE_LOST): S.LOST,
    (S.STOPPING, E.RELEASED): S.STOPPED,
    (S.QUARANTINED, E.STOP_REQUESTED): S.QUARANTINED,
    (S.QUARANTINED, E.LEASE_LOST): S.QUARANTINED,
    (S.QUARANTINED, E.RELEASED): S.QUARANTINED,
    (S.LOST, E.CHILD_READY): S.LOST,
    (S.LOST, E.STOP_REQUESTED): S.LOST,
    (S.LOST, E.LEASE_LOST): S.LOST,
    (S.LOST, E.RELEASED): S.LOST,
    (S.STOPPED, E.STOP_REQUESTED): S.STOPPED,
    (S.STOPPED, E.LEASE_LOST): S.STOPPED,
}

ALL_PAIRS = list(itertools.product(RunnerState, RunnerEvent))
LEGAL = [pair for pair in ALL_PAIRS if pair in EXPECTED]
ILLEGAL = [pair for pair in ALL_PAIRS if pair not in EXPECTED]


def test_the_table_is_exactly_the_expected_one():
    flat = {(s, e): new for s, row in TRANSITIONS.items() for e, new in row.items()}
    assert flat == EXPECTED
    assert set(TRANSITIONS) == set(RunnerState)  # every state has a row, if only an empty one


@pytest.mark.parametrize(("state", "event"), LEGAL, ids=lambda x: x.value)
def test_a_legal_event_moves_to_its_state(state, event):
    lifecycle = RunnerLifecycle(state)
    changed = lifecycle.process(event)
    assert lifecycle.state is EXPECTED[state, event]
    assert changed is (EXPECTED[state, event] is not state)


@pytest.mark.parametrize(("state", "event"), ILLEGAL, ids=lambda x: x.value)
def test_an_illegal_event_raises_and_changes_nothing(state, event):
    lifecycle = RunnerLifecycle(state)
    with pytest.raises(IllegalTransition) as caught:
        lifecycle.process(event)
    assert lifecycle.state is state
    assert (caught.value.state, caught.value.event) == (state, event)
    assert str(caught.value) == f"runner cannot handle {event.value} in state {state.value}"


def test_the_illegal_pairs_are_the_ones_that_would_be_bugs():
    assert set(ILLEGAL) == {
        (S.STARTING, E.RESTART),  # a child is already starting
        (S.RUNNING, E.RESTART),
        (S.BACKOFF, E.CHILD_READY),  # no child runs during the backoff
        (S.BACKOFF, E.CHILD_EXITED),
        (S.BACKOFF, E.CRASH_LOOP),
        (S.STOPPING, E.CHILD_EXITED),  # a stopping runner does not restart its child
        (S.STOPPING, E.RESTART),
        (S.STOPPING, E.CRASH_LOOP),
        (S.QUARANTINED, E.CHILD_READY),  # after a crash loop no child runs
        (S.QUARANTINED, E.CHILD_EXITED),
        (S.QUARANTINED, E.RESTART),
        (S.QUARANTINED, E.CRASH_LOOP),
        (S.LOST, E.CHILD_EXITED),
        (S.LOST, E.RESTART),
        (S.LOST, E.CRASH_LOOP),
        (S.STOPPED, E.CHILD_READY),  # done: only late requests may still arrive
        (S.STOPPED, E.CHILD_EXITED),
        (S.STOPPED, E.RESTART),
        (S.STOPPED, E.CRASH_LOOP),
        (S.STOPPED, E.RELEASED),
    }


def test_the_public_strings_stay():
    assert [s.value for s in RunnerState] == [
        "starting",
        "running",
        "backoff",
        "stopping",
        "stopped",
        "lost",
        "quarantined",
    ]


def test_what_each_state_means_to_the_supervisor():
    serving = {s for s in RunnerState if s.serving}
    holding = {s for s in RunnerState if s.holds_lease}
    leaving = {s for s in RunnerState if s.leaving}
    assert serving == {S.STARTING, S.RUNNING, S.BACKOFF}
    assert leaving == set(RunnerState) - serving
    assert holding == {S.STARTING, S.RUNNING, S.BACKOFF, S.STOPPING, S.QUARANTINED}


def run(events: list[RunnerEvent]) -> list[RunnerState]:
    lifecycle = RunnerLifecycle()
    states = []
    for event in events:
        lifecycle.process(event)
        states.append(lifecycle.state)
    return states


def test_a_crash_then_a_restart_then_a_rebalance():
    events = [
        E.CHILD_READY,
        E.CHILD_EXITED,
        E.RESTART,
        E.CHILD_READY,
        E.STOP_REQUESTED,
        E.CHILD_READY,
        E.RELEASED,
    ]
    assert run(events) == [
        S.RUNNING,
        S.BACKOFF,
        S.STARTING,
        S.RUNNING,
        S.STOPPING,
        S.STOPPING,
        S.STOPPED,
    ]


def test_a_child_that_never_gets_ready_crash_loops_into_quarantine():
    events = [E.CHILD_EXITED, E.RESTART] * 5 + [E.CRASH_LOOP, E.STOP_REQUESTED, E.RELEASED]
    assert run(events)[-3:] == [S.QUARANTINED, S.QUARANTINED, S.QUARANTINED]


def test_a_lease_lost_while_stopping_wins_over_the_release():
    assert run([E.CHILD_READY, E.STOP_REQUESTED, E.LEASE_LOST, E.RELEASED]) == [
        S.RUNNING,
        S.STOPPING,
        S.LOST,
        S.LOST,
    ]
