"""Waiting for a condition that another process or task makes true, within a deadline."""

from __future__ import annotations

from collections.abc import Callable

import trio


async def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Return once ``predicate()`` is true, polling every 10 ms; TooSlowError after
    ``timeout`` seconds."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)
