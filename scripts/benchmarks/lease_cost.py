"""The modelled monthly lease cost of a fleet: protocol 2, protocol 1 and KCL 2.x side by side.

One pure function, ``lease_cost``, is the model of docs/lease-protocol.md (*Modelled monthly
lease cost beside protocol 1 and KCL 2.x*; its table is this function's output at 20, 200 and
1,000 workers). Defaults throughout (lease 10 s, heartbeat and reconcile 2 s, hand-off poll
250 ms, full scan 60 s), on-demand prices of ``supervisor.adapters.lease_store.billing``,
checkpoints excluded (both systems write them; their count is the application's choice).

* Protocol 2, per worker and second (each term is flat in the fleet's size): a heartbeat
  (1 WRU per ``h``); watch reads of K = 2 peers, about 1.25 eventually consistent GetItems
  per peer per ``h``; the meta item each round (0.5 RRU); the hand-off poll (0.5 RRU per 250 ms);
  the member list re-read (64 buckets x 0.5 RRU) once per membership change, one a minute
  fleet-wide assumed; the own-items backstop (its shards, consistent, every 10 min); and the
  vacant buckets and the sweeper's share, 0.03 RRU.
* Protocol 1, per worker and second: the heartbeat; each round a consistent BatchGetItem of
  the meta item and its own item (2 RRU; a watched peer's only when its lease falls due), the
  watch reads of K = 2 peers as in protocol 2, the worker ids from the
  ``roster`` index (0.5 RRU per 4 KB of about 64 B entries) and the vacant shards (0.5 RRU);
  every worker item (W RRU) again after each membership change, one a minute fleet-wide
  assumed; the hand-off poll, one index query every 250 ms (vacant shards and hand-off
  notices); the full Scan every 60 s of S shard items of about 300 B, eventually consistent.
* KCL 2.x (../shared/reference/anchors.md): 0.302 renewal writes per lease per second, and every
  worker scanning the whole lease table (eventually consistent) every 20.05 s.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from benchmarks.anchors import KCL_RENEWALS_PER_LEASE_S, KCL_SCAN_INTERVAL_S
from supervisor.adapters.lease_store.billing import (
    MONTH,
    PRICE_PER_MILLION_RRU,
    PRICE_PER_MILLION_WRU,
    READ_BYTES,
)

HEARTBEAT_S = 2.0
ROUND_S = 2.0
HANDOFF_POLL_S = 0.25
FULL_SCAN_S = 60.0
EVENTUAL, CONSISTENT = 0.5, 1.0  # read units per 4 KB
SHARD_ITEM_BYTES = 300  # a shard item with its checkpoint, about
# protocol 2 (docs/lease-protocol.md, *Cost per worker and for the fleet*)
WATCHED_PEERS = 2
WATCH_READS_PER_HEARTBEAT = 1.25  # per peer: one, and a look early every 4th (peer_watch)
MEMBER_BUCKETS = 64
MEMBERSHIP_CHANGES_S = 1 / 60  # fleet-wide: one a minute
BACKSTOP_S = 600.0
BUCKETS_AND_SWEEPER_RRU = 0.03
ROSTER_ENTRY_BYTES = 64  # a worker's entry in the roster index (pk, roster, id, kind)


@attrs.frozen
class Cost:
    """Units per second for the whole fleet, and their monthly price."""

    wru_s: float
    rru_s: float

    @property
    def usd_month(self) -> float:
        return (
            (self.wru_s * PRICE_PER_MILLION_WRU + self.rru_s * PRICE_PER_MILLION_RRU) * MONTH / 1e6
        )

    def as_json(self) -> dict[str, float]:
        return {"wru_s": self.wru_s, "rru_s": self.rru_s, "usd_month": self.usd_month}


@attrs.frozen
class LeaseCost:
    workers: int
    shards: int
    protocol2: Cost
    protocol1: Cost
    kcl_renewals: Cost
    kcl_scans: Cost

    @property
    def kcl(self) -> Cost:
        return Cost(
            self.kcl_renewals.wru_s + self.kcl_scans.wru_s,
            self.kcl_renewals.rru_s + self.kcl_scans.rru_s,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "shards": self.shards,
            "protocol2": self.protocol2.as_json(),
            "protocol1": self.protocol1.as_json(),
            "kcl_renewals": self.kcl_renewals.as_json(),
            "kcl_scans": self.kcl_scans.as_json(),
            "kcl": self.kcl.as_json(),
        }


def lease_cost(workers: int, shards_per_worker: int = 100) -> LeaseCost:
    """The model for ``workers`` workers holding ``shards_per_worker`` shards each."""
    w = float(workers)
    shards = workers * shards_per_worker
    table_units = shards * SHARD_ITEM_BYTES / READ_BYTES  # 4 KB units of one full read
    heartbeat_wru = 1 / HEARTBEAT_S
    poll_rru = EVENTUAL / HANDOFF_POLL_S  # one query: successor = me (2), vacant (1)
    watch_rru = WATCHED_PEERS * WATCH_READS_PER_HEARTBEAT / HEARTBEAT_S * EVENTUAL
    p2_rru = (
        watch_rru
        + EVENTUAL / ROUND_S  # the meta item
        + poll_rru
        + MEMBER_BUCKETS * EVENTUAL * MEMBERSHIP_CHANGES_S
        + shards_per_worker * CONSISTENT / BACKSTOP_S
        + BUCKETS_AND_SWEEPER_RRU
    )
    ids_rru = EVENTUAL * math.ceil(w * ROSTER_ENTRY_BYTES / READ_BYTES)
    p1_rru = (
        (2 * CONSISTENT + ids_rru + EVENTUAL) / ROUND_S
        + watch_rru
        + w * CONSISTENT * MEMBERSHIP_CHANGES_S  # every item, after each change
        + poll_rru
        + table_units * EVENTUAL / FULL_SCAN_S
    )
    return LeaseCost(
        workers=workers,
        shards=shards,
        protocol2=Cost(w * heartbeat_wru, w * p2_rru),
        protocol1=Cost(w * heartbeat_wru, w * p1_rru),
        kcl_renewals=Cost(KCL_RENEWALS_PER_LEASE_S * shards, 0.0),
        kcl_scans=Cost(0.0, w * table_units * EVENTUAL / KCL_SCAN_INTERVAL_S),
    )
