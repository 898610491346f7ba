"""Prometheus metrics of one supervisor: events counted where they happen, state read at scrape.

prometheus_client does the exposition format (a well-kept library; the text format has enough
corner cases — escaping, histogram buckets, HELP/TYPE lines — not to hand-roll). Every metric
lives in the Supervisor's own registry, so tests can run several supervisors in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shard_worker.contract.pipe import RECONNECT_PREFIX

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_HANDOFF_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Message outcomes reported by the children, per stream (see Heartbeat.streams).
STREAM_OUTCOMES = (
    "received",
    "written",
    "duplicates",
    "gaps",
    "malformed",
    "reconnects",
    "dead_lettered",
)


class Metrics:
    """The counters and histograms the supervisor's code bumps; gauges come from ``state``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.takes = Counter(
            "shardvisor_epoch_changes",
            "Shards taken by this worker (each take starts a new epoch), by previous owner state",
            ["source"],
            registry=r,
        )
        self.releases = Counter(
            "shardvisor_releases",
            "Shards released by this worker, by reason",
            ["reason"],
            registry=r,
        )
        self.leases_lost = Counter(
            "shardvisor_leases_lost", "Shards this worker lost without releasing them", registry=r
        )
        self.restarts = Counter(
            "shardvisor_child_restarts", "Children restarted, by reason", ["reason"], registry=r
        )
        self.quarantines = Counter(
            "shardvisor_quarantines", "Shards released after a crash loop", registry=r
        )
        self.deaths_declared = Counter(
            "shardvisor_peers_declared_dead",
            "Death notices this worker wrote for a watched peer whose counter stood still",
            registry=r,
        )
        self.handoff = Histogram(
            "shardvisor_handoff_seconds",
            "Stop requested to lease released, per graceful hand-off",
            buckets=_HANDOFF_BUCKETS,
            registry=r,
        )
        self.heartbeat = Histogram(
            "shardvisor_heartbeat_seconds",
            "Latency of the lease heartbeat write",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.heartbeat_failures = Counter(
            "shardvisor_heartbeat_failures", "Lease heartbeats that failed or timed out", registry=r
        )
        self.store_requests = Counter(
            "shardvisor_dynamodb_requests",
            "DynamoDB requests, by operation",
            ["operation"],
            registry=r,
        )
        self.store_errors = Counter(
            "shardvisor_dynamodb_errors",
            "DynamoDB requests that failed, by operation and kind"
            " (throttled, unavailable, conflict, other)",
            ["operation", "kind"],
            registry=r,
        )
        self.store_latency = Histogram(
            "shardvisor_dynamodb_request_seconds",
            "DynamoDB request latency, by operation",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.messages = Counter(
            "shardvisor_stream_messages",
            "Messages per stream, by outcome: received from the feed, written to the sink"
            " (delivered, for batch sinks), duplicates dropped, gaps (sequence numbers the feed"
            " skipped), malformed (including too large), reconnects, dead_lettered (malformed,"
            " too large, or given up on by the sink)",
            ["shard", "stream", "outcome"],
            registry=r,
        )
        self.reconnects = Counter(
            "shardvisor_stream_reconnects",
            "Reconnects per stream, by reason: closed (by the feed, or dropped), connect_failed,"
            " too_large (a message over max_message_size), ping_timeout (no answer to a ping),"
            " idle (no message for idle_timeout)",
            ["shard", "stream", "reason"],
            registry=r,
        )
        self.stale = Gauge(
            "shardvisor_stream_stale",
            "1 while the stream has been silent past its timeout (idle_timeout, else a ping's"
            " round while disconnected), else 0; as its shard's child last reported",
            ["shard", "stream"],
            registry=r,
        )
        # Warm standbys and make-before-break hand-offs (issue 14; docs/runbook.md).
        self.handoffs = Counter(
            "shardvisor_handoffs",
            "Shards this worker handed to a peer, by mode: make_before_break (the peer's"
            " standby was connected before our child stopped) or break_before_make",
            ["mode"],
            registry=r,
        )
        self.handoff_fallbacks = Counter(
            "shardvisor_handoff_fallbacks",
            "Hand-offs to a peer that fell back to break-before-make, by reason",
            ["reason"],
            registry=r,
        )
        self.promotions = Counter(
            "shardvisor_promotions",
            "Standby children promoted to owner children on a take, by kind: handoff (a"
            " graceful move to us) or failover (a dead owner's shard)",
            ["kind"],
            registry=r,
        )
        self.standby_dropped = Counter(
            "shardvisor_standby_dropped_records",
            "Records a standby child dropped from its full buffer (standby.max_buffer_bytes)",
            ["shard"],
            registry=r,
        )
        self.info = Gauge(
            "shardvisor_worker_info", "This supervisor's identity", ["worker"], registry=r
        )

    def observe_store(self, op: str, seconds: float, error: str) -> None:
        """Called by the lease store for every request (error "" on success)."""
        self.store_requests.labels(op).inc()
        self.store_latency.labels(op).observe(seconds)
        if error:
            self.store_errors.labels(op, error).inc()

    def add_stream_counts(self, shard: str, deltas: Mapping[str, Mapping[str, int]]) -> None:
        for stream, counts in deltas.items():
            for outcome, delta in counts.items():
                if delta <= 0:
                    continue
                if outcome in STREAM_OUTCOMES:
                    self.messages.labels(shard, stream, outcome).inc(delta)
                elif outcome.startswith(RECONNECT_PREFIX):
                    reason = outcome[len(RECONNECT_PREFIX) :]
                    self.reconnects.labels(shard, stream, reason).inc(delta)

    def set_stale(self, shard: str, streams: Iterable[str], stale: Collection[str]) -> None:
        """Each reported stream of ``shard``: 1 if stale, else 0."""
        for stream in streams:
            self.stale.labels(shard, stream).set(1 if stream in stale else 0)

    def watch(self, state: Callable[[], Mapping[str, Any]]) -> None:
        """Gauges read at scrape time from ``state()`` (see Supervisor.metrics_state)."""
        self.registry.register(_StateCollector(state))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    def __init__(self, state: Callable[[], Mapping[str, Any]]) -> None:
        self._state = state

    def describe(self) -> list:
        return []  # unchecked collector: its families depend on the shards held

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._state()
        yield GaugeMetricFamily(
            "shardvisor_shards_held", "Shards this worker holds a lease on", value=state["held"]
        )
        yield GaugeMetricFamily(
            "shardvisor_children_up", "Shard children running and ready", value=state["up"]
        )
        yield GaugeMetricFamily(
            "shardvisor_lease_valid_seconds",
            "Seconds until this worker's own lease lapses (negative: lapsed)",
            value=state["lease_valid_s"],
        )
        age = GaugeMetricFamily(
            "shardvisor_checkpoint_age_seconds",
            "Seconds since the shard's checkpoint was last stored",
            labels=["shard"],
        )
        lag = GaugeMetricFamily(
            "shardvisor_checkpoint_lag_records",
            "Records written to the sink beyond the stored checkpoint (replayed after a crash)",
            labels=["shard", "stream"],
        )
        for shard, info in state["shards"].items():
            age.add_metric([shard], info["checkpoint_age_s"])
            for stream, records in info["lag"].items():
                lag.add_metric([shard, stream], records)
        yield age
        yield lag
        yield from _standby_families(state.get("standbys", {}))


def _standby_families(standbys: Mapping[str, Mapping[str, int]]) -> Iterator[GaugeMetricFamily]:
    """The standby runners of this worker: children alive, and their buffers per shard."""
    yield GaugeMetricFamily(
        "shardvisor_standby_children",
        "Standby children running on this worker (connected and buffering, writing nothing)",
        value=sum(info["up"] for info in standbys.values()),
    )
    records = GaugeMetricFamily(
        "shardvisor_standby_buffered_records",
        "Records a standby child holds, per shard",
        labels=["shard"],
    )
    size = GaugeMetricFamily(
        "shardvisor_standby_buffered_bytes",
        "Message bytes a standby child holds, per shard",
        labels=["shard"],
    )
    for shard, info in sorted(standbys.items()):
        records.add_metric([shard], info["buffered"])
        size.add_metric([shard], info["bytes"])
    yield records
    yield size
