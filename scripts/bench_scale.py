#!/usr/bin/env python3
"""One host, many shards: memory (row 5) and scale (row 7), with a real supervisor process.

    .venv/bin/python scripts/bench_scale.py [--quick] [--part memory|scale|all]
                                            [--server moto|dynalite]

Memory (--part memory: out/bench/memory.json): one supervisor (``python -m supervisor run``)
per spawn mode (zygote = warm, fresh), over a DynamoDB server and a reference feed process on
127.0.0.1; one stream per shard at 2 msg/s. It starts with 8 shards and grows to 32 and 64,
8 shards at a time, by rewriting its file and sending SIGHUP; at each size, once every stream
has written and 3 s more have passed, it reads the supervisor's RSS and PSS, each child's PSS
(``/proc/<pid>/smaps_rollup``, the code of scripts/bench_spawn.py) and the zygote's PSS
(shared by every warm child).

Scale (--part scale: out/bench/scale.json): 64 shards x 4 streams (256 WebSocket connections,
10 msg/s each) on one supervisor at its defaults (warm spawn, lease 10 s): from the
supervisor's start until every stream's first record, and its CPU (utime + stime from
``/proc/<pid>/stat``) over 20 s at steady state. --part all (the default) writes both into
out/bench/scale.json. Work files under out/bench/scale/.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_peers import bench_env, interruptible, summary, write_json  # noqa: E402
from bench_restart import worker_pids  # noqa: E402
from bench_spawn import _pss_kib  # noqa: E402
from helpers.servers import ServerProcess, start_dynalite, start_moto_server  # noqa: E402

WORK = ROOT / "out" / "bench" / "scale"
FEED_RATE = 10.0  # msg/s per stream (scale)
MEMORY_RATE = 2.0  # msg/s per stream (memory: a light load, so that it can run beside others)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def zygote_pids(supervisor: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == supervisor and b"zygote" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def start_feed(log: Path, rate: float) -> tuple[subprocess.Popen[bytes], str]:
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, __file__, "_feed", str(rate)],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    assert proc.stdout is not None
    port = int(proc.stdout.readline() or 0)
    if not port:
        raise RuntimeError(f"the feed did not start: see {log}")
    return proc, f"ws://127.0.0.1:{port}/feed"


def feed_main(rate: float) -> None:
    import trio

    from supervisor.devtools.feed import FeedServer

    async def serve() -> None:
        feed = FeedServer(rate)
        async with trio.open_nursery() as nursery:
            print(await nursery.start(feed.serve, "127.0.0.1", 0), flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve)


class Host:
    """One supervisor process and its config file, sink directory and log."""

    def __init__(self, name: str, server: str, feed: str, spawn: str) -> None:
        self.name, self.server, self.feed, self.spawn = name, server, feed, spawn
        self.workdir = WORK / name
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        self.table = "scale-" + uuid.uuid4().hex[:8]
        self.streams: dict[str, list[str]] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_wall = 0.0

    def write_config(self, shards: int, streams_per_shard: int) -> None:
        self.streams = {
            f"{self.name}-{i}": [f"{self.name}-{i}-{j}" for j in range(streams_per_shard)]
            for i in range(shards)
        }
        lines = [
            f'[worker]\nid = "{self.name}"',
            f'[dynamodb]\ntable = "{self.table}"\nendpoint_url = "{self.server}"',
            f'[supervisor]\nspawn = "{self.spawn}"',
            '[sink]\npath = "out/{shard}/{stream}.{epoch}.jsonl"',
            '[log]\nlevel = "warning"',
            '[http]\nlisten = ""',
        ]
        for shard, streams in self.streams.items():
            lines.append(f'[[shards]]\nid = "{shard}"')
            for stream in streams:
                url = f"{self.feed}/{stream}?after={{after}}"
                lines.append(f'[[shards.streams]]\nid = "{stream}"\nurl = "{url}"')
                lines.append('sequence = "seq"')
        (self.workdir / "host.toml").write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        log = (self.workdir / "host.log").open("ab")
        self.started_wall = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "run", "-c", str(self.workdir / "host.toml")],
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env={**os.environ, **bench_env()},
            start_new_session=True,
        )
        log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def reload(self) -> None:
        os.kill(self.pid, signal.SIGHUP)

    def first_records(self) -> dict[str, float]:
        """stream -> ts of its first record written (streams without one are left out)."""
        found = {}
        for shard, streams in self.streams.items():
            for stream in streams:
                for path in sorted((self.workdir / "out" / shard).glob(f"{stream}.*.jsonl")):
                    with contextlib.suppress(OSError, ValueError, KeyError), path.open("rb") as fh:
                        line = fh.readline()
                        if line.endswith(b"\n"):
                            found[stream] = float(json.loads(line)["ts"])
                            break
        return found

    def wait_flowing(self, timeout: float) -> dict[str, float]:
        wanted = sum(len(s) for s in self.streams.values())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: see its log")
            first = self.first_records()
            if len(first) == wanted and len(worker_pids(self.pid)) == len(self.streams):
                return first
            time.sleep(0.1)
        raise TimeoutError(
            f"{self.name}: {len(self.first_records())}/{wanted} streams flowing, "
            f"{len(worker_pids(self.pid))} children after {timeout:g} s"
        )

    def memory(self) -> dict[str, Any]:
        children = worker_pids(self.pid)
        zygotes = zygote_pids(self.pid)
        child_pss = [_pss_kib(pid) / 1024 for pid in children]
        zygote_pss = sum(_pss_kib(pid) for pid in zygotes) / 1024
        sup_pss = _pss_kib(self.pid) / 1024
        return {
            "shards": len(self.streams),
            "children": len(children),
            "supervisor_rss_mib": rss_kib(self.pid) / 1024,
            "supervisor_pss_mib": sup_pss,
            "zygote_pss_mib": zygote_pss,
            "child_pss_mib": summary(child_pss),
            "child_pss_mean_mib": sum(child_pss) / len(child_pss) if child_pss else 0.0,
            "per_shard_with_zygote_mib": (sum(child_pss) + zygote_pss) / max(1, len(children)),
            "host_total_pss_mib": sup_pss + zygote_pss + sum(child_pss),
        }

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # nothing of the group may outlive the run
        shutil.rmtree(self.workdir / "out", ignore_errors=True)


GROWTH_STEP = 8  # shards added per SIGHUP: a supervisor spawning dozens of fresh children at
# once on a busy 2-core machine can see one take over 10 s to say hello, which ends the whole
# supervisor (supervisor/drivers/shard_runner.py's HELLO_TIMEOUT is not caught): grow in steps.


def memory_run(
    server: str, feed: str, spawn: str, counts: list[int], settle: float = 3.0
) -> list[dict[str, Any]]:
    host = Host(f"mem-{spawn}", server, feed, spawn)
    rows = []
    try:
        size = 0
        for count in counts:
            grown = time.monotonic()
            while size < count:
                size = min(count, size + GROWTH_STEP)
                host.write_config(size, 1)
                if host.proc is None:
                    host.start()
                else:
                    host.reload()
                host.wait_flowing(timeout=60 + size)
            ready_s = time.monotonic() - grown
            time.sleep(settle)  # past the first checkpoints: the working set in steady state
            row = host.memory()
            row["spawn"] = spawn
            row["ready_s"] = ready_s
            row["how"] = "cold start" if count == counts[0] else "grown by SIGHUP"
            row["settle_s"] = settle
            rows.append(row)
            print(
                f"  {spawn} {count} shards: supervisor RSS {row['supervisor_rss_mib']:.1f} MiB, "
                f"child PSS {row['child_pss_mean_mib']:.1f} MiB (zygote "
                f"{row['zygote_pss_mib']:.1f})",
                flush=True,
            )
    finally:
        host.stop()
    return rows


def scale_run(
    server: str, feed: str, shards: int, streams: int, window: float, settle: float = 5.0
) -> dict[str, Any]:
    host = Host("scale", server, feed, "zygote")
    host.write_config(shards, streams)
    try:
        host.start()
        first = host.wait_flowing(timeout=120)
        flowing_wall = time.time()
        delays = [ts - host.started_wall for ts in first.values()]
        time.sleep(settle)  # past the start-up: first checkpoints and reconcile rounds
        c0, t0 = cpu_seconds(host.pid), time.monotonic()
        kids0 = {pid: cpu_seconds(pid) for pid in worker_pids(host.pid)}
        time.sleep(window)
        c1, t1 = cpu_seconds(host.pid), time.monotonic()
        kids1 = {pid: cpu_seconds(pid) for pid in kids0 if Path(f"/proc/{pid}").exists()}
        child_cpu = [(kids1[p] - kids0[p]) / (t1 - t0) * 100 for p in kids1]
        memory = host.memory()
    finally:
        host.stop()
    return {
        "shards": shards,
        "streams_per_shard": streams,
        "streams": shards * streams,
        "feed_rate_per_stream": FEED_RATE,
        "start_to_all_flowing_s": max(delays),
        "start_to_stream_flowing": summary(delays),
        "detected_after_start_s": flowing_wall - host.started_wall,
        "cpu_window_s": t1 - t0,
        "supervisor_cpu_percent": (c1 - c0) / (t1 - t0) * 100,
        "child_cpu_percent": summary(child_cpu),
        "memory": memory,
    }


def main() -> None:
    if sys.argv[1:2] == ["_feed"]:
        feed_main(float(sys.argv[2]))
        return
    interruptible()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test (a few seconds)")
    parser.add_argument("--server", choices=("moto", "dynalite"), default="moto")
    parser.add_argument("--cpu-window", type=float, default=0.0)
    parser.add_argument(
        "--part", choices=("memory", "scale", "all"), default="all", help="out/bench/<part>.json"
    )
    args = parser.parse_args()
    counts = [1, 2] if args.quick else [8, 32, 64]
    shards, streams = (2, 2) if args.quick else (64, 4)
    window = args.cpu_window or (1.0 if args.quick else 20.0)
    os.environ.update({k: v for k, v in bench_env().items() if k.startswith("AWS_")})
    WORK.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    server: ServerProcess = start_moto_server() if args.server == "moto" else start_dynalite()
    rate = MEMORY_RATE if args.part == "memory" else FEED_RATE
    feed_proc, feed = start_feed(WORK / f"feed-{args.part}.log", rate)
    results: dict[str, Any] = {"quick": args.quick, "server": args.server}
    try:
        memory = args.part in ("memory", "all")
        scale = args.part in ("scale", "all")
        if args.quick:  # a smoke test: the hosts side by side, figures meaningless
            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                jobs = {
                    spawn: pool.submit(memory_run, server.url, feed, spawn, counts, 0.5)
                    for spawn in (("zygote", "fresh") if memory else ())
                }
                if scale:
                    scaled = pool.submit(scale_run, server.url, feed, shards, streams, window, 0.5)
                    results["scale"] = scaled.result()
                if memory:
                    results["memory"] = {spawn: job.result() for spawn, job in jobs.items()}
        else:
            if memory:
                print("bench_scale: memory, warm and fresh", flush=True)
                results["memory"] = {
                    spawn: memory_run(server.url, feed, spawn, counts)
                    for spawn in ("zygote", "fresh")
                }
            if scale:
                print(f"bench_scale: {shards} shards x {streams} streams on one host", flush=True)
                results["scale"] = scale_run(server.url, feed, shards, streams, window)
        if scale:
            s = results["scale"]
            print(
                f"  all {s['streams']} streams flowing {s['start_to_all_flowing_s']:.2f} s "
                f"after start; supervisor CPU {s['supervisor_cpu_percent']:.1f} % over "
                f"{window:g} s",
                flush=True,
            )
    finally:
        feed_proc.terminate()
        feed_proc.wait(timeout=10)
        server.stop()
    results["settings"] = {
        "feed_rate_per_stream": rate,
        "server": args.server,
        "memory_counts": counts,
        "lease": "defaults (10 s / 2 s / 2 s)",
        "checkpoint_interval": "1 s (default)",
    }
    results["machine"] = {"nproc": os.cpu_count(), "python": platform.python_version()}
    results["command"] = " ".join(["scripts/bench_scale.py", *sys.argv[1:]])
    results["elapsed_s"] = time.monotonic() - started
    path = write_json("scale" if args.part == "all" else args.part, results)
    print(f"  -> {path.relative_to(ROOT)} ({results['elapsed_s']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
