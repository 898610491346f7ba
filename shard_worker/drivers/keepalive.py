"""The keepalive of one open connection: a task of its own beside the reading, asleep until its
next deadline (core/liveness.py decides). It pings when nothing came for ``ping_interval``, and
gives the connection up when a ping goes unanswered (``ping_timeout``) or the feed sends no
message for ``idle_timeout`` (``idle``); the reader then reconnects from the checkpoint.

The reading pays one clock read per batch (per socket read) for it, not a cancel scope per
receive: a cancel scope per receive cost trio-websocket's one-message batches about a third of
their time (docs/benchmarks.md, *WebSocket transport*).
"""

from __future__ import annotations

import trio

from shard_worker.adapters.websocket import Closed, Connection
from shard_worker.core.liveness import Due, Keepalive


class GaveUp(Exception):
    """The keepalive gave the connection up: ``reason`` says why (ping_timeout, idle)."""

    def __init__(self, due: Due, description: str) -> None:
        super().__init__(description)
        self.reason = due.value


async def watch(connection: Connection, keepalive: Keepalive) -> GaveUp | None:
    """Ping when due, until the connection must be given up: why (returned); None when the
    connection closed under a ping (the reading meets the same end)."""
    settings = keepalive.settings
    while True:
        await trio.sleep_until(keepalive.deadline())
        now = trio.current_time()
        keepalive.received(connection.last_frame_at, messages=False)
        due = keepalive.due(now)
        if due is Due.PING:
            try:
                await connection.ping()
            except Closed:
                return None
            keepalive.pinged(now)
        elif due is Due.PING_TIMEOUT:
            connection.abandon()  # no close handshake with a peer that is gone
            return GaveUp(due, f"no answer to a ping within {settings.ping_timeout:g}s")
        elif due is Due.IDLE:
            return GaveUp(due, f"no message for {settings.idle_timeout:g}s (idle)")
