"""Feeds for the tests that run a real child: the reference feed on a free port, with the URL
template a Start carries, and a scripted WebSocket server that sends fixed frames."""

from __future__ import annotations

import ssl

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

from supervisor.devtools.feed import FeedServer


async def start_feed(
    nursery: trio.Nursery, rate: float, *, ssl_context: ssl.SSLContext | None = None
) -> tuple[FeedServer, str]:
    """The reference feed on 127.0.0.1 (``rate`` messages/s per stream; wss:// with
    ``ssl_context``), and a stream URL template with the worker's placeholders."""
    server = FeedServer(rate=rate, ssl_context=ssl_context)
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    scheme = "ws" if ssl_context is None else "wss"
    return server, f"{scheme}://127.0.0.1:{port}/feed/{{shard}}-{{stream}}?after={{after}}"


async def serve_script(
    scripts: dict[str, list[str | bytes]],
    subscribed: dict[str, str],
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A tiny feed that sends a fixed list of frames per path, then holds the connection."""

    async def handler(request: WebSocketRequest) -> None:
        name = request.path.strip("/")
        try:
            ws = await request.accept()
            subscribed[name] = str(await ws.get_message())
            for frame in scripts[name]:
                await ws.send_message(frame)
            await trio.sleep_forever()
        except ConnectionClosed:
            return  # the worker left: stopped, or reconnecting (even before it subscribed)

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        task_status.started(server.port)
