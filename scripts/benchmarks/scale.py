"""Rows 5 and 7: one host with many shards, a real supervisor process at its defaults.

Memory (--part memory: out/bench/memory.json): one supervisor per spawn mode (zygote = warm,
fresh), one stream per shard at 2 msg/s, started with 8 shards and grown to 32 and 64, at most 8
at a time, by rewriting its file and sending SIGHUP; at each size, once every stream has written
and 3 s more have passed: the supervisor's RSS and PSS, each child's PSS and the zygote's PSS
(shared by every warm child), from /proc/<pid>/smaps_rollup.

Scale (--part scale: out/bench/scale.json): 64 shards x 4 streams (256 WebSocket connections,
10 msg/s each) from a cold start: until every stream's first record, and the supervisor's CPU
(utime + stime) over 20 s of steady state. --part all (the default) writes both into scale.json.

    python -m benchmarks.scale [--quick] [--part memory|scale|all] [--server moto|dynalite]
                               [--counts 8 32 64] [--shards 64 --streams 4] [--cpu-window 20]
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio

from benchmarks import harness, procfs
from benchmarks.fleets import first_record_ts, stop
from benchmarks.report import sections
from benchmarks.stats import summary
from supervisor.devtools.fleet import Fleet, child_pids, zygote_pids
from supervisor.devtools.servers import start_dynamodb, start_feed

FEED_RATE = 10.0  # msg/s per stream (scale)
MEMORY_RATE = 2.0  # msg/s per stream (memory: a light load, so that it can run beside others)
# Shards added per SIGHUP: a supervisor spawning dozens of fresh children at once on a busy
# 2-core machine can see one take over 10 s to say hello, which ends the whole supervisor.
GROWTH_STEP = 8
WORKER = "host"


def host(name: str, server: str, feed_url: str, spawn: str) -> Fleet:
    """A fleet of one supervisor; its shards are set by ``grow``."""
    settings: dict[str, dict[str, object]] = {
        "supervisor": {"spawn": spawn},
        "log": {"level": "warning"},
        "http": {"listen": ""},
    }
    workdir = harness.run_dir() / name
    return Fleet(workdir, server, f"scale-{name}", feed_url, {}, settings=settings)


def grow(fleet: Fleet, shards: int, streams: int) -> None:
    name = fleet.workdir.name
    fleet.shards = {
        f"{name}-{i}": [f"{name}-{i}-{j}" for j in range(streams)] for i in range(shards)
    }


def first_records(fleet: Fleet) -> dict[str, float]:
    """stream -> ts of its first record written (streams without one are left out)."""
    found = {}
    for shard, streams in fleet.shards.items():
        for stream in streams:
            for path in sorted((fleet.workdir / "out" / shard).glob(f"{stream}.*.jsonl")):
                if (ts := first_record_ts(path)) is not None:
                    found[stream] = ts
                    break
    return found


async def wait_flowing(fleet: Fleet, timeout: float) -> dict[str, float]:
    """Every stream written and a child per shard; the first records."""
    proc = fleet.procs[WORKER]
    wanted = sum(len(s) for s in fleet.shards.values())
    with trio.move_on_after(timeout):
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"{fleet.workdir.name} exited {proc.returncode}: see its log")
            first = first_records(fleet)
            if len(first) == wanted and len(child_pids(proc.pid)) == len(fleet.shards):
                return first
            await trio.sleep(0.1)
    raise TimeoutError(
        f"{fleet.workdir.name}: {len(first_records(fleet))}/{wanted} streams flowing, "
        f"{len(child_pids(proc.pid))} children after {timeout:g} s"
    )


def memory_of(fleet: Fleet) -> dict[str, Any]:
    pid = fleet.procs[WORKER].pid
    child_pss = [procfs.pss_kib(child) / 1024 for child in child_pids(pid)]
    zygote_pss = sum(procfs.pss_kib(z) for z in zygote_pids(pid)) / 1024
    sup_pss = procfs.pss_kib(pid) / 1024
    return {
        "shards": len(fleet.shards),
        "children": len(child_pss),
        "supervisor_rss_mib": procfs.rss_kib(pid) / 1024,
        "supervisor_pss_mib": sup_pss,
        "zygote_pss_mib": zygote_pss,
        "child_pss_mib": summary(child_pss),
        "child_pss_mean_mib": sum(child_pss) / len(child_pss) if child_pss else 0.0,
        "per_shard_with_zygote_mib": (sum(child_pss) + zygote_pss) / max(1, len(child_pss)),
        "host_total_pss_mib": sup_pss + zygote_pss + sum(child_pss),
    }


async def memory_run(
    server: str, feed_url: str, spawn: str, counts: list[int], settle: float = 3.0
) -> list[dict[str, Any]]:
    fleet = host(f"mem-{spawn}", server, feed_url, spawn)
    rows = []
    try:
        for count in counts:
            grown = time.monotonic()
            while len(fleet.shards) < count:
                grow(fleet, min(count, len(fleet.shards) + GROWTH_STEP), 1)
                if WORKER in fleet.procs:
                    fleet.reload(WORKER)
                else:
                    await fleet.start(WORKER)
                await wait_flowing(fleet, timeout=60 + len(fleet.shards))
            ready_s = time.monotonic() - grown
            await trio.sleep(settle)  # past the first checkpoints: the working set in steady state
            row = memory_of(fleet)
            row.update(
                spawn=spawn,
                ready_s=ready_s,
                how="cold start" if count == counts[0] else "grown by SIGHUP",
                settle_s=settle,
            )
            rows.append(row)
            print(
                f"  {spawn} {count} shards: supervisor RSS {row['supervisor_rss_mib']:.1f} MiB, "
                f"child PSS {row['child_pss_mean_mib']:.1f} MiB (zygote "
                f"{row['zygote_pss_mib']:.1f})",
                flush=True,
            )
    finally:
        await stop(fleet)
    return rows


async def scale_run(
    server: str, feed_url: str, shards: int, streams: int, window: float, settle: float = 5.0
) -> dict[str, Any]:
    fleet = host("scale", server, feed_url, "zygote")
    grow(fleet, shards, streams)
    try:
        started = time.time()
        proc = await fleet.start(WORKER)
        first = await wait_flowing(fleet, timeout=120)
        flowing_wall = time.time()
        delays = [ts - started for ts in first.values()]
        await trio.sleep(settle)  # past the start-up: first checkpoints and reconcile rounds
        c0, t0 = procfs.cpu_seconds(proc.pid), time.monotonic()
        kids0 = {pid: procfs.cpu_seconds(pid) for pid in child_pids(proc.pid)}
        await trio.sleep(window)
        c1, t1 = procfs.cpu_seconds(proc.pid), time.monotonic()
        kids1 = {pid: procfs.cpu_seconds(pid) for pid in kids0 if Path(f"/proc/{pid}").exists()}
        child_cpu = [(kids1[p] - kids0[p]) / (t1 - t0) * 100 for p in kids1]
        memory = memory_of(fleet)
    finally:
        await stop(fleet)
    return {
        "shards": shards,
        "streams_per_shard": streams,
        "streams": shards * streams,
        "feed_rate_per_stream": FEED_RATE,
        "start_to_all_flowing_s": max(delays),
        "start_to_stream_flowing": summary(delays),
        "detected_after_start_s": flowing_wall - started,
        "cpu_window_s": t1 - t0,
        "supervisor_cpu_percent": (c1 - c0) / (t1 - t0) * 100,
        "child_cpu_percent": summary(child_cpu),
        "memory": memory,
    }


async def measure(args: Any, server: str, feed_url: str, results: dict[str, Any]) -> None:
    counts = args.counts
    shards, streams = args.shards, args.streams
    window = args.cpu_window or (1.0 if args.quick else 20.0)
    memory, scale = args.part in ("memory", "all"), args.part in ("scale", "all")
    if args.quick:  # a smoke test: the hosts side by side, figures meaningless
        found: dict[str, list[dict[str, Any]]] = {}

        async def one(spawn: str) -> None:
            found[spawn] = await memory_run(server, feed_url, spawn, counts, 0.5)

        async def scaled() -> None:
            results["scale"] = await scale_run(server, feed_url, shards, streams, window, 0.5)

        async with trio.open_nursery() as nursery:
            for spawn in ("zygote", "fresh") if memory else ():
                nursery.start_soon(one, spawn)
            if scale:
                nursery.start_soon(scaled)
        if memory:
            results["memory"] = {spawn: found[spawn] for spawn in ("zygote", "fresh")}
        return
    if memory:
        print("bench scale: memory, warm and fresh", flush=True)
        results["memory"] = {
            spawn: await memory_run(server, feed_url, spawn, counts)
            for spawn in ("zygote", "fresh")
        }
    if scale:
        print(f"bench scale: {shards} shards x {streams} streams on one host", flush=True)
        results["scale"] = await scale_run(server, feed_url, shards, streams, window)


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--cpu-window", type=float, default=0.0, help="seconds of CPU measured")
    parser.add_argument(
        "--part", choices=("memory", "scale", "all"), default="all", help="out/bench/<part>.json"
    )
    parser.add_argument("--counts", type=int, nargs="+", help="memory: shards at each size")
    parser.add_argument("--shards", type=int, help="scale: shards on the host")
    parser.add_argument("--streams", type=int, help="scale: streams per shard")
    args = parser.parse_args()
    args.counts = args.counts or ([1, 2] if args.quick else [8, 32, 64])
    args.shards = args.shards or (2 if args.quick else 64)
    args.streams = args.streams or (2 if args.quick else 4)
    harness.interruptible()
    harness.use_local_aws()
    rate = MEMORY_RATE if args.part == "memory" else FEED_RATE
    name = "scale" if args.part == "all" else args.part
    with (
        harness.recorded(name, args.quick) as results,
        start_dynamodb(args.server) as server,
        start_feed(rate) as feed,
    ):
        results.update(
            server=args.server,
            settings={
                "feed_rate_per_stream": rate,
                "server": args.server,
                "memory_counts": args.counts,
                "lease": "defaults (10 s / 2 s / 2 s)",
                "checkpoint_interval": "1 s (default)",
            },
        )
        trio.run(measure, args, server.url, feed.url, results)
    print(sections([name]))


if __name__ == "__main__":
    main()
