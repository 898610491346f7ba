"""Handlers for the handler-sink tests: children import them as ``sink_handlers:<name>`` (tests/
is on their PYTHONPATH, see worker_helpers and fleet). Each writes what it accepted to
``$SINK_HANDLER_OUT/<shard>/<stream>.<epoch>.jsonl`` as public records (one append per batch),
so supervisor/devtools/sink_audit.py can judge them like jsonl sink files.

``$SINK_HANDLER_FAIL``: comma-separated sequence numbers a batch must not contain (else it
raises, every attempt); ``$SINK_HANDLER_RATE``: records per second (the handler sleeps);
``$SINK_HANDLER_CALLS``: a file that gets one line per call (``<pid> <first seq> <records>
<unix time>``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import trio

from shard_worker.records import Record, record_json


def _out() -> Path:
    return Path(os.environ.get("SINK_HANDLER_OUT", "out"))


def _note_call(batch: Sequence[Record]) -> None:
    calls = os.environ.get("SINK_HANDLER_CALLS")
    if calls:
        with Path(calls).open("a") as out:
            out.write(f"{os.getpid()} {batch[0].seq} {len(batch)} {time.time()!r}\n")


def _keep(batch: Sequence[Record]) -> None:
    by_file: dict[Path, list[str]] = {}
    for record in batch:
        path = _out() / record.shard / f"{record.stream}.{record.epoch}.jsonl"
        by_file.setdefault(path, []).append(record_json(record) + "\n")
    for path, lines in by_file.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write("".join(lines))


def record(batch: Sequence[Record]) -> None:
    """Keep every record; refuse batches holding a $SINK_HANDLER_FAIL sequence number."""
    _note_call(batch)
    refused = {int(n) for n in os.environ.get("SINK_HANDLER_FAIL", "").split(",") if n}
    for item in batch:
        if item.seq in refused:
            raise ValueError(f"seq {item.seq} refused")
    _keep(batch)


async def record_async(batch: Sequence[Record]) -> None:
    """The same, as a trio coroutine."""
    await trio.sleep(0)
    record(batch)


def slow(batch: Sequence[Record]) -> None:
    """Keep every record, at $SINK_HANDLER_RATE records per second."""
    time.sleep(len(batch) / float(os.environ["SINK_HANDLER_RATE"]))
    _keep(batch)


def crash_once(batch: Sequence[Record]) -> None:
    """Refuse (every attempt) the batches of the first process that sees sequence number
    $SINK_HANDLER_FAIL; later processes (the restarted child) keep them. The marker file holds
    the pid of the refusing process."""
    _note_call(batch)
    target = int(os.environ["SINK_HANDLER_FAIL"])
    marker = _out() / "crash-once.pid"
    if any(item.seq is not None and item.seq >= target for item in batch):
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(os.getpid()))
        if marker.read_text() == str(os.getpid()):
            raise RuntimeError(f"refusing seq >= {target} in pid {os.getpid()}")
    _keep(batch)
