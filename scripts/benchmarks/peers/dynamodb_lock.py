"""Row 1's peer: python-dynamodb-lock's takeover after a SIGKILL of the lock's holder.

Per trial a holder process acquires a lock and heartbeats; a waiting client (a thread of one
waiter process) polls every heartbeat period, the library's default retry period; the holder is
SIGKILLed at a random phase of its heartbeat; the figure is kill -> the waiter's ``acquire_lock``
returned. Lease 3 s / heartbeat 1 s and 10 s / 2 s, as shardvisor's rows; trials in batches side
by side, each on its own lock key. The peer runs under its own virtualenv
(``benchmarks.peers.lock_client``); ``benchmarks.fleet`` runs this beside shardvisor's fleets.

    python -m benchmarks.peers.dynamodb_lock [--quick] [--trials N] [--server moto|dynalite]

writes out/bench/peers_lock.json (the peer alone: for development).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import signal
import subprocess
import threading
import time
from typing import Any

import boto3
import trio

from benchmarks import harness
from benchmarks.stats import summary
from supervisor.devtools.servers import start_dynamodb

SETTINGS = {"3s": (3.0, 1.0), "10s": (10.0, 2.0)}  # lease duration, heartbeat
CLIENT = ("-m", "benchmarks.peers.lock_client")


class LineReader:
    """JSON lines of a child's stdout, read by a thread into a queue."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.lines.put(json.loads(line))

    def get(self, timeout: float) -> dict[str, Any]:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no line from pid {self.proc.pid} in {timeout:g} s") from None


def create_table(endpoint: str, table: str) -> None:
    """python-dynamodb-lock's schema (its create_dynamodb_table also calls UpdateTimeToLive,
    which dynalite lacks, so the table is made here)."""
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    client.create_table(
        TableName=table,
        KeySchema=[
            {"AttributeName": "lock_key", "KeyType": "HASH"},
            {"AttributeName": "sort_key", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "lock_key", "AttributeType": "S"},
            {"AttributeName": "sort_key", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 0.2})


def batch(
    endpoint: str, setting: str, keys: list[str], rng: random.Random, env: dict[str, str]
) -> list[dict[str, Any]]:
    """One batch of trials side by side: a holder process per key, one waiter process."""
    lease, heartbeat = SETTINGS[setting]
    python = str(harness.peer_python(harness.LOCK_VENV))
    piped = {"stdout": subprocess.PIPE, "text": True, "env": env}
    waiter = harness.spawn(
        [python, *CLIENT, "waiter", endpoint, str(lease), str(heartbeat)],
        stdin=subprocess.PIPE,
        **piped,
    )
    holders: dict[str, subprocess.Popen[str]] = {}
    try:
        readers = {}
        for key in keys:  # staggered: each start imports boto3 (CPU)
            argv = [python, *CLIENT, "holder", endpoint, key, str(lease), str(heartbeat)]
            holders[key] = harness.spawn(argv, stdin=subprocess.DEVNULL, **piped)
            readers[key] = LineReader(holders[key])
            time.sleep(0.3)
        for key in keys:
            readers[key].get(timeout=60)  # {"held": key}
        return _kill_and_wait(holders, waiter, keys, rng, lease, heartbeat)
    finally:
        for proc in holders.values():
            harness.stop_process(proc, signal.SIGKILL)
        if waiter.stdin:
            with contextlib.suppress(OSError):
                waiter.stdin.close()
        harness.stop_process(waiter, signal.SIGKILL)


def _kill_and_wait(
    holders: dict[str, subprocess.Popen[str]],
    waiter: subprocess.Popen[str],
    keys: list[str],
    rng: random.Random,
    lease: float,
    heartbeat: float,
) -> list[dict[str, Any]]:
    wait_reader = LineReader(waiter)
    assert waiter.stdin is not None
    waiting_since: dict[str, float] = {}
    done: dict[str, dict[str, Any]] = {}
    waiter.stdin.write("".join(key + "\n" for key in keys))
    waiter.stdin.flush()
    while len(waiting_since) < len(keys):
        line = wait_reader.get(timeout=60)
        if "waiting" in line:
            waiting_since[line["waiting"]] = line["t"]
        elif name := line.get("acquired") or line.get("failed"):
            done[name] = line  # (acquired before the kill: an error, reported below)
    # The waiter has seen several heartbeats; each holder dies at a random phase of its own.
    plan = sorted(
        (waiting_since[k] + 2.5 * heartbeat + rng.uniform(0.0, heartbeat), k) for k in keys
    )
    killed: dict[str, float] = {}
    for at, key in plan:
        time.sleep(max(0.0, at - time.time()))
        killed[key] = time.time()
        holders[key].send_signal(signal.SIGKILL)
    for proc in holders.values():
        proc.wait()
    deadline = time.time() + 4 * lease + 10 * heartbeat + 10
    while len(done) < len(keys) and time.time() < deadline:
        with contextlib.suppress(TimeoutError):
            line = wait_reader.get(timeout=max(0.1, deadline - time.time()))
            if name := line.get("acquired") or line.get("failed"):
                done[name] = line
    results = []
    for key in keys:
        line = done.get(key, {"error": "no acquisition before the deadline"})
        sample: dict[str, Any] = {"key": key, "killed_wall": killed[key]}
        if "acquired" in line and line["t"] < killed[key]:
            sample["error"] = "acquired while the holder was alive"
        elif "acquired" in line:
            sample["takeover_s"] = line["t"] - killed[key]
            sample["watched_before_kill_s"] = killed[key] - waiting_since[key]
        else:
            sample["error"] = line.get("error", "?")
        results.append(sample)
    return results


def measure(url: str, server: str, trials: int, parallel: int, settings: list[str]) -> dict:
    """The peer's takeover at each setting, on the DynamoDB server at ``url``."""
    parallel = max(1, min(parallel, trials))
    env = harness.benchmarks_env()
    rng = random.Random(20240601)
    t0 = time.monotonic()
    found = []
    for setting in settings:
        lease, heartbeat = SETTINGS[setting]
        table = f"locks-{setting}-{os.getpid()}-{int(time.time())}"
        create_table(url, table)
        env["BENCH_LOCK_TABLE"] = table
        samples: list[dict[str, Any]] = []
        started = time.monotonic()
        for first in range(0, trials, parallel):
            keys = [f"k{i}" for i in range(first, min(trials, first + parallel))]
            samples += batch(url, setting, keys, rng, env)
            print(f"  python-dynamodb-lock {setting}: {len(samples)}/{trials} trials", flush=True)
        ok = [s["takeover_s"] for s in samples if "takeover_s" in s]
        found.append(
            {
                "setting": setting,
                "lease_duration_s": lease,
                "heartbeat_s": heartbeat,
                "retry_period_s": heartbeat,
                "safe_period_s": lease * 0.8,
                "trials": trials,
                "trials_ok": len(ok),
                "trials_failed": len(samples) - len(ok),
                "side_by_side": parallel,
                "takeover": summary(ok),
                "samples": samples,
                "elapsed_s": time.monotonic() - started,
            }
        )
    return {
        "peer": "python-dynamodb-lock",
        "version": harness.version("python-dynamodb-lock", harness.LOCK_VENV / "bin" / "python"),
        "server": server,
        "measure": "SIGKILL of the holder process -> a waiting client's acquire_lock returned",
        "settings": found,
        "elapsed_s": time.monotonic() - t0,
    }


async def beside(url: str, server: str, trials: int, parallel: int, settings: list[str]) -> dict:
    """``measure`` in a thread (its processes ended by ``harness.end_spawned`` if cancelled)."""
    return await trio.to_thread.run_sync(
        measure, url, server, trials, parallel, settings, abandon_on_cancel=True
    )


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--parallel", type=int, default=10, help="trials side by side")
    args = parser.parse_args()
    harness.interruptible()
    harness.use_local_aws()
    trials = args.trials or (1 if args.quick else 20)
    settings = ["3s"] if args.quick else list(SETTINGS)
    with harness.recorded("peers_lock", args.quick) as results, start_dynamodb(args.server) as db:
        try:
            results.update(measure(db.url, args.server, trials, args.parallel, settings))
        finally:
            harness.end_spawned()


if __name__ == "__main__":
    main()
