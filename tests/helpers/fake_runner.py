"""A stand-in for ``ShardRunner`` in core tests: only what the supervisor's policies read
(``supervisor.core.runner_state.HeldShard``), no trio, no child."""

from __future__ import annotations

from typing import Any

import attrs

from supervisor.core.runner_state import RunnerState


@attrs.define
class FakeRunner:
    epoch: int = 1
    state: RunnerState = RunnerState.RUNNING
    taken_at: float = 0.0
    restarts: int = 0

    def checkpoint_metrics(self, now: float) -> dict[str, Any]:
        return {"checkpoint_age_s": now - self.taken_at, "lag": {}}
