"""Read and write units of DynamoDB requests seen on the wire, billed as DynamoDB on demand does.

The counting proxy (``benchmarks.wire_counter``) hands every request and response body to
``WireBill.bill``. When the response carries ``ConsumedCapacity`` (only when the request asked,
``ReturnConsumedCapacity``) that figure is used. The supervisor never asks, and neither local
server volunteers one (dynalite answers realistic figures when asked, moto fixed ones such as
0.5 for any GetItem), so the bill is computed from the bodies with the rules of
``supervisor.adapters.lease_store.billing`` (one implementation of them):

* GetItem: ``ceil(size / 4 KB)`` units of the item returned (or of its last full size seen when
  a projection cut it), one unit for a missing item; half when eventually consistent.
* BatchGetItem: the same per key asked, less the keys returned unprocessed.
* Query, Scan: the *sum* of the item sizes read, in 4 KB units, at least one; half when
  eventually consistent (every index read is). With a filter DynamoDB bills what it read before
  filtering: the sum is scaled by ``ScannedCount / Count`` (one unit when nothing passed).
* PutItem, DeleteItem, UpdateItem: 1 KB units of the larger of the old and new item, also when
  the condition fails. The old size is the last full size of that item seen on the wire (a read,
  a put, a response's ``ALL_NEW`` / ``ALL_OLD`` attributes). UpdateItem's new size is not on the
  wire unless the response returns the whole item, and the proxy asks the server nothing extra:
  an update is billed at the item's size as the response shows it or, failing that, as last
  seen; an item never seen yet is billed one unit, and when a later read shows it bigger than
  1 KB the difference is added then (``late_units``).
* BatchWriteItem: each put and delete as above, less the unprocessed ones.
* Control-plane requests (DescribeTable...) cost no units (``free``); anything else is counted
  in ``unbilled`` (the supervisor sends nothing else).

Index writes: a write that puts an item into a secondary index, takes it out, or changes an
attribute the index projects while the item is in it costs one more write unit per index
(entries are small). The indexes are learnt from the DescribeTable answers passing by (every
supervisor describes its table at start); which attributes a write changes from the put's
item or the UpdateExpression; whether the item was in an index from the attribute names last
seen on the wire. Approximations: a key that changes value costs DynamoDB two writes (a delete
and a put), one here, as values are not remembered; an item never seen is taken to be outside
every index unless the update removes an index key; a failed condition writes no index.
Pure bookkeeping: no clock, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import attrs

from supervisor.adapters.lease_store.billing import read_units, write_units

READ_OPS = ("GetItem", "BatchGetItem", "Query", "Scan")
WRITE_OPS = ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem")
# Control-plane requests: no read or write units (DynamoDB does not bill them).
FREE_OPS = ("DescribeTable", "CreateTable", "UpdateTable", "DeleteTable", "ListTables")
FULL_ITEM = ("ALL_NEW", "ALL_OLD")  # ReturnValues that answer the whole item

Item = Mapping[str, Any]  # an item in DynamoDB's JSON: {"name": {"S": "value"}, ...}
_CLAUSE = re.compile(r"(?<![#:\w.])\b(SET|REMOVE|ADD|DELETE)\b", re.IGNORECASE)


# --- indexes and update expressions -------------------------------------------------------------


@attrs.frozen
class Index:
    """A secondary index: its key attributes and what it projects (None: ALL)."""

    name: str
    keys: frozenset[str]
    projected: frozenset[str] | None

    @classmethod
    def from_description(cls, index: Mapping[str, Any], table_keys: frozenset[str]) -> Index:
        keys = frozenset(k["AttributeName"] for k in index.get("KeySchema", []))
        projection = index.get("Projection") or {}
        kind = projection.get("ProjectionType", "ALL")
        if kind == "ALL":
            return cls(str(index.get("IndexName", "")), keys, None)
        extra = (
            frozenset(projection.get("NonKeyAttributes", [])) if kind == "INCLUDE" else frozenset()
        )
        return cls(str(index.get("IndexName", "")), keys, keys | table_keys | extra)

    def writes(
        self, before: frozenset[str] | None, after: frozenset[str], changed: frozenset[str]
    ) -> int:
        """Index writes of one item write: ``before`` / ``after`` its attribute names (None:
        not known), ``changed`` the attributes the write sets or removes."""
        was = self.keys <= before if before is not None else bool(self.keys & (changed - after))
        now = self.keys <= after
        if was != now:
            return 1
        touched = changed if self.projected is None else changed & self.projected
        return 1 if now and touched else 0


def update_targets(
    expression: str, names: Mapping[str, str]
) -> tuple[frozenset[str], frozenset[str]]:
    """The top-level attributes an UpdateExpression writes, and those it removes."""
    written: set[str] = set()
    removed: set[str] = set()
    parts = _CLAUSE.split(expression)
    for clause, body in zip(parts[1::2], parts[2::2], strict=False):
        for action in _top_level(body):
            kind = clause.upper()
            target = action.split("=")[0] if kind == "SET" else (action.split() or [""])[0]
            path = target.strip()
            head = re.split(r"[.\[]", path)[0]  # a nested path changes its top attribute
            name = names.get(head, head)
            if name:
                (removed if kind == "REMOVE" and path == head else written).add(name)
    return frozenset(written), frozenset(removed)


def _top_level(body: str) -> list[str]:
    """``body`` split at its commas outside parentheses."""
    pieces, depth, start = [], 0, 0
    for i, char in enumerate(body):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            pieces.append(body[start:i])
            start = i + 1
    pieces.append(body[start:])
    return [p.strip() for p in pieces if p.strip()]


# --- item sizes ---------------------------------------------------------------------------------


def value_size(value: Mapping[str, Any]) -> int:
    """One attribute value's size as DynamoDB counts it (approximately for numbers: one byte
    per two significant digits plus one)."""
    ((kind, inner),) = value.items()
    if kind == "S":
        return len(str(inner).encode())
    if kind == "N":
        return _number_size(str(inner))
    if kind == "B":
        return _binary_size(inner)
    if kind == "SS":
        return sum(len(str(s).encode()) for s in inner)
    if kind == "NS":
        return sum(_number_size(str(n)) for n in inner)
    if kind == "BS":
        return sum(_binary_size(b) for b in inner)
    if kind == "M":
        return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in inner.items())
    if kind == "L":
        return 3 + sum(value_size(v) + 1 for v in inner)
    return 1  # BOOL, NULL


def _number_size(text: str) -> int:
    digits = text.strip("-").split("e")[0].split("E")[0].replace(".", "").strip("0")
    return (len(digits) + 1) // 2 + 1


def _binary_size(data: object) -> int:
    try:
        return len(base64.b64decode(str(data), validate=True))
    except (binascii.Error, ValueError):
        return len(str(data))


def item_size(item: Item) -> int:
    """An item's size: its attribute names plus their values."""
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


# --- the bill -----------------------------------------------------------------------------------


@attrs.define
class WireBill:
    """Read units by operation and write units by ``label`` (the update kind a caller gives,
    or the operation), with what it had to guess. ``sizes`` is the last full size seen of each
    item (by table and key); the key attributes of each table are learnt from the requests'
    ``Key`` fields and the ``KeySchema`` of DescribeTable / CreateTable answers passing by,
    ``default_key`` until then."""

    default_key: tuple[str, ...] = ("pk",)  # a table's key before one is seen: the lease table's
    read_units: Counter[str] = attrs.field(factory=Counter)
    write_units: Counter[str] = attrs.field(factory=Counter)
    from_server: int = 0  # requests billed from the response's ConsumedCapacity
    computed: int = 0  # requests billed from the bodies
    free: Counter[str] = attrs.field(factory=Counter)  # control-plane requests (no units)
    unbilled: Counter[str] = attrs.field(factory=Counter)  # operations with no rule here
    late_units: float = 0.0  # write units added when a later read showed an item > 1 KB
    index_units: float = 0.0  # of the write units: index writes
    sizes: dict[str, int] = attrs.field(factory=dict)
    names: dict[str, frozenset[str]] = attrs.field(factory=dict)  # item -> attribute names
    _keys: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    _indexes: dict[str, tuple[Index, ...]] = attrs.field(factory=dict)
    _guessed: Counter[str] = attrs.field(factory=Counter)  # item -> updates billed one unit

    def as_json(self) -> dict[str, Any]:
        return {
            "read_units": dict(self.read_units),
            "write_units": dict(self.write_units),
            "from_server": self.from_server,
            "computed": self.computed,
            "free": dict(self.free),
            "unbilled": dict(self.unbilled),
            "late_units": self.late_units,
            "index_units": self.index_units,
        }

    def bill(
        self, op: str, label: str, request: Mapping[str, Any], response: Mapping[str, Any]
    ) -> None:
        """Charge one request. ``response`` is the answer's JSON (an error's too: a failed
        condition is billed like the write it would have been)."""
        self._learn_keys(request, response)
        if op in FREE_OPS:
            self.free[op] += 1
            return
        if op not in READ_OPS and op not in WRITE_OPS:
            self.unbilled[op] += 1
            return
        reported = _reported(response.get("ConsumedCapacity"))
        computed = self._compute(op, request, response)
        if reported is not None:
            self.from_server += 1
            units = reported
        else:
            self.computed += 1
            units = computed
        if op in READ_OPS:
            self.read_units[op] += units
        else:
            self.write_units[label] += units

    # --- reads ----------------------------------------------------------------------------

    def _compute(self, op: str, request: Mapping[str, Any], response: Mapping[str, Any]) -> float:
        if op == "GetItem":
            return self._get(request, response)
        if op == "BatchGetItem":
            return self._batch_get(request, response)
        if op in ("Query", "Scan"):
            return self._query(request, response)
        if op == "BatchWriteItem":
            return self._batch_write(request, response)
        return self._write(op, request, response)

    def _get(self, request: Mapping[str, Any], response: Mapping[str, Any]) -> float:
        table = str(request.get("TableName", ""))
        item = response.get("Item")
        key = self._item_key(table, request.get("Key") or {})
        size = item_size(item) if item else 0
        if item and not _projected(request):
            self._seen(key, item)
        size = max(size, self.sizes.get(key, 0)) if item else 0
        return read_units([size], bool(request.get("ConsistentRead")), per_item=True)

    def _batch_get(self, request: Mapping[str, Any], response: Mapping[str, Any]) -> float:
        units = 0.0
        returned = response.get("Responses") or {}
        unprocessed = response.get("UnprocessedKeys") or {}
        for table, asked in (request.get("RequestItems") or {}).items():
            items = returned.get(table) or []
            left = len((unprocessed.get(table) or {}).get("Keys") or [])
            missing = max(0, len(asked.get("Keys") or []) - left - len(items))
            sizes = []
            for item in items:
                key = self._key_of(table, item)
                size = item_size(item)
                if not _projected(asked):
                    self._seen(key, item)
                sizes.append(max(size, self.sizes.get(key, 0)))
            sizes += [0] * missing
            if sizes:
                units += read_units(sizes, bool(asked.get("ConsistentRead")), per_item=True)
        return units

    def _query(self, request: Mapping[str, Any], response: Mapping[str, Any]) -> float:
        table = str(request.get("TableName", ""))
        items = response.get("Items") or []
        full = not _projected(request) and not request.get("IndexName")
        sizes = []
        for item in items:
            size = item_size(item)
            if full:
                self._seen(self._key_of(table, item), item)
            sizes.append(size)
        total = float(sum(sizes))
        count, scanned = int(response.get("Count", len(items))), response.get("ScannedCount")
        if scanned is not None and count and int(scanned) > count:
            total *= int(scanned) / count  # filtered out, but read (and billed) all the same
        consistent = bool(request.get("ConsistentRead")) and not request.get("IndexName")
        return read_units([math.ceil(total)], consistent, per_item=False)

    # --- writes ---------------------------------------------------------------------------

    def _write(self, op: str, request: Mapping[str, Any], response: Mapping[str, Any]) -> float:
        table = str(request.get("TableName", ""))
        new_item: Item = request.get("Item") or {}
        if op == "PutItem":
            key = self._key_of(table, new_item)
            new = item_size(new_item)
        else:
            key = self._item_key(table, request.get("Key") or {})
            new = 0
        old, before = self.sizes.get(key), self.names.get(key)
        shown = response.get("Attributes")
        full = bool(shown) and request.get("ReturnValues") in FULL_ITEM
        if shown and full:
            old = max(old or 0, item_size(shown))
        if old is None and op == "UpdateItem" and not full:
            self._guessed[key] += 1  # billed one unit until a read shows the item
        units = float(write_units(old or 0, new))
        if _failed(response):
            return units
        if op == "PutItem":
            after = frozenset(new_item)
            changed = after | (before or frozenset())
            self.sizes[key], self.names[key] = new, after
        elif op == "DeleteItem":
            after, changed = frozenset(), before or frozenset()
            self.sizes.pop(key, None)
            self.names.pop(key, None)
        else:
            names = request.get("ExpressionAttributeNames") or {}
            written, removed = update_targets(str(request.get("UpdateExpression", "")), names)
            changed = written | removed
            if shown and request.get("ReturnValues") == "ALL_NEW":
                after = frozenset(shown)
                self._seen(key, shown)
            else:
                after = ((before or frozenset()) | written) - removed
                if key and before is not None:
                    self.names[key] = after
        return units + self._index_writes(table, before, after, changed)

    def _index_writes(
        self,
        table: str,
        before: frozenset[str] | None,
        after: frozenset[str],
        changed: frozenset[str],
    ) -> float:
        units = float(
            sum(index.writes(before, after, changed) for index in self._indexes.get(table, ()))
        )
        self.index_units += units
        return units

    def _batch_write(self, request: Mapping[str, Any], response: Mapping[str, Any]) -> float:
        units = 0.0
        unprocessed = response.get("UnprocessedItems") or {}
        for table, writes in (request.get("RequestItems") or {}).items():
            left = len(unprocessed.get(table) or [])
            for entry in writes[: max(0, len(writes) - left)]:
                if "PutRequest" in entry:
                    item = entry["PutRequest"].get("Item") or {}
                    key = self._key_of(table, item)
                    before, after = self.names.get(key), frozenset(item)
                    units += write_units(self.sizes.get(key, 0), item_size(item))
                    units += self._index_writes(table, before, after, after | (before or after))
                    self.sizes[key], self.names[key] = item_size(item), after
                else:
                    key = self._item_key(table, entry.get("DeleteRequest", {}).get("Key") or {})
                    before = self.names.pop(key, None) or frozenset()
                    units += write_units(self.sizes.pop(key, 0), 0)
                    units += self._index_writes(table, before, frozenset(), before)
        return units

    # --- item identity --------------------------------------------------------------------

    def _learn_keys(self, request: Mapping[str, Any], response: Mapping[str, Any]) -> None:
        table = request.get("TableName")
        described = response.get("Table") or response.get("TableDescription") or {}
        if table and described.get("KeySchema"):
            names = tuple(sorted(k["AttributeName"] for k in described["KeySchema"]))
            self._keys[str(table)] = names
            indexes = [
                *described.get("GlobalSecondaryIndexes", []),
                *described.get("LocalSecondaryIndexes", []),
            ]
            self._indexes[str(table)] = tuple(
                Index.from_description(index, frozenset(names)) for index in indexes
            )
        if table and request.get("Key"):
            self._keys.setdefault(str(table), tuple(sorted(request["Key"])))
        for name, asked in (request.get("RequestItems") or {}).items():
            keys = asked.get("Keys") if isinstance(asked, Mapping) else None
            if keys:
                self._keys.setdefault(name, tuple(sorted(keys[0])))

    def _item_key(self, table: str, key: Item) -> str:
        return table + "\0" + json.dumps(key, sort_keys=True)

    def _key_of(self, table: str, item: Item) -> str:
        names = self._keys.get(table, self.default_key)
        if any(name not in item for name in names):
            return ""  # not yet known: the item's size is not remembered
        return self._item_key(table, {name: item[name] for name in names})

    def _seen(self, key: str, item: Item) -> None:
        """A full item seen on the wire: its size and attribute names."""
        if not key:
            return
        size = item_size(item)
        self.sizes[key], self.names[key] = size, frozenset(item)
        if guessed := self._guessed.pop(key, 0):
            late = (write_units(size, 0) - 1) * guessed
            self.late_units += late
            self.write_units["late"] += late


def _projected(request: Mapping[str, Any]) -> bool:
    return bool(request.get("ProjectionExpression") or request.get("AttributesToGet")) or (
        request.get("Select") not in (None, "ALL_ATTRIBUTES")
    )


def _failed(response: Mapping[str, Any]) -> bool:
    return "__type" in response


def _reported(consumed: object) -> float | None:
    """Units a response reports (one entry, or a list of them for a batch); None if none."""
    if consumed is None:
        return None
    entries = consumed if isinstance(consumed, list) else [consumed]
    total = 0.0
    for entry in entries:
        if not isinstance(entry, Mapping):
            return None
        total += float(entry.get("CapacityUnits", 0.0))
    return total
