"""Shard definitions stored in the table (`shardvisor shards add`): JSON in, ShardConfig out.

The same validation as ``[[shards]]`` in the TOML file (``loading``), so a registered
shard can never hold a definition a config file would reject.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from supervisor.config.loading import ConfigError, parse_config
from supervisor.config.model import ShardConfig


def encode_spec(shard: ShardConfig) -> str:
    """The ``spec`` attribute: the streams as JSON, only the keys that differ from defaults."""
    streams = [
        {
            key: _toml_form(value)
            for key, value in attrs.asdict(stream).items()
            if value or isinstance(value, float)  # a stream's timer set to 0 (off) is kept
        }
        for stream in shard.streams
    ]
    return json.dumps({"streams": streams}, sort_keys=True, separators=(",", ":"))


def _toml_form(value: Any) -> Any:
    """As a [[shards.streams]] table spells it: pairs (headers) become a table."""
    if isinstance(value, tuple | list) and all(isinstance(v, tuple | list) for v in value):
        return {str(k): v for k, v in value}
    return value


def shard_from_streams(
    shard_id: str, streams: Sequence[Mapping[str, Any]], source: str
) -> ShardConfig:
    """Validate like a ``[[shards]]`` table; ConfigError names each problem.

    ``${NAME}`` is refused here: the definition is stored in the table as given and shown by
    ``shards list``, so a secret must come from a config file's ``[[shards]]`` instead."""
    data = {"shards": [{"id": shard_id, "streams": list(streams)}]}
    config = parse_config(data, source, substitute=False)
    return config.shards[0]


def decode_spec(shard_id: str, spec: str) -> ShardConfig:
    """The ShardConfig of a registered shard; ConfigError if the stored JSON is not valid."""
    source = f"table item shard#{shard_id}"
    try:
        data = json.loads(spec)
    except ValueError as exc:
        raise ConfigError([f"spec is not JSON: {exc}"], source) from None
    streams = data.get("streams") if isinstance(data, dict) else None
    if not isinstance(streams, list):
        raise ConfigError(['spec must be {"streams": [...]}'], source)
    return shard_from_streams(shard_id, streams, source)
