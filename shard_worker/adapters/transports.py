"""The ``Transport`` that ``[websocket] transport`` names: ``websockets`` (its Sans-I/O protocol,
the default: docs/benchmarks.md, row 4) or ``trio-websocket``."""

from __future__ import annotations

from shard_worker.adapters.websocket import Transport, TrioWebSocket
from shard_worker.contract.pipe import TRANSPORTS, StreamSpec, WorkerSettings
from shard_worker.core.liveness import LivenessSettings

__all__ = ["TRANSPORTS", "open_transport", "stream_transport"]


def open_transport(
    kind: str, *, max_message_size: int, connect_timeout: float, compression: bool
) -> Transport:
    """The transport of ``kind``; ``compression``: offer permessage-deflate (trio-websocket
    negotiates no extension: it never compresses)."""
    if kind == "trio-websocket":
        return TrioWebSocket(max_message_size=max_message_size, connect_timeout=connect_timeout)
    if kind != "websockets":
        raise ValueError(f"unknown WebSocket transport {kind!r} (known: {', '.join(TRANSPORTS)})")
    from shard_worker.adapters.websockets_transport import WebSocketsTransport

    return WebSocketsTransport(
        max_message_size=max_message_size,
        connect_timeout=connect_timeout,
        compression=compression,
    )


def stream_transport(
    spec: StreamSpec, settings: WorkerSettings, max_message_size: int
) -> Transport:
    """The transport of one stream: the worker's kind, the stream's compression."""
    compression = LivenessSettings.of(spec, settings).compression
    return open_transport(
        settings.transport,
        max_message_size=max_message_size,
        connect_timeout=settings.connect_timeout,
        compression=compression == "deflate",
    )
