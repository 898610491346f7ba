"""CloudWatch Embedded Metric Format documents: the figures of /metrics, for log-reading AWS.

Pure: takes two samplings of the Prometheus registry (the previous interval's and now), the
hand-offs and failovers since the last documents, and returns JSON-ready dicts, one per line
to write. Counters become what was added in the interval; gauges are read as they are now. The
format (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/
CloudWatch_Embedded_Metric_Format_Specification.html) is small and stable enough that a pure
function is simpler than aws-embedded-metrics, whose logger is asyncio-bound and flushes on its
own schedule.

Documents, each within the specification's limits (at most 100 metrics, at most 30 dimensions
per set; every metric named in ``Metrics`` is a number at the top level):

- one per worker: dimensions (Worker) and () for fleet totals;
- one per restart reason and one per DynamoDB error kind seen in the interval:
  (Worker, Reason) / (Worker, Kind);
- one per shard held or stood by: (Shard) and (Worker, Shard);
- one per stream with messages in the interval, at most ``MAX_STREAM_DOCUMENTS`` (in shard
  and stream order): (Shard, Stream). Past the limit a stream is counted in the worker's
  totals and in its ``StreamsNotReported``, not in a document of its own;
- one per hand-off or failover: (Worker) and (), ``HandoffSeconds`` or ``FailoverSeconds``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from supervisor.core.fleet_view import FleetEvent

MAX_STREAM_DOCUMENTS = 100  # per interval: CloudWatch bills per metric and dimension set
MAX_METRICS = 100  # per document, the specification's limit
MAX_DIMENSIONS = 30  # per dimension set, the specification's limit

Labels = tuple[tuple[str, str], ...]
Samples = Mapping[tuple[str, Labels], float]  # (sample name, sorted labels) -> value

# (EMF name, Prometheus sample, unit): gauges of the worker, read as they are.
WORKER_GAUGES = (
    ("ShardsHeld", "shardvisor_shards_held", "Count"),
    ("ChildrenUp", "shardvisor_children_up", "Count"),
    ("LeaseValidSeconds", "shardvisor_lease_valid_seconds", "Seconds"),
    ("StandbyChildren", "shardvisor_standby_children", "Count"),
)
# Counters of the worker, summed over their labels (or one label value), per interval.
WORKER_COUNTERS = (
    ("ChildRestarts", "shardvisor_child_restarts_total", None),
    ("LeasesLost", "shardvisor_leases_lost_total", None),
    ("Quarantines", "shardvisor_quarantines_total", None),
    ("HeartbeatFailures", "shardvisor_heartbeat_failures_total", None),
    ("Handoffs", "shardvisor_handoffs_total", None),
    ("HandoffFallbacks", "shardvisor_handoff_fallbacks_total", None),
    ("Failovers", "shardvisor_epoch_changes_total", ("source", "dead-owner")),
    ("StandbyPromotions", "shardvisor_promotions_total", None),
    ("StandbyDroppedRecords", "shardvisor_standby_dropped_records_total", None),
    ("DynamoDBRequests", "shardvisor_dynamodb_requests_total", None),
    ("DynamoDBErrors", "shardvisor_dynamodb_errors_total", None),
)
# Message outcomes per stream (``adapters.metrics.STREAM_OUTCOMES``) and their EMF names.
OUTCOMES = (
    ("received", "MessagesReceived"),
    ("written", "MessagesWritten"),
    ("duplicates", "Duplicates"),
    ("gaps", "Gaps"),
    ("malformed", "Malformed"),
    ("reconnects", "Reconnects"),
    ("dead_lettered", "DeadLettered"),
)
_MESSAGES = "shardvisor_stream_messages_total"


def emf_documents(
    current: Samples,
    previous: Samples,
    events: Iterable[FleetEvent],
    *,
    worker: str,
    namespace: str,
    timestamp_ms: int,
) -> list[dict[str, Any]]:
    """Every document of one interval (see the module's docstring for which)."""
    doc = _Builder(namespace, timestamp_ms)
    streams = _stream_deltas(current, previous)
    reported = sorted(streams)[:MAX_STREAM_DOCUMENTS]
    docs = [_worker_document(doc, current, previous, streams, worker, len(streams) - len(reported))]
    docs += _labelled_counts(doc, current, previous, worker)
    docs += _shard_documents(doc, current, previous, worker)
    for shard, stream in reported:
        values = {name: streams[shard, stream].get(outcome, 0.0) for outcome, name in OUTCOMES}
        units = dict.fromkeys(values, "Count")
        dims = {"Shard": shard, "Stream": stream}
        docs.append(doc.build(dims, [["Shard", "Stream"]], values, units))
    for event in events:
        name = "HandoffSeconds" if event.kind == "handoff" else "FailoverSeconds"
        extra = {"ShardId": event.shard, "From": event.source, "To": event.target}
        dims = {"Worker": worker}
        docs.append(
            doc.build(dims, [["Worker"], []], {name: event.seconds}, {name: "Seconds"}, extra)
        )
    return docs


class _Builder:
    def __init__(self, namespace: str, timestamp_ms: int) -> None:
        self.namespace, self.timestamp_ms = namespace, timestamp_ms

    def build(
        self,
        dimensions: Mapping[str, str],
        sets: list[list[str]],
        values: Mapping[str, float],
        units: Mapping[str, str],
        properties: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One document: metadata naming ``values``, then the values and dimensions top level."""
        assert len(values) <= MAX_METRICS and all(len(s) <= MAX_DIMENSIONS for s in sets)
        directive = {
            "Namespace": self.namespace,
            "Dimensions": sets,
            "Metrics": [{"Name": name, "Unit": units[name]} for name in values],
        }
        meta = {"Timestamp": self.timestamp_ms, "CloudWatchMetrics": [directive]}
        numbers = {name: _number(value) for name, value in values.items()}
        return {"_aws": meta, **(properties or {}), **dimensions, **numbers}


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 6)


def _delta(current: Samples, previous: Samples, key: tuple[str, Labels]) -> float:
    """What a counter gained in the interval (a counter that went down started again)."""
    now, before = current.get(key, 0.0), previous.get(key, 0.0)
    return now - before if now >= before else now


def _counter_sum(current: Samples, previous: Samples, name: str, match=None) -> float:
    return sum(
        _delta(current, previous, key)
        for key in current
        if key[0] == name and (match is None or match in key[1])
    )


def _stream_deltas(current: Samples, previous: Samples) -> dict[tuple[str, str], dict[str, float]]:
    """(shard, stream) -> outcome -> messages in the interval, for streams with any."""
    deltas: dict[tuple[str, str], dict[str, float]] = {}
    for key in current:
        if key[0] != _MESSAGES:
            continue
        labels = dict(key[1])
        gained = _delta(current, previous, key)
        if gained > 0:
            counts = deltas.setdefault((labels["shard"], labels["stream"]), {})
            counts[labels["outcome"]] = counts.get(labels["outcome"], 0.0) + gained
    return deltas


def _worker_document(
    doc: _Builder,
    current: Samples,
    previous: Samples,
    streams: Mapping[tuple[str, str], Mapping[str, float]],
    worker: str,
    not_reported: int,
) -> dict[str, Any]:
    values = {name: current.get((sample, ()), 0.0) for name, sample, _ in WORKER_GAUGES}
    units = {name: unit for name, _, unit in WORKER_GAUGES}
    for name, sample, match in WORKER_COUNTERS:
        values[name] = _counter_sum(current, previous, sample, match)
        units[name] = "Count"
    for outcome, name in OUTCOMES:
        values[name] = sum(counts.get(outcome, 0.0) for counts in streams.values())
        units[name] = "Count"
    values["StreamsNotReported"], units["StreamsNotReported"] = not_reported, "Count"
    return doc.build({"Worker": worker}, [["Worker"], []], values, units)


def _labelled_counts(
    doc: _Builder, current: Samples, previous: Samples, worker: str
) -> list[dict[str, Any]]:
    """Restarts by reason and DynamoDB errors by kind, for the labels that moved."""
    docs = []
    for sample, label, dimension, name in (
        ("shardvisor_child_restarts_total", "reason", "Reason", "ChildRestarts"),
        ("shardvisor_dynamodb_errors_total", "kind", "Kind", "DynamoDBErrors"),
    ):
        gained: dict[str, float] = {}
        for key in current:
            if key[0] == sample and (value := _delta(current, previous, key)) > 0:
                which = dict(key[1])[label]
                gained[which] = gained.get(which, 0.0) + value
        for which, value in sorted(gained.items()):
            dims = {"Worker": worker, dimension: which}
            docs.append(doc.build(dims, [["Worker", dimension]], {name: value}, {name: "Count"}))
    return docs


def _shard_documents(
    doc: _Builder, current: Samples, previous: Samples, worker: str
) -> list[dict[str, Any]]:
    """Checkpoint age and lag of held shards; buffers and drops of standby shards."""
    shards: dict[str, dict[str, float]] = {}
    units: dict[str, str] = {}
    for (name, labels), value in sorted(current.items()):
        label = dict(labels)
        shard = label.get("shard")
        if shard is None or name == _MESSAGES:
            continue
        metric, unit = _SHARD_SAMPLES.get(name, ("", ""))
        if not metric:
            continue
        if name.endswith("_total"):
            value = _delta(current, previous, (name, labels))
        values = shards.setdefault(shard, {})
        values[metric] = values.get(metric, 0.0) + value
        units[metric] = unit
    return [
        doc.build(
            {"Worker": worker, "Shard": shard},
            [["Shard"], ["Worker", "Shard"]],
            values,
            {n: units[n] for n in values},
        )
        for shard, values in sorted(shards.items())
    ]


_SHARD_SAMPLES = {
    "shardvisor_checkpoint_age_seconds": ("CheckpointAgeSeconds", "Seconds"),
    "shardvisor_checkpoint_lag_records": ("CheckpointLagRecords", "Count"),
    "shardvisor_standby_buffered_records": ("StandbyBufferedRecords", "Count"),
    "shardvisor_standby_buffered_bytes": ("StandbyBufferedBytes", "Bytes"),
    "shardvisor_standby_dropped_records_total": ("StandbyDroppedRecords", "Count"),
}


def dimension_sets() -> dict[str, frozenset[tuple[str, ...]]]:
    """Every metric name with the dimension sets it is written under (for dashboards)."""
    worker = {name for name, _, _ in WORKER_GAUGES} | {name for name, _, _ in WORKER_COUNTERS}
    worker |= {name for _, name in OUTCOMES} | {"StreamsNotReported"}
    sets: dict[str, set[tuple[str, ...]]] = {name: {("Worker",), ()} for name in worker}
    sets["ChildRestarts"].add(("Worker", "Reason"))
    sets["DynamoDBErrors"].add(("Worker", "Kind"))
    for metric, _ in _SHARD_SAMPLES.values():
        sets.setdefault(metric, set()).update({("Shard",), ("Worker", "Shard")})
    for _, name in OUTCOMES:
        sets[name].add(("Shard", "Stream"))
    for name in ("HandoffSeconds", "FailoverSeconds"):
        sets[name] = {("Worker",), ()}
    return {name: frozenset(found) for name, found in sets.items()}


def metric_names() -> frozenset[str]:
    """Every metric name a document can carry (the CloudWatch dashboard names only these)."""
    names = {name for name, _, _ in WORKER_GAUGES} | {name for name, _, _ in WORKER_COUNTERS}
    names |= {name for _, name in OUTCOMES} | {m for m, _ in _SHARD_SAMPLES.values()}
    return frozenset(names | {"StreamsNotReported", "HandoffSeconds", "FailoverSeconds"})


__all__ = ["MAX_STREAM_DOCUMENTS", "dimension_sets", "emf_documents", "metric_names"]
