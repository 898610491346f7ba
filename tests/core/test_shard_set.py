"""What a worker may run and what a reload changes: exact values, no I/O."""

from __future__ import annotations

import attrs
from helpers.fake_runner import FakeRunner

from shard_worker.contract.pipe import StreamSpec
from supervisor.config.model import Config, LeaseConfig, LogConfig, ShardConfig
from supervisor.core.items import ShardItem
from supervisor.core.runner_state import RunnerState
from supervisor.core.shard_set import (
    RESTART_ONLY_SECTIONS,
    ReloadDiff,
    SpecReports,
    diff_reload,
    registered_candidates,
    restart_on_reload,
)


def shard(sid: str, url: str = "ws://127.0.0.1:1/x") -> ShardConfig:
    return ShardConfig(sid, (StreamSpec(sid, url),))


RUNNING = Config(shards=(shard("a"), shard("b"), shard("c")))
SHARDS = {s.id: s for s in RUNNING.shards}


def test_added_removed_changed_and_unchanged_shards():
    reloaded = attrs.evolve(RUNNING, shards=(shard("c"), shard("b", "ws://h/new"), shard("d")))
    diff = diff_reload(RUNNING, SHARDS, reloaded)
    assert (diff.added, diff.removed, diff.changed, diff.unchanged) == (("d",), ("a",), ("b",), 1)
    assert diff.ignored == ()
    assert dict(diff.shards) == {"c": shard("c"), "b": shard("b", "ws://h/new"), "d": shard("d")}


def test_other_sections_are_reported_and_apply_at_the_next_restart():
    reloaded = attrs.evolve(RUNNING, lease=LeaseConfig(duration=30.0), log=LogConfig(level="debug"))
    assert diff_reload(RUNNING, SHARDS, reloaded) == ReloadDiff(
        shards=SHARDS, ignored=("lease", "log")
    )
    assert RESTART_ONLY_SECTIONS == (
        "worker",
        "dynamodb",
        "lease",
        "supervisor",
        "standby",
        "sink",
        "log",
    )


def test_sections_compare_with_the_config_the_process_started_with():
    """A second reload still reports a section the first one changed: it never applied."""
    first = attrs.evolve(RUNNING, log=LogConfig(level="debug"))
    assert diff_reload(RUNNING, SHARDS, first).ignored == ("log",)
    assert diff_reload(RUNNING, SHARDS, first).ignored == ("log",)


def test_only_serving_runners_of_changed_shards_restart():
    held = {
        "a": FakeRunner(state=RunnerState.RUNNING),
        "b": FakeRunner(state=RunnerState.STOPPING),  # already handing off
        "c": FakeRunner(state=RunnerState.LOST),
        "d": FakeRunner(state=RunnerState.BACKOFF),
    }
    assert restart_on_reload(["a", "b", "c", "d", "e"], held) == ["a", "d"]


def test_registered_candidates_have_a_spec_are_not_retired_and_not_in_the_file():
    items = [
        ShardItem("a", "", 1, spec='[{"id": "a"}]'),  # the file's id wins
        ShardItem("r1", "", 1, spec='[{"id": "x"}]'),
        ShardItem("r2", "", 1, spec='[{"id": "y"}]', retired_at=5.0),
        ShardItem("t", "", 1),  # a file shard's item (no spec)
    ]
    assert [i.id for i in registered_candidates({"a", "b"}, items)] == ["r1"]


def test_an_invalid_spec_is_reported_once_until_it_changes():
    reports = SpecReports()
    assert reports.first_time("r1", "bad")
    assert not reports.first_time("r1", "bad")
    assert reports.first_time("r2", "bad")
    assert reports.first_time("r1", "worse")
    assert not reports.first_time("r1", "worse")
