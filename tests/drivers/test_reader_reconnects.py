"""Reconnects are counted by reason in the heartbeat's per-stream counts, and logged once per
burst: the first line of a burst, then one that says how many it left out."""

from __future__ import annotations

import io

import trio

from shard_worker.adapters.log import Log
from shard_worker.adapters.transports import open_transport
from shard_worker.contract.pipe import RECONNECT_REASONS, StreamSpec, WorkerSettings
from shard_worker.drivers.reader import RECONNECT_LOG_INTERVAL, Placeholders, StreamReader


class _NoSink:
    def last(self, stream: str) -> int:
        return 0


async def test_each_reason_is_counted_and_a_burst_makes_two_lines() -> None:
    out = io.StringIO()
    reader = StreamReader(
        StreamSpec(id="a", url="ws://127.0.0.1:1/"),
        recorder=_NoSink(),  # type: ignore[arg-type]
        settings=WorkerSettings(),
        placeholders=Placeholders("s1", "a", 1, "w1"),
        log=Log(shard="s1", out=out),
        transport=open_transport(
            "websockets", max_message_size=1024, connect_timeout=1, compression=True
        ),
    )
    for reason in ("closed", "idle", "idle", "ping_timeout"):  # a burst: one line
        reader._reconnecting(f"disconnected: {reason}", reason, 0.1)
    await trio.sleep(RECONNECT_LOG_INTERVAL + 0.05)  # (real time: the log's own clock)
    reader._reconnecting("disconnected: connect_failed", "connect_failed", 0.1)
    counts = reader.counts(written=0)
    assert counts["reconnects"] == 5
    assert {k: v for k, v in counts.items() if k.startswith("reconnect.")} == {
        "reconnect.closed": 1,
        "reconnect.idle": 2,
        "reconnect.ping_timeout": 1,
        "reconnect.connect_failed": 1,
    }
    assert set(RECONNECT_REASONS) >= {k.split(".")[1] for k in counts if "." in k}
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith("disconnected: closed; reconnecting in 0.100s (after=0)")
    assert lines[1].endswith(
        "disconnected: connect_failed; reconnecting in 0.100s (after=0); 3 more reconnect(s)"
        " since the last line"
    )
