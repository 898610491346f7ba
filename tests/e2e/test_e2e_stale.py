"""A stream that goes silent is ``stale`` in ``status`` (which reads only the table), its idle
reconnects counted there, until it flows again: a real supervisor, its child, a real feed on
127.0.0.1, the table over HTTP."""

from __future__ import annotations

import contextlib
import json

import pytest
import trio
from helpers.fleet import Fleet, cli, status_json
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

pytestmark = pytest.mark.slow


async def status_shards(fleet: Fleet) -> list[dict]:
    return (await status_json(fleet))["shards"]


async def test_a_silent_stream_is_stale_in_status_until_it_flows_again(
    tmp_path, ddb_url, table_name, nursery
) -> None:
    flowing = False

    async def accept(request: WebSocketRequest) -> None:
        ws = await request.accept()
        seq = int(request.path.rsplit("after=", 1)[1])
        with contextlib.suppress(ConnectionClosed):
            for _ in range(3 if seq == 0 else 0):  # three messages, then silence...
                seq += 1
                await ws.send_message(json.dumps({"seq": seq}))
            while True:
                await trio.sleep(0.05)
                if flowing:  # ...until the feed flows again
                    seq += 1
                    await ws.send_message(json.dumps({"seq": seq}))

    server = await nursery.start(serve_websocket, accept, "127.0.0.1", 0, None)
    feed_url = f"ws://127.0.0.1:{server.port}/feed"
    fleet = Fleet(tmp_path, ddb_url, table_name, feed_url, {"q1": ["q1-a", "q1-b"]})
    fleet.overrides["websocket"] = {"idle_timeout": "1s"}
    await fleet.store.ensure_table(True)
    try:
        with trio.fail_after(30):
            await fleet.start("w1")
            await fleet.wait_until_owned(by=["w1"], timeout=10)
            streams = ["q1-a", "q1-b"]
            while (shards := await status_shards(fleet))[0]["stale"] != streams:
                await trio.sleep(0.2)
            assert shards[0]["owner"] == "w1"
            # Each silent connection was given up (idle) and counted; the counts reach the
            # table within RECONNECTS_PUBLISH_INTERVAL.
            while not all(shards[0]["reconnects"].get(s, {}).get("idle") for s in streams):
                await trio.sleep(0.2)
                shards = await status_shards(fleet)
            flowing = True
            while (await status_shards(fleet))[0]["stale"]:
                await trio.sleep(0.2)
            code, table = await cli(fleet, "status")
            assert code == 0 and "stale" not in table, table
            await fleet.stop_all()
    finally:
        await fleet.stop_all()
        print(f"===== w1.log =====\n{fleet.log('w1')}")
    log = fleet.log("w1")
    assert "no message for 1s (idle)" in log
