"""Row 6: DynamoDB requests per worker-minute, counted on the wire, and their monthly cost.

One supervisor per (shards, checkpoint interval), all at once, each on its own server behind its
own counting proxy (``benchmarks.wire_counter``), one stream per shard at 5 msg/s (every
checkpoint has something to store), counted over a window of steady state: after every shard is
owned and flowing, and one more reconcile round. Defaults otherwise. The cost model prices the
measured rates for 1,000 shards over 20 workers against KCL's lease renewals.

    python -m benchmarks.dynamodb_requests [--quick] [--shards 1 16 64] [--checkpoint 1 10]

writes out/bench/requests.json.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import Any

import boto3
import trio

from benchmarks import harness
from benchmarks.anchors import KCL_RENEWALS_PER_LEASE_S
from benchmarks.fleets import (
    DEFAULT_LEASE,
    bench_fleet,
    feed_for,
    servers,
    snapshot,
    stop,
    wait_settled,
)
from benchmarks.report import sections
from benchmarks.wire_billing import item_size
from benchmarks.wire_counter import CONTROL_PATH
from supervisor.devtools.fleet import Fleet
from supervisor.devtools.servers import ServerProcess, answers_http, start_server

SHARDS = (1, 16, 64)
RATE = 5.0  # msg/s per stream: every checkpoint interval has something new to store
READ_OPS = ("GetItem", "Query", "BatchGetItem", "Scan")
WRU_PRICE = 0.625  # USD per million write request units, on demand, us-east-1 (2025 list)
RRU_PRICE = 0.125  # USD per million read request units, on demand, us-east-1 (2025 list)
MONTH_S = 30 * 24 * 3600  # the month the anchors' $490 uses


def start_proxy(upstream: str) -> ServerProcess:
    """A counting proxy in front of ``upstream``, as a server process."""
    return start_server(
        "wire-counter",
        lambda port: [
            sys.executable, "-m", "benchmarks.wire_counter",
            "--upstream", upstream, "--port", str(port),
        ],
        ready=partial(answers_http, path=CONTROL_PATH),
    )  # fmt: skip


def proxy_counts(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}{CONTROL_PATH}", timeout=5) as response:
        return dict(json.loads(response.read()))


async def measure(
    window: float,
    dynamodb: Sequence[ServerProcess],
    checkpoints: Sequence[float],
    shard_counts: Sequence[int],
) -> list[dict[str, Any]]:
    """Every (shards, checkpoint interval) at once, one server each, over the same window."""
    configs = [(n, c) for c in checkpoints for n in shard_counts]
    streams = {cfg: [f"r{cfg[0]}x{cfg[1]:g}-{i}" for i in range(cfg[0])] for cfg in configs}
    shards = {f"s-{stream}": [stream] for names in streams.values() for stream in names}
    feed = await feed_for(shards, RATE)
    fleets: list[tuple[Fleet, ServerProcess, float]] = []
    try:
        for (n, ckpt), server in zip(configs, dynamodb, strict=False):
            proxy = await trio.to_thread.run_sync(start_proxy, server.url)
            own = {f"s-{stream}": [stream] for stream in streams[(n, ckpt)]}
            fleet = bench_fleet(
                f"requests-{n}shards-ckpt{ckpt:g}s",
                server.url,
                feed.url,
                own,
                supervisor={"checkpoint_interval": f"{ckpt:g}s"},
                endpoint=proxy.url,
            )
            fleets.append((fleet, proxy, ckpt))
        return await _count(fleets, window)
    finally:
        for fleet, proxy, _ in fleets:
            await stop(fleet)
            proxy.stop()
        feed.stop()


async def _count(fleets: list[tuple[Fleet, ServerProcess, float]], window: float) -> list[dict]:
    for fleet, _, _ in fleets:
        await fleet.store.ensure_table(True)  # as an operator would (init-table)
        await fleet.start("w1")
    settle_by = trio.current_time()
    for fleet, _, ckpt in fleets:
        await wait_settled(fleet, timeout=60, window=ckpt + 2.0, stable=2.0)
    settled_s = trio.current_time() - settle_by
    await trio.sleep(DEFAULT_LEASE.reconcile_interval)  # the round after the takes
    before = [(proxy_counts(proxy.url), time.monotonic()) for _, proxy, _ in fleets]
    await trio.sleep(window)
    after = [(proxy_counts(proxy.url), time.monotonic()) for _, proxy, _ in fleets]
    results = []
    for (fleet, _, ckpt), (c0, t0), (c1, t1) in zip(fleets, before, after, strict=True):
        minutes = (t1 - t0) / 60
        targets = Counter(c1["targets"]) - Counter(c0["targets"])
        updates = Counter(c1["updates"]) - Counter(c0["updates"])
        writes = sum(v for k, v in targets.items() if k not in READ_OPS)
        snap = await snapshot(fleet)
        results.append(
            {
                "name": fleet.workdir.name,
                "shards": len(fleet.shards),
                "checkpoint_interval": ckpt,
                "window_s": t1 - t0,
                "per_minute": {
                    "total": sum(targets.values()) / minutes,
                    "reads": sum(targets[op] for op in READ_OPS) / minutes,
                    "heartbeat": updates["heartbeat"] / minutes,
                    "checkpoint": updates["checkpoint"] / minutes,
                    "other_writes": (writes - updates["heartbeat"] - updates["checkpoint"])
                    / minutes,
                    "by_op": {op: v / minutes for op, v in sorted(targets.items())},
                    "by_update": {k: v / minutes for k, v in sorted(updates.items())},
                },
                "counts": {"targets": dict(targets), "updates": dict(updates)},
                "errors": c1["errors"] - c0["errors"],
                "status": c1["status"],
                "owned_by_w1": sum(1 for s in snap.shards if s.owner == "w1"),
                "item_bytes": item_sizes(fleet),
                "settled_after_s": settled_s,
            }
        )
    return results


def item_sizes(fleet: Fleet) -> dict[str, float]:
    """Mean stored size of the worker and shard items (a raw scan: the items as stored)."""
    client = boto3.client("dynamodb", endpoint_url=fleet.ddb_url, region_name="us-east-1")
    items = client.scan(TableName=fleet.table, ConsistentRead=True).get("Items", [])
    workers = [item_size(i) for i in items if i.get("kind", {}).get("S") == "worker"]
    shards = [item_size(i) for i in items if i.get("kind", {}).get("S") == "shard"]
    return {
        "worker": statistics.mean(workers) if workers else 0.0,
        "shard": statistics.mean(shards) if shards else 0.0,
    }


def cost_model(requests: list[dict[str, Any]], shards: int = 1000, workers: int = 20) -> dict:
    """Monthly on-demand cost of the lease traffic of ``shards`` over ``workers``, from the
    measured request rates per worker-minute, against KCL's renewal writes."""
    rates: dict[str, list[float]] = {}
    for r in requests:
        for op, v in r["per_minute"]["by_op"].items():
            rates.setdefault(op, []).append(v)
        rates.setdefault("heartbeat", []).append(r["per_minute"]["heartbeat"])
    mean = {k: statistics.mean(v) for k, v in rates.items()}
    worker_b = max(r["item_bytes"]["worker"] for r in requests)
    shard_b = max(r["item_bytes"]["shard"] for r in requests)
    table_b = shards * shard_b + workers * worker_b
    rru = {  # read request units per request, 20 workers and 1,000 shards in the table
        "Query": 0.5,  # GSI, eventually consistent: 0.5 per 4 KB returned (steady: tiny)
        "BatchGetItem": workers * 1.0,  # strongly consistent, each worker item <= 4 KB
        "Scan": math.ceil(table_b / 4096) * 1.0,  # strongly consistent full scan
        "GetItem": 1.0,
    }
    minutes = MONTH_S / 60
    reads_month = sum(mean.get(op, 0.0) * rru[op] for op in rru) * workers * minutes
    hb_month = mean["heartbeat"] * workers * minutes  # 1 WRU each (item <= 1 KB)
    ckpt = {}
    busiest = max(q["shards"] for q in requests)
    for r in requests:
        if r["shards"] == busiest:
            per_shard_min = r["per_minute"]["checkpoint"] / r["shards"]
            writes = per_shard_min * shards * minutes
            ckpt[f"{r['checkpoint_interval']:g}s"] = {
                "per_shard_minute": per_shard_min,
                "wru_month": writes,
                "usd_month": writes * WRU_PRICE / 1e6,
            }
    kcl_month = KCL_RENEWALS_PER_LEASE_S * shards * MONTH_S
    return {
        "shards": shards,
        "workers": workers,
        "shards_per_worker": math.ceil(shards / workers),
        "table_bytes": table_b,
        "worker_item_bytes": worker_b,
        "shard_item_bytes": shard_b,
        "rru_per_request": rru,
        "requests_per_worker_minute": mean,
        "shardvisor": {
            "heartbeat_wru_month": hb_month,
            "read_rru_month": reads_month,
            "usd_month": hb_month * WRU_PRICE / 1e6 + reads_month * RRU_PRICE / 1e6,
            "heartbeat_usd_month": hb_month * WRU_PRICE / 1e6,
            "read_usd_month": reads_month * RRU_PRICE / 1e6,
        },
        "checkpoints": ckpt,
        "kcl_renewals": {"wru_month": kcl_month, "usd_month": kcl_month * WRU_PRICE / 1e6},
        "prices": {"wru_per_million": WRU_PRICE, "rru_per_million": RRU_PRICE},
    }


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--shards", type=int, nargs="+", default=None, help="one worker each")
    parser.add_argument("--checkpoint", type=float, nargs="+", default=[1.0], help="seconds")
    parser.add_argument("--window", type=float, default=0.0, help="seconds counted")
    args = parser.parse_args()
    harness.interruptible()
    harness.use_local_aws()
    shard_counts = args.shards or ([1] if args.quick else list(SHARDS))
    window = args.window or (5.0 if args.quick else 60.0)
    with harness.recorded("requests", args.quick) as results:
        results.update(server=args.server, window_s=window)
        count = len(shard_counts) * len(args.checkpoint)
        with servers(args.server, count) as dynamodb:
            found = trio.run(measure, window, dynamodb, args.checkpoint, shard_counts)
        results["requests"] = found
        results["cost"] = cost_model(found)
    print(sections(["requests"]))


if __name__ == "__main__":
    main()
