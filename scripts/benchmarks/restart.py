"""Row 3: a child's crash -> the first record written again, warm (zygote) and fresh spawns.

A real supervisor holds one shard with one stream from the reference feed (1,000 msg/s, so the
feed adds at most ~1 ms). Each trial SIGKILLs the shard worker and measures, from the kill, the
``ts`` of the first record the restarted worker writes. Between trials the child runs longer than
``restart_reset_after`` (200 ms here), so every trial is the first crash after a healthy run,
restarted at once; repeated crashes back off instead. CPU-bound: run on an idle machine.

    python -m benchmarks.restart [--quick] [--trials N]

writes out/bench/restart.json (supervisord's figure, the peer, comes from ``benchmarks.fleet``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import trio

from benchmarks import harness
from benchmarks.fleets import feed_for, stop
from benchmarks.report import sections
from benchmarks.stats import summary
from supervisor.devtools.fleet import Fleet, child_pids
from supervisor.devtools.servers import start_dynamodb

SETTINGS: dict[str, dict[str, object]] = {
    "lease": {"duration": "3s", "heartbeat_interval": "1s", "reconcile_interval": "1s"},
    "supervisor": {
        "checkpoint_interval": "50ms",
        "restart_reset_after": "200ms",
        "max_restarts": 1000,
    },
    "log": {"level": "warning"},
    "http": {"listen": "127.0.0.1:0"},
}
SPAWNS = ("zygote", "fresh")
HEALTHY_RUN = 0.5  # seconds between trials: longer than restart_reset_after


def first_ts_after(sink_dir: Path, t0: float) -> float | None:
    """The earliest ``ts`` after ``t0`` in the tails of the sink files."""
    best = None
    for file in sink_dir.rglob("*.jsonl"):
        with file.open("rb") as fh:
            fh.seek(max(0, file.stat().st_size - 200_000))
            for line in fh.read().splitlines()[1:]:
                try:
                    ts = json.loads(line)["ts"]
                except (ValueError, KeyError):
                    continue
                if ts > t0 and (best is None or ts < best):
                    best = ts
    return best


async def measure(spawn: str, trials: int, server: str, feed_url: str) -> list[float]:
    """``trials`` crashes of the child of one supervisor spawning ``spawn`` children."""
    settings = {**SETTINGS, "supervisor": {**SETTINGS["supervisor"], "spawn": spawn}}
    shards = {"s1": ["a"]}
    workdir = harness.run_dir() / f"restart-{spawn}"
    fleet = Fleet(workdir, server, f"bench-{spawn}", feed_url, shards, settings=settings)
    sink = fleet.workdir / "out"
    samples = []
    try:
        proc = await fleet.start(f"bench-{spawn}")
        with trio.fail_after(30):
            while first_ts_after(sink, 0.0) is None or len(child_pids(proc.pid)) != 1:
                await trio.sleep(0.05)
        for _ in range(trials):
            await trio.sleep(HEALTHY_RUN)
            (pid,) = child_pids(proc.pid)
            t0 = time.time()
            os.kill(pid, signal.SIGKILL)
            with trio.fail_after(10):
                while (ts := first_ts_after(sink, t0)) is None:
                    await trio.sleep(0.005)
            samples.append(ts - t0)
            with trio.fail_after(10):
                while len(child_pids(proc.pid)) != 1:
                    await trio.sleep(0.01)
    finally:
        await stop(fleet)
    return samples


async def measure_both(trials: int, rate: float, server: str) -> dict[str, list[float]]:
    feed = await feed_for({"s1": ["a"]}, rate)
    try:
        return {spawn: await measure(spawn, trials, server, feed.url) for spawn in SPAWNS}
    finally:
        feed.stop()


def main() -> None:
    args = harness.arguments(__doc__).parse_args()
    harness.interruptible()
    harness.use_local_aws()
    trials = args.trials or (2 if args.quick else 20)
    rate = 100.0 if args.quick else 1000.0
    with harness.recorded("restart", args.quick) as results, start_dynamodb(args.server) as db:
        print(f"  shardvisor crash -> writing, warm and fresh, {trials} trials each", flush=True)
        started = time.monotonic()
        samples = trio.run(measure_both, trials, rate, db.url)
        shardvisor: dict[str, Any] = {
            "settings": {
                "feed_rate": rate,
                "restart_reset_after": "200ms",
                "checkpoint_interval": "50ms",
                "healthy_run_between_trials_s": HEALTHY_RUN,
                "server": args.server,
            },
            "trials": trials,
            "warm": summary(samples["zygote"]),
            "fresh": summary(samples["fresh"]),
            "samples": samples,
            "elapsed_s": time.monotonic() - started,
        }
        results.update(
            measure="SIGKILL of the shard worker -> ts of the first record the restarted "
            "worker writes",
            shardvisor=shardvisor,
        )
    print(sections(["restart"]))


if __name__ == "__main__":
    main()
