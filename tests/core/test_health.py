"""Readiness, the watchdog, the host-quarantine rule, the status line and the metrics' shape:
exact values, no I/O."""

from __future__ import annotations

import json

from helpers.fake_runner import FakeRunner

from supervisor.core.health import (
    HostQuarantine,
    HostVerdict,
    SupervisorState,
    heartbeat_state,
    held_shards,
    local_status,
    metrics_state,
    readiness_problems,
    status_line,
    watchdog_ok,
)
from supervisor.core.runner_state import RunnerState

R = RunnerState


def ready(**kw) -> list[str]:
    args = {
        "state": SupervisorState.RUNNING,
        "heartbeat_problem": None,
        "lease_valid": True,
        "shutting_down": False,
    }
    return readiness_problems(**(args | kw))


def test_ready_when_running_or_draining_with_heartbeats_and_a_valid_lease():
    assert ready() == []
    assert ready(state=SupervisorState.DRAINING) == []  # an operator drain is still ready


def test_every_problem_is_listed_in_order():
    assert ready(
        state=SupervisorState.STARTING,
        heartbeat_problem="no heartbeat yet",
        lease_valid=False,
        shutting_down=True,
    ) == [
        "state starting",
        "lease store: no heartbeat yet",
        "own lease not valid",
        "shutting down",
    ]
    assert ready(state=SupervisorState.STOPPED) == ["state stopped"]


def test_the_supervisor_states_are_public_strings():
    assert [f"{s}" for s in SupervisorState] == ["starting", "running", "draining", "stopped"]
    assert json.dumps({"state": SupervisorState.DRAINING}) == '{"state": "draining"}'


def test_the_heartbeat_advertises_draining_while_stopping_or_drained():
    assert heartbeat_state(shutting_down=False, operator_drain=False) == "running"
    assert heartbeat_state(shutting_down=True, operator_drain=False) == "draining"
    assert heartbeat_state(shutting_down=False, operator_drain=True) == "draining"


def test_the_watchdog_needs_an_on_time_loop_and_a_valid_lease():
    assert watchdog_ok(lag=0.5, interval=1.0, lease_valid=True)
    assert not watchdog_ok(lag=1.0, interval=1.0, lease_valid=True)
    assert not watchdog_ok(lag=0.0, interval=1.0, lease_valid=False)


def test_one_poison_shard_never_quarantines_the_host():
    host = HostQuarantine(window=60.0)
    assert host.crash_looped(now=10.0, still_running=0) == HostVerdict(False, 1, 1)


def test_two_crash_loops_that_are_most_of_the_host_do():
    host = HostQuarantine(window=60.0)
    assert host.crash_looped(now=10.0, still_running=2) == HostVerdict(False, 1, 3)
    assert host.crash_looped(now=20.0, still_running=1) == HostVerdict(True, 2, 3)


def test_half_is_not_most():
    host = HostQuarantine(window=60.0)
    host.crash_looped(now=10.0, still_running=3)
    assert host.crash_looped(now=20.0, still_running=2) == HostVerdict(False, 2, 4)


def test_crash_loops_older_than_the_window_are_forgotten():
    host = HostQuarantine(window=60.0)
    host.crash_looped(now=0.0, still_running=1)
    assert host.crash_looped(now=60.0, still_running=0) == HostVerdict(True, 2, 2)  # inclusive
    host = HostQuarantine(window=60.0)
    host.crash_looped(now=0.0, still_running=1)
    assert host.crash_looped(now=60.001, still_running=0) == HostVerdict(False, 1, 1)


RUNNERS = {
    "b": FakeRunner(epoch=2, state=R.RUNNING, taken_at=4.0, restarts=1),
    "a": FakeRunner(epoch=7, state=R.STARTING, taken_at=9.0),
    "x": FakeRunner(epoch=3, state=R.LOST),
    "q": FakeRunner(epoch=1, state=R.QUARANTINED, taken_at=1.0, restarts=5),
}


def test_held_shards_and_the_status_line_leave_lost_ones_out():
    assert held_shards(RUNNERS) == ["a", "b", "q"]
    assert status_line(SupervisorState.RUNNING, RUNNERS) == "running: 3 shards (a b q)"
    assert status_line(SupervisorState.DRAINING, {}) == "draining: 0 shards"


def test_local_status_lists_every_runner_with_its_public_state():
    assert local_status(
        worker="w1", state=SupervisorState.RUNNING, lease_valid_for=7.12345, runners=RUNNERS
    ) == {
        "worker": "w1",
        "state": "running",
        "lease_valid_for_s": 7.123,
        "shards": {
            "a": {"state": "starting", "epoch": 7, "restarts": 0},
            "b": {"state": "running", "epoch": 2, "restarts": 1},
            "q": {"state": "quarantined", "epoch": 1, "restarts": 5},
            "x": {"state": "lost", "epoch": 3, "restarts": 0},
        },
    }


def test_metrics_state_counts_held_and_up_shards():
    assert metrics_state(runners=RUNNERS, lease_valid_for=3.5, now=10.0) == {
        "held": 3,
        "up": 1,
        "lease_valid_s": 3.5,
        "shards": {
            "a": {"checkpoint_age_s": 1.0, "lag": {}},
            "b": {"checkpoint_age_s": 6.0, "lag": {}},
            "q": {"checkpoint_age_s": 9.0, "lag": {}},
        },
    }
    never = metrics_state(runners={}, lease_valid_for=float("-inf"), now=0.0)
    assert never["lease_valid_s"] == -1e9  # before the first heartbeat: a finite gauge
