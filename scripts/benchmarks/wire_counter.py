"""A counting HTTP reverse proxy on 127.0.0.1 in front of a DynamoDB endpoint (row 6's wire).

Every request is forwarded unchanged to ``--upstream`` and counted by its ``X-Amz-Target``
header (``DynamoDB_20120810.UpdateItem`` -> ``UpdateItem``); UpdateItem bodies are also
classified by their UpdateExpression (heartbeat, checkpoint, take, release, other), the way
``benchmarks.dynamodb_requests`` reports DynamoDB requests per worker-minute. Each exchange is
also billed in read and write units from its request and response bodies
(``benchmarks.wire_billing``: write units by the same kinds). ``GET /__wire_counter__`` answers
the counters as JSON instead of forwarding.

    python -m benchmarks.wire_counter --upstream http://127.0.0.1:8000 --port 8001

serves until SIGTERM/SIGINT; ``benchmarks.dynamodb_requests`` starts one per supervisor as a
server of ``supervisor.devtools.servers``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gzip
import json
import signal
from typing import Any
from urllib.parse import urlsplit

from benchmarks.wire_billing import WireBill

CONTROL_PATH = "/__wire_counter__"
MAX_HEADER = 64 * 1024
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}

# How the supervisor's UpdateItem kinds tell apart by their UpdateExpression (see
# supervisor/adapters/lease_store/dynamodb.py). A release also sets the checkpoint: only an
# expression that is exactly this one is a checkpoint.
HEARTBEAT = "#counter = #counter + :one"
CHECKPOINT = "SET #checkpoint = :cp"
TAKE = "#owner = :me, #epoch = :next"
RELEASE = "REMOVE #owner"


def classify_update(body: bytes) -> str:
    try:
        return classify_expression(json.loads(body))
    except (ValueError, AttributeError):
        return "unparsable"


def classify_expression(request: dict[str, Any]) -> str:
    expression = str(request.get("UpdateExpression", "")).strip()
    if HEARTBEAT in expression:
        return "heartbeat"
    if expression == CHECKPOINT:
        return "checkpoint"
    if TAKE in expression:
        return "take"
    if RELEASE in expression:
        return "release"
    return "other"


class Counts:
    def __init__(self) -> None:
        self.requests = 0
        self.targets: collections.Counter[str] = collections.Counter()
        self.updates: collections.Counter[str] = collections.Counter()
        self.status: collections.Counter[str] = collections.Counter()  # "Op 200", "Op 400"
        self.errors = 0  # upstream unreachable / broken answers
        self.bill = WireBill()
        self.unparsable = 0  # exchanges whose bodies are not JSON (not billed)

    def as_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "targets": dict(self.targets),
            "updates": dict(self.updates),
            "status": dict(self.status),
            "errors": self.errors,
            "units": self.bill.as_json(),
            "unparsable": self.unparsable,
        }

    def charge(self, op: str, body: bytes, answer: bytes) -> None:
        """Bill one exchange: write units under the update's kind (or the operation)."""
        try:
            request, response = json.loads(body or b"{}"), json.loads(answer or b"{}")
        except ValueError:
            self.unparsable += 1
            return
        if not isinstance(request, dict) or not isinstance(response, dict):
            self.unparsable += 1
            return
        label = classify_expression(request) if op == "UpdateItem" else op
        self.bill.bill(op, label, request, response)


async def read_message(reader: asyncio.StreamReader) -> tuple[str, list[tuple[str, str]], bytes]:
    """One HTTP/1.x message: start line, headers, body (Content-Length, chunked, or to EOF
    for a response without either). Raises EOFError on a cleanly closed connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise EOFError from None
        raise
    if len(head) > MAX_HEADER:
        raise ValueError("header too large")
    lines = head.decode("latin-1").split("\r\n")
    start, headers = lines[0], []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    fields = {name.lower(): value for name, value in headers}
    if "content-length" in fields:
        body = await reader.readexactly(int(fields["content-length"]))
    elif "chunked" in fields.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # (no trailers from our servers)
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    elif start.startswith("HTTP/"):
        body = await reader.read()  # a response delimited by the connection's end
    else:
        body = b""
    return start, headers, body


def render(start: str, headers: list[tuple[str, str]], body: bytes, keep_alive: bool) -> bytes:
    kept = [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP]
    kept += [
        ("Content-Length", str(len(body))),
        ("Connection", "keep-alive" if keep_alive else "close"),
    ]
    head = start + "\r\n" + "".join(f"{n}: {v}\r\n" for n, v in kept) + "\r\n"
    return head.encode("latin-1") + body


class Proxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit(f"upstream must be on loopback, got {upstream}")
        self.host = parts.hostname
        self.port = parts.port or 80

    async def forward(self, request: bytes) -> tuple[str, list[tuple[str, str]], bytes]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(request)
            await writer.drain()
            return await read_message(reader)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def handler(self, counts: Counts):
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while await self.one_exchange(counts, reader, writer):
                    pass
            except ConnectionError:
                pass
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

        return handle

    async def one_exchange(
        self, counts: Counts, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Serve one request; True to keep the client connection for the next."""
        try:
            start, headers, body = await read_message(reader)
        except (EOFError, asyncio.IncompleteReadError):
            return False
        fields = {n.lower(): v for n, v in headers}
        keep_alive = fields.get("connection", "").lower() != "close"
        if start.split(" ")[1:2] == [CONTROL_PATH]:
            answer = json.dumps(counts.as_json()).encode()
            json_type = [("Content-Type", "application/json")]
            writer.write(render("HTTP/1.1 200 OK", json_type, answer, keep_alive))
            await writer.drain()
            return keep_alive
        op = fields.get("x-amz-target", "").rpartition(".")[2] or "(none)"
        counts.requests += 1
        counts.targets[op] += 1
        if op == "UpdateItem":
            counts.updates[classify_update(body)] += 1
        upstream = [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP]
        upstream += [("Content-Length", str(len(body))), ("Connection", "close")]
        head = start + "\r\n" + "".join(f"{n}: {v}\r\n" for n, v in upstream) + "\r\n"
        try:
            status, rheaders, rbody = await self.forward(head.encode("latin-1") + body)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            counts.errors += 1
            return False  # the client sees a dropped connection, as with a dead server
        code = [*status.split(" "), "?"][1]
        counts.status[f"{op} {code}"] += 1
        encoding = {n.lower(): v for n, v in rheaders}.get("content-encoding", "")
        answer = rbody
        if "gzip" in encoding:
            with contextlib.suppress(OSError, EOFError):  # left compressed: counted unparsable
                answer = gzip.decompress(rbody)
        counts.charge(op, body, answer)
        writer.write(render(status, rheaders, rbody, keep_alive))
        await writer.drain()
        return keep_alive


async def serve(upstream: str, port: int) -> None:
    server = await asyncio.start_server(Proxy(upstream).handler(Counts()), "127.0.0.1", port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.close()
    await server.wait_closed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.upstream, args.port))


if __name__ == "__main__":
    main()
