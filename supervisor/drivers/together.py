"""Requests that do not depend on each other, sent side by side: a round then waits for the
slowest of them, not for their sum (on DynamoDB each is a round trip of its own)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

A = TypeVar("A")
B = TypeVar("B")


async def both(
    first: Callable[[], Awaitable[A]], second: Callable[[], Awaitable[B]]
) -> tuple[A, B]:
    """Both results. An error of either cancels the other and is raised as itself (callers
    handle a store's errors one by one); when both failed, one is raised, the other noted.
    Cancellation and other BaseExceptions pass through as trio raised them."""
    results: list[object] = [None, None]

    async def run(index: int, call: Callable[[], Awaitable[object]]) -> None:
        results[index] = await call()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, 0, first)
            nursery.start_soon(run, 1, second)
    except ExceptionGroup as group:
        first_error, *others = group.exceptions
        for other in others:
            first_error.add_note(f"and, side by side: {other!r}")
        raise first_error from None
    return results[0], results[1]  # type: ignore[return-value]
