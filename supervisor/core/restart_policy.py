"""When to restart a crashed child: exponential backoff with full jitter, pure and clock-injected.

The first crash after a healthy run restarts at once: a child that crashes once a day should
cost milliseconds. Each further crash waits a full-jitter draw (uniform in [0, cap]) with the cap
doubling from ``initial`` to ``maximum``, so a host whose children all crash at once does not
restart them in lock-step. The count resets once a child has stayed up for ``reset_after``.
Too many crashes inside ``window`` is a crash loop: the caller quarantines the shard
(see docs/architecture.md). The jitter is the child's own formula
(``shard_worker.core.backoff.full_jitter``); the random draw is injected.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs

from shard_worker.core.backoff import full_jitter, jitter_cap


@attrs.frozen
class RestartDecision:
    delay: float  # seconds to wait before the next start
    crash_loop: bool  # too many crashes within the window: do not restart here


@attrs.define
class RestartPolicy:
    initial: float
    maximum: float
    reset_after: float
    max_restarts: int = 5
    window: float = 60.0
    rng: Callable[[], float] = attrs.field(kw_only=True)  # uniform in [0, 1): random.random
    _attempt: int = 0
    _started_at: float | None = None
    _crashes: deque[float] = attrs.field(factory=deque)

    def child_started(self, now: float) -> None:
        self._started_at = now

    def child_healthy_for(self, now: float) -> float:
        return 0.0 if self._started_at is None else now - self._started_at

    def child_crashed(self, now: float) -> RestartDecision:
        if self.child_healthy_for(now) >= self.reset_after:
            self._attempt = 0
        self._started_at = None
        self._crashes.append(now)
        while self._crashes and now - self._crashes[0] > self.window:
            self._crashes.popleft()
        delay = (
            0.0
            if self._attempt == 0
            else full_jitter(self.initial, self.maximum, self._attempt - 1, self.rng)
        )
        self._attempt += 1
        return RestartDecision(delay=delay, crash_loop=len(self._crashes) > self.max_restarts)

    def cap(self, attempt: int) -> float:
        """The jitter cap before restart number ``attempt`` (0 = the first: immediate)."""
        return jitter_cap(self.initial, self.maximum, attempt - 1) if attempt else 0.0
