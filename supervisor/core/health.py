"""How healthy this supervisor is, in the words its observers read: /readyz's problems, the
systemd watchdog and status line, the host-quarantine rule, the local status and the metrics'
gauges. Pure: the driver passes its state, its runners and ``now``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from supervisor.core.runner_state import HeldShard, RunnerState


class SupervisorState(enum.StrEnum):
    """The supervisor's own state (the value is the public string: /healthz, status line)."""

    STARTING = "starting"  # registering with the store
    RUNNING = "running"
    DRAINING = "draining"  # handing everything off: an operator drain, or shutting down
    STOPPED = "stopped"


def heartbeat_state(*, shutting_down: bool, operator_drain: bool) -> str:
    """The state our worker item advertises: peers do not count a draining worker as a taker."""
    return "draining" if shutting_down or operator_drain else "running"


def readiness_problems(
    *,
    state: SupervisorState,
    heartbeat_problem: str | None,
    lease_valid: bool,
    shutting_down: bool,
) -> list[str]:
    """Why /readyz answers 503 (empty: ready). Ready = registered, heartbeats reaching the
    store (``heartbeat_problem`` None), own lease valid, not stopping."""
    problems = []
    if state not in (SupervisorState.RUNNING, SupervisorState.DRAINING):
        problems.append(f"state {state}")
    if heartbeat_problem is not None:
        problems.append(f"lease store: {heartbeat_problem}")
    if not lease_valid:
        problems.append("own lease not valid")
    if shutting_down:
        problems.append("shutting down")
    return problems


def watchdog_ok(*, lag: float, interval: float, lease_valid: bool) -> bool:
    """WATCHDOG=1 only while our loop runs on time and our lease is valid: systemd then
    restarts a supervisor that is stuck, not merely one that is busy."""
    return lag < interval and lease_valid


def held_shards(runners: Mapping[str, HeldShard]) -> list[str]:
    """The shards we still count as ours (a lost one is not), sorted."""
    return sorted(sid for sid, r in runners.items() if r.state.holds_lease)


def status_line(state: SupervisorState, runners: Mapping[str, HeldShard]) -> str:
    """systemd's STATUS=: ``running: 2 shards (a b)``."""
    held = held_shards(runners)
    return f"{state}: {len(held)} shards" + (f" ({' '.join(held)})" if held else "")


@attrs.frozen
class HostVerdict:
    unhealthy: bool  # most of this host's shards crash-looped: exit 70
    recent: int  # crash loops within the window, this one included
    total: int  # those plus the shards still running here


@attrs.define
class HostQuarantine:
    """Most of this host's shards crash-looping points at the host, not the shards: the
    supervisor then exits 70 so that systemd's start limit or ECS's circuit breaker can act.
    One poison shard (which would crash-loop anywhere) must not take every host down, so it
    takes at least two, and more than half of the shards, within ``window`` seconds."""

    window: float
    _at: list[float] = attrs.field(factory=list)

    def crash_looped(self, now: float, still_running: int) -> HostVerdict:
        """A shard crash-looped at ``now``; ``still_running`` runners remain on this host."""
        self._at = [t for t in self._at if now - t <= self.window] + [now]
        recent = len(self._at)
        total = recent + still_running
        return HostVerdict(recent >= 2 and recent * 2 > total, recent, total)


def local_status(
    *, worker: str, state: SupervisorState, lease_valid_for: float, runners: Mapping[str, HeldShard]
) -> dict[str, Any]:
    """This supervisor's view of itself (every runner, a lost one too)."""
    return {
        "worker": worker,
        "state": state,
        "lease_valid_for_s": round(lease_valid_for, 3),
        "shards": {
            sid: {"state": r.state.value, "epoch": r.epoch, "restarts": r.restarts}
            for sid, r in sorted(runners.items())
        },
    }


def metrics_state(
    *, runners: Mapping[str, HeldShard], lease_valid_for: float, now: float
) -> dict[str, Any]:
    """The gauges read at scrape time (``supervisor.adapters.metrics``)."""
    active = {sid: r for sid, r in runners.items() if r.state.holds_lease}
    return {
        "held": len(active),
        "up": sum(1 for r in active.values() if r.state is RunnerState.RUNNING),
        "lease_valid_s": max(lease_valid_for, -1e9),
        "shards": {sid: r.checkpoint_metrics(now) for sid, r in sorted(active.items())},
    }


__all__ = [
    "HostQuarantine",
    "HostVerdict",
    "SupervisorState",
    "heartbeat_state",
    "held_shards",
    "local_status",
    "metrics_state",
    "readiness_problems",
    "status_line",
    "watchdog_ok",
]
