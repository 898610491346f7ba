"""Row 9: DynamoDB work per worker as the fleet grows, on the wire; the lease cost modelled.

For each fleet size N in turn (3, 6, 12, 24): N real supervisors (``python -m supervisor run``,
zygote spawn, defaults: heartbeat 2 s, reconcile 2 s) on one new table of ONE dynalite, all
behind ONE counting proxy (``benchmarks.wire_counter``, which bills every request in read and
write units: ``benchmarks.wire_billing``), 2 shards per worker, one stream each at 1 msg/s from
the reference feed. Once every shard is owned and flowing, the loads differ by one at most and
no shard moved for two rounds, and after one more round, the proxy's counters are read every
SLICE_S seconds over a steady window; then the fleet is stopped
(SIGTERM, reaped, SIGKILL after the bounded grace) before the next size starts. Whatever
protocol the daemon speaks is what is measured: the benchmark reads only the wire.

After the window, before the stop, one host death: the process group of the worker last in id
order is SIGKILLed, and each of its shards is timed from the victim's last heartbeat (its
item's wall-clock stamp) to its new owner's take (``owner_since``), noting whether the taker
watches the victim (``watch_ring.watchers_of``): in a fleet larger than three most takers do
not, and learn the death from the watcher's death marker at their next hand-off poll.

The per-slice rates give the standard error of read units per worker-minute: the work of a
round is the same every round, so a window of ten rounds is enough from 6 workers on (2 to 8
worker-minutes in 20 s; the whole row takes about 5.5 minutes on 2 cores, most of it the
larger fleets settling); 3 workers get 60 s, so each worker's full scan (every 60 s) falls in
the window once. The shorter windows of the larger fleets, whose workers all started together,
can end before their first full scan: a scan of 72 items (24 workers) is about 5 read units a
worker-minute, under 1 % of the figure.

    python -m benchmarks.fleet_growth [--quick] [--sizes 3 6 12 24] [--window S] [--protocol 2]
                                      [--standbys 1]

``--protocol 2`` runs every size on a table flipped to protocol 2 before its first worker
starts (``init-table --protocol 2`` on the empty table), and writes
out/bench/fleet_growth_p2.json; without it, out/bench/fleet_growth.json; the report adds the
modelled monthly lease cost at 20, 200 and 1,000 workers (``benchmarks.lease_cost``).
``--standbys N`` (by hand, not in ``scripts/bench.sh``) runs the fleets with `[standby] count =
N`, written to ``..._standbysN.json``: the standbys' own reads and writes on the wire, and
host deaths taken by promotion.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import signal
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import boto3
import trio

from benchmarks import harness
from benchmarks.dynamodb_requests import proxy_counts, start_proxy
from benchmarks.fleets import (
    DEFAULT_LEASE,
    bench_fleet,
    feed_for,
    servers,
    snapshot,
    stop,
    wait_settled,
)
from benchmarks.lease_cost import lease_cost
from benchmarks.report import sections
from benchmarks.wire_billing import READ_OPS
from supervisor.core.watch_ring import watchers_of
from supervisor.devtools.fleet import Fleet
from supervisor.devtools.servers import ServerProcess

SIZES = (3, 6, 12, 24)
QUICK_SIZES = (2, 3)  # the smoke run shares 2 cores with the suite: a light fleet
WINDOWS = {3: 60.0}  # seconds counted; 20 for the larger fleets (whose settling takes longer)
QUICK_WINDOW = 4.0
SLICE_S = 4.0  # two rounds
SHARDS_PER_WORKER = 2
RATE = 1.0  # msg/s per stream
SETTLE_TIMEOUT = 150.0
STABLE_S = 4.0  # no shard changed owner or epoch for two rounds: the fleet's moves are over
MODEL_WORKERS = (20, 200, 1000)
TARGET = 1.2  # read units per worker-minute at the largest size <= 1.2 x the smallest (issue 16)


def rates(
    c0: Mapping[str, Any], c1: Mapping[str, Any], workers: int, seconds: float
) -> dict[str, Any]:
    """Per worker-minute between two readings of the proxy: requests by operation and by
    update kind, read units by operation, write units by kind; lease = all but checkpoints."""
    per = workers * seconds / 60
    targets = Counter(c1["targets"]) - Counter(c0["targets"])
    updates = Counter(c1["updates"]) - Counter(c0["updates"])
    u0, u1 = c0["units"], c1["units"]
    rru = {k: v - u0["read_units"].get(k, 0.0) for k, v in u1["read_units"].items()}
    wru = {k: v - u0["write_units"].get(k, 0.0) for k, v in u1["write_units"].items()}
    total = sum(targets.values())
    return {
        "requests": total / per,
        "lease_requests": (total - updates["checkpoint"]) / per,
        "reads": sum(targets[op] for op in READ_OPS) / per,
        "by_op": {op: v / per for op, v in sorted(targets.items())},
        "by_update": {k: v / per for k, v in sorted(updates.items())},
        "rru": sum(rru.values()) / per,
        "rru_by_op": {k: v / per for k, v in sorted(rru.items()) if v},
        "wru": sum(wru.values()) / per,
        "lease_wru": (sum(wru.values()) - wru.get("checkpoint", 0.0)) / per,
        "wru_by_kind": {k: v / per for k, v in sorted(wru.items()) if v},
    }


def spread(samples: Sequence[tuple[Mapping[str, Any], float]], workers: int) -> dict[str, Any]:
    """Read units per worker-minute of each slice between consecutive readings, and the
    standard error of their mean."""
    slices = [
        rates(a, b, workers, tb - ta)["rru"] for (a, ta), (b, tb) in itertools.pairwise(samples)
    ]
    stderr = statistics.stdev(slices) / math.sqrt(len(slices)) if len(slices) > 1 else None
    return {"rru_slices": slices, "rru_stderr": stderr}


def protocol_of(fleet: Fleet) -> int:
    """The protocol the table says the fleet speaks: protocol 2's meta item's ``protocol``,
    1 without one (docs/lease-protocol.md, *Compatibility*)."""
    client = boto3.client("dynamodb", endpoint_url=fleet.ddb_url, region_name="us-east-1")
    item = client.get_item(TableName=fleet.table, Key={"pk": {"S": "fleet#meta"}}).get("Item")
    return int(item.get("protocol", {}).get("N", "1")) if item else 1


async def measure_size(
    workers: int,
    server: ServerProcess,
    proxy: ServerProcess,
    window: float,
    *,
    kill: bool,
    protocol: int = 1,
    standbys: int = 0,
) -> dict[str, Any]:
    """One fleet of ``workers`` supervisors (``standbys``: `[standby] count`), counted over
    ``window`` seconds, then (``kill``) one host death, then stopped."""
    shards = {
        f"g{workers}-{i:03d}": [f"g{workers}-stream-{i:03d}"]
        for i in range(workers * SHARDS_PER_WORKER)
    }
    feed = await feed_for(shards, RATE)
    sections = {"standby": {"count": standbys}} if standbys else None
    fleet = bench_fleet(
        f"growth-{workers}", server.url, feed.url, shards, endpoint=proxy.url, sections=sections
    )
    codes: dict[str, int | None] = {}
    death: dict[str, Any] = {}
    try:
        if protocol == 2:  # init-table --protocol 2: indexes, meta item, flipped (no worker)
            await fleet.store.set_protocol(2)
        else:
            await fleet.store.ensure_table(True)  # as an operator would (init-table)
        started = trio.current_time()
        for i in range(workers):
            await fleet.start(f"w{i:02d}")
        await wait_settled(
            fleet, timeout=SETTLE_TIMEOUT, window=5.0, stable=STABLE_S, balanced=True
        )
        settled_s = trio.current_time() - started
        await trio.sleep(DEFAULT_LEASE.reconcile_interval)  # the round after the takes
        samples = [(proxy_counts(proxy.url), time.monotonic())]
        end = samples[0][1] + window
        while samples[-1][1] < end - 1e-3:
            await trio.sleep(min(SLICE_S, end - samples[-1][1]))
            samples.append((proxy_counts(proxy.url), time.monotonic()))
        protocol = await trio.to_thread.run_sync(protocol_of, fleet)
        death = await host_death(fleet) if kill else {}
    finally:
        codes = await stop(fleet)
        feed.stop()
    codes.pop(death.get("victim", ""), None)  # SIGKILLed on purpose: not a stop
    (c0, t0), (c1, t1) = samples[0], samples[-1]
    status = Counter(c1["status"]) - Counter(c0["status"])
    return {
        "workers": workers,
        "shards": len(shards),
        "protocol": protocol,
        "standbys": standbys,
        "window_s": t1 - t0,
        "worker_minutes": workers * (t1 - t0) / 60,
        "settled_after_s": settled_s,
        "per_worker_minute": rates(c0, c1, workers, t1 - t0),
        **spread(samples, workers),
        "not_ok": {k: v for k, v in status.items() if not k.endswith(" 200")},
        "proxy_errors": c1["errors"] - c0["errors"],
        "billed": {
            "from_server": c1["units"]["from_server"] - c0["units"]["from_server"],
            "computed": c1["units"]["computed"] - c0["units"]["computed"],
            "index_units": c1["units"]["index_units"] - c0["units"]["index_units"],
            "late_units": c1["units"]["late_units"] - c0["units"]["late_units"],
            "unbilled": c1["units"]["unbilled"],  # since the proxy started
            "unparsable": c1["unparsable"],
        },
        "exit_codes": codes,
        "host_death": death or None,
    }


async def host_death(fleet: Fleet) -> dict[str, Any]:
    """SIGKILL the process group of the last worker in id order (a dead host); each of its
    shards from the victim's last heartbeat to its new owner's take, and who took it."""
    before = await snapshot(fleet)
    live = sorted(fleet.live())
    victim = live[-1]
    orphans = {s.id: s.epoch for s in before.shards if s.owner == victim}
    watchers = watchers_of(victim, live)
    os.killpg(fleet.procs[victim].pid, signal.SIGKILL)
    await fleet.procs[victim].wait()
    new: dict[str, Any] = {}
    with trio.fail_after(3 * DEFAULT_LEASE.duration + 15):
        while len(new) < len(orphans):
            for item in (await snapshot(fleet)).shards:
                moved = item.id in orphans and item.epoch > orphans[item.id]
                if moved and item.owner not in ("", victim):
                    new[item.id] = item
            await trio.sleep(0.1)
    after = await snapshot(fleet)
    last = next(w.heartbeat_at for w in after.workers if w.id == victim)
    return {
        "victim": victim,
        "watchers": list(watchers),
        "lease_s": DEFAULT_LEASE.duration,
        "takes": [
            {
                "shard": sid,
                "by": item.owner,
                "watcher": item.owner in watchers,
                "after_last_heartbeat_s": item.owner_since - last,
            }
            for sid, item in sorted(new.items())
        ],
    }


def growth(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """Read units per worker-minute at the largest size over the smallest, against TARGET."""
    small = min(sizes, key=lambda r: r["workers"])
    large = max(sizes, key=lambda r: r["workers"])
    ratio = large["per_worker_minute"]["rru"] / small["per_worker_minute"]["rru"]
    return {
        "small": small["workers"],
        "large": large["workers"],
        "rru_ratio": ratio,
        "target": TARGET,
        "met": ratio <= TARGET,
    }


async def measure(
    server: ServerProcess,
    sizes: Sequence[int],
    window: float,
    *,
    quick: bool = False,
    protocol: int = 1,
    standbys: int = 0,
) -> list[dict[str, Any]]:
    """Each size in turn; a host death after each window (a quick run: the largest only)."""
    proxy = await trio.to_thread.run_sync(start_proxy, server.url)
    try:
        found = []
        for n in sizes:
            kill = not quick or n == max(sizes)
            window_n = window or WINDOWS.get(n, 20.0)
            found.append(
                await measure_size(
                    n, server, proxy, window_n, kill=kill, protocol=protocol, standbys=standbys
                )
            )
            rru = found[-1]["per_worker_minute"]["rru"]
            print(f"  {n} workers: {rru:.0f} RRU/worker-min", flush=True)
        return found
    finally:
        proxy.stop()


def main() -> None:
    parser = harness.arguments(__doc__, server="dynalite")
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="fleet sizes")
    parser.add_argument("--window", type=float, default=0.0, help="seconds counted, each size")
    parser.add_argument("--protocol", type=int, choices=(1, 2), default=1, help="the table's")
    parser.add_argument("--standbys", type=int, default=0, help="[standby] count (by hand)")
    args = parser.parse_args()
    harness.interruptible()
    harness.use_local_aws()
    sizes = args.sizes or list(QUICK_SIZES if args.quick else SIZES)
    window = args.window or (QUICK_WINDOW if args.quick else 0.0)
    name = "fleet_growth" if args.protocol == 1 else "fleet_growth_p2"
    name += f"_standbys{args.standbys}" if args.standbys else ""
    with harness.recorded(name, args.quick) as results:
        results.update(
            server=args.server, shards_per_worker=SHARDS_PER_WORKER, feed_rate=RATE, slice_s=SLICE_S
        )
        with servers(args.server, 1) as (server,):
            run = functools.partial(
                measure,
                server,
                sizes,
                window,
                quick=args.quick,
                protocol=args.protocol,
                standbys=args.standbys,
            )
            found = trio.run(run)
        results["sizes"] = found
        results["growth"] = growth(found)
        results["cost_model"] = [lease_cost(w).as_json() for w in MODEL_WORKERS]
    if args.protocol == 1 and not args.standbys:
        print(sections(["fleet_growth"]))
    else:  # the report's row 9 is protocol 1's; protocol 2's figures are printed as measured
        for size in found:
            death = size["host_death"] or {}
            takes = [t["after_last_heartbeat_s"] for t in death.get("takes", [])]
            print(
                f"  protocol {size['protocol']}, {size['workers']} workers: "
                f"{size['per_worker_minute']['rru']:.0f} RRU, "
                f"{size['per_worker_minute']['requests']:.0f} requests, "
                f"{size['per_worker_minute']['lease_wru']:.0f} lease WRU per worker-minute; "
                f"host death taken {min(takes, default=0):.2f}-{max(takes, default=0):.2f} s "
                "after the last heartbeat"
            )
        print(f"  growth: {results['growth']['rru_ratio']:.2f}x")


if __name__ == "__main__":
    main()
