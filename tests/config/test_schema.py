"""The schema is spelled once: every key of the file is a field of the model with exactly one
check, and the loader, the renderer and the did-you-mean list read the keys from there."""

from __future__ import annotations

import tomllib

import attrs
import pytest

from shard_worker.contract.pipe import SinkSpec, StreamSpec
from supervisor.config import checks
from supervisor.config.loading import ConfigError, parse_config
from supervisor.config.model import Config, ShardConfig, setting
from supervisor.config.rendering import render_config
from supervisor.config.schema import (
    SECTIONS,
    SHARD,
    SINK_KEYS,
    SINK_KINDS,
    STREAM,
    STREAM_KEYS,
    TOP_LEVEL,
    Entry,
    SchemaError,
    table_of,
)


def names(model: type) -> list[str]:
    return [f.name for f in attrs.fields(model)]


def test_every_section_of_config_is_a_table_of_the_file() -> None:
    sections = [f.name for f in attrs.fields(Config) if attrs.has(f.type)]
    assert list(SECTIONS) == sections
    assert (*sections, "shards") == TOP_LEVEL
    for name, table in SECTIONS.items():
        assert table.model is type(getattr(Config(), name))


def test_every_field_is_a_key_with_exactly_one_check() -> None:
    for table in SECTIONS.values():
        if table.model is not SinkSpec:
            assert list(table.keys) == table.known == names(table.model)
    # [sink]: every field but the dead-letter path, which [dead_letter] sets for the children.
    assert list(SECTIONS["sink"].keys) == [n for n in names(SinkSpec) if n != "dead_letter"]
    assert list(SINK_KEYS) == list(SECTIONS["sink"].keys)
    assert list(STREAM_KEYS) == list(STREAM.keys) == STREAM.known == names(StreamSpec)
    assert (list(SHARD.keys), SHARD.known) == (["id", "standbys"], names(ShardConfig))
    for table in (*SECTIONS.values(), SHARD, STREAM):
        for key in table.keys.values():
            assert callable(key.check), (table.model, key.name)


def test_a_sink_key_applies_to_known_kinds() -> None:
    for key in SECTIONS["sink"].keys.values():
        assert set(key.kinds) <= set(SINK_KINDS), key.name


def test_the_contract_tables_stay_beside_their_classes() -> None:
    for model, contract in ((SinkSpec, SINK_KEYS), (StreamSpec, STREAM_KEYS)):
        for field in attrs.fields(model):
            assert "shardvisor.check" not in field.metadata, (model, field.name)
        assert set(contract) <= set(names(model))


@attrs.frozen
class _Own:
    ok: int = setting(1, checks.integer(0, 9))
    unchecked: int = 2


@attrs.frozen
class _Contract:
    a: int = 1


def test_a_field_without_its_check_is_refused() -> None:
    with pytest.raises(SchemaError, match=r"_Own\.unchecked has no check"):
        table_of(_Own)
    with pytest.raises(SchemaError, match=r"_Contract\.a has no check"):
        table_of(_Contract, {})


def test_a_field_with_two_checks_is_refused() -> None:
    with pytest.raises(SchemaError, match=r"_Own\.ok has two checks"):
        table_of(_Own, {"ok": Entry(checks.string), "unchecked": Entry(checks.string)})


def test_a_check_that_names_no_field_is_refused() -> None:
    with pytest.raises(SchemaError, match="checks for no field: b"):
        table_of(_Contract, {"a": Entry(checks.string), "b": Entry(checks.string)})


def test_a_new_key_is_one_line_in_the_model() -> None:
    """What the loader does with a section is read from the table alone."""
    table = table_of(_Own, elsewhere=("unchecked",))
    assert table.known == ["ok"]
    assert table.keys["ok"].check(3) == 3


def test_each_default_passes_its_own_check() -> None:
    """The defaults, rendered and read back, are the defaults: no default fails its check."""
    assert parse_config(tomllib.loads(render_config(Config()))) == Config()


def test_did_you_mean_comes_from_the_model() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"lease": {"full_scan_intervall": "1m"}, "sink": {"qeue_url": "x"}})
    assert caught.value.problems == [
        "lease.full_scan_intervall: unknown key (did you mean 'full_scan_interval'?)",
        "sink.qeue_url: unknown key (did you mean 'queue_url'?)",
    ]
