"""The keys of the file, read from the model: each table's known keys, their checks and (in
``[sink]``) the sink kinds a key applies to.

The supervisor's own sections carry each key's check in its field's metadata (``model.setting``).
``[sink]`` and ``[[shards.streams]]`` are ``SinkSpec`` and ``StreamSpec`` of the pipe contract,
which the child imports without the supervisor: their checks are the two tables below, keyed by
field name. ``table_of`` refuses a field with no check or two, and a check that names no field,
so the tables cannot drift from the classes (``tests/config/test_schema.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from shard_worker.contract.pipe import SinkSpec, StreamSpec
from supervisor.config import checks
from supervisor.config.checks import Check, duration, integer, matching, one_of
from supervisor.config.model import CHECK, Config, ShardConfig

SINK_KINDS = ("jsonl", "stdout", "kinesis", "sqs", "handler")
BATCH_KINDS = ("stdout", "kinesis", "sqs", "handler")
_JSONL = ("jsonl",)
_AWS = ("kinesis", "sqs")


class SchemaError(TypeError):
    """The model and its checks disagree: a programming error, raised at import."""


@attrs.frozen
class Entry:
    """A check of a contract field; ``kinds``: the sink kinds it applies to (() = every kind)."""

    check: Check
    kinds: tuple[str, ...] = ()


# [sink]: SinkSpec's fields but ``dead_letter``, which [dead_letter] sets.
SINK_KEYS: Mapping[str, Entry] = {
    "kind": Entry(one_of(SINK_KINDS)),
    "path": Entry(checks.sink_path, _JSONL),
    "fsync": Entry(checks.boolean),
    "rotate_bytes": Entry(checks.rotate_bytes, _JSONL),
    "stream": Entry(
        matching(
            r"(?:[A-Za-z0-9_.-]{1,128}|arn:.+)?",
            "be a Kinesis stream name (1-128 characters of A-Z a-z 0-9 _ . -) or an ARN",
        ),
        ("kinesis",),
    ),
    "partition_key": Entry(checks.partition_key, ("kinesis",)),
    "queue_url": Entry(
        matching(r"(?:https?://.+)?", 'be "" or an SQS queue URL (https://...)'), ("sqs",)
    ),
    "region": Entry(checks.string, _AWS),
    "endpoint_url": Entry(checks.HTTP_URL, _AWS),
    "handler": Entry(checks.handler_reference, ("handler",)),
    "batch_max_records": Entry(integer(0, 100_000), BATCH_KINDS),
    "batch_max_bytes": Entry(integer(0, 1 << 30), BATCH_KINDS),
    "batch_max_wait": Entry(duration(allow_zero=True), BATCH_KINDS),
    "max_attempts": Entry(integer(1, 1000), BATCH_KINDS),
    "on_failure": Entry(one_of(("dead_letter", "crash")), BATCH_KINDS),
    "max_message_size": Entry(integer(1024, 1 << 30)),
}

# [[shards.streams]]: every field of StreamSpec.
STREAM_KEYS: Mapping[str, Entry] = {
    "id": Entry(checks.IDENTIFIER),
    "url": Entry(checks.stream_url),
    "sequence": Entry(
        matching(
            r"(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)?",
            'be "" or a dotted path of identifiers like "seq" or "meta.seq"',
        )
    ),
    "subscribe": Entry(checks.templated),
    "headers": Entry(checks.headers),
    # This stream's own [websocket] values (absent: the section's); rules.stream_liveness
    # checks them together with the section.
    "ping_interval": Entry(duration(allow_zero=True)),
    "ping_timeout": Entry(duration(allow_zero=True)),
    "idle_timeout": Entry(duration(allow_zero=True)),
    "compression": Entry(one_of(checks.COMPRESSIONS)),
}


@attrs.frozen
class Key:
    name: str
    check: Check
    kinds: tuple[str, ...] = ()


@attrs.frozen
class Table:
    """The keys of one TOML table, in the model's field order."""

    model: type
    keys: Mapping[str, Key]
    nested: tuple[str, ...] = ()  # arrays of tables the loader walks itself

    @property
    def known(self) -> list[str]:
        """Every key the table may hold (for unknown-key problems and did-you-mean)."""
        names = [f.name for f in attrs.fields(self.model)]
        return [name for name in names if name in self.keys or name in self.nested]


def table_of(
    model: type,
    contract: Mapping[str, Entry] | None = None,
    *,
    nested: Sequence[str] = (),
    elsewhere: Sequence[str] = (),
) -> Table:
    """The table of ``model``: each field's check from its metadata or from ``contract`` (for
    classes that cannot carry ours). ``nested``: fields that are arrays of tables; ``elsewhere``:
    fields set from another section. SchemaError unless every other field has exactly one check
    and every check of ``contract`` names a field."""
    contract = contract or {}
    fields = {f.name: f for f in attrs.fields(model)}
    strays = sorted(set(contract) - set(fields))
    if strays:
        raise SchemaError(f"{model.__name__}: checks for no field: {', '.join(strays)}")
    keys: dict[str, Key] = {}
    for name, field in fields.items():
        if name in nested or name in elsewhere:
            continue
        keys[name] = _key(model, field, contract.get(name))
    return Table(model, keys, tuple(nested))


def _key(model: type, field: attrs.Attribute[Any], entry: Entry | None) -> Key:
    own: Check | None = field.metadata.get(CHECK)
    if own is not None and entry is None:
        return Key(field.name, own)
    if own is None and entry is not None:
        return Key(field.name, entry.check, entry.kinds)
    count = "two checks" if own else "no check"
    raise SchemaError(f"{model.__name__}.{field.name} has {count}")


def _sections() -> dict[str, Table]:
    """Each field of Config whose type is an attrs class is a section, in Config's order."""
    attrs.resolve_types(Config)
    contracts: dict[type, Mapping[str, Entry]] = {SinkSpec: SINK_KEYS}
    # SinkSpec.dead_letter is the [dead_letter] path, joined into the spec for the children.
    elsewhere: dict[type, tuple[str, ...]] = {SinkSpec: ("dead_letter",)}
    return {
        f.name: table_of(f.type, contracts.get(f.type), elsewhere=elsewhere.get(f.type, ()))
        for f in attrs.fields(Config)
        if isinstance(f.type, type) and attrs.has(f.type)
    }


SECTIONS: Mapping[str, Table] = _sections()
SHARD = table_of(ShardConfig, nested=("streams",))
STREAM = table_of(StreamSpec, STREAM_KEYS)
TOP_LEVEL = (*SECTIONS, "shards")  # the keys of the document: the sections and [[shards]]

Problem = tuple[str, str]  # (key path, message): one line of a ConfigError

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key_path(path: str, key: str) -> str:
    """How problem lines and templates name ``key`` inside ``path`` (TOML quoting if needed)."""
    shown = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
    return f"{path}.{shown}" if path else shown
