"""CloudWatch EMF documents (core.emf) on plain samples: the specification's rules, the
figures of /metrics (counters per interval, gauges as they are), the stream limit."""

from __future__ import annotations

from helpers.emf_spec import check_emf

from supervisor.core.emf import MAX_STREAM_DOCUMENTS, dimension_sets, emf_documents, metric_names
from supervisor.core.fleet_view import FleetEvent

MSG = "shardvisor_stream_messages_total"


def msg(shard: str, stream: str, outcome: str):
    return (MSG, (("outcome", outcome), ("shard", shard), ("stream", stream)))


BEFORE = {
    ("shardvisor_shards_held", ()): 2.0,
    ("shardvisor_child_restarts_total", (("reason", "crash"),)): 1.0,
    msg("s1", "a", "written"): 100.0,
    msg("s1", "a", "gaps"): 1.0,
}
NOW = {
    ("shardvisor_shards_held", ()): 3.0,
    ("shardvisor_children_up", ()): 3.0,
    ("shardvisor_lease_valid_seconds", ()): 7.25,
    ("shardvisor_standby_children", ()): 1.0,
    ("shardvisor_child_restarts_total", (("reason", "crash"),)): 3.0,
    ("shardvisor_child_restarts_total", (("reason", "hang"),)): 0.0,
    ("shardvisor_epoch_changes_total", (("source", "dead-owner"),)): 2.0,
    ("shardvisor_epoch_changes_total", (("source", "unowned"),)): 5.0,
    ("shardvisor_dynamodb_errors_total", (("kind", "throttled"), ("operation", "heartbeat"))): 4.0,
    ("shardvisor_checkpoint_age_seconds", (("shard", "s1"),)): 0.5,
    ("shardvisor_checkpoint_lag_records", (("shard", "s1"), ("stream", "a"))): 12.0,
    ("shardvisor_standby_buffered_records", (("shard", "s9"),)): 40.0,
    msg("s1", "a", "written"): 160.0,
    msg("s1", "a", "gaps"): 1.0,
    msg("s2", "b", "received"): 30.0,
}
EVENTS = [
    FleetEvent("handoff", "s4", "w1", "w2", 0.125, 1.0),
    FleetEvent("failover", "s5", "w3", "w1", 2.5, 2.0),
]


def documents(current=NOW, previous=BEFORE, events=EVENTS):
    return emf_documents(
        current, previous, events, worker="w1", namespace="shardvisor", timestamp_ms=1234
    )


def by_dimensions(docs):
    return {tuple(d["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]): d for d in docs}


def test_every_document_follows_the_specification():
    docs = documents()
    for doc in docs:
        assert check_emf(doc) == [], doc
        assert doc["_aws"]["Timestamp"] == 1234
        assert doc["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "shardvisor"
        for metric in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]:
            assert metric["Name"] in metric_names()


def test_the_worker_document_has_gauges_as_they_are_and_counters_per_interval():
    worker = next(
        d
        for d in documents()
        if d["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Worker"], []]
    )
    assert worker["Worker"] == "w1"
    assert (worker["ShardsHeld"], worker["ChildrenUp"], worker["StandbyChildren"]) == (3, 3, 1)
    assert worker["LeaseValidSeconds"] == 7.25
    assert worker["ChildRestarts"] == 2  # 3 - 1 in the interval
    assert worker["Failovers"] == 2  # dead-owner takes only, not the 5 unowned ones
    assert worker["DynamoDBErrors"] == 4
    assert (worker["MessagesWritten"], worker["MessagesReceived"], worker["Gaps"]) == (60, 30, 0)
    assert worker["StreamsNotReported"] == 0


def test_labelled_counters_get_a_document_per_label_that_moved():
    docs = documents()
    reasons = [d for d in docs if "Reason" in d]
    assert [(d["Reason"], d["ChildRestarts"]) for d in reasons] == [("crash", 2)]
    (kind,) = [d for d in docs if "Kind" in d]
    assert (kind["Kind"], kind["DynamoDBErrors"]) == ("throttled", 4)


def test_shard_and_stream_documents():
    docs = documents()
    shards = {d["Shard"]: d for d in docs if "Shard" in d and "Stream" not in d}
    assert shards["s1"]["CheckpointAgeSeconds"] == 0.5
    assert shards["s1"]["CheckpointLagRecords"] == 12
    assert shards["s9"]["StandbyBufferedRecords"] == 40
    assert shards["s1"]["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [
        ["Shard"],
        ["Worker", "Shard"],
    ]
    streams = {(d["Shard"], d["Stream"]): d for d in docs if "Stream" in d}
    assert set(streams) == {("s1", "a"), ("s2", "b")}  # streams with messages in the interval
    assert streams["s1", "a"]["MessagesWritten"] == 60
    assert streams["s2", "b"]["MessagesReceived"] == 30


def test_handoffs_and_failovers_are_one_document_each_with_their_duration():
    docs = documents()
    handoff = next(d for d in docs if "HandoffSeconds" in d)
    failover = next(d for d in docs if "FailoverSeconds" in d)
    assert (handoff["HandoffSeconds"], handoff["ShardId"], handoff["To"]) == (0.125, "s4", "w2")
    assert (failover["FailoverSeconds"], failover["From"]) == (2.5, "w3")


def test_streams_past_the_limit_are_counted_not_documented():
    many = {msg("s1", f"st{i:04}", "written"): 1.0 for i in range(MAX_STREAM_DOCUMENTS + 5)}
    docs = documents(current=many, previous={}, events=[])
    assert sum("Stream" in d for d in docs) == MAX_STREAM_DOCUMENTS
    worker = docs[0]
    assert worker["StreamsNotReported"] == 5
    assert worker["MessagesWritten"] == MAX_STREAM_DOCUMENTS + 5  # the totals keep them all


def test_a_counter_that_went_down_counts_from_zero():
    docs = documents(
        current={msg("s1", "a", "written"): 5.0},
        previous={msg("s1", "a", "written"): 9.0},
        events=[],
    )
    assert docs[0]["MessagesWritten"] == 5


def test_declared_dimension_sets_are_the_ones_written():
    declared = dimension_sets()
    assert set(declared) == metric_names()
    for doc in documents():
        directive = doc["_aws"]["CloudWatchMetrics"][0]
        for metric in directive["Metrics"]:
            for dims in directive["Dimensions"]:
                assert tuple(dims) in declared[metric["Name"]], (metric["Name"], dims)
