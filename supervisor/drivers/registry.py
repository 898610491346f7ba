"""``shardvisor shards add|remove|list``: the live shard registry in the lease table.

A registered shard carries its definition (``spec``) in its item, so every worker can run it
without a config change; the vacant-shard index makes it visible to every worker at its next
reconcile. ``[[shards]]`` in the TOML files stay the other source; the two never share an id.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

import trio

from supervisor import exit_codes
from supervisor.adapters.lease_store.base import LeaseConflict, LeaseStore
from supervisor.adapters.logs import REDACTED
from supervisor.config.loading import ConfigError
from supervisor.config.model import Config
from supervisor.config.shard_spec import encode_spec, shard_from_streams
from supervisor.core.items import Snapshot


def _error(message: str) -> None:
    print(f"shardvisor: {message}", file=sys.stderr)


def streams_from_args(args: argparse.Namespace) -> list[dict[str, Any]]:
    """--spec JSON, or one --stream ID=URL per stream with the shared --sequence/--subscribe."""
    if args.spec:
        if args.stream:
            raise ValueError("give either --spec or --stream, not both")
        try:
            streams = json.loads(args.spec)
        except ValueError as exc:
            raise ValueError(f"--spec is not JSON: {exc}") from None
        if isinstance(streams, dict):
            streams = streams.get("streams")
        if not isinstance(streams, list):
            raise ValueError('--spec must be a list of streams or {"streams": [...]}')
        return streams
    if not args.stream:
        raise ValueError("a shard needs at least one --stream ID=URL (or --spec)")
    streams = []
    for text in args.stream:
        ident, sep, url = text.partition("=")
        if not sep or not ident or not url:
            raise ValueError(f"--stream {text!r}: expected ID=URL, e.g. trades=wss://host/feed")
        stream = {"id": ident, "url": url}
        if args.sequence:
            stream["sequence"] = args.sequence
        if args.subscribe:
            stream["subscribe"] = args.subscribe
        streams.append(stream)
    return streams


def add(store: LeaseStore, config: Config, args: argparse.Namespace) -> int:
    if any(shard.id == args.shard for shard in config.shards):
        _error(f"shard {args.shard!r} is defined in [[shards]] of the config file; edit it there")
        return exit_codes.EXISTS
    try:
        shard = shard_from_streams(args.shard, streams_from_args(args), "shards add")
    except (ValueError, ConfigError) as exc:
        problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
        for problem in problems:
            _error(f"shards add {args.shard}: {problem.removeprefix('shards[0].')}")
        return exit_codes.USAGE

    async def write() -> None:
        await store.ensure_table(False)
        await store.add_shard(shard.id, encode_spec(shard), time.time())

    try:
        trio.run(write)
    except LeaseConflict:
        _error(
            f"shard {args.shard!r} already exists in table {config.dynamodb.table} (defined in "
            "a config file, registered, or retired but still stopping); see `shards list`"
        )
        return exit_codes.EXISTS
    print(f"shard {shard.id}: registered with {len(shard.streams)} streams")
    return exit_codes.OK


def remove(store: LeaseStore, config: Config, shard_id: str) -> int:
    async def retire() -> str:
        await store.ensure_table(False)
        item = await store.retire_shard(shard_id, time.time())
        if item.owner:
            with contextlib.suppress(LeaseConflict):  # no worker item: nobody to tell
                await store.poke(item.owner)
        return item.owner

    try:
        owner = trio.run(retire)
    except LeaseConflict:
        _error(
            f"no registered shard {shard_id!r} in table {config.dynamodb.table} (a shard "
            "from [[shards]] is removed from the config file, then `systemctl reload`)"
        )
        return exit_codes.NOT_FOUND
    tail = f"its owner {owner} stops it at its next reconcile" if owner else "it had no owner"
    print(f"shard {shard_id}: retired; {tail}")
    return exit_codes.OK


def registry_rows(snapshot: Snapshot) -> list[dict[str, Any]]:
    rows = []
    for item in snapshot.shards:
        streams: list[Any] = []
        if item.spec:
            with contextlib.suppress(ValueError, AttributeError):
                streams = [_masked(s) for s in json.loads(item.spec).get("streams", [])]
        rows.append(
            {
                "id": item.id,
                "source": "table" if item.spec else "config",
                "state": "retired" if item.retired_at else (item.state or "unowned"),
                "owner": item.owner or None,
                "epoch": item.epoch,
                "streams": streams,
            }
        )
    return rows


def _masked(stream: Any) -> Any:
    """A stored stream with its header values hidden: headers carry tokens."""
    if isinstance(stream, dict) and isinstance(stream.get("headers"), dict):
        return {**stream, "headers": dict.fromkeys(stream["headers"], REDACTED)}
    return stream


def listing(store: LeaseStore, config: Config, *, as_json: bool) -> int:
    async def read() -> Snapshot:
        await store.ensure_table(False)
        return await store.snapshot()

    rows = registry_rows(trio.run(read))
    if as_json:
        print(json.dumps({"shards": rows}, indent=2))
        return exit_codes.OK
    print("SHARD                 SOURCE  STATE       OWNER                 EPOCH  STREAMS")
    for row in rows:
        streams = ",".join(s.get("id", "?") for s in row["streams"]) or "-"
        owner = row["owner"] or "-"
        print(
            f"{row['id']:<21} {row['source']:<7} {row['state']:<11} {owner:<21} "
            f"{row['epoch']:>5}  {streams}"
        )
    return exit_codes.OK
