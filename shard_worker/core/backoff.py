"""Reconnect delays: exponential growth with full jitter, so many workers don't retry in step."""

from __future__ import annotations

import random

import attrs


@attrs.define
class Backoff:
    """Delay n is uniform in [0, min(maximum, initial * 2**n)]; ``reset`` starts over."""

    initial: float
    maximum: float
    rng: random.Random = attrs.field(factory=random.Random)
    _cap: float = 0.0

    def next_delay(self) -> float:
        self._cap = self.initial if not self._cap else min(self.maximum, self._cap * 2)
        return self.rng.uniform(0, self._cap)

    def reset(self) -> None:
        self._cap = 0.0
