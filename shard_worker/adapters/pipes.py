"""Messages over a pair of byte streams (the child's two pipes), using the sans-IO codec.

The one adapter for both ends: the child reads the control pipe and writes the report pipe;
the supervisor's child handles (``supervisor.adapters.spawn.ChildProcess``, the zygote's
``ZygoteChild``) and the tests do the opposite. Needs only trio and the contract.
"""

from __future__ import annotations

import trio

from shard_worker.contract.pipe import Decoder, Message, encode

RECEIVE_BYTES = 64 * 1024


class PipeClosed(Exception):
    """The peer closed the pipe we write to: it is gone, nobody reads our reports any more."""


class MessageChannel:
    """Receives messages from one stream and sends to another; sends are serialized."""

    def __init__(self, receive_stream: trio.abc.ReceiveStream, send_stream: trio.abc.SendStream):
        self._receive_stream = receive_stream
        self._send_stream = send_stream
        self._decoder = Decoder()
        self._send_lock = trio.Lock()

    async def receive(self) -> Message | None:
        """The next message, or None at a clean EOF. Raises ProtocolError on garbage."""
        while True:
            for message in self._decoder:
                return message
            if self._decoder.at_eof:
                return None
            self._decoder.feed(await self._receive_stream.receive_some(RECEIVE_BYTES))

    async def send(self, message: Message) -> None:
        """Send one message whole; concurrent senders take turns so lines never interleave."""
        data = encode(message)
        async with self._send_lock:
            try:
                await self._send_stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise PipeClosed(f"cannot send {message.type!r}: pipe closed") from exc

    async def aclose_send(self) -> None:
        """Close only the sending side: the peer reads EOF, we can still receive."""
        await self._send_stream.aclose()

    async def aclose(self) -> None:
        """Close both streams (and so both fds)."""
        try:
            await self._send_stream.aclose()
        finally:
            await self._receive_stream.aclose()
