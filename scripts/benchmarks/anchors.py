"""Peer figures that cannot be measured here (KCL is Java), from ../shared/reference/anchors.md."""

from __future__ import annotations

# KCL renews every lease every failover/3 - 25 ms = 3.308 s at its defaults (KCL 3.5.1).
KCL_RENEWALS_PER_LEASE_S = 0.302
# KCL 2.x, kill -9 with one survivor, default timers, zero network latency (a model).
KCL_FAILOVER = {"p50": 28.9, "max": 40.9}
# KCL 2.x: every worker scans the whole lease table every 2 x (failover + 25 ms) = 20.05 s (its
# taker), and renews each of its leases every 3.308 s (above).
KCL_SCAN_INTERVAL_S = 20.05
