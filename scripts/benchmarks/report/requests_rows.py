"""Row 6 of the report: DynamoDB requests per worker-minute on the wire, and their monthly cost."""

from __future__ import annotations

from typing import Any

from benchmarks.anchors import KCL_RENEWALS_PER_LEASE_S
from benchmarks.report.common import Load, Rendered, SummaryRow, heading, not_measured
from benchmarks.tables import LEFT, RIGHT, ratio, table

SERVERS = {"moto": "moto server", "dynalite": "dynalite server"}
READS = ("GetItem", "Query", "BatchGetItem", "Scan")


def requests(load: Load) -> Rendered:
    data = load("requests") or load("fleet")
    out = [heading(6, data)]
    add = out.append
    found = (data or {}).get("requests")
    if not found:
        add(not_measured("no out/bench/requests.json"))
        return "\n".join(out), []
    window = max(r["window_s"] for r in found)
    server = SERVERS.get((data or {}).get("server", "moto"), "?")
    add(
        "One supervisor per configuration, each behind its own counting reverse proxy "
        f"(`benchmarks.wire_counter`) in front of its own {server}: every request counted on "
        f"the wire by its `X-Amz-Target`, over {window:.0f} s of steady state (after every "
        "shard is owned and flowing, and one more reconcile round). Defaults otherwise "
        "(heartbeat 2 s, reconcile 2 s, hand-off poll 250 ms, full scan every 60 s). Lease "
        "traffic = everything but checkpoint writes. KCL renews every lease every 3.3 s: "
        f"{KCL_RENEWALS_PER_LEASE_S} renewal writes per lease per second, i.e. "
        f"{KCL_RENEWALS_PER_LEASE_S * 60:.1f} per lease per minute, before its reads (a "
        "full-table taker scan every 20 s) and checkpoints.\n"
    )
    rows, summary_rows = [], []
    for r in sorted(found, key=lambda x: (x["checkpoint_interval"], x["shards"])):
        p = r["per_minute"]
        reads = " / ".join(f"{p['by_op'].get(op, 0.0):.0f}" for op in READS)
        lease = p["total"] - p["checkpoint"]
        writes = lease - p["reads"]
        kcl = KCL_RENEWALS_PER_LEASE_S * 60 * r["shards"]
        rows.append(
            (
                r["shards"],
                f"{r['checkpoint_interval']:g} s",
                f"{p['total']:.0f}",
                f"{p['reads']:.0f} ({reads})",
                f"{p['heartbeat']:.1f}",
                f"{p['checkpoint']:.0f}",
                f"{lease:.0f}",
                f"{kcl:,.0f}",
                ratio(lease, kcl),
                ratio(writes, kcl),
            )
        )
        if r["checkpoint_interval"] == 1.0:
            n = r["shards"]
            summary_rows.append(
                (
                    f"6. DynamoDB lease requests / worker-minute, {n} shard{'s' * (n != 1)}",
                    f"{lease:.0f} ({writes:.0f} writes)",
                    f"KCL renewal writes {kcl:,.0f}",
                    f"{ratio(lease, kcl)} ({ratio(writes, kcl)} writes)",
                    f"{r['window_s']:.0f} s on the wire",
                )
            )
    header = (
        "shards on the worker",
        "checkpoint interval",
        "all requests",
        "reads (Get / Query / BatchGet / Scan)",
        "heartbeat writes",
        "checkpoint writes",
        "shardvisor lease requests (all but checkpoints)",
        "KCL renewal writes",
        "lease requests ÷ KCL",
        "lease writes ÷ KCL",
    )
    add(table(header, rows, RIGHT * 3 + LEFT + RIGHT * 6))
    add(
        "\nshardvisor's reads are a fixed cost per worker (the hand-off poll, a Query on a "
        "sparse index every 250 ms, and the reconcile round's BatchGet every 2 s), whatever "
        "its shard count; its only lease write is one heartbeat per worker every 2 s. KCL's "
        "renewal writes grow with the leases a worker holds. At one shard per worker "
        "shardvisor makes more requests than KCL's renewals; from a handful of shards on, "
        "fewer. Reads cost a fifth of a write or less (a Query on the sparse index returns a "
        "few hundred bytes: half a read unit). The Queries are the hand-off poll (every 250 ms "
        "plus the query's own time) and two per reconcile round (worker items and vacant "
        "shards); BatchGetItem is one strongly consistent read of the meta item and the "
        "worker's own item per round (every worker item only after a membership change); "
        "GetItem is the eventually consistent reads of the peers it watches (none for a "
        "lone worker); "
        "Scan is the full scan every `full_scan_interval` (60 s). Checkpoint writes scale with "
        "busy shards and, at the default 1 s interval, are most of a busy worker's writes; "
        "KCL checkpoints too, so they are shown apart below.\n"
    )
    cost = (data or {}).get("cost")
    if cost:
        add(_cost(cost))
        summary_rows.append(_cost_row(cost))
    return "\n".join(out), summary_rows


def _cost(cost: dict[str, Any]) -> str:
    sv, kcl = cost["shardvisor"], cost["kcl_renewals"]
    rows = [
        (
            "shardvisor heartbeats (1 write per worker per heartbeat)",
            f"{sv['heartbeat_wru_month'] / 1e6:,.1f} M WRU",
            f"${sv['heartbeat_usd_month']:,.2f}",
        ),
        (
            "shardvisor reconcile, hand-off poll and full-scan reads",
            f"{sv['read_rru_month'] / 1e6:,.1f} M RRU",
            f"${sv['read_usd_month']:,.2f}",
        ),
        ("**shardvisor lease traffic**", "", f"**${sv['usd_month']:,.2f}**"),
        (
            f"**KCL lease renewals alone** ({KCL_RENEWALS_PER_LEASE_S} / lease / s)",
            f"{kcl['wru_month'] / 1e6:,.1f} M WRU",
            f"**${kcl['usd_month']:,.2f}**",
        ),
    ]
    for interval, ck in cost.get("checkpoints", {}).items():
        rows.append(
            (
                f"checkpoints every {interval}, busy shards (both systems checkpoint; the "
                "interval is yours)",
                f"{ck['wru_month'] / 1e6:,.1f} M WRU",
                f"${ck['usd_month']:,.2f}",
            )
        )
        if interval == "1s":  # one write per busy shard per interval: a tenth at 10 s
            rows.append(
                (
                    "checkpoints every 10 s, busy shards (model: a tenth of the 1 s figure)",
                    f"{ck['wru_month'] / 1e7:,.1f} M WRU",
                    f"${ck['usd_month'] / 10:,.2f}",
                )
            )
    return (
        f"\nMonthly on-demand cost of the lease traffic for {cost['shards']:,} shards over "
        f"{cost['workers']} workers ({cost['shards_per_worker']} shards each), from the "
        f"measured rates (30-day month; ${cost['prices']['wru_per_million']} per million "
        f"writes, ${cost['prices']['rru_per_million']} per million reads, us-east-1):\n\n"
        + table(("traffic", "units / month", "USD / month"), rows, LEFT + RIGHT * 2)
        + f"\n\nshardvisor's lease traffic costs {ratio(sv['usd_month'], kcl['usd_month'])} of "
        "KCL's renewals alone: one heartbeat write per *worker* instead of one renewal per "
        "*lease*; liveness of a shard is its owner's heartbeat counter, read by its two "
        "watchers: per worker, reads do not grow with the fleet's size (row 9). Anchors: "
        "KCL 1,000 "
        "leases ≈ $490/month in renewals (../shared/reference/anchors.md).\n"
    )


def _cost_row(cost: dict[str, Any]) -> SummaryRow:
    sv, kcl = cost["shardvisor"], cost["kcl_renewals"]
    return (
        f"6. Monthly lease cost, {cost['shards']:,} shards / {cost['workers']} workers",
        f"${sv['usd_month']:,.2f}",
        f"KCL renewals ${kcl['usd_month']:,.2f}",
        ratio(sv["usd_month"], kcl["usd_month"]),
        "model from measured rates",
    )
