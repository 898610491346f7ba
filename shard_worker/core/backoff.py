"""Retry delays: exponential growth with full jitter, so many workers don't retry in step.

One formula for both processes: the child's reconnects and sink retries (``Backoff``) and the
supervisor's child restarts (``supervisor.core.restart_policy``). Pure: the caller injects the
random source (``random.Random`` in production, a fixed draw in tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs


def jitter_cap(initial: float, maximum: float, attempt: int) -> float:
    """The upper bound of retry ``attempt`` (0-based): ``min(maximum, initial * 2**attempt)``.

    Doubled step by step, stopping at ``maximum``: a reader that reconnects for days never
    overflows a float."""
    cap = initial
    for _ in range(attempt):
        if cap >= maximum:
            break
        cap *= 2
    return min(cap, maximum)


def full_jitter(initial: float, maximum: float, attempt: int, draw: Callable[[], float]) -> float:
    """A delay uniform in [0, ``jitter_cap``]: ``draw()`` is uniform in [0, 1)."""
    return draw() * jitter_cap(initial, maximum, attempt)


class RandomSource(Protocol):
    """What ``Backoff`` needs of ``random.Random``."""

    def random(self) -> float: ...


@attrs.define
class Backoff:
    """Delay n is uniform in [0, min(maximum, initial * 2**n)]; ``reset`` starts over."""

    initial: float
    maximum: float
    rng: RandomSource = attrs.field(kw_only=True)
    _attempt: int = 0

    def next_delay(self) -> float:
        delay = full_jitter(self.initial, self.maximum, self._attempt, self.rng.random)
        self._attempt += 1
        return delay

    def reset(self) -> None:
        self._attempt = 0


__all__ = ["Backoff", "RandomSource", "full_jitter", "jitter_cap"]
