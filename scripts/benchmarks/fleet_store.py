"""Protocol 2's requests on a local DynamoDB (issue 16): what each costs in requests and time.

Not a row of the benchmark table: the store alone, no daemon (which does not run protocol 2
yet). Against moto's server and dynalite on 127.0.0.1, one table each: the requests a worker
makes every round (meta read, heartbeat, hand-off poll, watch reads), the member re-read (64
bucket queries) with ``--workers`` members, a page of a vacant bucket and a take; then
``init-table --protocol 2``'s backfill of ``--items`` protocol-1 shard items. Loopback times
show the client's and the server's overhead, not DynamoDB's; the request counts are exact.

    PYTHONPATH=scripts python -m benchmarks.fleet_store [--repeat 200] [--workers 100]
        [--items 2000]

prints one JSON object per server.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore
from supervisor.core.items import WorkerItem
from supervisor.core.partition_keys import bucket, start_spot
from supervisor.devtools.servers import ServerProcess, start_dynalite, start_moto_server

REGION = "us-east-1"


async def timed(repeat: int, call: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    """p50 and p99 of ``repeat`` calls, in milliseconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    return {"p50_ms": round(statistics.median(times), 2), "p99_ms": round(p99, 2)}


async def measure(url: str, repeat: int, workers: int, items: int) -> dict[str, Any]:
    store = DynamoLeaseStore(f"bench-{uuid.uuid4().hex[:8]}", REGION, url)
    await store.ensure_table(True, protocol=2)
    fleet = store.fleet()
    for n in range(workers):
        await fleet.join(WorkerItem(f"w{n:04d}", "s", 0, "running", 0.0, 0.0))
    shards = [f"s{n:05d}" for n in range(300)]
    await fleet.ensure_shards(shards)
    number = bucket(shards[0], 256)
    ops: dict[str, dict[str, float]] = {}
    before = dict(store.request_counts)
    ops["read_generation"] = await timed(repeat, fleet.read_generation)
    ops["heartbeat"] = await timed(repeat, lambda: fleet.heartbeat("w0000", "s", "running", 0))
    ops["watch_read"] = await timed(repeat, lambda: fleet.watch_read("w0001", consistent=False))
    ops["addressed_to (empty)"] = await timed(repeat, lambda: fleet.addressed_to("w0000"))
    ops["vacant_in"] = await timed(
        repeat, lambda: fleet.vacant_in(number, start_spot("w0000", number, 0))
    )
    ops["read_members"] = await timed(max(repeat // 10, 5), fleet.read_members)
    epochs = iter(range(10**6))

    async def take_and_release() -> None:
        epoch = next(epochs)
        await fleet.take("s00000", "w0000", "", epoch)
        await fleet.release("s00000", "w0000", epoch + 1, "")

    ops["take + release"] = await timed(repeat, take_and_release)
    counts = {
        op: store.request_counts[op] - before.get(op, 0)
        for op in store.request_counts
        if store.request_counts[op] - before.get(op, 0)
    }

    old = DynamoLeaseStore(f"bench-{uuid.uuid4().hex[:8]}", REGION, url)
    await old.ensure_table(True, protocol=2)
    async with trio.open_nursery() as nursery:
        for n in range(items):
            nursery.start_soon(old.ensure_shard, f"b{n:06d}")  # protocol 1: no keys
    started = time.perf_counter()
    change = await old.set_protocol(2)
    seconds = time.perf_counter() - started
    return {
        "workers": workers,
        "ops": ops,
        "requests": counts,
        "backfill": {
            "items": change.backfilled,
            "seconds": round(seconds, 2),
            "items_per_s": round(change.backfilled / seconds),
            "protocol": change.protocol,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--items", type=int, default=2000)
    args = parser.parse_args()
    starters: dict[str, Callable[[], ServerProcess]] = {
        "moto-server": start_moto_server,
        "dynalite": start_dynalite,
    }
    for name, start in starters.items():
        server = start()
        try:
            result = trio.run(measure, server.url, args.repeat, args.workers, args.items)
        finally:
            server.stop()
        print(json.dumps({"server": name, **result}))


if __name__ == "__main__":
    main()
