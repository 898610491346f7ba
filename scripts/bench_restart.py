#!/usr/bin/env python3
"""Child crash -> first record written again, warm (zygote) vs fresh spawn.

A real supervisor process holds one shard with one stream from the reference feed (1,000
messages/s, so the feed adds at most ~1 ms). Each trial SIGKILLs the shard worker and measures,
from the kill, the ``ts`` of the first record the restarted worker writes. Between trials the
child runs longer than ``restart_reset_after`` (set to 200 ms here), so every trial is the
"first crash after a healthy run" (restarted at once; repeated crashes back off instead).

    .venv/bin/python scripts/bench_restart.py [--trials 30] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from supervisor.devtools.feed import FeedServer  # noqa: E402
from supervisor.devtools.local_dynamodb import LocalDynamoDB  # noqa: E402


def worker_pids(supervisor_pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])

    def cmd(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return ""

    zygotes = {p for p, pp in parents.items() if pp == supervisor_pid and "zygote" in cmd(p)}
    return [
        p
        for p, pp in parents.items()
        if (pp == supervisor_pid and p not in zygotes) or pp in zygotes
    ]


def config(workdir: Path, ddb: str, feed_port: int, spawn: str) -> Path:
    path = workdir / f"{spawn}.toml"
    path.write_text(
        f"""
[worker]
id = "bench-{spawn}"
[dynamodb]
table = "bench-{spawn}"
endpoint_url = "{ddb}"
[lease]
duration = "3s"
heartbeat_interval = "1s"
reconcile_interval = "1s"
[supervisor]
spawn = "{spawn}"
checkpoint_interval = "50ms"
restart_reset_after = "200ms"
max_restarts = 1000
[sink]
path = "out-{spawn}/{{shard}}/{{stream}}.{{epoch}}.jsonl"
[log]
level = "warning"
[[shards]]
id = "s1"
[[shards.streams]]
id = "a"
url = "ws://127.0.0.1:{feed_port}/feed/a?after={{after}}"
sequence = "seq"
"""
    )
    return path


def first_ts_after(sink_dir: Path, t0: float) -> float | None:
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


async def measure(spawn: str, trials: int, workdir: Path, ddb: str, feed_port: int) -> list[float]:
    cfg = config(workdir, ddb, feed_port, spawn)
    log = (workdir / f"{spawn}.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "run", "-c", str(cfg)],
        cwd=workdir,
        stdout=log,
        stderr=log,
    )
    sink = workdir / f"out-{spawn}"
    samples = []
    try:
        with trio.fail_after(30):
            while first_ts_after(sink, 0.0) is None or len(worker_pids(proc.pid)) != 1:
                await trio.sleep(0.05)
        for _ in range(trials):
            await trio.sleep(0.5)  # a healthy run longer than restart_reset_after
            (pid,) = worker_pids(proc.pid)
            t0 = time.time()
            os.kill(pid, signal.SIGKILL)
            with trio.fail_after(10):
                while (ts := first_ts_after(sink, t0)) is None:
                    await trio.sleep(0.005)
            samples.append(ts - t0)
            with trio.fail_after(10):
                while len(worker_pids(proc.pid)) != 1:
                    await trio.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
    return samples


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main_async(trials: int) -> None:
    server = LocalDynamoDB().start()
    feed = FeedServer(rate=1000.0, stream_names=["a"])
    try:
        with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
            async with trio.open_nursery() as nursery:
                port = await nursery.start(feed.serve, "127.0.0.1", 0)
                results = {}
                for spawn in ("zygote", "fresh"):
                    results[spawn] = await measure(spawn, trials, Path(tmp), server.url, port)
                nursery.cancel_scope.cancel()
    finally:
        server.stop()
    print(f"\nChild crash (SIGKILL) -> first record written again, {trials} trials each\n")
    print("| spawn | p50 | p99 | max |")
    print("|---|---|---|---|")
    for spawn, samples in results.items():
        p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
        worst = max(samples)
        print(f"| {spawn} | {p50 * 1e3:.1f} ms | {p99 * 1e3:.1f} ms | {worst * 1e3:.1f} ms |")
    ratio = statistics.median(results["fresh"]) / statistics.median(results["zygote"])
    print(f"\nwarm is {ratio:.1f}x faster at the median")
    print(f"command: .venv/bin/python scripts/bench_restart.py --trials {trials}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="5 trials (smoke test)")
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    trio.run(main_async, 5 if args.quick else args.trials)


if __name__ == "__main__":
    main()
