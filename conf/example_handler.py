"""An example shardvisor handler: each batch into SQLite, idempotent and fenced by epoch.

    [sink]
    kind = "handler"
    handler = "example_handler:handle"

with this directory on PYTHONPATH (docs/handlers.md: ``Environment=PYTHONPATH=/etc/shardvisor``
in the systemd unit, ``ENV PYTHONPATH=/app/conf`` in a Docker image). The database is
``$EXAMPLE_HANDLER_DB`` (default ``out/example-handler.sqlite3``), shared by every shard worker
of the host (SQLite locks it; WAL lets readers in while a batch is written).

What makes it a correct at-least-once consumer:

- **One transaction per batch.** The handler returns only after the commit, and the worker
  moves its checkpoint past a batch only once the handler returned. A crash before the commit
  leaves nothing; the records come again.
- **Idempotent.** A record delivered twice (a retry, a restart, the next owner's replay) lands
  on the same ``(stream, seq)`` row.
- **Fenced by epoch.** The row keeps the highest epoch that wrote it; an older epoch (a zombie
  writer: a frozen host whose lease has moved on) never overwrites a newer one. Streams without
  sequence numbers (``seq`` None) are appended, keyed by nothing.
- **Raising is the error path.** Any exception (the database is locked for too long, the disk
  is full) makes the worker retry the batch with backoff, then dead-letter it or crash,
  as ``[sink] on_failure`` says. Never swallow an error and return: that acknowledges the batch.

The handler is a plain function, so the worker runs it in a thread: blocking I/O here is fine.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from shard_worker.records import Record

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    shard TEXT NOT NULL,
    worker TEXT NOT NULL,
    received_at REAL NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (stream, seq)
);
CREATE TABLE IF NOT EXISTS unsequenced (
    stream TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    received_at REAL NOT NULL,
    data TEXT NOT NULL
);
"""

# A newer or equal epoch replaces the row (a replay carries the same message); an older one is
# a zombie's late write and changes nothing.
_UPSERT = """
INSERT INTO events AS e (stream, seq, epoch, shard, worker, received_at, data)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (stream, seq) DO UPDATE SET
    epoch = excluded.epoch, shard = excluded.shard, worker = excluded.worker,
    received_at = excluded.received_at, data = excluded.data
WHERE excluded.epoch >= e.epoch
"""

_local = threading.local()  # one connection per worker thread (sqlite3 objects stay in theirs)


def _connection() -> sqlite3.Connection:
    connection = getattr(_local, "connection", None)
    if connection is None:
        path = Path(os.environ.get("EXAMPLE_HANDLER_DB", "out/example-handler.sqlite3"))
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(path, timeout=30, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.executescript(_SCHEMA)
        _local.connection = connection
    return connection


def handle(batch: Sequence[Record]) -> None:
    """Store one batch in one transaction; raise to have it retried."""
    sequenced = []
    unsequenced = []
    for record in batch:
        data = json.dumps(record.data)
        if record.encoding:  # a binary frame: data is base64 text
            data = json.dumps({"encoding": record.encoding, "data": record.data})
        if record.seq is None:
            unsequenced.append((record.stream, record.epoch, record.received_at, data))
        else:
            sequenced.append(
                (
                    record.stream,
                    record.seq,
                    record.epoch,
                    record.shard,
                    record.worker,
                    record.received_at,
                    data,
                )
            )
    connection = _connection()
    connection.execute("BEGIN IMMEDIATE")
    try:
        connection.executemany(_UPSERT, sequenced)
        connection.executemany(
            "INSERT INTO unsequenced (stream, epoch, received_at, data) VALUES (?, ?, ?, ?)",
            unsequenced,
        )
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
