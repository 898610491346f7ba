"""Standard output sink: the public records as JSON lines, for piping into other tools.

One write and one flush per batch: a reader sees whole lines, and a batch is accepted once the
OS has it (the pipe, or the file stdout is redirected to). Writes run in a worker thread, so a
slow reader stalls this sink but never the worker's event loop (its heartbeats go on).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Sequence
from typing import BinaryIO

import trio

from shard_worker.adapters.sinks.batch import DeliveryFailed
from shard_worker.records import Record, record_json

MAX_RECORDS = 1000
MAX_BYTES = 1024 * 1024


class StdoutSink:
    """JSON lines to ``stream`` (default: sys.stdout.buffer), never closed by this sink."""

    def __init__(
        self,
        stream: BinaryIO | None = None,
        *,
        max_records: int = MAX_RECORDS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        if max_records < 1 or max_bytes < 1:
            raise ValueError("max_records and max_bytes must be at least 1")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._stream = stream if stream is not None else sys.stdout.buffer
        self._closed = False

    def size(self, record: Record) -> int:
        """The line's bytes, newline included (the lines are ASCII)."""
        return len(record_json(record)) + 1

    async def deliver(self, batch: Sequence[Record]) -> None:
        if self._closed:
            raise RuntimeError("deliver on a closed sink")
        if not batch:
            return
        payload = "".join(f"{record_json(record)}\n" for record in batch).encode()
        try:
            # abandon_on_cancel: a reader that stopped reading must not hold the worker past
            # its fence deadline (the abandoned write may still finish: at-least-once).
            await trio.to_thread.run_sync(self._write, payload, abandon_on_cancel=True)
        except OSError as exc:  # BrokenPipeError: the reader is gone; ENOSPC for a file...
            raise DeliveryFailed(batch, f"write to stdout failed: {exc!r}") from exc

    def _write(self, payload: bytes) -> None:
        view = memoryview(payload)
        while view:  # a buffered stream takes it all at once; a raw one may take a part
            written = self._stream.write(view)
            if written is None:  # a non-blocking stream that is full
                raise BlockingIOError(errno.EAGAIN, "stdout would block")
            view = view[written:]
        self._stream.flush()

    async def aclose(self) -> None:
        """Flush what the stream buffers; the stream stays open (it is not ours)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):  # the reader is gone: nothing left to deliver to
            await trio.to_thread.run_sync(self._stream.flush)


def records_stdout() -> BinaryIO:
    """A binary stream on the process's original standard output, for the records alone: fd 1
    is then pointed at stderr, so a stray print (ours, a library's) can never get between two
    records; it lands in the log instead."""
    out = os.fdopen(os.dup(1), "wb")
    sys.stdout.flush()
    os.dup2(2, 1)
    return out
