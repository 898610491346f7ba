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
    (S.RUNNING, E.HAND_OFF): S.HANDING_OFF,
    (S.BACKOFF, E.RESTART): S.STARTING,
    (S.BACKOFF, E.STOP_REQUESTED): S.STOPPING,
    (S.BACKOFF, E.LEASE_LOST): S.LOST,
    (S.BACKOFF, E.RELEASED): S.STOPPED,
    (S.STOPPING, E.CHILD_READY): S.STOPPING,
    (S.STOPPING, E.STANDBY_READY): S.STOPPING,
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
    # Make-before-break (issue 14): the child writes on until the successor is ready.
    (S.HANDING_OFF, E.CHILD_READY): S.HANDING_OFF,
    (S.HANDING_OFF, E.STOP_REQUESTED): S.HANDING_OFF,
    (S.HANDING_OFF, E.SUCCESSOR_READY): S.STOPPING,
    (S.HANDING_OFF, E.HANDOFF_FALLBACK): S.STOPPING,
    (S.HANDING_OFF, E.LEASE_LOST): S.LOST,
    (S.HANDING_OFF, E.RELEASED): S.STOPPED,
    # Warm standbys (issue 14).
    (S.STANDBY, E.STANDBY_READY): S.STANDBY_READY,
    (S.STANDBY, E.PROMOTE): S.PROMOTING,
    (S.STANDBY, E.CHILD_EXITED): S.STANDBY_BACKOFF,
    (S.STANDBY, E.CRASH_LOOP): S.QUARANTINED,
    (S.STANDBY, E.STOP_REQUESTED): S.STOPPING,
    (S.STANDBY, E.RELEASED): S.STOPPED,
    (S.STANDBY_READY, E.STANDBY_READY): S.STANDBY_READY,
    (S.STANDBY_READY, E.PROMOTE): S.PROMOTING,
    (S.STANDBY_READY, E.CHILD_EXITED): S.STANDBY_BACKOFF,
    (S.STANDBY_READY, E.CRASH_LOOP): S.QUARANTINED,
    (S.STANDBY_READY, E.STOP_REQUESTED): S.STOPPING,
    (S.STANDBY_READY, E.RELEASED): S.STOPPED,
    (S.STANDBY_BACKOFF, E.RESTART): S.STANDBY,
    (S.STANDBY_BACKOFF, E.STOP_REQUESTED): S.STOPPING,
    (S.STANDBY_BACKOFF, E.RELEASED): S.STOPPED,
    (S.PROMOTING, E.CHILD_READY): S.RUNNING,
    (S.PROMOTING, E.STANDBY_READY): S.PROMOTING,
    (S.PROMOTING, E.CHILD_EXITED): S.BACKOFF,
    (S.PROMOTING, E.CRASH_LOOP): S.QUARANTINED,
    (S.PROMOTING, E.STOP_REQUESTED): S.STOPPING,
    (S.PROMOTING, E.LEASE_LOST): S.LOST,
    (S.PROMOTING, E.RELEASED): S.STOPPED,
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


OLD_STATES = {S.STARTING, S.RUNNING, S.BACKOFF, S.STOPPING, S.QUARANTINED, S.LOST, S.STOPPED}
NEW_EVENTS = {E.HAND_OFF, E.SUCCESSOR_READY, E.HANDOFF_FALLBACK, E.STANDBY_READY, E.PROMOTE}


def test_the_illegal_pairs_are_the_ones_that_would_be_bugs():
    old = {(s, e) for s, e in ILLEGAL if s in OLD_STATES and e not in NEW_EVENTS}
    assert old == {
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


def test_the_new_events_are_legal_only_where_they_can_happen():
    legal = {(s, e) for s, e in EXPECTED if e in NEW_EVENTS}
    assert legal == {
        (S.RUNNING, E.HAND_OFF),  # not while starting or backing off: nothing writes to a cut
        (S.HANDING_OFF, E.SUCCESSOR_READY),
        (S.HANDING_OFF, E.HANDOFF_FALLBACK),
        (S.STANDBY, E.STANDBY_READY),
        (S.STANDBY_READY, E.STANDBY_READY),
        (S.STOPPING, E.STANDBY_READY),
        (S.PROMOTING, E.STANDBY_READY),
        (S.STANDBY, E.PROMOTE),  # only a standby with a child is promoted (never in backoff)
        (S.STANDBY_READY, E.PROMOTE),
    }


def test_a_standby_holds_no_lease_to_lose():
    for state in (S.STANDBY, S.STANDBY_READY, S.STANDBY_BACKOFF):
        assert (state, E.LEASE_LOST) in ILLEGAL
        assert (state, E.CHILD_READY) in ILLEGAL  # a standby child never says ready
    assert (S.STANDBY_BACKOFF, E.PROMOTE) in ILLEGAL
    assert (S.STANDBY_BACKOFF, E.CHILD_EXITED) in ILLEGAL
    assert (S.HANDING_OFF, E.CHILD_EXITED) in ILLEGAL  # a leaving runner restarts nothing
    assert (S.HANDING_OFF, E.CRASH_LOOP) in ILLEGAL
    assert (S.PROMOTING, E.RESTART) in ILLEGAL


def test_the_public_strings_stay():
    assert [s.value for s in RunnerState] == [
        "starting",
        "running",
        "backoff",
        "stopping",
        "stopped",
        "lost",
        "quarantined",
        "handing-off",
        "standby",
        "standby-ready",
        "standby-backoff",
        "promoting",
    ]


def test_what_each_state_means_to_the_supervisor():
    serving = {s for s in RunnerState if s.serving}
    standing_by = {s for s in RunnerState if s.standing_by}
    holding = {s for s in RunnerState if s.holds_lease}
    leaving = {s for s in RunnerState if s.leaving}
    assert serving == {S.STARTING, S.RUNNING, S.BACKOFF, S.PROMOTING}
    assert standing_by == {S.STANDBY, S.STANDBY_READY, S.STANDBY_BACKOFF}
    assert leaving == set(RunnerState) - serving - standing_by
    assert holding == {
        S.STARTING,
        S.RUNNING,
        S.BACKOFF,
        S.STOPPING,
        S.QUARANTINED,
        S.HANDING_OFF,
        S.PROMOTING,
    }
    assert {s for s in RunnerState if s.stops_child} == leaving - {S.HANDING_OFF}
    assert {s for s in RunnerState if s.backing_off} == {S.BACKOFF, S.STANDBY_BACKOFF}


def run(events: list[RunnerEvent], start: RunnerState = S.STARTING) -> list[RunnerState]:
    lifecycle = RunnerLifecycle(start)
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


def test_a_make_before_break_hand_off_then_its_fallback():
    assert run([E.CHILD_READY, E.HAND_OFF, E.STOP_REQUESTED, E.SUCCESSOR_READY, E.RELEASED]) == [
        S.RUNNING,
        S.HANDING_OFF,
        S.HANDING_OFF,
        S.STOPPING,
        S.STOPPED,
    ]
    assert run([E.CHILD_READY, E.HAND_OFF, E.HANDOFF_FALLBACK, E.RELEASED])[-2:] == [
        S.STOPPING,
        S.STOPPED,
    ]


def test_a_standby_crashes_restarts_gets_ready_and_is_promoted():
    events = [
        E.CHILD_EXITED,
        E.RESTART,
        E.STANDBY_READY,
        E.PROMOTE,
        E.STANDBY_READY,
        E.CHILD_READY,
        E.CHILD_EXITED,
        E.RESTART,
    ]
    assert run(events, S.STANDBY) == [
        S.STANDBY_BACKOFF,
        S.STANDBY,
        S.STANDBY_READY,
        S.PROMOTING,
        S.PROMOTING,
        S.RUNNING,
        S.BACKOFF,  # an owner now: its next child starts active
        S.STARTING,
    ]


def test_a_crash_looping_standby_is_stopped_and_a_placement_change_stops_one():
    assert run([E.CHILD_EXITED, E.RESTART, E.CRASH_LOOP, E.RELEASED], S.STANDBY)[-2:] == [
        S.QUARANTINED,
        S.QUARANTINED,
    ]
    assert run([E.STANDBY_READY, E.STOP_REQUESTED, E.STANDBY_READY, E.RELEASED], S.STANDBY) == [
        S.STANDBY_READY,
        S.STOPPING,
        S.STOPPING,
        S.STOPPED,
    ]
