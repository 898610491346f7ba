"""/metrics from the children's per-stream counts: reconnects by reason, stale streams."""

from __future__ import annotations

from supervisor.adapters.metrics import Metrics


def test_reconnect_reasons_become_one_counter_and_stale_a_gauge() -> None:
    metrics = Metrics()
    counts = {"a": {"reconnects": 3, "reconnect.idle": 2, "reconnect.closed": 1, "received": 9}}
    metrics.add_stream_counts("s1", counts)
    metrics.add_stream_counts("s1", {"a": {"reconnect.idle": 1, "reconnect.closed": 0}})
    metrics.set_stale("s1", ["a", "b"], ("b",))
    text = metrics.exposition().decode()
    assert 'shardvisor_stream_reconnects_total{reason="idle",shard="s1",stream="a"} 3.0' in text
    assert 'shardvisor_stream_reconnects_total{reason="closed",shard="s1",stream="a"} 1.0' in text
    assert (
        'shardvisor_stream_messages_total{outcome="reconnects",shard="s1",stream="a"} 3.0' in text
    )
    assert 'shardvisor_stream_stale{shard="s1",stream="a"} 0.0' in text
    assert 'shardvisor_stream_stale{shard="s1",stream="b"} 1.0' in text
