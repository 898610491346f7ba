"""The lease cost model (``benchmarks.lease_cost``) with plain numbers: the figures of
docs/lease-protocol.md's table, and protocol 2's cost per worker flat in the fleet's size."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from benchmarks.lease_cost import lease_cost

DOC = Path(__file__).resolve().parents[2] / "docs" / "lease-protocol.md"


def test_twenty_workers_by_hand() -> None:
    cost = lease_cost(20)
    assert cost.shards == 2000
    # protocol 2: per worker 0.5 WRU/s and 0.625 + 0.25 + 2 + 0.5333 + 0.1667 + 0.03 RRU/s
    assert cost.protocol2.wru_s == pytest.approx(10.0)
    assert cost.protocol2.rru_s == pytest.approx(20 * 3.605)
    # protocol 1: per worker, a round's (meta and own item) + ids + vacant shards every 2 s,
    # the watch reads between rounds (2 peers x 1.25 a heartbeat x 0.5), every item once a
    # minute, the poll, 2,000 x 300 B / 4 KB every 60 s, eventually consistent
    per_worker = (2 + 0.5 + 0.5) / 2 + 0.625 + 20 / 60 + 2 + 2000 * 300 / 4096 * 0.5 / 60
    assert cost.protocol1.rru_s == pytest.approx(20 * per_worker)
    # KCL 2.x: 0.302 renewals per lease per s; each worker scans 2,000 x 300 B every 20.05 s
    assert cost.kcl_renewals.wru_s == pytest.approx(604.0)
    assert cost.kcl_scans.rru_s == pytest.approx(20 * 2000 * 300 / 4096 * 0.5 / 20.05)
    # prices: $0.625 per million WRU, $0.125 per million RRU, 2,592,000 s a month
    assert cost.protocol2.usd_month == pytest.approx((10 * 0.625 + 72.1 * 0.125) * 2.592)


def test_protocol_2_per_worker_is_flat_and_protocol_1_grows() -> None:
    small, large = lease_cost(20), lease_cost(1000)
    assert large.protocol2.usd_month / 1000 == pytest.approx(small.protocol2.usd_month / 20)
    assert large.protocol2.usd_month <= 2000  # issue 16's target
    # Protocol 1 per worker still grows with the fleet: its full Scan reads every shard item
    # (the per-round reads no longer do: 4 items whatever the fleet).
    assert large.protocol1.rru_s / 1000 > 10 * small.protocol1.rru_s / 20


def test_the_doc_table_is_the_model() -> None:
    """docs/lease-protocol.md's table of monthly lease cost says what ``lease_cost`` says."""
    text = DOC.read_text()
    start = text.index("| workers / shards | protocol 2 | protocol 1 | KCL 2.x")
    rows = [line for line in text[start:].splitlines()[2:] if line.startswith("|")]
    assert len(rows) == 3
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        workers = int(cells[0].split("/")[0].replace(",", ""))
        cost = lease_cost(workers)
        dollars = [int(re.sub(r"[$,]", "", c)) for c in cells[1:]]
        assert dollars == [
            round(cost.protocol2.usd_month),
            round(cost.protocol1.usd_month),
            round(cost.kcl_renewals.usd_month),
            round(cost.kcl_scans.usd_month),
            round(cost.kcl.usd_month),
        ], row
