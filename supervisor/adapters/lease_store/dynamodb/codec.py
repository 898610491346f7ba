"""The item codec: WorkerItem / ShardItem / VacantShard <-> DynamoDB AttributeValues. Pure.

Key format and attribute names come from the table's contract (``shard_worker.contract.table``),
which a child's last will writes with too.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping

from shard_worker.contract import table as t
from shard_worker.contract.table import AttributeValue, Item, checkpoint_value, number, string
from supervisor.adapters.lease_store.base import LeaseStoreError
from supervisor.core import partition_keys as keys
from supervisor.core.items import (
    DeathMarker,
    HandoffRequest,
    ShardItem,
    VacantShard,
    WorkerItem,
)
from supervisor.core.membership import Member, member_of


def _with_strings(item: Item, **strings: str) -> Item:
    """Add the non-empty strings only: dynalite rejects empty ones, and absent reads back as ""."""
    item.update({name: string(value) for name, value in strings.items() if value})
    return item


def worker_item(worker: WorkerItem) -> Item:
    """The whole worker item, as register_worker puts it."""
    item = {
        **t.worker_key(worker.id),
        t.KIND: string(t.KIND_WORKER),
        t.ID: string(worker.id),
        t.COUNTER: number(worker.counter),
        t.HEARTBEAT_AT: number(worker.heartbeat_at),
        t.STARTED_AT: number(worker.started_at),
        t.PID: number(worker.pid),
        t.MAX_SHARDS: number(worker.max_shards),
        t.MAX_STANDBYS: number(worker.max_standbys),
        t.MAILBOX: number(worker.mailbox),
        t.STANDBYS: standbys_value(worker.standbys),
        t.ROSTER: string(t.ROSTER_WORKER),
    }
    if worker.features:  # a string set cannot be empty
        item[t.FEATURES] = {"SS": sorted(worker.features)}
    strings = {t.SESSION: worker.session, t.STATE: worker.state, t.HOST: worker.host}
    return _with_strings(item, **strings)


def standbys_value(shards: tuple[str, ...]) -> AttributeValue:
    """The shards a worker runs ready standbys for: a list (it may be empty; a set may not)."""
    return {"L": [string(shard) for shard in sorted(shards)]}


def new_shard_item(shard_id: str) -> Item:
    """A shard as it first appears: unowned at epoch 0, no checkpoint, listed as vacant."""
    return {
        **t.shard_key(shard_id),
        t.KIND: string(t.KIND_SHARD),
        t.ID: string(shard_id),
        t.EPOCH: number(0),
        t.CHECKPOINT: checkpoint_value({}),
        t.ROSTER: string(t.ROSTER_VACANT),
    }


def worker_fleet(worker_id: str, mgen: int, held: int) -> Item:
    """Protocol 2's attributes of a worker item: its ``fleet`` bucket and ``spot`` (so the
    index lists it), the generation of its last membership change, the shards it holds."""
    return {
        t.FLEET: string(keys.worker_key(worker_id)),
        t.SPOT: string(keys.spot(worker_id)),
        t.MGEN: number(mgen),
        t.HELD: number(held),
    }


def shard_fleet(shard_id: str) -> Item:
    """A new (vacant) shard's protocol-2 attributes: its vacant bucket and ``spot``."""
    return {
        t.FLEET: string(keys.vacant_key(shard_id)),
        t.SPOT: string(keys.spot(shard_id)),
    }


def member_from(item: Item) -> Member:
    """A worker item as the ``fleet`` index projects it."""
    with _decoding(item):
        held, mgen = read_int(item, t.HELD), read_int(item, t.MGEN)
    return member_of(worker_from(item), held=held, mgen=mgen)


def read_str(item: Item, name: str) -> str:
    return str(item[name]["S"]) if name in item else ""


def read_int(item: Item, name: str) -> int:
    return int(item[name]["N"]) if name in item else 0


def read_float(item: Item, name: str) -> float:
    return float(item[name]["N"]) if name in item else 0.0


def read_features(item: Item) -> frozenset[str]:
    """A worker's advertised features (a string set; absent when it has none)."""
    return frozenset(item.get(t.FEATURES, {"SS": []})["SS"])


def read_seqs(item: Item, name: str) -> dict[str, int]:
    """A map of numbers (a checkpoint, a hand-off's first sequences); {} if absent."""
    return {stream: int(pos["N"]) for stream, pos in item.get(name, {"M": {}})["M"].items()}


def reconnects_text(reconnects: Mapping[str, Mapping[str, int]]) -> str:
    """The ``reconnects`` attribute: {stream: {reason: count}} as compact, sorted JSON."""
    return json.dumps(reconnects, separators=(",", ":"), sort_keys=True)


def _reconnects(text: str) -> dict[str, dict[str, int]]:
    """{} when absent; a malformed value is the item's (see _decoding)."""
    if not text:
        return {}
    return {
        str(stream): {str(reason): int(n) for reason, n in reasons.items()}
        for stream, reasons in json.loads(text).items()
    }


@contextlib.contextmanager
def _decoding(item: Item) -> Iterator[None]:
    """A malformed item is the store's fault, not a crash of the caller."""
    try:
        yield
    except (KeyError, ValueError, TypeError) as exc:
        raise LeaseStoreError(f"malformed item {item.get(t.PK)!r}: {exc!r}") from exc


def worker_from(item: Item) -> WorkerItem:
    with _decoding(item):
        return WorkerItem(
            id=read_str(item, t.ID),
            session=read_str(item, t.SESSION),
            counter=read_int(item, t.COUNTER),
            state=read_str(item, t.STATE),
            heartbeat_at=read_float(item, t.HEARTBEAT_AT),
            started_at=read_float(item, t.STARTED_AT),
            host=read_str(item, t.HOST),
            pid=read_int(item, t.PID),
            drain_requested=read_float(item, t.DRAIN_REQUESTED),
            max_shards=read_int(item, t.MAX_SHARDS),
            mailbox=read_int(item, t.MAILBOX),
            standbys=tuple(str(v["S"]) for v in item.get(t.STANDBYS, {"L": []})["L"]),
            max_standbys=read_int(item, t.MAX_STANDBYS),
            features=read_features(item),
        )


def shard_from(item: Item) -> ShardItem:
    with _decoding(item):
        return ShardItem(
            id=read_str(item, t.ID),
            owner=read_str(item, t.OWNER),
            epoch=read_int(item, t.EPOCH),
            checkpoint=read_seqs(item, t.CHECKPOINT),
            owner_since=read_float(item, t.OWNER_SINCE),
            state=read_str(item, t.STATE),
            release_requested=read_float(item, t.RELEASE_REQUESTED),
            successor=read_str(item, t.SUCCESSOR),
            spec=read_str(item, t.SPEC),
            retired_at=read_float(item, t.RETIRED_AT),
            stale=tuple(sorted(item.get(t.STALE, {}).get("SS", ()))),
            reconnects=_reconnects(read_str(item, t.RECONNECTS)),
            handoff_stage=read_str(item, t.HANDOFF_STAGE),
            handoff_first=read_seqs(item, t.HANDOFF_FIRST),
        )


def _roster_entry(item: Item) -> tuple[str, int, str]:
    """A shard's entry in the roster index: its projected id, epoch and successor."""
    with _decoding(item):
        return read_str(item, t.ID), read_int(item, t.EPOCH), read_str(item, t.SUCCESSOR)


def vacant_from(item: Item) -> VacantShard:
    """An entry of the roster index under ``vacant``."""
    return VacantShard(*_roster_entry(item))


def handoff_request_from(item: Item) -> HandoffRequest:
    """An entry of the roster index under ``handoff``."""
    return HandoffRequest(*_roster_entry(item))


def _listed_as_vacant(item_id: str, kind: str, epoch: int) -> Item:
    """A small item that is not a shard but is listed among the vacant shards, so that the
    hand-off poll's one query finds it; its ``id`` is its pk, never a shard's."""
    return {
        t.PK: string(item_id),
        t.KIND: string(kind),
        t.ID: string(item_id),
        t.EPOCH: number(epoch),
        t.ROSTER: string(t.ROSTER_VACANT),
    }


def notice_item(shard_id: str, epoch: int, successor: str) -> Item:
    """A hand-off notice, listed under ``vacant`` (``t.KIND_HANDOFF`` says why)."""
    item = _listed_as_vacant(t.handoff_notice_id(shard_id), t.KIND_HANDOFF, epoch)
    return {**item, t.SUCCESSOR: string(successor)}


def death_marker_item(worker_id: str, generation: int) -> Item:
    """A death marker, listed under ``vacant`` (``t.KIND_DEATH``); ``epoch``: the generation."""
    return _listed_as_vacant(t.death_marker_id(worker_id), t.KIND_DEATH, generation)


def death_from(item: Item) -> DeathMarker:
    marker_id = read_str(item, t.ID)
    return DeathMarker(marker_id.removeprefix(f"{t.KIND_DEATH}#"), read_int(item, t.EPOCH))


def notice_from(item: Item) -> HandoffRequest:
    """An entry of the roster index under ``vacant`` whose kind is ``handoff``."""
    notice_id, epoch, successor = _roster_entry(item)
    return HandoffRequest(t.shard_of_notice(notice_id), epoch, successor)


def kind_of(item: Item) -> str:
    """``shard``, ``worker``, or something else that shares the table (ignored)."""
    return read_str(item, t.KIND)
