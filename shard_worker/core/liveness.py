"""Is a stream's connection alive, is its feed still sending: the keepalive and the staleness
of one stream, as decisions. Pure: every method takes ``now`` (the reader passes trio's clock).

A pong proves only that the peer's WebSocket layer is alive (RFC 6455 §5.5.2), not that the
subscription still sends: hence two timers.

- **Keepalive** (``ping_interval``, ``ping_timeout``): when nothing at all was received for
  ``ping_interval``, send a ping; when nothing (a pong, or any frame) comes within
  ``ping_timeout`` after it, the connection is dead: reconnect, reason ``ping_timeout``.
- **Idle** (``idle_timeout``): no *message* for that long on a connection: reconnect, reason
  ``idle`` (a feed whose upstream dropped the subscription, the socket still answering pings).

``Staleness`` outlives connections: a stream is stale while it has been silent for longer than
its timeout, until a message comes again, whatever the reconnects in between.
"""

from __future__ import annotations

import enum
import math

import attrs

from shard_worker.contract.pipe import StreamSpec, WorkerSettings


class Due(enum.Enum):
    """What the reader must do now."""

    PING = "ping"
    PING_TIMEOUT = "ping_timeout"  # (the value is the reconnect reason)
    IDLE = "idle"


@attrs.frozen
class LivenessSettings:
    """One stream's timers, in seconds; 0 = off."""

    ping_interval: float = 20.0
    ping_timeout: float = 20.0
    idle_timeout: float = 0.0
    compression: str = "deflate"

    @classmethod
    def of(cls, spec: StreamSpec, settings: WorkerSettings) -> LivenessSettings:
        """The stream's own values, else the worker's ([websocket])."""

        def pick(own: float | None, default: float) -> float:
            return default if own is None else own

        return cls(
            ping_interval=pick(spec.ping_interval, settings.ping_interval),
            ping_timeout=pick(spec.ping_timeout, settings.ping_timeout),
            idle_timeout=pick(spec.idle_timeout, settings.idle_timeout),
            compression=spec.compression or settings.compression,
        )

    @property
    def stale_after(self) -> float:
        """How long a stream may go without delivering before ``status`` calls it stale: its
        idle timeout; without one, a connection down (or dead) for longer than a ping's
        round (interval + timeout); 0 = never (no timer is on)."""
        if self.idle_timeout:
            return self.idle_timeout
        if self.ping_interval:
            return self.ping_interval + self.ping_timeout
        return 0.0


class Keepalive:
    """The timers of one connection, opened at ``now``."""

    def __init__(self, settings: LivenessSettings, now: float) -> None:
        self.settings = settings
        self.last_frame = now  # anything received
        self.last_message = now
        self.ping_sent: float | None = None  # outstanding ping

    def received(self, frame_at: float, messages: bool) -> None:
        """Something arrived at ``frame_at``; ``messages``: data messages among it."""
        if frame_at > self.last_frame:
            self.last_frame = frame_at
        if self.ping_sent is not None and self.last_frame > self.ping_sent:
            self.ping_sent = None  # answered (a pong, or anything else)
        if messages:
            self.last_message = max(self.last_message, frame_at)

    def deadline(self) -> float:
        """When ``due`` may next have something to say (inf: never)."""
        s = self.settings
        at = math.inf
        if s.ping_interval:
            if self.ping_sent is None:
                at = self.last_frame + s.ping_interval
            else:
                at = self.ping_sent + s.ping_timeout
        if s.idle_timeout:
            at = min(at, self.last_message + s.idle_timeout)
        return at

    def due(self, now: float) -> Due | None:
        """What to do at ``now``: give up (idle, ping timeout), ping, or nothing yet."""
        s = self.settings
        if s.idle_timeout and now >= self.last_message + s.idle_timeout:
            return Due.IDLE
        if not s.ping_interval:
            return None
        if self.ping_sent is not None:
            return Due.PING_TIMEOUT if now >= self.ping_sent + s.ping_timeout else None
        return Due.PING if now >= self.last_frame + s.ping_interval else None

    def pinged(self, now: float) -> None:
        self.ping_sent = now


class Staleness:
    """A stream's silence across connections: since its last message, and since its
    connection went down (None: up)."""

    def __init__(self, stale_after: float, now: float) -> None:
        self.stale_after = stale_after
        self.last_message = now  # (the stream's start counts as news)
        self.down_since: float | None = now

    def delivered(self, now: float) -> None:
        self.last_message = now

    def connected(self) -> None:
        self.down_since = None

    def disconnected(self, now: float) -> None:
        if self.down_since is None:
            self.down_since = now

    def stale(self, now: float, idle_timeout: float) -> bool:
        """Silent past the idle timeout; or, with no idle timeout, down past ``stale_after``
        (a quiet feed on a live connection is not stale then)."""
        if not self.stale_after:
            return False
        if idle_timeout:
            return now - self.last_message > self.stale_after
        return self.down_since is not None and now - self.down_since > self.stale_after
