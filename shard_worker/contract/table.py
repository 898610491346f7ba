"""The lease table's contract: item keys, attribute names, and the writes both processes make.

The supervisor's store (``supervisor/adapters/lease_store/dynamodb/``) and a child whose
supervisor died (``shard_worker/adapters/last_will.py``) write the same items, so the key
format, the attribute names and the fenced release are spelled here once. Pure: it builds the
parameters of DynamoDB's low-level client (AttributeValues such as ``{"S": "x"}``) and imports
only attrs and the standard library. See docs/dynamodb-table.md and docs/lease-protocol.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

AttributeValue = dict[str, Any]  # as the low-level client speaks: {"S": "x"}, {"N": "1"}
Item = dict[str, AttributeValue]

# --- keys and attribute names --------------------------------------------------------------

PK = "pk"  # the only key: "shard#<id>", "worker#<id>" or "handoff#<shard id>"
KIND_SHARD, KIND_WORKER = "shard", "worker"  # the pk's prefix and the item's `kind`
# A hand-off notice: a small item listed among the vacant shards while an owner asks a named
# successor for a make-before-break hand-off, so the successor's one hand-off poll query finds
# both what was released to it and what it is asked for. Its `id` is its pk ("handoff#<shard>"),
# never a shard's id: a version that knows no notices takes it for a vacant shard it does not run.
KIND_HANDOFF = "handoff"
# A death marker: a small item listed among the vacant shards for a few seconds after a
# watcher declared a worker dead (its `epoch` holds the membership generation the notice
# raised), so that every worker's hand-off poll sees the death within a poll and runs a round,
# not only at its next one. Its `id` is its pk ("death#<worker>"), never a shard's.
KIND_DEATH = "death"
# A standby-wanted marker (protocol 2; docs/lease-protocol.md, *Standbys*): the holder of a
# shard that is itself among the shard's first k standby candidates names the (k+1)-th, who
# reads the markers listed under its own `successor` value "want#<worker>" (the `successor`
# index). pk "want#<shard>", `id` the shard, `owner` the holder, `epoch` the holder's epoch:
# a holder of an earlier epoch can neither overwrite nor remove a later holder's marker.
KIND_WANT = "want"
# A registration item (protocol 2; docs/lease-protocol.md, *Shards nobody lists*): one per
# shard registered with `shards add`, listed in the `fleet` index under "reg#NN" (the top 8
# bits of the shard's ring point) with the point as `spot`, so that a standby candidate
# reads the registered shards of its arcs of the ring, not all of them. pk "reg#<shard>".
KIND_REG = "reg"

# Both kinds of item.
KIND, ID, STATE, ROSTER = "kind", "id", "state", "roster"
# Shard items.
OWNER, EPOCH, CHECKPOINT, OWNER_SINCE = "owner", "epoch", "checkpoint", "owner_since"
SUCCESSOR, RELEASE_REQUESTED = "successor", "release_requested"
SPEC, REGISTERED_AT, RETIRED_AT = "spec", "registered_at", "retired_at"
STALE = "stale"  # string set: the owner's streams silent past their timeout (absent: none)
RECONNECTS = "reconnects"  # JSON {stream: {reason: count}}: the owner's reconnects since its take
# A make-before-break hand-off in progress (docs/lease-protocol.md): its stage, the
# successor's first buffered sequence per stream, and when the owner asked (for humans).
HANDOFF_STAGE, HANDOFF_FIRST, HANDOFF_AT = "handoff_stage", "handoff_first", "handoff_at"
# Worker items.
SESSION, COUNTER, HEARTBEAT_AT, STARTED_AT = "session", "counter", "heartbeat_at", "started_at"
HOST, PID, MAX_SHARDS = "host", "pid", "max_shards"
DRAIN_REQUESTED, MAILBOX, ORPHANED_AT = "drain_requested", "mailbox", "orphaned_at"
# The shards whose standby child is ready here, what this version can do, its standby cap.
STANDBYS, FEATURES, MAX_STANDBYS = "standbys", "features", "max_standbys"
# Protocol 2 (docs/lease-protocol.md, *Fleets of a thousand workers*): the ``fleet`` index's
# key and sort key (worker and shard items), a worker's generation of its last membership
# change, the shards it holds as of its last heartbeat, and who declared it dead.
FLEET, SPOT, MGEN, HELD, DEAD_BY = "fleet", "spot", "mgen", "held", "dead_by"
# The fleet meta item (``META_PK``): the membership generation and the protocol in force.
GENERATION, PROTOCOL = "generation", "protocol"
# ... and the registered shards: a counter raised by every `shards add` and `remove`, and how
# many are registered (the planner's shard count is the file's shards plus this).
SHARDGEN, REGISTERED_COUNT = "shardgen", "registered_count"
META_PK = "fleet#meta"

SHARD_ATTRIBUTES = frozenset(
    {KIND, ID, STATE, ROSTER, OWNER, EPOCH, CHECKPOINT, OWNER_SINCE, SUCCESSOR}
    | {RELEASE_REQUESTED, SPEC, REGISTERED_AT, RETIRED_AT, STALE, RECONNECTS}
    | {HANDOFF_STAGE, HANDOFF_FIRST, HANDOFF_AT, FLEET, SPOT}
)
WORKER_ATTRIBUTES = frozenset(
    {KIND, ID, STATE, ROSTER, SESSION, COUNTER, HEARTBEAT_AT, STARTED_AT, HOST, PID}
    | {MAX_SHARDS, DRAIN_REQUESTED, MAILBOX, ORPHANED_AT}
    | {STANDBYS, FEATURES, MAX_STANDBYS, FLEET, SPOT, MGEN, HELD, DEAD_BY}
)
META_ATTRIBUTES = frozenset({GENERATION, PROTOCOL, SHARDGEN, REGISTERED_COUNT})
ATTRIBUTES = SHARD_ATTRIBUTES | WORKER_ATTRIBUTES | META_ATTRIBUTES

# `roster` puts an item in the sparse index of that name: every worker, unowned shards, and
# owned shards whose owner asked a named successor for a make-before-break hand-off.
ROSTER_WORKER, ROSTER_VACANT, ROSTER_HANDOFF = "worker", "vacant", "handoff"
# `handoff_stage`: the owner asked (requested), the successor's standby is connected (ready).
HANDOFF_REQUESTED, HANDOFF_READY = "requested", "ready"
# `features`: this version answers make-before-break requests and runs standby children.
FEATURE_MBB = "mbb"
# `features`: this version adopts a shard its owner handed over to it in one write
# (``hand_over``: owner := successor, epoch + 1) instead of taking it after a release.
FEATURE_HANDOVER = "handover"
# `features`: this version lists a hand-off notice with each request and finds requests by it
# (an owner without it is asked by the `roster = handoff` query, one more per poll).
FEATURE_HANDOFF_NOTICE = "notice"
# `features`: this version runs protocol 2 when the meta item says so (and writes its
# attributes meanwhile); `init-table --protocol 2` flips a fleet only if every live worker
# advertises it.
FEATURE_P2 = "p2"
# What every write that ends an owner's tenure also clears (release, take).
HANDOFF_ATTRIBUTES = (HANDOFF_STAGE, HANDOFF_FIRST, HANDOFF_AT)

# The states the contract's writes set or test.
RELEASED, LAST_WILL = "released", "last-will"  # a shard released by its owner / by its child
ORPHANED, STOPPED = "orphaned", "stopped"  # a worker whose child saw it die / that exited
DEAD = "dead"  # protocol 2: a worker whose watcher's death notice landed

# A local DynamoDB server (moto, dynalite) checks that a request is signed, not by whom: both
# processes sign with these when boto3 finds no credentials and an endpoint URL is set.
LOCAL_CREDENTIALS: Mapping[str, str] = MappingProxyType(
    {"aws_access_key_id": "local", "aws_secret_access_key": "local"}
)

# The fence: an owner's write lands only while the item still names it at its epoch.
OWNED_AT_EPOCH = "#owner = :me AND #epoch = :epoch"


# --- AttributeValues -----------------------------------------------------------------------


def string(value: str) -> AttributeValue:
    return {"S": value}


def number(value: float) -> AttributeValue:
    """An exact decimal: ints as they are, floats by repr (shortest round-trip form)."""
    return {"N": str(value) if isinstance(value, int) else repr(float(value))}


def checkpoint_value(checkpoint: Mapping[str, int]) -> AttributeValue:
    """Stream id -> last sequence written, as a map of numbers."""
    return {"M": {stream: {"N": str(int(pos))} for stream, pos in checkpoint.items()}}


def shard_key(shard_id: str) -> Item:
    return {PK: string(f"{KIND_SHARD}#{shard_id}")}


def worker_key(worker_id: str) -> Item:
    return {PK: string(f"{KIND_WORKER}#{worker_id}")}


def handoff_notice_id(shard_id: str) -> str:
    """The notice's pk and `id`."""
    return f"{KIND_HANDOFF}#{shard_id}"


def death_marker_id(worker_id: str) -> str:
    """The death marker's pk and `id`."""
    return f"{KIND_DEATH}#{worker_id}"


def want_marker_key(shard_id: str) -> Item:
    """A standby-wanted marker's key."""
    return {PK: string(f"{KIND_WANT}#{shard_id}")}


def registration_key(shard_id: str) -> Item:
    """A registration item's key."""
    return {PK: string(f"{KIND_REG}#{shard_id}")}


def wanted_by(worker_id: str) -> str:
    """The `successor` value that lists the markers naming ``worker_id``."""
    return f"{KIND_WANT}#{worker_id}"


def shard_of_notice(notice_id: str) -> str:
    return notice_id.removeprefix(f"{KIND_HANDOFF}#")


def meta_key() -> Item:
    return {PK: string(META_PK)}


_NAME = re.compile(r"#([A-Za-z_][A-Za-z0-9_]*)")


def expression_names(*expressions: str) -> dict[str, str]:
    """ExpressionAttributeNames for every ``#name`` in the expressions (``owner``, ``state``...
    are reserved words, so every attribute is named this way). A name that is not an
    attribute of the table is a typo: ValueError, before anything is sent."""
    names: dict[str, str] = {}
    for expression in expressions:
        for name in _NAME.findall(expression):
            if name not in ATTRIBUTES:
                raise ValueError(f"#{name} in {expression!r} is not an attribute of the table")
            names[f"#{name}"] = name
    return names


def equal_or_absent(
    name: str, value: AttributeValue | None, values: dict[str, AttributeValue], key: str = ""
) -> str:
    """A condition that the attribute ``name`` is ``value`` (its placeholder ``:key``, or
    ``:name``, added to ``values``), or absent if ``value`` is None: DynamoDB has no empty
    attribute, so "no owner" is an absent one."""
    if value is None:
        return f"attribute_not_exists(#{name})"
    placeholder = f":{key or name}"
    values[placeholder] = value
    return f"#{name} = {placeholder}"


def fence_values(owner: str, epoch: int) -> dict[str, AttributeValue]:
    """The values of ``OWNED_AT_EPOCH``."""
    return {":me": string(owner), ":epoch": number(epoch)}


# --- writes ---------------------------------------------------------------------------------


@attrs.frozen
class UpdateItem:
    """One conditional UpdateItem; ``params(table)`` gives the low-level client's arguments,
    with the attribute names taken from the expressions."""

    key: Item
    update: str
    condition: str
    values: Mapping[str, AttributeValue]
    returns: str = ""  # ReturnValues ("ALL_NEW", "UPDATED_NEW"); "" = none

    def params(self, table: str) -> dict[str, Any]:
        params: dict[str, Any] = {
            "TableName": table,
            "Key": self.key,
            "UpdateExpression": self.update,
            "ExpressionAttributeNames": expression_names(self.update, self.condition),
        }
        if self.values:  # DynamoDB refuses an empty map (a bare REMOVE needs none)
            params["ExpressionAttributeValues"] = dict(self.values)
        if self.condition:  # "" only for the meta item's counter (ADD needs no condition)
            params["ConditionExpression"] = self.condition
        if self.returns:
            params["ReturnValues"] = self.returns
        return params


def release_shard(
    shard_id: str,
    owner: str,
    epoch: int,
    checkpoint: Mapping[str, int] | None,
    state: str = RELEASED,
    successor: str = "",
    fleet: str | None = None,
) -> UpdateItem:
    """Give the shard up with its final checkpoint, fenced on owner and epoch. The epoch stays
    (the next take bumps it, so it is never reused); ``roster`` puts the shard back among the
    vacant ones; a named ``successor`` takes it first; a hand-off's stage goes. ``state``:
    released, quarantined, or last-will (released by the child of a dead supervisor).

    ``checkpoint`` None keeps the stored one. ``fleet`` is protocol 2's index key, computed by
    the caller (supervisor/core/partition_keys.py): None leaves the attribute alone (protocol
    1's writers), "" removes it (a shard addressed to a successor is listed under it only)."""
    values = {
        ":vacant": string(ROSTER_VACANT),
        ":released": string(state),
        **fence_values(owner, epoch),
    }
    sets = ["#state = :released", "#roster = :vacant"]
    removes = ["#owner", "#release_requested"]
    if checkpoint is not None:
        sets.insert(0, "#checkpoint = :cp")
        values[":cp"] = checkpoint_value(checkpoint)
    if successor:
        sets.append("#successor = :successor")
        values[":successor"] = string(successor)
    else:
        removes.append("#successor")
    removes += [f"#{name}" for name in HANDOFF_ATTRIBUTES]
    if fleet:
        sets.append("#fleet = :fleet")
        values[":fleet"] = string(fleet)
    elif fleet is not None:
        removes.append("#fleet")
    update = f"SET {', '.join(sets)} REMOVE {', '.join(removes)}"
    return UpdateItem(shard_key(shard_id), update, OWNED_AT_EPOCH, values)


def mark_orphaned(worker_id: str, session: str, wall_now: float) -> UpdateItem:
    """The worker item of a supervisor whose children saw it die: ``orphaned``, if it still
    carries that supervisor's session and did not exit cleanly (``stopped``). Peers stop
    counting it as a member at once; its next heartbeat, if any, sets it running again."""
    return UpdateItem(
        worker_key(worker_id),
        "SET #state = :orphaned, #orphaned_at = :now",
        "#session = :session AND #state <> :stopped",
        {
            ":orphaned": string(ORPHANED),
            ":now": number(wall_now),
            ":session": string(session),
            ":stopped": string(STOPPED),
        },
    )
