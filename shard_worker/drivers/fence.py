"""The fence deadline: past it, this child may no longer be the shard's only writer.

The supervisor moves the deadline forward with every heartbeat it wins (``Fence`` messages);
both doors to the sinks (the Recorder for jsonl, the BatchPipeline for the rest: each a
``FencedDoor``) and the dead-letter sink behind them check it before every write, so a child
whose supervisor froze stops writing on its own, before a peer may take the shard over.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec

import trio

from shard_worker.adapters.sinks.jsonl import DeadLetterSink

P = ParamSpec("P")


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


class FencedDoor:
    """What both doors to the sinks share: the fence guard (whose deadline Fence messages
    move: ``fence_deadline``) and the dead-letter sink behind it. ``dead_letter(stream, seq,
    data, reason=, error=, encoding=)``: a message that cannot become a record (malformed, too
    large), written as ``DeadLetterSink.write`` writes it once the fence check passed."""

    def __init__(self, fence: FenceGuard, dead_letters: DeadLetterSink) -> None:
        self.fence = fence
        self.dead_letters = dead_letters
        self.dead_letter = _fenced(fence, dead_letters.write)

    @property
    def fence_deadline(self) -> float:
        return self.fence.deadline

    @fence_deadline.setter
    def fence_deadline(self, value: float) -> None:
        self.fence.deadline = value


def _fenced(fence: FenceGuard, write: Callable[P, None]) -> Callable[P, None]:
    """``write`` behind the fence check: nothing gets through it once the deadline passed."""

    def checked(*args: P.args, **kwargs: P.kwargs) -> None:
        fence.check()
        write(*args, **kwargs)

    return checked
