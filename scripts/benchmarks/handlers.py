"""Batch handlers the throughput benchmark's shard workers load (``benchmarks.handlers:<name>``).

Imported inside a shard worker child, whose PYTHONPATH names ``scripts/``; nothing here imports
more than the standard library.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any


def noop_handler(batch: Sequence[Any]) -> None:
    """Takes the batch and does nothing: the cost of the handler path itself."""


def slow_handler(batch: Sequence[Any]) -> None:
    """Sleeps so that it handles BENCH_HANDLER_RATE records per second, and appends each
    record's (stream, seq) to BENCH_HANDLER_OUT (one write per batch) for the gap check."""
    time.sleep(len(batch) / float(os.environ["BENCH_HANDLER_RATE"]))
    lines = "".join(f"{record.stream} {record.seq}\n" for record in batch)
    with open(os.environ["BENCH_HANDLER_OUT"], "a") as out:
        out.write(lines)
