"""What DynamoDB bills for each request, counted per partition key value (for the memory twin).

The in-memory store has no bill of its own; this meter charges each of its requests as
DynamoDB on-demand would, so tests and the simulation can state per-worker units and each
key's share of its partition's limit (docs/lease-protocol.md, *Protocol 2*). The rules:

* GetItem / BatchGetItem: per item, ceil(size / 4 KB) read units; half for an eventually
  consistent read.
* Query / Scan: the *sum* of the sizes read, rounded up to 4 KB, half when eventually
  consistent (every index read is); at least one unit even when nothing matches.
* PutItem / UpdateItem: ceil(max(old, new size) / 1 KB) write units, charged also when the
  condition fails; each index whose projected attributes or key change costs one more write
  (two when the key changes: a delete and a put).

Sizes are approximations (names plus values, as DynamoDB counts them); what matters is which
side of 1 KB and 4 KB an item is on. Pure bookkeeping: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable

import attrs

from supervisor.core.items import ShardItem, WorkerItem

READ_BYTES, WRITE_BYTES = 4096, 1024
PARTITION_RCU, PARTITION_WCU = 3000.0, 1000.0  # per partition key value, per second
PRICE_PER_MILLION_RRU, PRICE_PER_MILLION_WRU = 0.125, 0.625  # on demand, us-east-1
MONTH = 2.592e6  # seconds


def item_size(item: WorkerItem | ShardItem | None) -> int:
    """An item's size as DynamoDB counts it (attribute names plus values), approximately: the
    fixed attributes as a constant, the variable ones by length. 0 for no item."""
    if item is None:
        return 0
    if isinstance(item, WorkerItem):
        return 160 + len(item.id) + len(item.session) + len(item.host) + 16 * len(item.standbys)
    text = len(item.id) + len(item.owner) + len(item.successor) + len(item.spec)
    return 80 + text + 24 * (len(item.checkpoint) + len(item.handoff_first))


@attrs.define
class Meter:
    """Requests, read and write units in total and per partition key value (table keys as
    ``pk``, index keys as ``index:value``). ``window`` returns and clears the per-key load of
    the current window, so a caller can find the hottest key per second of a burst."""

    requests: Counter[str] = attrs.field(factory=Counter)
    read_units: float = 0.0
    write_units: float = 0.0
    key_reads: dict[str, float] = attrs.field(factory=lambda: defaultdict(float))
    key_writes: dict[str, float] = attrs.field(factory=lambda: defaultdict(float))
    _window_reads: dict[str, float] = attrs.field(factory=lambda: defaultdict(float))
    _window_writes: dict[str, float] = attrs.field(factory=lambda: defaultdict(float))

    def _read(self, key: str, units: float) -> None:
        self.read_units += units
        self.key_reads[key] += units
        self._window_reads[key] += units

    def _write(self, key: str, units: float) -> None:
        self.write_units += units
        self.key_writes[key] += units
        self._window_writes[key] += units

    def get(self, op: str, key: str, size: int, *, consistent: bool) -> None:
        self.requests[op] += 1
        self._read(key, read_units([size], consistent, per_item=True))

    def batch_get(self, op: str, sizes: dict[str, int], *, consistent: bool) -> None:
        self.requests[op] += 1
        for key, size in sizes.items():
            self._read(key, read_units([size], consistent, per_item=True))

    def query(self, op: str, key: str, sizes: Iterable[int], *, consistent: bool = False) -> None:
        self.requests[op] += 1
        self._read(key, read_units(list(sizes), consistent, per_item=False))

    def write(self, op: str, key: str, old_size: int, new_size: int) -> None:
        self.requests[op] += 1
        self._write(key, write_units(old_size, new_size))

    def index_write(self, old_key: str | None, new_key: str | None) -> None:
        """An index entry moved from ``old_key`` to ``new_key`` (either may be None)."""
        if old_key is not None and old_key == new_key:
            self._write(old_key, 1)
            return
        for key in (old_key, new_key):
            if key is not None:
                self._write(key, 1)

    def window(self) -> tuple[dict[str, float], dict[str, float]]:
        """(reads, writes) per key since the last call; clears them."""
        reads, writes = dict(self._window_reads), dict(self._window_writes)
        self._window_reads.clear()
        self._window_writes.clear()
        return reads, writes

    def monthly_cost(self, seconds: float) -> float:
        """Dollars per month if the units counted over ``seconds`` went on all month."""
        scale = MONTH / seconds / 1e6
        return scale * (
            self.read_units * PRICE_PER_MILLION_RRU + self.write_units * PRICE_PER_MILLION_WRU
        )


def read_units(sizes: list[int], consistent: bool, *, per_item: bool) -> float:
    """Read units of one request that read items of ``sizes`` bytes: per item (GetItem,
    BatchGetItem) or on their sum (Query, Scan); also the wire benchmark's bill."""
    factor = 1.0 if consistent else 0.5
    if per_item:
        return sum(max(1, math.ceil(size / READ_BYTES)) for size in sizes) * factor
    return max(1, math.ceil(sum(sizes) / READ_BYTES)) * factor


def write_units(old_size: int, new_size: int) -> int:
    """Write units of one write: 1 KB units of the larger of the old and new item."""
    return max(1, math.ceil(max(old_size, new_size) / WRITE_BYTES))
