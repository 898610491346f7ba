"""The fence deadline: past it, this child may no longer be the shard's only writer.

The supervisor moves the deadline forward with every heartbeat it wins (``Fence`` messages);
both doors to the sinks (the Recorder for jsonl, the BatchPipeline for the rest) and the
dead-letter sink check it before every write, so a child whose supervisor froze stops writing
on its own, before a peer may take the shard over.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import trio


class FenceExpired(Exception):
    """The lease may be lost: a peer may own the shard, so writing would make a second writer."""


def trio_deadline(monotonic_deadline: float) -> float:
    """A time.monotonic() deadline on trio's clock (which has a random offset)."""
    return trio.current_time() + (monotonic_deadline - time.monotonic())


class FenceGuard:
    """The fence deadline (time.monotonic() of this host), moved by Fence messages.

    ``check()`` before a write; ``delivering()`` around an awaited delivery: it refuses to
    start at or after the deadline and cancels the delivery when the deadline passes (moving
    the deadline moves the cancellation too)."""

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline
        self._scopes: set[trio.CancelScope] = set()

    @property
    def deadline(self) -> float:
        return self._deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self._deadline = value
        if self._scopes:
            at = trio_deadline(value)
            for scope in self._scopes:
                scope.deadline = at

    def check(self) -> None:
        if time.monotonic() >= self._deadline:
            raise FenceExpired("fence deadline passed: lease may be lost")

    @contextmanager
    def delivering(self) -> Iterator[None]:
        self.check()
        scope = trio.CancelScope(deadline=trio_deadline(self._deadline))
        self._scopes.add(scope)
        try:
            with scope:
                yield
        finally:
            self._scopes.discard(scope)
        if scope.cancelled_caught:
            raise FenceExpired("fence deadline passed during a delivery: lease may be lost")
