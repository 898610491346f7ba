"""The supervisor's HTTP endpoint: /healthz, /readyz, /metrics, and the fleet page (/, /fleet).

HTTP/1.1 with h11 (sans-IO, already installed with trio-websocket) on trio's TCP listeners:
a handful of probe and scrape requests a minute needs no web framework. Bounded everywhere: a
few connections at once, a deadline per connection, small requests only.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping

import attrs
import h11
import trio

log = logging.getLogger("shardvisor.http")

MAX_CONNECTIONS = 16  # probes and scrapes: more at once means something is wrong
CONNECTION_TIMEOUT = 10.0  # seconds for one connection, all its requests included
MAX_REQUEST_BYTES = 16 * 1024
_READ_CHUNK = 4096


class ListenError(Exception):
    """The configured address cannot be bound (in use, not local, bad host)."""


@attrs.frozen
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"


Route = Callable[[], Response]


def parse_listen(listen: str) -> tuple[str, int]:
    """ "host:port" or "[v6]:port" -> (host, port). The config loader checked the shape."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


async def serve_http(
    listen: str,
    routes: Mapping[str, Route],
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; ``task_status.started(port)`` with the port actually bound."""
    host, port = parse_listen(listen)
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ListenError(
            f"http.listen = {listen!r}: cannot listen: {exc.strerror or exc}"
        ) from exc
    bound = listeners[0].socket.getsockname()[1]
    log.info("HTTP endpoint on %s:%d (%s)", host, bound, " ".join(sorted(routes)))
    task_status.started(bound)
    limiter = trio.CapacityLimiter(MAX_CONNECTIONS)
    await trio.serve_listeners(functools.partial(_connection, routes, limiter), listeners)


async def _connection(
    routes: Mapping[str, Route], limiter: trio.CapacityLimiter, stream: trio.SocketStream
) -> None:
    try:
        limiter.acquire_nowait()
    except trio.WouldBlock:
        await stream.aclose()  # over the limit: refuse rather than queue
        return
    try:
        with trio.move_on_after(CONNECTION_TIMEOUT):
            await _serve(routes, stream)
    finally:
        limiter.release()
        await stream.aclose()


async def _serve(routes: Mapping[str, Route], stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    while True:
        try:
            event = await _next_event(conn, stream)
        except h11.RemoteProtocolError as exc:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _send(conn, stream, Response(400, b'{"error":"bad request"}\n'), "GET")
            log.debug("bad HTTP request: %s", exc)
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if isinstance(event, h11.ConnectionClosed):
            return
        if not isinstance(event, h11.Request):
            continue
        while not isinstance(await _next_event(conn, stream), h11.EndOfMessage):
            pass  # a body (unexpected here) is read and ignored, within the size limit
        method = event.method.decode("ascii", "replace")
        response = _route(routes, method, event.target.decode("ascii", "replace"))
        await _send(conn, stream, response, method)
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            return
        conn.start_next_cycle()


def _route(routes: Mapping[str, Route], method: str, target: str) -> Response:
    path = target.split("?", 1)[0]
    route = routes.get(path)
    if route is None:
        return Response(404, b'{"error":"not found"}\n')
    if method not in ("GET", "HEAD"):
        return Response(405, b'{"error":"method not allowed"}\n')
    return route()


async def _next_event(conn: h11.Connection, stream: trio.SocketStream):
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.receive_some(_READ_CHUNK))


async def _send(
    conn: h11.Connection, stream: trio.SocketStream, response: Response, method: str
) -> None:
    headers = [
        ("content-type", response.content_type),
        ("content-length", str(len(response.body))),
        ("cache-control", "no-store"),
    ]
    data = conn.send(h11.Response(status_code=response.status, headers=headers))
    if method != "HEAD":
        data += conn.send(h11.Data(data=response.body))
    data += conn.send(h11.EndOfMessage())
    with trio.move_on_after(CONNECTION_TIMEOUT):
        await stream.send_all(data)
