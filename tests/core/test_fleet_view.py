"""The fleet page's document (core.fleet_view): status --json's fields, extended from memory."""

from __future__ import annotations

from supervisor.config.model import Config
from supervisor.core.fleet_view import (
    FleetCache,
    FleetEvent,
    FleetEvents,
    StreamRates,
    fleet_document,
)
from supervisor.core.items import ShardItem, Snapshot, WorkerItem
from supervisor.core.status import fleet_status

WALL = 5000.0
SNAPSHOT = Snapshot(
    workers=(
        WorkerItem("w1", "a", 9, "running", WALL - 1, 0.0, host="h1", standbys=("s2",)),
        WorkerItem("w2", "b", 4, "running", WALL - 60, 0.0, host="h2"),
    ),
    shards=(
        ShardItem("s1", "w1", 3, {"a": 10}),
        ShardItem("s2", "w2", 7, {"b": 5}),
        ShardItem("s3", "", 2, {}, state="quarantined"),
    ),
)
LOCAL = {
    "worker": "w1",
    "state": "running",
    "lease_valid_for_s": 7.5,
    "shards": {"s1": {"state": "running", "epoch": 3, "restarts": 2}},
    "standbys": {},
}


def document(**overrides):
    args = dict(
        local=LOCAL,
        lag={"s1": {"a": 4}},
        checkpoints={"s1": {"a": 12}},
        events=[FleetEvent("failover", "s1", "w3", "w1", 2.5, WALL - 10)],
        rates={("s1", "a"): {"received": 50.0, "written": 49.5}},
        wall=WALL,
    )
    return fleet_document(SNAPSHOT, Config(), **{**args, **overrides})


def test_the_document_is_status_json_extended():
    doc = document()
    status = fleet_status(SNAPSHOT, Config(), WALL)
    assert doc["workers"] == status["workers"]
    for shard, plain in zip(doc["shards"], status["shards"], strict=True):
        assert {k: v for k, v in shard.items() if k in plain and k != "checkpoint"} == {
            k: v for k, v in plain.items() if k != "checkpoint"
        }
    assert doc["worker"] == "w1" and doc["generated_at"] == WALL
    assert doc["local"] == LOCAL


def test_own_shards_carry_the_runners_figures_and_others_carry_nulls():
    s1, s2, s3 = document()["shards"]
    assert s1["checkpoint"] == {"a": 12}  # the runner's, fresher than the last scan's 10
    assert (s1["lag"], s1["restarts"], s1["quarantined"]) == ({"a": 4}, 2, False)
    assert s1["rates"] == {"a": {"received": 50.0, "written": 49.5}}
    assert s2["checkpoint"] == {"b": 5} and s2["lag"] is None and s2["restarts"] is None
    assert s2["rates"] == {}
    assert s3["quarantined"] is True and s3["owner"] is None


def test_a_worker_without_heartbeats_shows_dead():
    states = {w["id"]: w["state"] for w in document()["workers"]}
    assert states == {"w1": "running", "w2": "dead"}


def test_events_are_listed_with_their_durations():
    (event,) = document()["events"]
    assert event == {
        "kind": "failover", "shard": "s1", "source": "w3", "target": "w1",
        "seconds": 2.5, "at": WALL - 10,
    }  # fmt: skip


def test_an_empty_fleet_has_a_document_too():
    doc = fleet_document(
        Snapshot((), ()), Config(), local=LOCAL, lag={}, checkpoints={}, events=[], rates={},
        wall=WALL,
    )  # fmt: skip
    assert doc["workers"] == [] and doc["shards"] == [] and doc["events"] == []


def test_a_handoff_is_recorded_when_its_runner_released_the_lease():
    events = FleetEvents()
    events.leaving("s1", "w2", now=10.0)
    events.leaving("s1", "w2", now=11.0)  # asked again: the first request counts
    events.ended("s1", released=True, me="w1", now=10.75, wall=WALL)
    assert events.recent() == [FleetEvent("handoff", "s1", "w1", "w2", 0.75, WALL)]


def test_no_handoff_for_a_lost_lease_a_restart_in_place_or_a_plain_end():
    events = FleetEvents()
    events.leaving("s1", "w2", now=1.0)
    events.ended("s1", released=False, me="w1", now=2.0, wall=WALL)  # lost
    events.leaving("s2", "w1", now=1.0)
    events.ended("s2", released=True, me="w1", now=2.0, wall=WALL)  # handed to ourselves
    events.ended("s3", released=True, me="w1", now=2.0, wall=WALL)  # never asked to leave
    assert events.recent() == []


def test_a_failover_takes_its_duration_from_the_dead_owners_last_heartbeat():
    events = FleetEvents()
    events.failover("s1", owner="w2", me="w1", last_heartbeat=WALL - 3.5, wall=WALL)
    events.failover("s2", owner="w9", me="w1", last_heartbeat=0.0, wall=WALL)  # never seen
    assert events.recent() == [FleetEvent("failover", "s1", "w2", "w1", 3.5, WALL)]


def test_events_are_bounded_and_readers_take_what_is_new():
    events = FleetEvents(limit=3)
    for i in range(5):
        events.failover(f"s{i}", owner="w2", me="w1", last_heartbeat=WALL - i, wall=WALL)
    assert [e.shard for e in events.recent()] == ["s2", "s3", "s4"]
    assert events.total == 5
    assert [e.shard for e in events.since(3)] == ["s3", "s4"]
    assert [e.shard for e in events.since(0)] == ["s2", "s3", "s4"]  # the older ones are gone
    assert events.since(5) == []


def test_rates_are_deltas_over_the_elapsed_time():
    rates = StreamRates()
    first = rates.update({("s1", "a", "written"): 100.0, ("s1", "a", "malformed"): 1.0}, 10.0)
    assert first == {("s1", "a"): {"written": 0.0}}  # one sample: no rate yet
    second = rates.update({("s1", "a", "written"): 150.0, ("s1", "b", "written"): 7.0}, 12.0)
    assert second == {("s1", "a"): {"written": 25.0}, ("s1", "b"): {"written": 0.0}}


def test_the_cache_serves_one_body_per_max_age():
    cache = FleetCache(max_age=1.0)
    assert cache.fresh(0.0) is None
    cache.store(b"one", 0.0)
    assert cache.fresh(0.99) == b"one"
    assert cache.fresh(1.0) is None
