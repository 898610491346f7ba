"""The keys of warm standbys and make-before-break hand-offs (issue 14): [standby], a shard's
standbys, [worker] max_standbys, [lease] handoff_timeout, and the buffer rule."""

from __future__ import annotations

import tomllib

import attrs
import pytest

from supervisor.config.loading import ConfigError, parse_config
from supervisor.config.model import Config, ShardConfig, StandbyConfig
from supervisor.config.rendering import render_config
from supervisor.core.shard_set import diff_reload

SHARD = """
[[shards]]
id = "s1"
{extra}
[[shards.streams]]
id = "a"
url = "ws://feed.example/a?after={{after}}"
"""


def parse(text: str) -> Config:
    return parse_config(tomllib.loads(text))


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return info.value.problems


def test_the_defaults_run_no_standby() -> None:
    config = parse(SHARD.format(extra=""))
    assert config.standby == StandbyConfig(count=0, buffer=30.0, max_buffer_bytes=64 << 20)
    assert (config.worker.max_standbys, config.lease.handoff_timeout) == (0, 5.0)
    assert config.shards[0].standbys is None
    assert config.shards[0].standby_count(config.standby.count) == 0


def test_every_key_read() -> None:
    config = parse(
        '[worker]\nmax_standbys = 4\n[lease]\nhandoff_timeout = "1500ms"\n'
        '[standby]\ncount = 2\nbuffer = "1m"\nmax_buffer_bytes = 1048576\n'
        + SHARD.format(extra="standbys = 0")
    )
    assert config.worker.max_standbys == 4
    assert config.lease.handoff_timeout == 1.5
    assert config.standby == StandbyConfig(count=2, buffer=60.0, max_buffer_bytes=1 << 20)
    assert config.shards[0].standbys == 0
    assert config.shards[0].standby_count(config.standby.count) == 0  # its own wins


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[standby]\ncount = -1", "standby.count: must be from 0 to 100 (got -1)"),
        ("[standby]\ncount = 1.5", "standby.count: expected a whole number, got 1.5"),
        ("[standby]\nbuffer = 0", "standby.buffer: must be greater than 0 (got 0)"),
        (
            "[standby]\nmax_buffer_bytes = 10",
            "standby.max_buffer_bytes: must be from 1024 to 1099511627776 (got 10)",
        ),
        ("[worker]\nmax_standbys = -2", "worker.max_standbys: must be from 0 to 100000 (got -2)"),
        ("[lease]\nhandoff_timeout = 0", "lease.handoff_timeout: must be greater than 0 (got 0)"),
        (SHARD.format(extra="standbys = -1"), "shards[0].standbys: must be from 0 to 100 (got -1)"),
    ],
)
def test_bad_values_name_the_key(text: str, problem: str) -> None:
    assert problems(text) == [problem]


BUFFER_TOO_SHORT = (
    "standby.buffer: must be at least lease.duration + 2 x lease.reconcile_interval +"
    " supervisor.checkpoint_interval = {needed} (got {got})"
)


def test_with_standbys_the_buffer_must_cover_a_dead_owners_lease() -> None:
    text = '[lease]\nduration = "30s"\n[standby]\ncount = 1\n'
    assert problems(text) == [BUFFER_TOO_SHORT.format(needed="35s", got="30s")]
    assert parse(text + 'buffer = "35s"').standby.buffer == 35.0  # exactly enough


def test_a_shard_of_its_own_with_standbys_needs_the_buffer_too() -> None:
    text = '[standby]\nbuffer = "10s"\n' + SHARD.format(extra="standbys = 1")
    assert problems(text) == [BUFFER_TOO_SHORT.format(needed="15s", got="10s")]
    assert parse('[standby]\nbuffer = "10s"\n' + SHARD.format(extra="standbys = 0"))


def test_without_standbys_the_buffer_is_not_compared() -> None:
    """An existing config with a long lease keeps loading: no standby, no constraint."""
    assert parse('[lease]\nduration = "5m"\n').standby.buffer == 30.0


def test_the_rule_reports_alongside_other_problems_and_not_a_failed_buffer() -> None:
    text = '[lease]\nduration = "30s"\n[standby]\ncount = 1\nbuffer = "x"\n[log]\nlevel = "loud"'
    found = problems(text)
    assert [p.split(":")[0] for p in found] == ["standby.buffer", "log.level"]
    assert found[0].startswith("standby.buffer: ") and "at least" not in found[0]


def test_render_shows_a_shard_standbys_only_when_set() -> None:
    plain = parse(SHARD.format(extra=""))
    assert "standbys" not in render_config(plain).split("[[shards]]")[1]
    own = parse(SHARD.format(extra="standbys = 2"))
    assert "standbys = 2" in render_config(own)
    for config in (plain, own):
        assert parse(render_config(config)) == config


def test_a_reload_that_changes_only_standbys_restarts_nothing() -> None:
    running = parse(SHARD.format(extra=""))
    shards = {s.id: s for s in running.shards}
    more = attrs.evolve(running, shards=(attrs.evolve(running.shards[0], standbys=2),))
    diff = diff_reload(running, shards, more)
    assert (diff.changed, diff.restandby, diff.unchanged) == ((), ("s1",), 1)
    assert diff.shards["s1"].standbys == 2
    moved = attrs.evolve(running.shards[0], streams=())
    diff = diff_reload(running, shards, attrs.evolve(running, shards=(moved,)))
    assert (diff.changed, diff.restandby) == (("s1",), ())


def test_the_standby_section_applies_at_the_next_restart() -> None:
    running = parse("")
    reloaded = attrs.evolve(running, standby=StandbyConfig(count=1))
    assert diff_reload(running, {}, reloaded).ignored == ("standby",)


def test_a_shard_config_made_in_code_uses_the_default() -> None:
    assert ShardConfig("s", ()).standby_count(3) == 3
