"""The end-to-end tests' fleet: ``supervisor.devtools.fleet`` with short leases and debug logs."""

from __future__ import annotations

import copy

import attrs

from supervisor.devtools import fleet
from supervisor.devtools.feed import FeedServer

SHARDS = {"s1": ["s1-a", "s1-b"], "s2": ["s2-a"], "s3": ["s3-a"], "s4": ["s4-a"]}
STREAMS = [s for streams in SHARDS.values() for s in streams]

# Short leases keep the tests fast; the same code runs with production values.
DURATION, HEARTBEAT, RECONCILE = 2.0, 0.5, 0.5
SETTINGS: dict[str, dict[str, object]] = {
    "lease": {
        "duration": f"{DURATION}s",
        "heartbeat_interval": f"{HEARTBEAT}s",
        "reconcile_interval": f"{RECONCILE}s",
    },
    "supervisor": {
        "shutdown_timeout": "5s",
        "checkpoint_interval": "200ms",
        "restart_backoff_initial": "50ms",
    },
    "log": {"level": "debug"},
    "http": {"listen": "127.0.0.1:0"},  # several supervisors share this host
}


@attrs.define
class Fleet(fleet.Fleet):
    """``Fleet(workdir, ddb_url, table, feed_url, shards, feed=...)``; tests tweak a section
    with ``fleet.overrides[section] = {...}`` before starting a supervisor."""

    settings: dict[str, dict[str, object]] = attrs.field(factory=lambda: copy.deepcopy(SETTINGS))
    feed: FeedServer | None = None  # the feed the streams come from (tests ask how far it is)
