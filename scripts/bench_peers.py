#!/usr/bin/env python3
"""shardvisor's fleet, restart and throughput rows, and the peers measured beside them.

    .venv/bin/python scripts/bench_peers.py PART [--quick] [--trials N] [--server moto|dynalite]

PART is one of (scripts/bench.sh runs them; each writes out/bench/<json>):

fleet (rows 1, 2; fleet.json, peers_lock.json, peers_supervisord.json): scripts/bench_fleet.py's
    failover and hand-off measurements (its code, imported) in three lanes side by side, with
    the timer-bound peers in the third lane:
    - python-dynamodb-lock (PyPI, its own virtualenv out/bench/venv-dynamodb-lock) on a moto
      server like the fleet's (--quick: then on dynalite too). Per trial a holder process
      acquires a lock and heartbeats; a waiting client (a thread of one waiter process) polls
      every heartbeat period, the library's default retry period; the holder is SIGKILLed at a
      random phase of its heartbeat; the figure is kill -> the waiter's ``acquire_lock``
      returned. Lease 3 s / heartbeat 1 s and 10 s / 2 s, as shardvisor's rows; trials in
      batches side by side, each on its own lock key.
    - supervisord (PyPI, its own virtualenv out/bench/venv-supervisord: its import name is
      ``supervisor`` too) restarting a crashing program (a generated supervisord.conf, unix
      socket under out/bench, no inet server; startsecs=0, autorestart=true): the program
      stamps its start, imports trio and trio-websocket (what a shard worker starts with),
      prints its first line, runs a while, stamps its crash and ``os._exit(1)``s.
    - the full run also measures row 5 there (scripts/bench_scale.py --part memory, on
      dynalite: memory.json), its figures being independent of timing.
requests (row 6; requests.json): bench_fleet.py's DynamoDB requests per worker-minute, counted
    on the wire, at 1, 16 and 64 shards on one worker.
restart (row 3; restart.json): shardvisor's child crash -> first record written again, warm and
    fresh (scripts/bench_restart.py's code, imported; raw samples kept).
throughput (row 4; throughput.json): messages/s of 100-byte messages into a real shard worker
    child writing the jsonl sink and handing batches to a no-op handler (scripts/
    bench_throughput.py's code and feed, imported), beside a bare trio-websocket loop (the
    ceiling of our stack) and a bare ``websockets`` (asyncio) loop, runs interleaved.
lock, supervisord: the peers alone (for development).

Only the standard library is imported at the top: the helper commands (``_lock_holder``,
``_lock_waiter``, ``_blast``, ``_ws_trio``, ``_ws_websockets``) run under the peers' own
virtualenvs.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import hashlib
import json
import math
import os
import platform
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "out" / "bench"
LOCK_VENV = OUT / "venv-dynamodb-lock"
SUPERVISORD_VENV = OUT / "venv-supervisord"
MAIN_PYTHON = ROOT / ".venv" / "bin" / "python"
LOCK_SETTINGS = {"3s": (3.0, 1.0), "10s": (10.0, 2.0)}  # lease duration, heartbeat
REQUEST_SHARDS = (1, 16, 64)
MESSAGE_BYTES = 100
SPAWNED: list[subprocess.Popen[Any]] = []  # peer processes, all killed when a part ends


def interruptible() -> None:
    """SIGTERM acts like Ctrl-C (KeyboardInterrupt), so every ``finally`` stops what it
    started; SIGINT too when started in the background by a shell (which ignores it there)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))


def kill_spawned() -> None:
    """SIGTERM (supervisord then stops its program), then SIGKILL after 5 s."""
    for proc in SPAWNED:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + 5
    for proc in SPAWNED:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    SPAWNED.clear()


# --- small helpers (shared with bench_scale.py and bench_report.py) ------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest rank, as scripts/bench_fleet.py: with fewer than 100 samples p99 is the max."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
    }


def write_json(name: str, data: dict[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=str))
    return path


def pip_version(python: Path, dist: str) -> str:
    found = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() or "?"


def venv_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{venv} is missing: run scripts/bench.sh (it creates the peer venvs)")
    return python


def bench_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"))
    }
    env.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        PYTHONUNBUFFERED="1",
    )
    return env


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


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- lock: python-dynamodb-lock, kill -9 of the holder -> a waiting client takes the lock -------


def lock_client(endpoint: str, lease: float, heartbeat: float) -> Any:
    """(Runs under the lock venv.) A DynamoDBLockClient with shardvisor's timers."""
    import logging

    import boto3
    from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockClient

    logging.getLogger("python_dynamodb_lock").setLevel(logging.ERROR)  # "lease has expired"

    resource = boto3.resource("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    return DynamoDBLockClient(
        resource,
        table_name=os.environ["BENCH_LOCK_TABLE"],
        heartbeat_period=datetime.timedelta(seconds=heartbeat),
        # "in danger" (app callback) this long without a heartbeat; shardvisor's owner stops
        # writing duration/5 before a peer may take over: the same point.
        safe_period=datetime.timedelta(seconds=lease * 0.8),
        lease_duration=datetime.timedelta(seconds=lease),
    )


def lock_holder_main(argv: list[str]) -> None:
    """``_lock_holder ENDPOINT KEY LEASE HEARTBEAT``: acquire, say so, heartbeat until killed."""
    endpoint, key, lease, heartbeat = argv[0], argv[1], float(argv[2]), float(argv[3])
    client = lock_client(endpoint, lease, heartbeat)
    hb = datetime.timedelta(seconds=heartbeat)
    client.acquire_lock(key, retry_period=hb, retry_timeout=hb * 20)
    print(json.dumps({"held": key, "t": time.time()}), flush=True)
    while True:
        time.sleep(3600)


def lock_waiter_main(argv: list[str]) -> None:
    """``_lock_waiter ENDPOINT LEASE HEARTBEAT``: for each key read on stdin, a thread waits
    for it with ``acquire_lock`` (retry period = heartbeat, the library's default)."""
    endpoint, lease, heartbeat = argv[0], float(argv[1]), float(argv[2])
    client = lock_client(endpoint, lease, heartbeat)
    hb = datetime.timedelta(seconds=heartbeat)
    out = threading.Lock()

    def say(**fields: Any) -> None:
        with out:
            print(json.dumps(fields), flush=True)

    def wait(key: str) -> None:
        say(waiting=key, t=time.time())
        try:
            timeout = datetime.timedelta(seconds=heartbeat * 60 + lease * 4)
            client.acquire_lock(key, retry_period=hb, retry_timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
            say(failed=key, error=repr(exc), t=time.time())
            return
        say(acquired=key, t=time.time())

    for line in sys.stdin:
        if line.strip():
            threading.Thread(target=wait, args=(line.strip(),), daemon=True).start()
    os._exit(0)  # the client's heartbeat threads are not daemons


def create_lock_table(endpoint: str, table: str) -> None:
    """python-dynamodb-lock's schema (its create_dynamodb_table also calls UpdateTimeToLive,
    which dynalite lacks, so the table is made here)."""
    import boto3

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


def lock_batch(
    endpoint: str, setting: str, keys: list[str], rng: random.Random, env: dict[str, str]
) -> list[dict[str, Any]]:
    """One batch of trials side by side: a holder process per key, one waiter process."""
    lease, heartbeat = LOCK_SETTINGS[setting]
    python = str(venv_python(LOCK_VENV))
    me = str(Path(__file__).resolve())
    holders: dict[str, subprocess.Popen[str]] = {}
    waiter = subprocess.Popen(
        [python, me, "_lock_waiter", endpoint, str(lease), str(heartbeat)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    SPAWNED.append(waiter)
    results: list[dict[str, Any]] = []
    try:
        readers = {}
        for key in keys:  # staggered: each start imports boto3 (CPU)
            holders[key] = subprocess.Popen(
                [python, me, "_lock_holder", endpoint, key, str(lease), str(heartbeat)],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
            )
            SPAWNED.append(holders[key])
            readers[key] = LineReader(holders[key])
            time.sleep(0.3)
        for key in keys:
            readers[key].get(timeout=60)  # {"held": key}
        wait_reader = LineReader(waiter)
        assert waiter.stdin is not None
        waiting_since: dict[str, float] = {}
        done: dict[str, dict[str, Any]] = {}
        for key in keys:
            waiter.stdin.write(key + "\n")
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
                key = line.get("acquired") or line.get("failed")
                if key:
                    done[key] = line
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
    finally:
        for proc in holders.values():
            stop(proc, signal.SIGKILL)
        if waiter.stdin:
            with contextlib.suppress(OSError):
                waiter.stdin.close()
        stop(waiter, signal.SIGKILL)
    return results


def lock_measure(
    url: str, server: str, trials: int, parallel: int, settings: list[str]
) -> dict[str, Any]:
    """python-dynamodb-lock's takeover at each setting, on the DynamoDB server at ``url``."""
    parallel = max(1, min(parallel, trials))
    env = bench_env()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        os.environ.setdefault(name, env[name])
    rng = random.Random(20240601)
    t0 = time.monotonic()
    found = []
    for setting in settings:
        lease, heartbeat = LOCK_SETTINGS[setting]
        table = f"locks-{setting}-{os.getpid()}-{int(time.time())}"
        create_lock_table(url, table)
        env["BENCH_LOCK_TABLE"] = table
        samples: list[dict[str, Any]] = []
        started = time.monotonic()
        for first in range(0, trials, parallel):
            keys = [f"k{i}" for i in range(first, min(trials, first + parallel))]
            samples += lock_batch(url, setting, keys, rng, env)
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
        "version": pip_version(venv_python(LOCK_VENV), "python-dynamodb-lock"),
        "server": server,
        "measure": "SIGKILL of the holder process -> a waiting client's acquire_lock returned",
        "settings": found,
        "elapsed_s": time.monotonic() - t0,
    }


def run_lock(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.servers import start_dynalite, start_moto_server

    server = start_moto_server() if args.server == "moto" else start_dynalite()
    try:
        trials = args.trials or (1 if args.quick else 20)
        settings = ["3s"] if args.quick else list(LOCK_SETTINGS)
        result = lock_measure(server.url, args.server, trials, args.parallel, settings)
    finally:
        server.stop()
    result["quick"] = args.quick
    return result


# --- fleet: scripts/bench_fleet.py's measurements in parallel lanes, the lock peer beside them ---


def cpu_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


@contextlib.contextmanager
def fleet_session(name: str, quick: bool) -> Any:
    """scripts/bench_fleet.py imported, its environment set as its main() sets it, holding its
    lock file (out/bench_fleet.lock: a bench_fleet.py run and this one never overlap), and
    everything it started ended on the way out. Yields (module, results dict)."""
    import fcntl
    import shutil

    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_fleet as bf

    for var in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_DYNAMODB",
    ):
        os.environ.pop(var, None)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    (ROOT / "out").mkdir(exist_ok=True)
    with (ROOT / "out" / "bench_fleet.lock").open("w") as lock_file:
        # A smoke run's figures mean nothing: it never waits (work directories are per process).
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quick:
                print("  a bench_fleet.py run holds out/bench_fleet.lock: waiting", flush=True)
                fcntl.flock(lock_file, fcntl.LOCK_EX)
        bf.WORK.mkdir(parents=True, exist_ok=True)
        results: dict[str, Any] = {
            "command": f"scripts/bench_peers.py {name}" + (" --quick" if quick else ""),
            "machine": bf.machine(),
            "quick": quick,
            "workdir": str(bf.WORK.relative_to(ROOT)),
            "busy_at_start": bf.busy_with_tests(),
            "git": bf.git_state(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        busy0, t0 = cpu_busy(), time.monotonic()
        try:
            yield bf, results
        finally:
            kill_spawned()
            bf.REAPER.cleanup()
            for sink in bf.WORK.glob("*/out"):
                shutil.rmtree(sink, ignore_errors=True)
        busy1 = cpu_busy()
        results["elapsed_s"] = time.monotonic() - t0
        results["machine_cpu_busy_percent"] = (
            100.0 * (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])
        )
        results["busy_at_end"] = bf.busy_with_tests()
        results["errors"] = list(getattr(bf, "ERRORS", []))


def run_fleet(args: argparse.Namespace) -> dict[str, Any]:
    """Rows 1 and 2 with scripts/bench_fleet.py's own code (imported), and the timer-bound
    peers beside them: python-dynamodb-lock (on moto's server, then on dynalite) and
    supervisord. Three lanes side by side, so that the whole benchmark fits 10 minutes
    (bench_fleet.py alone runs its parts in stages: about 9.5 minutes); each figure is
    dominated by lease timers, not CPU. Writes out/bench/fleet.json (bench_fleet.py's schema),
    peers_lock.json and peers_supervisord.json."""
    import trio

    quick = args.quick
    trials = args.trials or (1 if quick else 20)
    lock: dict[str, Any] = {}
    with fleet_session("fleet", quick) as (bf, results):
        results.update(server=args.server, failover=[])

        def failover(mode: str, setting: str, url: str):
            async def job() -> None:
                results["failover"].append(await bf.failover_fleet(mode, setting, trials, url))

            return job

        def handoff(url: str, count: int):
            async def job() -> None:
                results["handoff"] = await bf.handoff_fleet(count, url)

            return job

        def supervisord_lane():
            async def job() -> None:
                found = await trio.to_thread.run_sync(
                    run_supervisord_part, args, abandon_on_cancel=True
                )
                found["side_by_side_with"] = "the fleet stage (timer-bound parts of the same run)"
                write_json("peers_supervisord", found)

            return job

        def lock_lane(url: str, settings: list[str], other: bool):
            """The peer on a server like the fleet's; with ``other``, then on the other kind
            too (moto's and dynalite: how little the server matters)."""

            async def job() -> None:
                found = await trio.to_thread.run_sync(
                    lock_measure,
                    url,
                    args.server,
                    trials,
                    args.parallel,
                    settings,
                    abandon_on_cancel=True,  # its processes are killed by kill_spawned()
                )
                lock.update(found)
                if not other:
                    return
                kind = "dynalite" if args.server == "moto" else "moto"
                (second,) = await bf.start_servers(kind, 1)
                found = await trio.to_thread.run_sync(
                    lock_measure,
                    second.url,
                    kind,
                    trials,
                    args.parallel,
                    settings,
                    abandon_on_cancel=True,
                )
                lock["other_servers"] = {kind: found["settings"]}

            return job

        def memory_lane():
            """Row 5 (scripts/bench_scale.py --part memory, on dynalite): memory figures do not
            depend on timing, and its feed is light, so it runs here rather than alone."""

            async def job() -> None:
                argv = [sys.executable, str(ROOT / "scripts" / "bench_scale.py")]
                argv += ["--part", "memory", "--server", "dynalite"]
                with (OUT / "memory.log").open("wb") as log:
                    await trio.run_process(argv, stdout=log, stderr=subprocess.STDOUT)

            return job

        async def go() -> None:
            if quick:  # a smoke test: each code path once
                s = await bf.start_servers(args.server, 2)
                lanes = [
                    [failover("host", "3s", s[0].url), handoff(s[0].url, 1)],
                    [lock_lane(s[1].url, ["3s"], other=True), supervisord_lane()],
                ]
            else:
                s = await bf.start_servers(args.server, 4)
                lanes = [  # about equally long: 5.5 minutes on 2 cores
                    [failover("host", "10s", s[0].url)],
                    [
                        failover("host", "3s", s[1].url),
                        failover("supervisor", "3s", s[1].url),
                        supervisord_lane(),
                    ],
                    [
                        handoff(s[2].url, max(20, trials)),
                        memory_lane(),
                        failover("supervisor", "10s", s[2].url),
                        lock_lane(s[3].url, list(LOCK_SETTINGS), other=False),
                    ],
                ]
            print(f"  {len(lanes)} lanes side by side", flush=True)
            await bf.run_lanes(lanes)

        trio.run(go)
        order = {("host", "3s"): 0, ("host", "10s"): 1, ("supervisor", "3s"): 2}
        results["failover"].sort(key=lambda r: order.get((r["mode"], r["setting"]), 3))
    if lock:
        lock["quick"] = quick
        lock["side_by_side_with"] = "shardvisor's fleet measurements (same run, own server)"
        lock["machine"] = {"nproc": os.cpu_count(), "python": platform.python_version()}
        lock["command"] = results["command"]
        write_json("peers_lock", lock)
    return results


def run_requests(args: argparse.Namespace) -> dict[str, Any]:
    """Row 6 with scripts/bench_fleet.py's code: one supervisor per shard count (1, 16, 64),
    each behind its own counting proxy and server, checkpoint every 1 s (the default), counted
    over 60 s of steady state. Writes out/bench/requests.json."""
    import trio

    quick = args.quick
    shards = [1] if quick else list(REQUEST_SHARDS)
    window = 5.0 if quick else 60.0
    with fleet_session("requests", quick) as (bf, results):
        results.update(server=args.server, window_s=window)

        async def go() -> None:
            servers = await bf.start_servers(args.server, len(shards))
            results["requests"] = await bf.request_configs(window, servers, [1.0], shards)

        trio.run(go)
        if results.get("requests"):
            results["cost"] = bf.cost_model(results["requests"])
    return results


# --- restart: shardvisor (bench_restart.py's code) and supervisord -----------------------------

CRASHER = """\
import os, sys, time
t_exec = time.time()
import trio, trio_websocket  # what a shard worker starts with
t_ready = time.time()
print("started", flush=True)  # its first output
with open(sys.argv[1], "a") as fh:
    fh.write(f"start {os.getpid()} {t_exec!r} {t_ready!r}\\n")
time.sleep(float(sys.argv[2]))
with open(sys.argv[1], "a") as fh:
    fh.write(f"crash {os.getpid()} {time.time()!r}\\n")
os._exit(1)
"""


def supervisord_conf(workdir: Path, stamps: Path, run_for: float) -> Path:
    crasher = workdir / "crasher.py"
    crasher.write_text(CRASHER)
    conf = workdir / "supervisord.conf"
    conf.write_text(
        f"""\
; generated by scripts/bench_peers.py: a unix socket only, no inet server
[unix_http_server]
file={workdir}/supervisor.sock
chmod=0700

[supervisord]
nodaemon=true
logfile={workdir}/supervisord.log
pidfile={workdir}/supervisord.pid
childlogdir={workdir}
loglevel=info

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{workdir}/supervisor.sock

[program:crasher]
command={MAIN_PYTHON} {crasher} {stamps} {run_for}
startsecs=0
autorestart=true
startretries=100000
stdout_logfile={workdir}/crasher.out
redirect_stderr=true
"""
    )
    return conf


def run_supervisord(trials: int, run_for: float = 0.5) -> dict[str, Any]:
    """Crash -> the restarted program's first statement and first output, ``trials`` times."""
    import shutil

    root = OUT / "supervisord"
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():  # earlier runs' directories (named by their process id)
        if old.is_dir() and old.name.isdigit() and not Path(f"/proc/{old.name}").exists():
            shutil.rmtree(old, ignore_errors=True)
    workdir = root / str(os.getpid())
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir()
    stamps = workdir / "stamps.txt"
    conf = supervisord_conf(workdir, stamps, run_for)
    proc = subprocess.Popen(
        [str(SUPERVISORD_VENV / "bin" / "supervisord"), "-n", "-c", str(conf)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=workdir,
    )
    SPAWNED.append(proc)
    started = time.monotonic()

    def parsed() -> tuple[list[tuple[float, float]], list[float]]:
        """Starts (first statement, first output) and crashes, in the file's order."""
        starts, crashes = [], []
        with contextlib.suppress(OSError):
            for line in stamps.read_text().splitlines():
                parts = line.split()
                if parts[:1] == ["start"] and len(parts) == 4:
                    starts.append((float(parts[2]), float(parts[3])))
                elif parts[:1] == ["crash"] and len(parts) == 3:
                    crashes.append(float(parts[2]))
        return starts, crashes

    try:
        deadline = started + 30 + trials * (run_for + 4)
        while time.monotonic() < deadline and proc.poll() is None:
            starts, _ = parsed()
            if len(starts) > trials:  # the first start is no restart
                break
            time.sleep(0.1)
    finally:
        stop(proc, signal.SIGTERM, timeout=15)
    starts, crashes = parsed()
    pairs = []
    for crash in crashes:  # each crash with the first start after it
        later = [start for start in starts if start[0] > crash]
        if later:
            pairs.append((crash, min(later)))
    exec_s, output_s = [], []
    for crash, (t_exec, t_ready) in pairs[:trials]:
        exec_s.append(t_exec - crash)
        output_s.append(t_ready - crash)
    return {
        "peer": "supervisord",
        "version": pip_version(SUPERVISORD_VENV / "bin" / "python", "supervisor"),
        "settings": {
            "startsecs": 0,
            "autorestart": True,
            "startretries": 100000,
            "run_for_s": run_for,
        },
        "program": "python: stamp, import trio + trio_websocket, print a line, sleep, crash",
        "trials": len(output_s),
        "crash_to_exec": summary(exec_s),
        "crash_to_first_output": summary(output_s),
        "samples": {"crash_to_exec_s": exec_s, "crash_to_first_output_s": output_s},
        "elapsed_s": time.monotonic() - started,
    }


def run_shardvisor_restart(trials: int, rate: float = 1000.0) -> dict[str, Any]:
    """scripts/bench_restart.py's measurement (imported), raw samples kept."""
    import tempfile

    import trio

    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT))
    import bench_restart

    from supervisor.devtools.feed import FeedServer
    from supervisor.devtools.local_dynamodb import LocalDynamoDB

    results: dict[str, list[float]] = {}

    async def go() -> None:
        server = LocalDynamoDB().start()
        feed = FeedServer(rate=rate, stream_names=["a"])
        try:
            with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
                async with trio.open_nursery() as nursery:
                    port = await nursery.start(feed.serve, "127.0.0.1", 0)
                    for spawn in ("zygote", "fresh"):
                        results[spawn] = await bench_restart.measure(
                            spawn, trials, Path(tmp), server.url, port
                        )
                    nursery.cancel_scope.cancel()
        finally:
            server.stop()

    started = time.monotonic()
    trio.run(go)
    return {
        "settings": {
            "feed_rate": rate,
            "restart_reset_after": "200ms",
            "checkpoint_interval": "50ms",
            "healthy_run_between_trials_s": 0.5,
        },
        "trials": trials,
        "warm": summary(results["zygote"]),
        "fresh": summary(results["fresh"]),
        "samples": results,
        "elapsed_s": time.monotonic() - started,
    }


def run_restart(args: argparse.Namespace) -> dict[str, Any]:
    """shardvisor's crash -> writing again, warm and fresh (CPU-bound: run on an idle machine)."""
    trials = args.trials or (2 if args.quick else 20)
    os.environ.update({k: v for k, v in bench_env().items() if k.startswith("AWS_")})
    t0 = time.monotonic()
    print(f"  shardvisor crash -> writing, warm and fresh, {trials} trials each", flush=True)
    shardvisor = run_shardvisor_restart(trials, rate=100.0 if args.quick else 1000.0)
    return {
        "quick": args.quick,
        "measure": "SIGKILL of the shard worker -> ts of the first record the restarted worker "
        "writes",
        "shardvisor": shardvisor,
        "elapsed_s": time.monotonic() - t0,
    }


def run_supervisord_part(args: argparse.Namespace) -> dict[str, Any]:
    """supervisord restarting a crashing program (its ~1 s is its main loop's tick, not CPU: the
    full run measures it in the fleet stage, beside the other timer-bound parts)."""
    trials = args.trials or (1 if args.quick else 20)
    venv_python(SUPERVISORD_VENV)
    print(f"  supervisord crash -> restarted, {trials} trials", flush=True)
    result = run_supervisord(trials, run_for=0.2 if args.quick else 0.5)
    result["quick"] = args.quick
    return result


# --- throughput: a child to the jsonl sink and to a no-op handler, and the bare client loops ----

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def blast_main(argv: list[str]) -> None:
    """``_blast``: (used only without scripts/bench_throughput.py) a WebSocket server on
    127.0.0.1 that sends each connection 100-byte text messages, pre-framed, as fast as the
    socket takes them, until the client leaves; prints its port."""
    payload = (b'{"seq":0,"pad":"' + b"x" * MESSAGE_BYTES)[: MESSAGE_BYTES - 2] + b'"}'
    chunk = (bytes([0x81, MESSAGE_BYTES]) + payload) * 512
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)

    def serve(conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                data = conn.recv(4096)
                if not data:
                    return
                request += data
            key = ""
            for line in request.decode("latin-1").split("\r\n"):
                name, _, value = line.partition(":")
                if name.strip().lower() == "sec-websocket-key":
                    key = value.strip()
            accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
            conn.sendall(
                (
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                    f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
                ).encode()
            )
            with contextlib.suppress(OSError):
                while True:
                    conn.sendall(chunk)

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def ws_trio_main(argv: list[str]) -> None:
    """``_ws_trio URL SECONDS``: (fallback) a bare trio-websocket receive loop; 1 s warm-up."""
    import trio
    from trio_websocket import open_websocket_url

    url, seconds = argv[0], float(argv[1])
    pin_self()

    async def go() -> None:
        async with open_websocket_url(url) as ws:
            end = trio.current_time() + 1.0
            while trio.current_time() < end:
                await ws.get_message()
            count, start, cpu = 0, trio.current_time(), time.process_time()
            while True:
                await ws.get_message()
                count += 1
                if not count & 255 and trio.current_time() >= start + seconds:
                    break
            elapsed, cpu = trio.current_time() - start, time.process_time() - cpu
            print(json.dumps({"messages": count, "seconds": elapsed, "cpu": cpu}), flush=True)
            os._exit(0)  # no close handshake: the feed does not answer it

    trio.run(go)


def ws_websockets_main(argv: list[str]) -> None:
    """``_ws_websockets URL SECONDS``: a bare ``websockets`` (asyncio) client loop, as a user
    would write it (defaults); 1 s warm-up, then messages counted for SECONDS."""
    import asyncio

    from websockets.asyncio.client import connect

    url, seconds = argv[0], float(argv[1])
    pin_self()

    async def go() -> None:
        loop = asyncio.get_running_loop()
        async with connect(url) as ws:
            warm_until = loop.time() + 1.0
            count, start = 0, 0.0
            async for _message in ws:
                if start == 0.0:
                    if loop.time() < warm_until:
                        continue
                    start, cpu = loop.time(), time.process_time()
                count += 1
                if not count & 255 and loop.time() >= start + seconds:
                    break
            elapsed, cpu = loop.time() - start, time.process_time() - cpu
            print(json.dumps({"messages": count, "seconds": elapsed, "cpu": cpu}), flush=True)
            os._exit(0)  # no close handshake: the feed does not answer it

    asyncio.run(go())


def pin_self() -> None:
    """On the CPU that BENCH_PIN_CPU names (bench_throughput.py pins its feed to one CPU and
    every receiver to the other: the peers' loops run where ours do)."""
    cpu = os.environ.get("BENCH_PIN_CPU", "")
    if cpu.isdigit() and int(cpu) < (os.cpu_count() or 1) and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(cpu)})


def client_rate(
    argv: list[str], url: str, seconds: float, pin: int | None = None
) -> tuple[float, float]:
    """(messages/s, CPU seconds per message) of a client loop run as a process."""
    env = {**os.environ, "BENCH_PIN_CPU": "" if pin is None else str(pin)}
    found = subprocess.run(
        [*argv, url, str(seconds)], capture_output=True, text=True, timeout=seconds + 60, env=env
    )
    lines = found.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{argv[-1]} failed: {found.stderr[-2000:]}")
    result = json.loads(lines[-1])
    return result["messages"] / result["seconds"], result["cpu"] / result["messages"]


def rate_and_cpu(found: Any) -> tuple[float, float | None]:
    """bench_throughput.py's loops answer messages/s, or (messages/s, CPU s per message)."""
    if isinstance(found, tuple | list):
        return float(found[0]), (float(found[1]) if len(found) > 1 else None)
    return float(found), None


def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Row 4, side by side in one run: a real shard worker child writing the jsonl sink and
    handing batches to a no-op handler (scripts/bench_throughput.py's code, imported), a bare
    trio-websocket loop (its ceiling) and a bare ``websockets`` loop, all from
    bench_throughput.py's feed process; rounds interleaved, ``runs`` of each."""
    import tempfile

    import trio

    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT))
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    runs = args.trials or (1 if args.quick else 3)
    me = str(Path(__file__).resolve())
    websockets_argv = [str(venv_python(SUPERVISORD_VENV)), me, "_ws_websockets"]
    rates: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}  # CPU microseconds per message
    errors: dict[str, str] = {}
    t0 = time.monotonic()
    bt: Any = None
    try:
        import bench_throughput
    except ImportError as exc:
        errors["shardvisor child"] = f"not measured: {exc}"
    else:
        missing = [
            n for n in ("Feed", "bare_loop", "child_rate") if not hasattr(bench_throughput, n)
        ]
        if missing:
            errors["shardvisor child"] = f"not measured: bench_throughput.py has no {missing}"
        else:
            bt = bench_throughput
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        out = Path(tmp)
        loops: dict[str, Any] = {}
        if bt is not None:
            from shard_worker.contract.pipe import SinkSpec

            def bare(url: str) -> float:
                return trio.run(bt.bare_loop, url, seconds)

            def child(sink: Any) -> Any:
                return lambda url: trio.run(bt.child_rate, url, sink, out, seconds)

            loops["bare trio-websocket"] = bare
            jsonl = SinkSpec(path=str(out / "{shard}" / "{stream}.{epoch}.jsonl"))
            loops["child → jsonl"] = child(jsonl)
            try:
                noop = SinkSpec(kind="handler", handler="bench_throughput:noop_handler")
                loops["child → no-op handler"] = child(noop)
            except (TypeError, ValueError) as exc:
                errors["child → no-op handler"] = f"not measured: {exc!r}"
            pin = getattr(bt, "LOOP_CPU", None)
            loops["bare websockets"] = lambda url: client_rate(
                websockets_argv, url.replace("{after}", "0"), seconds, pin
            )
            feed_kind = "scripts/bench_throughput.py's feed (raw frames after a wsproto handshake)"
        else:
            loops["bare trio-websocket"] = lambda url: client_rate(
                [str(MAIN_PYTHON), me, "_ws_trio"], url, seconds
            )
            loops["bare websockets"] = lambda url: client_rate(websockets_argv, url, seconds)
            feed_kind = "bench_peers.py's pre-framing socket server"
        for run in range(runs):
            for name, measure in loops.items():
                if name in errors:
                    continue
                try:
                    if bt is not None:
                        with bt.Feed() as feed:
                            rate, cpu = rate_and_cpu(measure(feed.url))
                    else:
                        rate, cpu = rate_and_cpu(blast_rate(measure))
                except Exception as exc:  # noqa: BLE001 - one loop failing is reported, not fatal
                    errors[name] = f"failed: {exc!r}"[:500]
                    continue
                rates.setdefault(name, []).append(rate)
                if cpu is not None:
                    cpus.setdefault(name, []).append(cpu * 1e6)
                print(f"  run {run + 1}/{runs}: {name} {rate:,.0f} msg/s", flush=True)
    versions = {
        "trio-websocket": pip_version(MAIN_PYTHON, "trio-websocket"),
        "websockets": pip_version(venv_python(SUPERVISORD_VENV), "websockets"),
    }
    return {
        "quick": args.quick,
        "message_bytes": MESSAGE_BYTES,
        "seconds_per_measurement": seconds,
        "warm_up_s": 1.0,
        "runs": runs,
        "feed": feed_kind,
        "versions": versions,
        "loops": {
            name: {
                "rate": summary(values),
                "samples": values,
                "cpu_us_per_message": summary(cpus.get(name, [])),
            }
            for name, values in rates.items()
        },
        "errors": errors,
        "elapsed_s": time.monotonic() - t0,
    }


def blast_rate(measure: Any) -> Any:
    server = subprocess.Popen(
        [str(MAIN_PYTHON), str(Path(__file__).resolve()), "_blast"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        return measure(f"ws://127.0.0.1:{int(server.stdout.readline())}/")
    finally:
        stop(server, signal.SIGKILL)


# --- main ----------------------------------------------------------------------------------------


def main() -> None:
    helpers = {
        "_lock_holder": lock_holder_main,
        "_lock_waiter": lock_waiter_main,
        "_blast": blast_main,
        "_ws_trio": ws_trio_main,
        "_ws_websockets": ws_websockets_main,
    }
    if sys.argv[1:2] and sys.argv[1] in helpers:
        helpers[sys.argv[1]](sys.argv[2:])
        return
    interruptible()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "part", choices=("fleet", "requests", "lock", "restart", "supervisord", "throughput", "all")
    )
    parser.add_argument("--quick", action="store_true", help="a smoke test (a few seconds each)")
    parser.add_argument("--trials", type=int, default=0)
    parser.add_argument("--server", choices=("moto", "dynalite"), default="moto")
    parser.add_argument("--parallel", type=int, default=10, help="lock trials side by side")
    parser.add_argument("--seconds", type=float, default=0.0, help="throughput: per run")
    args = parser.parse_args()
    machine = {"nproc": os.cpu_count(), "python": platform.python_version()}
    parts = {
        "fleet": ("fleet", run_fleet),
        "requests": ("requests", run_requests),
        "lock": ("peers_lock", run_lock),
        "restart": ("restart", run_restart),
        "supervisord": ("peers_supervisord", run_supervisord_part),
        "throughput": ("throughput", run_throughput),
    }
    chosen = ("fleet", "requests", "restart", "throughput") if args.part == "all" else (args.part,)
    for part in chosen:
        name, run = parts[part]
        print(f"bench_peers {part}", flush=True)
        try:
            result = run(args)
        finally:
            kill_spawned()
        result["machine"] = machine
        result["command"] = " ".join(["scripts/bench_peers.py", *sys.argv[1:]])
        path = write_json(name, result)
        print(f"  -> {path.relative_to(ROOT)} ({result['elapsed_s']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
