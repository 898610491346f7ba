"""The live fleet page's data (`GET /fleet`, drawn by `GET /`): pure, from what a round read.

The document is ``status --json`` (``core.status.fleet_status`` on the round's snapshot),
extended with what only this worker knows: its runners (restarts, lag, fresher checkpoints),
its recent hand-offs and failovers with their durations, and message rates per stream. It is
built from data already in memory, at most once per ``FleetCache.max_age`` seconds however
many pages poll it: a page view never reads the table.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from supervisor.config.model import Config
from supervisor.core.items import Snapshot
from supervisor.core.status import fleet_status

EVENT_LIMIT = 50  # recent hand-offs and failovers kept (and shown) per worker
RATE_OUTCOMES = ("received", "written", "gaps", "dead_lettered")  # shown as messages/s

StreamKey = tuple[str, str]  # (shard, stream)


@attrs.frozen
class FleetEvent:
    """A shard that moved: ``handoff`` (this worker released it to a peer: stop requested to
    lease released) or ``failover`` (this worker took it from a dead owner: the owner's last
    heartbeat to our take, wall clock, so only as good as the two hosts' clocks)."""

    kind: str  # "handoff" | "failover"
    shard: str
    source: str  # the previous owner
    target: str  # the new owner ("" for a hand-off to whoever takes it first)
    seconds: float
    at: float  # wall clock, for humans

    def as_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "seconds": round(self.seconds, 3), "at": round(self.at, 3)}


@attrs.define
class FleetEvents:
    """The last ``limit`` events, oldest first; ``total`` counts every one ever added, so a
    reader (the EMF writer) can take what is new since its last look."""

    limit: int = EVENT_LIMIT
    total: int = 0
    _events: collections.deque[FleetEvent] = attrs.field(init=False)
    _leaving: dict[str, tuple[float, str]] = attrs.field(factory=dict)  # shard -> (at, to)

    def __attrs_post_init__(self) -> None:
        self._events = collections.deque(maxlen=self.limit)

    def add(self, event: FleetEvent) -> None:
        self._events.append(event)
        self.total += 1

    def recent(self) -> list[FleetEvent]:
        return list(self._events)

    def since(self, seen: int) -> list[FleetEvent]:
        """The events added after the first ``seen`` (at most ``limit`` of them)."""
        new = min(self.total - seen, len(self._events))
        return list(self._events)[len(self._events) - new :] if new > 0 else []

    def leaving(self, shard: str, successor: str, now: float) -> None:
        """A hand-off began (``now`` monotonic); the first request counts."""
        self._leaving.setdefault(shard, (now, successor))

    def ended(self, shard: str, *, released: bool, me: str, now: float, wall: float) -> None:
        """The shard's runner ended: a hand-off if it was leaving and released its lease."""
        started = self._leaving.pop(shard, None)
        if started is not None and released and started[1] != me:
            at, successor = started
            self.add(FleetEvent("handoff", shard, me, successor, now - at, wall))

    def failover(self, shard: str, *, owner: str, me: str, last_heartbeat: float, wall: float):
        """We took ``shard`` from ``owner``, judged dead; ``last_heartbeat`` is its wall stamp
        (0: unknown, then no duration can be given and none is recorded)."""
        if last_heartbeat > 0:
            seconds = max(0.0, wall - last_heartbeat)
            self.add(FleetEvent("failover", shard, owner, me, seconds, wall))


@attrs.define
class StreamRates:
    """Messages per second per stream and outcome, from monotonic counter totals sampled at
    each build (the first sample gives no rate yet)."""

    _last: dict[tuple[str, str, str], float] = attrs.field(factory=dict)
    _at: float | None = None

    def update(self, totals: Mapping[tuple[str, str, str], float], now: float) -> dict:
        """``totals``: (shard, stream, outcome) -> count; returns {(shard, stream): {outcome:
        rate}} for the outcomes of ``RATE_OUTCOMES``."""
        rates: dict[StreamKey, dict[str, float]] = {}
        elapsed = now - self._at if self._at is not None else 0.0
        for (shard, stream, outcome), total in sorted(totals.items()):
            if outcome not in RATE_OUTCOMES:
                continue
            delta = max(0.0, total - self._last.get((shard, stream, outcome), total))
            per_s = round(delta / elapsed, 2) if elapsed > 0 else 0.0
            rates.setdefault((shard, stream), {})[outcome] = per_s
        self._last, self._at = dict(totals), now
        return rates


def fleet_document(
    snapshot: Snapshot,
    config: Config,
    *,
    local: Mapping[str, Any],
    lag: Mapping[str, Mapping[str, int]],
    checkpoints: Mapping[str, Mapping[str, int]],
    events: Iterable[FleetEvent],
    rates: Mapping[StreamKey, Mapping[str, float]],
    wall: float,
    read_ago: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """``status --json``'s fields, extended: ``worker`` (who answers), ``generated_at``,
    ``local`` (``health.local_status`` plus standbys), per shard ``lag``, ``restarts``,
    ``quarantined`` and ``rates``, and ``events``.

    ``lag`` and ``checkpoints`` are this worker's runners' (fresher than the table's between
    full scans); ``restarts`` and ``lag`` are null for shards another worker runs. ``read_ago``:
    seconds since each worker item was read (``status.fleet_status``)."""
    status = fleet_status(snapshot, config, wall, read_ago)
    mine = local.get("shards", {})
    for shard in status["shards"]:
        sid = shard["id"]
        if sid in checkpoints:
            shard["checkpoint"] = dict(sorted(checkpoints[sid].items()))
        runner = mine.get(sid)
        shard["restarts"] = runner["restarts"] if runner is not None else None
        shard["lag"] = dict(sorted(lag[sid].items())) if sid in lag else None
        shard["quarantined"] = shard["state"] == "quarantined"
        shard["rates"] = {
            stream: dict(per_s) for (s, stream), per_s in sorted(rates.items()) if s == sid
        }
    return {
        "worker": local.get("worker", ""),
        "generated_at": round(wall, 3),
        **status,
        "local": dict(local),
        "events": [e.as_json() for e in events],
    }


@attrs.define
class FleetCache:
    """The last document, rebuilt when a request finds it older than ``max_age`` seconds."""

    max_age: float
    _built_at: float | None = None
    _body: bytes = b""

    def fresh(self, now: float) -> bytes | None:
        """The cached body if it is recent enough, else None (the caller rebuilds)."""
        if self._built_at is not None and now - self._built_at < self.max_age:
            return self._body
        return None

    def store(self, body: bytes, now: float) -> bytes:
        self._body, self._built_at = body, now
        return body


__all__ = [
    "EVENT_LIMIT",
    "FleetCache",
    "FleetEvent",
    "FleetEvents",
    "StreamRates",
    "fleet_document",
]
