"""Registered shards: the stored definition round-trips, and bad command lines are refused."""

from __future__ import annotations

import argparse

import pytest

from shard_worker.contract.pipe import StreamSpec
from supervisor.config.loading import ConfigError
from supervisor.config.model import ShardConfig
from supervisor.config.shard_spec import decode_spec, encode_spec
from supervisor.drivers.registry import streams_from_args


def args(**kwargs) -> argparse.Namespace:
    defaults = {"stream": [], "sequence": "", "subscribe": "", "spec": ""}
    return argparse.Namespace(**{**defaults, **kwargs})


def test_a_definition_round_trips_through_the_item():
    shard = ShardConfig(
        "n1",
        (
            StreamSpec("a", "wss://h/a?after={after}", sequence="meta.seq", subscribe='{"s":1}'),
            StreamSpec("b", "ws://h/b"),
        ),
    )
    spec = encode_spec(shard)
    assert '"sequence":"meta.seq"' in spec and "subscribe" in spec
    assert decode_spec("n1", spec) == shard


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("not json", "spec is not JSON"),
        ('{"streams": 3}', 'spec must be {"streams": [...]}'),
        ('{"streams": [{"id": "a", "url": "http://h"}]}', "must start with ws:// or wss://"),
        ('{"streams": []}', "at least one"),
    ],
)
def test_an_invalid_stored_definition_is_a_config_error(spec, problem):
    with pytest.raises(ConfigError) as caught:
        decode_spec("n1", spec)
    assert problem in "\n".join(caught.value.problems)


def test_streams_from_the_command_line():
    streams = streams_from_args(args(stream=["a=ws://h/a", "b=ws://h/b"], sequence="seq"))
    assert streams == [
        {"id": "a", "url": "ws://h/a", "sequence": "seq"},
        {"id": "b", "url": "ws://h/b", "sequence": "seq"},
    ]
    assert streams_from_args(args(spec='[{"id": "a", "url": "ws://h"}]')) == [
        {"id": "a", "url": "ws://h"}
    ]
    assert streams_from_args(args(spec='{"streams": [{"id": "a", "url": "ws://h"}]}')) == [
        {"id": "a", "url": "ws://h"}
    ]


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({}, "at least one --stream"),
        ({"stream": ["a"]}, "expected ID=URL"),
        ({"stream": ["=ws://h"]}, "expected ID=URL"),
        ({"spec": "[", "stream": []}, "--spec is not JSON"),
        ({"spec": "3"}, "--spec must be a list"),
        ({"spec": "[]", "stream": ["a=ws://h"]}, "either --spec or --stream"),
    ],
)
def test_bad_command_lines_say_what_is_wrong(given, problem):
    with pytest.raises(ValueError, match=problem.replace("-", r"\-").replace("[", r"\[")):
        streams_from_args(args(**given))
