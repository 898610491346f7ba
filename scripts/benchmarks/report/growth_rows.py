"""Row 9 of the report: DynamoDB work per worker as the fleet grows (on the wire), and the
modelled monthly lease cost at 20, 200 and 1,000 workers beside KCL 2.x."""

# ruff: noqa: RUF001 - the report uses typographic signs on purpose
from __future__ import annotations

from typing import Any

from benchmarks.report.common import Load, Rendered, SummaryRow, heading, not_measured
from benchmarks.tables import LEFT, RIGHT, count, ratio, table

READS = ("GetItem", "Query", "BatchGetItem", "Scan")


def growth(load: Load) -> Rendered:
    data = load("fleet_growth")
    out = [heading(9, data)]
    add = out.append
    sizes = (data or {}).get("sizes")
    if not data or not sizes:
        add(not_measured("no out/bench/fleet_growth.json"))
        return "\n".join(out), []
    protocols = sorted({r["protocol"] for r in sizes})
    add(
        f"`{data.get('command', 'python -m benchmarks.fleet_growth')}`: for each fleet size in "
        f"turn, that many real supervisors (zygote spawn, defaults: heartbeat 2 s, reconcile "
        f"2 s) on one table of one {data.get('server', 'dynalite')} server, all behind one "
        "counting proxy that bills every request in read and write units from its request and "
        "response bodies with DynamoDB's rules (`benchmarks.wire_billing`: 4 KB read units, "
        "half when eventually consistent, per item for GetItem and BatchGetItem, on the summed "
        "size for Query and Scan; 1 KB write units of the larger of the old and new item, and "
        "one more per index entry a write puts, removes or changes). "
        f"{data.get('shards_per_worker', 2)} shards per worker, one stream each at "
        f"{data.get('feed_rate', 1.0):g} msg/s; counted once every shard is owned and flowing, "
        "the loads are balanced and no shard moved for two rounds, after one more round; then "
        "the fleet is stopped before the next size. Per "
        "worker-minute; lease = all but checkpoint writes. Protocol spoken (the table's meta "
        f"item): {', '.join(str(p) for p in protocols)}. ± is the standard error over slices "
        f"of {data.get('slice_s', 4.0):g} s. Each worker's full scan (every 60 s) falls in "
        "the 60 s window of the smallest fleet; the shorter windows of larger fleets may miss "
        "it (at 24 workers ≈ 5 RRU per worker-minute, under 1 %).\n"
    )
    summary: list[SummaryRow] = []
    _measured(data, "fleet_growth", out, summary)
    p2 = load("fleet_growth_p2")
    if p2 and p2.get("sizes"):
        add(
            f"\n**Protocol 2.** `{p2.get('command', 'python -m benchmarks.fleet_growth')}`: "
            "the same fleets on a table flipped to protocol 2 (`init-table --protocol 2`) "
            "before the first worker starts (docs/lease-protocol.md, *The daemon on protocol "
            "2*): no scan, no roster; the member list only after a membership change.\n"
        )
        _measured(p2, "fleet_growth_p2", out, summary)
    model = data.get("cost_model") or []
    if model:
        add(_model(model))
        big = max(model, key=lambda m: m["workers"])
        summary.append(
            (
                f"9. Modelled lease cost / month, {big['workers']:,} workers",
                f"protocol 2 ${big['protocol2']['usd_month']:,.0f} · protocol 1 "
                f"${big['protocol1']['usd_month']:,.0f}",
                f"KCL 2.x ${big['kcl']['usd_month']:,.0f}",
                ratio(big["protocol2"]["usd_month"], big["kcl"]["usd_month"]),
                "model",
            )
        )
    return "\n".join(out), summary


def _measured(data: dict[str, Any], name: str, out: list[str], summary: list[SummaryRow]) -> None:
    """One run's tables (per size, the host deaths) and verdict, onto ``out`` and ``summary``."""
    add = out.append
    sizes = data["sizes"]
    protocols = sorted({r["protocol"] for r in sizes})
    rows = []
    for r in sorted(sizes, key=lambda x: x["workers"]):
        p = r["per_worker_minute"]
        reads = " / ".join(f"{p['by_op'].get(op, 0.0):.0f}" for op in READS)
        rru_ops = " / ".join(f"{p['rru_by_op'].get(op, 0.0):.0f}" for op in READS)
        err = r.get("rru_stderr")
        rows.append(
            (
                r["workers"],
                f"{r['window_s']:.0f} s ({r['worker_minutes']:.1f})",
                f"{p['requests']:.0f}",
                f"{p['lease_requests']:.0f}",
                reads,
                f"{p['rru']:.0f}" + (f" ± {err:.0f}" if err is not None else ""),
                rru_ops,
                f"{p['wru']:.0f}",
                f"{p['lease_wru']:.0f}",
            )
        )
    header = (
        "workers",
        "window (worker-minutes)",
        "requests",
        "lease requests",
        "reads: Get / Query / BatchGet / Scan",
        "RRU",
        "RRU: Get / Query / BatchGet / Scan",
        "WRU",
        "lease WRU",
    )
    add(table(header, rows, RIGHT * 4 + LEFT + RIGHT + LEFT + RIGHT * 2))
    codes = [c for r in sizes for c in r.get("exit_codes", {}).values()]
    failed = [r["workers"] for r in sizes if r.get("not_ok") or r.get("proxy_errors")]
    add(
        f"\nStopped with SIGTERM: {sum(c == 0 for c in codes)} of {len(codes)} supervisors "
        "exited 0. "
        + (
            f"Requests that failed or were dropped in the window at {failed} workers (see "
            f"`not_ok` in out/bench/{name}.json)."
            if failed
            else "No request failed in any window."
        )
    )
    deaths = [r for r in sorted(sizes, key=lambda x: x["workers"]) if r.get("host_death")]
    if deaths:
        add(_deaths(deaths, protocol=max(protocols)))
    g = data.get("growth") or {}
    if not g:
        return
    verdict = "met" if g["met"] else "**not met**"
    add(
        f"\nRead units per worker-minute at {g['large']} workers ÷ at {g['small']}: "
        f"**{g['rru_ratio']:.2f}×** (target ≤ {g['target']:g}×: {verdict}). "
        + (
            "Protocol 1 (spoken here) reads, each round, the meta item and its own item by a "
            "consistent BatchGetItem, and between rounds the two peers it watches (the Get "
            "column); every worker item only after a membership change (docs/lease-"
            "protocol.md, *Liveness*). Before the watch ring (issue 16) every round read "
            "every worker item: 238 → 849 RRU per worker-minute from 3 to 24 workers "
            "(3.57×).\n"
            if 1 in protocols
            else "Protocol 2 reads, each round, the meta item (eventually consistent: the Get "
            "column with the watch reads), its own item from its heartbeat's response, "
            "and its hand-off poll's `successor = <me>` (the Query column, 4 a second).\n"
        )
    )
    by_n = {r["workers"]: r["per_worker_minute"]["rru"] for r in sizes}
    summary.append(
        (
            f"9. RRU / worker-minute, {g['small']} → {g['large']} workers"
            + (", protocol 2" if 1 not in protocols else ""),
            f"{by_n[g['small']]:.0f} → {by_n[g['large']]:.0f} ({g['rru_ratio']:.2f}×)",
            f"target ≤ {g['target']:g}×",
            verdict,
            f"{sum(r['window_s'] for r in sizes):.0f} s on the wire",
        )
    )


def _deaths(sizes: list[dict[str, Any]], protocol: int = 1) -> str:
    """The host death after each window: watchers' takes and the other workers' takes."""

    def takes(death: dict[str, Any], by_watcher: bool) -> str:
        found = [t for t in death["takes"] if t["watcher"] == by_watcher]
        if not found:
            return "—"
        return ", ".join(
            f"{t['after_last_heartbeat_s']:.2f} s ({t['by']})"
            for t in sorted(found, key=lambda t: t["after_last_heartbeat_s"])
        )

    rows = [
        (
            r["workers"],
            f"{r['host_death']['victim']} (watched by {', '.join(r['host_death']['watchers'])})",
            takes(r["host_death"], True),
            takes(r["host_death"], False),
        )
        for r in sizes
    ]
    lease = sizes[0]["host_death"]["lease_s"]
    return (
        "\nA host death in each fleet, after its window: the process group of the last worker "
        "in id order SIGKILLed; each of its shards from the victim's last heartbeat (its "
        "item's wall-clock stamp) to the new owner's take (`owner_since`), by the two workers "
        "that watch it and by the others, which learn the death "
        + (
            "from the watcher's death marker"
            if protocol == 1
            else "from the watcher's routing of the shard to them"
        )
        + f" at their next hand-off poll (250 ms). Lease {lease:g} s.\n\n"
        + table(
            ("workers", "victim", "taken by a watcher", "taken by another worker"),
            rows,
            RIGHT + LEFT * 3,
        )
    )


def _model(model: list[dict[str, Any]]) -> str:
    rows = [
        (
            f"{m['workers']:,} / {m['shards']:,}",
            f"${m['protocol2']['usd_month']:,.0f}",
            f"${m['protocol1']['usd_month']:,.0f}",
            f"${m['kcl_renewals']['usd_month']:,.0f}",
            f"${m['kcl_scans']['usd_month']:,.0f}",
            f"${m['kcl']['usd_month']:,.0f}",
            f"{count(m['protocol2']['rru_s'])} · {count(m['protocol1']['rru_s'])}",
        )
        for m in model
    ]
    header = (
        "workers / shards",
        "protocol 2",
        "protocol 1",
        "KCL 2.x renewals",
        "KCL 2.x scans",
        "KCL 2.x",
        "RRU/s: protocol 2 · 1",
    )
    return (
        "\nModelled monthly lease cost (`benchmarks.lease_cost`, the model of "
        "docs/lease-protocol.md: 100 shards per worker, defaults, on-demand us-east-1 prices, "
        "30-day month, checkpoints excluded; a model, not a measurement). KCL 2.x "
        "(../shared/reference/anchors.md): 0.302 renewal writes per lease per second, and "
        "every worker scanning the lease table every 20.05 s.\n\n"
        + table(header, rows, LEFT + RIGHT * 6)
        + "\n"
    )
