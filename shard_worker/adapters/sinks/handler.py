"""Handler sink: your own callable receives each batch of records (docs/handlers.md).

``[sink] kind = "handler"``, ``handler = "package.module:callable"``. The callable takes one
argument, a tuple of frozen ``shard_worker.records.Record``, and returns when the batch is
handled; returning is what lets the checkpoint move past those records. It may be

- a plain function: it runs in a worker thread (``trio.to_thread``), so a slow or blocking
  handler stalls only this shard's sink, never the child's event loop (heartbeats go on);
- an ``async def`` (trio): awaited on the event loop. It must not block: a loop blocked for
  ``hang_timeout`` gets the child killed as hung.

An exception means "not handled": the same batch is offered again after a backoff (exponential,
full jitter), up to ``max_attempts`` calls in all; then ``deliver`` raises DeliveryFailed and the
worker applies ``on_failure`` (dead-letter the batch, or crash).
"""

from __future__ import annotations

import importlib
import inspect
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from shard_worker.adapters.sinks.batch import DeliveryFailed
from shard_worker.core.backoff import Backoff
from shard_worker.records import Record, record_json

MAX_RECORDS = 1000
MAX_BYTES = 1024 * 1024

# (exception, attempt that failed, seconds until the next one): for the worker's log.
OnRetry = Callable[[BaseException, int, float], None]


def load_handler(reference: str) -> Callable[..., Any]:
    """``"package.module:callable"`` (the part after ``:`` may be dotted, ``mod:Class.method``)
    to the callable; ValueError with a message an operator can act on otherwise."""
    module_name, colon, attribute = reference.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f'expected "package.module:callable", got {reference!r}')
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"cannot import module {module_name!r}: {exc} (is its directory on PYTHONPATH?)"
        ) from exc
    except Exception as exc:
        raise ValueError(f"importing module {module_name!r} failed: {exc!r}") from exc
    target: Any = module
    for name in attribute.split("."):
        try:
            target = getattr(target, name)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        not_callable = f"{reference!r} is not callable (it is a {type(target).__name__})"
        raise ValueError(not_callable)  # noqa: TRY004 - a config problem, like the others
    return target


def is_async(handler: Callable[..., Any]) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - the method, not callable()
    )


class HandlerSink:
    """At-least-once delivery to a callable: ``deliver`` returns once a call returned."""

    def __init__(
        self,
        handler: Callable[..., Any],
        *,
        max_records: int = MAX_RECORDS,
        max_bytes: int = MAX_BYTES,
        max_attempts: int = 8,
        backoff_initial: float = 0.05,
        backoff_max: float = 2.0,
        rng: random.Random | None = None,
        on_retry: OnRetry | None = None,
    ) -> None:
        if max_records < 1 or max_bytes < 1:
            raise ValueError("max_records and max_bytes must be at least 1")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.handler = handler
        self.is_async = is_async(handler)
        self._max_attempts = max_attempts
        self._backoff = (backoff_initial, backoff_max)
        self._rng = rng or random.Random()
        self._on_retry = on_retry
        self._closed = False

    def size(self, record: Record) -> int:
        """The record's JSON text (the worker measures the frame instead, which is cheaper)."""
        return len(record_json(record))

    async def deliver(self, batch: Sequence[Record]) -> None:
        if self._closed:
            raise RuntimeError("deliver on a closed sink")
        records = tuple(batch)
        backoff = Backoff(*self._backoff, rng=self._rng)
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._call(records)
                return
            except Exception as exc:
                if attempt >= self._max_attempts:
                    reason = f"handler raised {type(exc).__name__}: {exc}"
                    raise DeliveryFailed(records, f"{reason} ({attempt} attempt(s))") from exc
                delay = backoff.next_delay()
                if self._on_retry is not None:
                    self._on_retry(exc, attempt, delay)
                await trio.sleep(delay)

    async def _call(self, records: tuple[Record, ...]) -> None:
        if self.is_async:
            await self.handler(records)
            return
        # abandon_on_cancel: at the fence deadline (or the stop deadline) the worker stops
        # waiting for a handler stuck in its thread; the call's outcome is then unknown and its
        # records are not checkpointed (they are delivered again by the next owner).
        not_after = time.monotonic() + (trio.current_effective_deadline() - trio.current_time())
        try:
            result = await trio.to_thread.run_sync(
                self._call_in_thread, records, not_after, abandon_on_cancel=True
            )
        except _TooLate:
            await trio.sleep_forever()  # the deadline has passed: its cancellation is due
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(
                "the handler returned an awaitable: declare it `async def` so it is awaited"
            )

    def _call_in_thread(self, records: tuple[Record, ...], not_after: float) -> Any:
        """The handler, unless the delivery's deadline (time.monotonic()) passed before this
        worker thread started: on a busy machine it may start late, and the call would then
        write past the fence for a delivery already cancelled (not checkpointed)."""
        if time.monotonic() >= not_after:
            raise _TooLate
        trio.from_thread.check_cancelled()  # cancelled for another reason meanwhile
        return self.handler(records)

    async def aclose(self) -> None:
        self._closed = True


class _TooLate(Exception):
    """The worker thread started after the delivery's deadline: the handler was not called."""
