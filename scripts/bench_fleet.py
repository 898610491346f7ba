#!/usr/bin/env python3
"""Fleet benchmarks (issue 4): failover, graceful hand-off, DynamoDB requests on the wire.

Real supervisor processes (``python -m supervisor run -c FILE``) on 127.0.0.1, each in its own
process group, over a DynamoDB server started here (moto's app served one request at a time, as
the tests use it, or dynalite) and reference feeds run as separate processes.

1. Failover after host death: SIGKILL of a supervisor's whole process group (no last will), at
   3 s leases (heartbeat 1 s, reconcile 1 s) and 10 s leases (the defaults). Per trial: from the
   kill until every orphaned shard is owned by a live peer (the taker's ``owner_since``), and
   until the new owner's first record of each orphaned stream (the record's ``ts``).
2. Failover after a SIGKILL of the supervisor alone: its children release their own shards and
   mark it orphaned (the last will). Same settings and measurements.
3. Graceful hand-off gap on SIGTERM at the default settings: per stream of each handed-off shard,
   the first record of the new epoch minus the last record of the old one; lost and duplicated
   records across the hand-off.
4. DynamoDB requests per worker-minute, counted by a reverse proxy (scripts/wire_counter.py):
   one supervisor with 1, 16 and 64 shards, checkpoint interval 1 s and 10 s.

    .venv/bin/python scripts/bench_fleet.py [--quick] [--trials N] [--server moto|dynalite]

The full run (about 9-10 minutes on 2 cores) first waits, up to --wait-idle seconds, until no
other pytest or scripts/bench_*.py run is active, then runs the parts in stages so they do not
distort each other; --quick (under a minute) runs every part once, side by side: a smoke test.
Prints Markdown tables and writes out/bench_fleet.json (also kept as results.json beside the
run's supervisor logs in out/bench_fleet/<run>/, linked as out/bench_fleet/latest; sink files are
removed at the end unless --keep-sinks). Every process started is ended and reaped, also on
SIGINT and SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import itertools
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import attrs
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from helpers.fleet import alive, child_pids  # noqa: E402
from helpers.servers import ServerProcess, start_dynalite, start_moto_server  # noqa: E402

from supervisor.adapters.lease_store.base import LeaseStoreError  # noqa: E402
from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore  # noqa: E402
from supervisor.config.model import Config, LeaseConfig, LogConfig, SupervisorConfig  # noqa: E402
from supervisor.core.items import Snapshot  # noqa: E402

OUT = ROOT / "out"
# One directory per run (and per process importing this module), so that runs never clobber
# each other's logs and sinks; out/bench_fleet/latest points at the last run's.
WORK_ROOT = OUT / "bench_fleet"
WORK = WORK_ROOT / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
RESULTS = OUT / "bench_fleet.json"
TERM_GRACE = 10.0  # seconds between SIGTERM and SIGKILL when cleaning up

# KCL renews every lease every failover/3 - 25 ms = 3.308 s at its defaults: 0.302 renewal
# writes per lease per second (../shared/reference/anchors.md).
KCL_RENEWALS_PER_LEASE_S = 0.302
KCL_RENEWALS_PER_LEASE_MIN = 18  # 0.30 x 60, as the anchors round it
WRU_PRICE = 0.625  # USD per million write request units, on demand, us-east-1 (2025 list)
RRU_PRICE = 0.125  # USD per million read request units, on demand, us-east-1 (2025 list)
MONTH_S = 30 * 24 * 3600  # the month the anchors' $490 uses

READ_OPS = ("GetItem", "Query", "BatchGetItem", "Scan")
DEFAULTS_LEASE, DEFAULTS_SUPERVISOR = LeaseConfig(), SupervisorConfig()
LEASE = {  # name -> (duration, heartbeat, reconcile)
    "3s": (3.0, 1.0, 1.0),
    "10s": (
        DEFAULTS_LEASE.duration,
        DEFAULTS_LEASE.heartbeat_interval,
        DEFAULTS_LEASE.reconcile_interval,
    ),
}


# --- small helpers ----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: with fewer than 100 samples p99 is the maximum."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else math.nan,
        "min": min(values) if values else math.nan,
    }


def fmt_s(value: float, digits: int = 2) -> str:
    return "—" if math.isnan(value) else f"{value:.{digits}f} s"


def fmt_ms(value: float) -> str:
    return "—" if math.isnan(value) else f"{value * 1e3:.0f} ms"


def first_record_ts(path: Path) -> float | None:
    """The ``ts`` of the first complete line of a sink file (None if there is none yet)."""
    try:
        with path.open("rb") as fh:
            line = fh.readline()
    except OSError:
        return None
    if not line.endswith(b"\n"):
        return None
    return float(json.loads(line)["ts"])


def last_record_ts(path: Path) -> float | None:
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - 8192))
            lines = fh.read().split(b"\n")
    except OSError:
        return None
    for line in reversed(lines[1:-1] if len(lines) > 2 else lines[:-1]):
        with contextlib.suppress(ValueError, KeyError):
            return float(json.loads(line)["ts"])
    return None


def pgid_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid`` (a supervisor's group: it, its zygote and
    its children, which stay in the group even after the supervisor died)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) != pgid or fields[0] == "Z":
            continue
        with contextlib.suppress(OSError):  # only what a supervisor starts, never a stranger
            command = (entry / "cmdline").read_bytes()
            if b"supervisor" in command or b"shard_worker" in command:
                found.append(int(entry.name))
    return found


class Reaper:
    """Every process this benchmark starts, so that all are ended and reaped in ``finally``."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[bytes]] = []
        self.servers: list[ServerProcess] = []
        self.groups: set[int] = set()  # process groups of supervisors (pgid == supervisor pid)

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, **kwargs)
        self.popens.append(proc)
        return proc

    def cleanup(self) -> None:
        groups = {g: pgid_members(g) for g in self.groups}
        for members in groups.values():
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE
        while time.monotonic() < deadline and any(alive(p) for m in groups.values() for p in m):
            time.sleep(0.1)
        for members in groups.values():
            for pid in members:
                if alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        for proc in self.popens:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.popens:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for server in self.servers:
            server.stop()


REAPER = Reaper()
ERRORS: list[dict[str, str]] = []  # parts that failed (recorded, the others still run)


def start_server(kind: str) -> ServerProcess:
    server = start_moto_server() if kind == "moto" else start_dynalite()
    REAPER.servers.append(server)
    return server


async def start_servers(kind: str, count: int) -> list[ServerProcess]:
    servers: list[ServerProcess] = [None] * count  # type: ignore[list-item]

    async def one(i: int) -> None:
        servers[i] = await trio.to_thread.run_sync(start_server, kind)

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)
    return servers


def start_feed(streams: Sequence[str], rate: float, log: Path) -> str:
    """A reference feed in its own process; returns its ws:// base URL."""
    with log.open("wb") as err:
        proc = REAPER.popen(
            [
                sys.executable,
                __file__,
                "_feed",
                "--rate",
                str(rate),
                "--streams",
                ",".join(streams),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    assert proc.stdout is not None
    port = int(proc.stdout.readline().decode().strip() or 0)
    if not port:
        raise RuntimeError(f"the feed did not start: see {log}")
    return f"ws://127.0.0.1:{port}/feed"


def start_proxy(upstream: str, listeners: int, log: Path) -> list[str]:
    with log.open("wb") as err:
        proc = REAPER.popen(
            [
                sys.executable,
                str(ROOT / "scripts" / "wire_counter.py"),
                "--upstream",
                upstream,
                "--listeners",
                str(listeners),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line:
        raise RuntimeError(f"the counting proxy did not start: see {log}")
    return [f"http://127.0.0.1:{port}" for port in json.loads(line)["ports"]]


def proxy_counts(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/__wire_counter__", timeout=5) as response:
        return dict(json.loads(response.read()))


# --- a fleet of real supervisors ---------------------------------------------------------------


@dataclass
class Fleet:
    name: str
    server_url: str  # the benchmark reads the table here, never through a proxy
    feed_url: str
    shards: dict[str, list[str]]
    lease: tuple[float, float, float] | None = None  # None = the defaults
    supervisor: dict[str, object] = field(default_factory=dict)
    endpoints: dict[str, str] = field(default_factory=dict)  # worker -> endpoint (a proxy)
    procs: dict[str, trio.Process] = field(default_factory=dict)
    table: str = field(default_factory=lambda: "bench-" + uuid.uuid4().hex[:10])
    _store: DynamoLeaseStore | None = None

    @property
    def workdir(self) -> Path:
        return WORK / self.name

    @property
    def store(self) -> DynamoLeaseStore:
        if self._store is None:
            self._store = DynamoLeaseStore(self.table, "us-east-1", self.server_url)
        return self._store

    def config_text(self, worker: str) -> str:
        sections: dict[str, dict[str, object]] = {
            "worker": {"id": worker},
            "dynamodb": {
                "table": self.table,
                "endpoint_url": self.endpoints.get(worker, self.server_url),
            },
            "lease": {},
            "supervisor": dict(self.supervisor),
            "sink": {"path": "out/{shard}/{stream}.{epoch}.jsonl"},
            "log": {"level": "info"},
        }
        if "format" in attrs.fields_dict(LogConfig):
            sections["log"]["format"] = "json"  # parsed for the hand-off decomposition
        if "http" in attrs.fields_dict(Config):
            sections["http"] = {"listen": "127.0.0.1:0"}  # several supervisors on one host
        if self.lease is not None:
            duration, heartbeat, reconcile = self.lease
            sections["lease"] = {
                "duration": f"{duration:g}s",
                "heartbeat_interval": f"{heartbeat:g}s",
                "reconcile_interval": f"{reconcile:g}s",
            }
        lines = []
        for section, values in sections.items():
            lines.append(f"[{section}]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        for shard, streams in self.shards.items():
            lines.append(f'[[shards]]\nid = "{shard}"')
            for stream in streams:
                url = f"{self.feed_url}/{stream}?after={{after}}"
                lines.append(f'[[shards.streams]]\nid = "{stream}"\nurl = "{url}"')
                lines.append('sequence = "seq"')
        return "\n".join(lines) + "\n"

    async def start(self, worker: str) -> trio.Process:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / f"{worker}.toml"
        config.write_text(self.config_text(worker))
        with (self.workdir / f"{worker}.log").open("ab") as log:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "supervisor", "run", "-c", str(config)],
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,  # its own process group: the "host"
            )
        REAPER.groups.add(proc.pid)
        self.procs[worker] = proc
        return proc

    def live(self) -> list[str]:
        return [w for w, p in self.procs.items() if p.returncode is None]

    async def snapshot(self) -> Snapshot:
        for attempt in range(5):
            try:
                return await self.store.snapshot()
            except LeaseStoreError:
                if attempt == 4:
                    raise
                await trio.sleep(0.2)
        raise AssertionError("unreachable")

    def sink(self, shard: str, stream: str, epoch: int) -> Path:
        return self.workdir / "out" / shard / f"{stream}.{epoch}.jsonl"

    def newest_sink(self, shard: str, stream: str) -> Path | None:
        directory = self.workdir / "out" / shard
        try:
            names = [p.name for p in directory.iterdir() if p.name.startswith(f"{stream}.")]
        except OSError:
            return None
        epochs = [int(n.split(".")[-2]) for n in names if n.endswith(".jsonl")]
        return self.sink(shard, stream, max(epochs)) if epochs else None

    def flowing(self, window: float) -> bool:
        """Every stream's newest sink file has a record written within ``window`` seconds."""
        now = time.time()
        for shard, streams in self.shards.items():
            for stream in streams:
                path = self.newest_sink(shard, stream)
                ts = last_record_ts(path) if path else None
                if ts is None or now - ts > window:
                    return False
        return True

    async def settled(self, snap: Snapshot, window: float) -> bool:
        """Every live worker registered (its item names its pid) and running, every shard owned
        by a live worker, every stream flowing."""
        live = {w: self.procs[w].pid for w in self.live()}
        items = {w.id: w for w in snap.workers}
        for worker, pid in live.items():
            item = items.get(worker)
            if item is None or item.pid != pid or item.state != "running":
                return False
        owners = {s.id: s.owner for s in snap.shards}
        if any(owners.get(shard) not in live for shard in self.shards):
            return False
        held = Counter(owners.values())
        # Each worker runs a child per shard it owns (not, say, lost them to a lapsed lease).
        if any(len(child_pids(pid)) != held[worker] for worker, pid in live.items()):
            return False
        return self.flowing(window)

    async def wait_settled(self, timeout: float, window: float, stable: float = 0.0) -> Snapshot:
        """Settled, and no shard changed owner or epoch for ``stable`` seconds."""
        with trio.fail_after(timeout):
            since, last = trio.current_time(), None
            while True:
                snap = await self.snapshot()
                key = {s.id: (s.owner, s.epoch) for s in snap.shards}
                if key != last:
                    since, last = trio.current_time(), key
                if await self.settled(snap, window) and trio.current_time() - since >= stable:
                    return snap
                await trio.sleep(0.5)

    async def wait_registered(self, worker: str, timeout: float) -> None:
        pid = self.procs[worker].pid
        with trio.fail_after(timeout):
            while True:
                snap = await self.snapshot()
                item = next((w for w in snap.workers if w.id == worker), None)
                if item is not None and item.pid == pid and item.state == "running":
                    return
                await trio.sleep(0.5)

    async def stop_all(self) -> dict[str, int | None]:
        """SIGTERM every live supervisor at once (draining workers take nothing), then SIGKILL
        the process groups still alive after the grace period."""
        with trio.CancelScope(shield=True):
            for proc in self.procs.values():
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
            with trio.move_on_after(TERM_GRACE + 15):
                for proc in self.procs.values():
                    await proc.wait()
            for proc in self.procs.values():
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    await proc.wait()
            # Orphaned children (a supervisor killed alone) stay in the group: end them too.
            for pgid in {p.pid for p in self.procs.values()}:
                for pid in pgid_members(pgid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        return {w: p.returncode for w, p in self.procs.items()}

    def log_lines(self, worker: str, needle: str) -> list[str]:
        text = (self.workdir / f"{worker}.log").read_text(errors="replace")
        return [line for line in text.splitlines() if needle in line]


def read_sinks(root: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """Per stream, per epoch: first/last ts, the seqs written (with repeats), the writer."""
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(root.rglob("*.jsonl")):
        with path.open("rb") as fh:
            for line in fh:
                if not line.endswith(b"\n"):
                    continue
                rec = json.loads(line)
                if rec.get("seq") is None:
                    continue
                epochs = found.setdefault(rec["stream"], {})
                info = epochs.setdefault(
                    rec["epoch"],
                    {"first": rec["ts"], "last": rec["ts"], "seqs": [], "worker": rec["worker"]},
                )
                info["first"] = min(info["first"], rec["ts"])
                info["last"] = max(info["last"], rec["ts"])
                info["seqs"].append(rec["seq"])
    return found


def stream_losses(epochs: dict[int, dict[str, Any]]) -> tuple[int, int]:
    """(missing sequence numbers in 1..max, records written more than once)."""
    seqs = [s for info in epochs.values() for s in info["seqs"]]
    distinct = set(seqs)
    return (max(distinct, default=0) - len(distinct), len(seqs) - len(distinct))


# --- 1 and 2: failover ---------------------------------------------------------------------------


FAILOVER_WORKERS = ("w1", "w2", "w3")
FAILOVER_SHARDS = 6
FAILOVER_RATE = 50.0  # msg/s per stream; the new owner replays from its checkpoint at once


async def failover_fleet(mode: str, setting: str, trials: int, server: str) -> dict[str, Any]:
    """``mode`` "host": SIGKILL the process group; "supervisor": SIGKILL the supervisor alone."""
    duration, heartbeat, reconcile = LEASE[setting]
    name = f"failover-{mode}-{setting}"
    shards = {f"{name[9:]}-k{i}": [f"{name[9:]}-k{i}-a"] for i in range(1, FAILOVER_SHARDS + 1)}
    (WORK / name).mkdir(parents=True, exist_ok=True)
    feed = await trio.to_thread.run_sync(
        start_feed,
        [s for ss in shards.values() for s in ss],
        FAILOVER_RATE,
        WORK / name / "feed.log",
    )
    lease = None if setting == "10s" else (duration, heartbeat, reconcile)
    fleet = Fleet(name, server, feed, shards, lease=lease)
    await fleet.store.ensure_table(True)
    samples: list[dict[str, Any]] = []
    kills: Counter[str] = Counter()
    try:
        for worker in FAILOVER_WORKERS:
            await fleet.start(worker)
        await fleet.wait_settled(timeout=30 + duration, window=2.0)
        for trial in range(trials):
            try:
                sample = await failover_trial(fleet, mode, trial, kills, duration, reconcile)
            except trio.TooSlowError as exc:
                sample = {"trial": trial, "error": f"timed out: {exc!r}"}
                for worker, proc in fleet.procs.items():  # bring the fleet back to three
                    if proc.returncode is not None:
                        await fleet.start(worker)
            samples.append(sample)
            print(f"  {name} trial {trial + 1}/{trials}: {short(sample)}", flush=True)
    finally:
        codes = await fleet.stop_all()
    audits = await trio.to_thread.run_sync(read_sinks, fleet.workdir / "out")
    losses = {stream: stream_losses(epochs) for stream, epochs in audits.items()}
    return {
        "name": name,
        "mode": mode,
        "setting": setting,
        "duration": duration,
        "heartbeat": heartbeat,
        "reconcile": reconcile,
        "workers": len(FAILOVER_WORKERS),
        "shards": FAILOVER_SHARDS,
        "feed_rate": FAILOVER_RATE,
        "samples": samples,
        "exit_codes": codes,
        "missing_records": sum(m for m, _ in losses.values()),
        "rewritten_records": sum(r for _, r in losses.values()),
    }


def short(sample: dict[str, Any]) -> str:
    if "error" in sample:
        return sample["error"]
    return (
        f"killed {sample['victim']} ({len(sample['orphans'])} shards) -> owned "
        f"{sample['owned_s']:.2f}s, first record {max(sample['first_record_s'].values()):.2f}s"
    )


async def failover_trial(
    fleet: Fleet,
    mode: str,
    trial: int,
    kills: Counter[str],
    duration: float,
    reconcile: float,
) -> dict[str, Any]:
    window = DEFAULTS_SUPERVISOR.checkpoint_interval + 1.5  # sinks flush at each checkpoint
    snap = await fleet.wait_settled(timeout=3 * duration + 20, window=window, stable=0.5)
    loads = Counter(s.owner for s in snap.shards if s.id in fleet.shards)
    # The most loaded worker; among equals the one killed least often.
    victim = max(fleet.live(), key=lambda w: (loads[w], -kills[w], w))
    kills[victim] += 1
    orphans = {s.id: s.epoch for s in snap.shards if s.owner == victim and s.id in fleet.shards}
    proc = fleet.procs[victim]
    kids = child_pids(proc.pid)
    t_kill = time.time()
    if mode == "host":
        os.killpg(proc.pid, signal.SIGKILL)  # supervisor, zygote and children at once
    else:
        proc.send_signal(signal.SIGKILL)  # the supervisor alone: its children see EOF
    await proc.wait()
    if mode == "host":  # the kernel tears the group down within milliseconds
        with trio.move_on_after(2):
            while [pid for pid in kids if alive(pid)]:
                await trio.sleep(0.01)
    kids_alive_after_kill = [pid for pid in kids if alive(pid)]
    # (a) every orphaned shard owned by a live peer, with a new epoch.
    new: dict[str, Any] = {}
    seen_at: dict[str, float] = {}
    released_at: dict[str, float] = {}  # seen unowned (the last will released it)
    with trio.fail_after(2 * duration + reconcile + 15):
        while len(new) < len(orphans):
            snap = await fleet.snapshot()
            polled = time.time()
            for item in snap.shards:
                if item.id not in orphans or item.id in new:
                    continue
                if not item.owner:
                    released_at.setdefault(item.id, polled)
                elif item.owner != victim and item.epoch > orphans[item.id]:
                    new[item.id] = item
                    seen_at[item.id] = polled
            await trio.sleep(0.1)
    owned = {sid: item.owner_since - t_kill for sid, item in new.items()}
    # The victim's item keeps its last heartbeat's wall-clock stamp (same host's clock).
    last_hb = next((w.heartbeat_at for w in snap.workers if w.id == victim), math.nan)
    # (b) the new owner's first record of each orphaned stream.
    first: dict[str, float] = {}
    with trio.fail_after(15):
        for sid, item in new.items():
            for stream in fleet.shards[sid]:
                while (ts := first_record_ts(fleet.sink(sid, stream, item.epoch))) is None:
                    await trio.sleep(0.02)
                first[stream] = ts - t_kill
    # The last will: the children exit by themselves, the worker item says "orphaned".
    kids_exit_s = None
    worker_state = ""
    if mode == "supervisor":
        with trio.fail_after(10):
            while [pid for pid in kids if alive(pid)]:
                await trio.sleep(0.05)
        kids_exit_s = time.time() - t_kill
    snap = await fleet.snapshot()
    worker_state = next((w.state for w in snap.workers if w.id == victim), "")
    await fleet.start(victim)  # the same worker id: a restarted host
    await fleet.wait_registered(victim, timeout=30)
    return {
        "trial": trial,
        "victim": victim,
        "orphans": orphans,
        "new_owners": {sid: [item.owner, item.epoch] for sid, item in new.items()},
        "owned_per_shard_s": owned,
        "owned_s": max(owned.values()),
        "owned_polled_s": max(seen_at.values()) - t_kill,
        "released_seen_s": {sid: t - t_kill for sid, t in released_at.items()},
        "kill_after_last_heartbeat_s": t_kill - last_hb,
        "owned_after_last_heartbeat_s": max(owned.values()) + t_kill - last_hb,
        "first_record_s": first,
        "children": len(kids),
        "children_alive_after_kill": len(kids_alive_after_kill),
        "children_exit_s": kids_exit_s,
        "victim_state_after": worker_state,
        "kill_wall": t_kill,
    }


def failover_rows(result: dict[str, Any]) -> dict[str, Any]:
    ok = [s for s in result["samples"] if "error" not in s]
    owned = [s["owned_s"] for s in ok]
    per_shard = [v for s in ok for v in s["owned_per_shard_s"].values()]
    first = [v for s in ok for v in s["first_record_s"].values()]
    d, r = result["duration"], result["reconcile"]
    row = {
        "owned": summary(owned),
        "owned_per_shard": summary(per_shard),
        "first_record": summary(first),
        "owned_polled": summary([s["owned_polled_s"] for s in ok]),
        "owned_after_last_heartbeat": summary(
            [s["owned_after_last_heartbeat_s"] for s in ok if "owned_after_last_heartbeat_s" in s]
        ),
        "kill_after_last_heartbeat": summary(
            [s["kill_after_last_heartbeat_s"] for s in ok if "kill_after_last_heartbeat_s" in s]
        ),
        "released_seen": summary([v for s in ok for v in s.get("released_seen_s", {}).values()]),
        "orphans": len(per_shard),
        "trials_ok": len(ok),
        "trials_failed": len(result["samples"]) - len(ok),
    }
    if result["mode"] == "host":
        row["target"] = f"p50 ≤ {d + 1:g} s, every orphan ≤ {d + r + 1:g} s"
        row["target_met"] = bool(
            ok
            and row["owned"]["p50"] <= d + 1
            and row["owned"]["max"] <= d + r + 1
            and row["trials_failed"] == 0
        )
    else:
        row["target"] = f"≈ reconcile interval ({r:g} s), far below the lease ({d:g} s)"
        row["target_met"] = bool(ok and row["owned"]["max"] < d and row["trials_failed"] == 0)
    return row


# --- 3: graceful hand-off ------------------------------------------------------------------------


HANDOFF_WORKERS = ("w1", "w2", "w3")
HANDOFF_SHARDS = 9
HANDOFF_RATE = 200.0


async def handoff_fleet(min_handoffs: int, server: str) -> dict[str, Any]:
    name = "handoff-sigterm"
    shards = {f"h{i}": [f"h{i}-a"] for i in range(1, HANDOFF_SHARDS + 1)}
    (WORK / name).mkdir(parents=True, exist_ok=True)
    feed = await trio.to_thread.run_sync(
        start_feed,
        [s for ss in shards.values() for s in ss],
        HANDOFF_RATE,
        WORK / name / "feed.log",
    )
    fleet = Fleet(name, server, feed, shards)  # every setting at its default
    await fleet.store.ensure_table(True)
    reconcile = DEFAULTS_LEASE.reconcile_interval
    events: list[dict[str, Any]] = []
    try:
        for worker in HANDOFF_WORKERS:
            await fleet.start(worker)
        await fleet.wait_settled(timeout=40, window=2.0)
        handed = 0
        while handed < min_handoffs:
            # The restarted worker must have been seen by its peers (one reconcile round)
            # before the next SIGTERM, so that it can be named a successor.
            await trio.sleep(reconcile + 0.5)
            snap = await fleet.wait_settled(timeout=60, window=2.0, stable=0.5)
            loads = Counter(s.owner for s in snap.shards)
            victim = max(fleet.live(), key=lambda w: (loads[w], w))
            moving = {s.id: s.epoch for s in snap.shards if s.owner == victim}
            proc = fleet.procs[victim]
            t_term = time.time()
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(DEFAULTS_SUPERVISOR.shutdown_timeout + 10):
                code = await proc.wait()
            exited_s = time.time() - t_term
            with trio.fail_after(reconcile * 3 + 10):
                while True:
                    snap = await fleet.snapshot()
                    now = {s.id: s for s in snap.shards}
                    if all(now[sid].owner and now[sid].epoch > e for sid, e in moving.items()):
                        break
                    await trio.sleep(0.2)
            events.append(
                {
                    "victim": victim,
                    "sigterm_wall": t_term,
                    "exit_code": code,
                    "exit_s": exited_s,
                    "shards": moving,
                    "new_owners": {sid: [now[sid].owner, now[sid].epoch] for sid in moving},
                }
            )
            handed += len(moving)
            print(
                f"  {name}: SIGTERM {victim} ({len(moving)} shards, exit {code} after "
                f"{exited_s:.2f}s); {handed}/{min_handoffs} hand-offs",
                flush=True,
            )
            await fleet.start(victim)
            await fleet.wait_registered(victim, timeout=30)
        await trio.sleep(2.0)  # let the last new owners write for a while
    finally:
        codes = await fleet.stop_all()
    audits = await trio.to_thread.run_sync(read_sinks, fleet.workdir / "out")
    return analyse_handoffs(fleet, events, audits, codes)


def json_log(path: Path) -> list[dict[str, Any]]:
    """A supervisor's JSON log lines (others skipped), with ``t`` = unix seconds of ``ts``."""
    found = []
    with contextlib.suppress(OSError), path.open(errors="replace") as fh:
        for line in fh:
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entry = json.loads(line)
                stamp = datetime.datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ")
                entry["t"] = stamp.replace(tzinfo=datetime.UTC).timestamp()
                found.append(entry)
    return found


def events_at(log: list[dict[str, Any]], prefix: str, shard: str, epoch: int) -> float | None:
    """When the supervisor logged an event starting with ``prefix`` for (shard, epoch)."""
    for entry in log:
        if (
            str(entry.get("event", "")).startswith(prefix)
            and entry.get("shard") == shard
            and entry.get("epoch") == epoch
        ):
            return float(entry["t"])
    return None


def analyse_handoffs(
    fleet: Fleet,
    events: list[dict[str, Any]],
    audits: dict[str, dict[int, dict[str, Any]]],
    codes: dict[str, int | None],
) -> dict[str, Any]:
    logs = {w: json_log(fleet.workdir / f"{w}.log") for w in HANDOFF_WORKERS}
    sigterm_moves = {(sid, e) for ev in events for sid, e in ev["shards"].items()}
    term_at = {(sid, e): ev["sigterm_wall"] for ev in events for sid, e in ev["shards"].items()}
    transitions = []
    for shard, streams in fleet.shards.items():
        for stream in streams:
            epochs = audits.get(stream, {})
            ordered = sorted(epochs)
            for old, new in itertools.pairwise(ordered):
                a, b = epochs[old], epochs[new]
                dup = len(set(a["seqs"]) & set(b["seqs"]))
                lost = max(0, min(b["seqs"]) - max(a["seqs"]) - 1)
                cause = "sigterm" if (shard, old) in sigterm_moves else "rebalance"
                released = events_at(logs.get(a["worker"], []), "released:", shard, old)
                taken = events_at(logs.get(b["worker"], []), "took shard", shard, new)
                transitions.append(
                    {
                        "shard": shard,
                        "stream": stream,
                        "old_epoch": old,
                        "new_epoch": new,
                        "from": a["worker"],
                        "to": b["worker"],
                        "cause": cause,
                        "gap_s": b["first"] - a["last"],
                        "signal_to_first_s": (
                            b["first"] - term_at[(shard, old)] if cause == "sigterm" else None
                        ),
                        "duplicates": dup,
                        "lost": lost,
                        # From the supervisors' logs (ms resolution): old owner's last record
                        # -> its release logged -> new owner's take logged -> first record.
                        "stop_release_s": released - a["last"] if released else None,
                        "release_take_s": taken - released if taken and released else None,
                        "take_first_s": b["first"] - taken if taken else None,
                    }
                )
    losses = {stream: stream_losses(epochs) for stream, epochs in audits.items()}
    return {
        "workers": len(HANDOFF_WORKERS),
        "shards": HANDOFF_SHARDS,
        "feed_rate": HANDOFF_RATE,
        "events": events,
        "transitions": transitions,
        "missing_records": sum(m for m, _ in losses.values()),
        "rewritten_records": sum(r for _, r in losses.values()),
        "exit_codes": codes,
    }


def handoff_rows(result: dict[str, Any]) -> dict[str, Any]:
    rows = {}
    for cause in ("sigterm", "rebalance"):
        moves = [t for t in result["transitions"] if t["cause"] == cause]
        rows[cause] = {
            "handoffs": len(moves),
            "gap": summary([t["gap_s"] for t in moves]),
            "duplicates": sum(t["duplicates"] for t in moves),
            "lost": sum(t["lost"] for t in moves),
        }
    for cause in ("sigterm", "rebalance"):
        moves = [t for t in result["transitions"] if t["cause"] == cause]
        for part in ("stop_release_s", "release_take_s", "take_first_s"):
            rows[cause][part] = summary([t[part] for t in moves if t[part] is not None])
    sig = [t["signal_to_first_s"] for t in result["transitions"] if t["cause"] == "sigterm"]
    rows["sigterm"]["signal_to_first"] = summary(sig)
    rows["sigterm"]["sigterms"] = len(result["events"])
    rows["sigterm"]["exit"] = summary([e["exit_s"] for e in result["events"]])
    rows["sigterm"]["exit_codes"] = sorted({e["exit_code"] for e in result["events"]})
    return rows


# --- 4: requests per worker-minute ---------------------------------------------------------------


REQUEST_SHARDS = (1, 16, 64)
REQUEST_CHECKPOINTS = (1.0, 10.0)
REQUEST_RATE = 5.0  # msg/s per stream: every checkpoint interval has something new to store


async def request_configs(
    window: float,
    servers: Sequence[ServerProcess],
    checkpoints: Sequence[float],
    shard_counts: Sequence[int],
) -> list[dict[str, Any]]:
    """One supervisor per (shards, checkpoint interval), all at once, each with its own
    server and proxy, measured over the same window of steady state."""
    configs = [(n, c) for c in checkpoints for n in shard_counts]
    WORK.mkdir(parents=True, exist_ok=True)
    streams = {cfg: [f"r{cfg[0]}x{cfg[1]:g}-{i}" for i in range(cfg[0])] for cfg in configs}
    feed = await trio.to_thread.run_sync(
        start_feed,
        [s for ss in streams.values() for s in ss],
        REQUEST_RATE,
        WORK / f"requests-ckpt{'-'.join(f'{c:g}' for c in checkpoints)}s-feed.log",
    )
    fleets: list[tuple[Fleet, str]] = []
    for (n, ckpt), server in zip(configs, servers, strict=False):
        proxy = (await trio.to_thread.run_sync(
            start_proxy, server.url, 1, WORK / f"requests-{n}x{ckpt:g}s-proxy.log"
        ))[0]  # fmt: skip
        shards = {f"s-{stream}": [stream] for stream in streams[(n, ckpt)]}
        fleet = Fleet(
            f"requests-{n}shards-ckpt{ckpt:g}s",
            server.url,
            feed,
            shards,
            supervisor={"checkpoint_interval": f"{ckpt:g}s"},
            endpoints={"w1": proxy},
        )
        fleets.append((fleet, proxy))
    results = []
    try:
        for fleet, _ in fleets:
            await fleet.store.ensure_table(True)  # as an operator would (init-table)
            await fleet.start("w1")
        settle_by = trio.current_time()
        for fleet, _ in fleets:
            ckpt = float(str(fleet.supervisor["checkpoint_interval"]).rstrip("s"))
            await fleet.wait_settled(timeout=60, window=ckpt + 2.0, stable=2.0)
        settled_s = trio.current_time() - settle_by
        await trio.sleep(DEFAULTS_LEASE.reconcile_interval)  # the round after the takes
        before = [(proxy_counts(proxy), time.monotonic()) for _, proxy in fleets]
        await trio.sleep(window)
        after = [(proxy_counts(proxy), time.monotonic()) for _, proxy in fleets]
        for (fleet, _), (c0, t0), (c1, t1) in zip(fleets, before, after, strict=True):
            minutes = (t1 - t0) / 60
            targets = Counter(c1["targets"]) - Counter(c0["targets"])
            updates = Counter(c1["updates"]) - Counter(c0["updates"])
            snap = await fleet.snapshot()
            results.append(
                {
                    "name": fleet.name,
                    "shards": len(fleet.shards),
                    "checkpoint_interval": float(
                        str(fleet.supervisor["checkpoint_interval"]).rstrip("s")
                    ),
                    "window_s": t1 - t0,
                    "per_minute": {
                        "total": sum(targets.values()) / minutes,
                        "reads": sum(targets[op] for op in READ_OPS) / minutes,
                        "heartbeat": updates["heartbeat"] / minutes,
                        "checkpoint": updates["checkpoint"] / minutes,
                        "other_writes": (
                            sum(v for k, v in targets.items() if k not in READ_OPS)
                            - updates["heartbeat"]
                            - updates["checkpoint"]
                        )
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
    finally:
        for fleet, _ in fleets:
            await fleet.stop_all()
    return results


# DynamoDB item size (for the read-unit model): attribute names plus values; numbers take about
# one byte per two significant digits plus one.
def _value_size(value: dict[str, Any]) -> int:
    (kind, inner), = value.items()  # fmt: skip
    if kind == "S":
        return len(str(inner).encode())
    if kind == "N":
        return len(str(inner).strip("-").replace(".", "").lstrip("0")) // 2 + 1
    if kind == "M":
        return 3 + sum(len(k.encode()) + _value_size(v) + 1 for k, v in inner.items())
    if kind == "L":
        return 3 + sum(_value_size(v) + 1 for v in inner)
    return 1


def _item_size(item: dict[str, Any]) -> int:
    return sum(len(k.encode()) + _value_size(v) for k, v in item.items())


def item_sizes(fleet: Fleet) -> dict[str, float]:
    import boto3

    from shard_worker.contract.table import LOCAL_CREDENTIALS

    # A raw scan (the items as stored), on a client of its own: the store keeps boto3's to itself.
    store = fleet.store
    client = boto3.client(
        "dynamodb", region_name=store.region, endpoint_url=store.endpoint, **LOCAL_CREDENTIALS
    )
    items = client.scan(TableName=fleet.table, ConsistentRead=True).get("Items", [])
    workers = [_item_size(i) for i in items if i.get("kind", {}).get("S") == "worker"]
    shards = [_item_size(i) for i in items if i.get("kind", {}).get("S") == "shard"]
    return {
        "worker": statistics.mean(workers) if workers else 0.0,
        "shard": statistics.mean(shards) if shards else 0.0,
    }


def cost_model(requests: list[dict[str, Any]], shards: int = 1000, workers: int = 20) -> dict:
    """Monthly on-demand cost of the lease traffic of ``shards`` over ``workers``, from the
    measured request rates per worker-minute, against KCL's renewal writes."""
    per_shard = math.ceil(shards / workers)
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
        "BatchGetItem": workers * 1.0,  # strongly consistent, each worker item ≤ 4 KB
        "Scan": math.ceil(table_b / 4096) * 1.0,  # strongly consistent full scan
        "GetItem": 1.0,
    }
    minutes = MONTH_S / 60
    reads_month = sum(mean.get(op, 0.0) * rru[op] for op in rru) * workers * minutes
    hb_month = mean["heartbeat"] * workers * minutes  # 1 WRU each (item ≤ 1 KB)
    ckpt = {}
    for r in requests:
        if r["shards"] == max(q["shards"] for q in requests):
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
        "shards_per_worker": per_shard,
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


# --- report --------------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def markdown(results: dict[str, Any]) -> str:
    out: list[str] = []
    add = out.append
    d_keys = {"3s": "3 s / 1 s / 1 s", "10s": "10 s / 2 s / 2 s (defaults)"}
    if results.get("failover"):
        add("### Failover (SIGKILL) → orphaned shards owned by a peer, and first record\n")
        add(
            "| kill | duration / heartbeat / reconcile | trials (orphaned shards) | owned by a "
            "peer p50 · p99 · max | beyond duration (p50 · max) | new owner's first record "
            "p50 · p99 · max | beyond duration (p50 · max) | target | met |"
        )
        add("|---|---|---|---|---|---|---|---|---|")
        for res in results["failover"]:
            row = failover_rows(res)
            d = res["duration"]
            o, f = row["owned"], row["first_record"]
            kill = "host (process group)" if res["mode"] == "host" else "supervisor alone"
            failed = f", {row['trials_failed']} failed" if row["trials_failed"] else ""
            add(
                f"| {kill} | {d_keys[res['setting']]} | {row['trials_ok']}{failed} "
                f"({row['orphans']}) | {fmt_s(o['p50'])} · {fmt_s(o['p99'])} · "
                f"{fmt_s(o['max'])} | {o['p50'] - d:+.2f} · {o['max'] - d:+.2f} s | "
                f"{fmt_s(f['p50'])} · {fmt_s(f['p99'])} · {fmt_s(f['max'])} | "
                f"{f['p50'] - d:+.2f} · {f['max'] - d:+.2f} s | {row['target']} | "
                f"{'yes' if row['target_met'] else '**no**'} |"
            )
        add(
            "\nDetail: per orphaned shard (not the last of a trial); from the victim's last "
            "heartbeat (its item's wall-clock stamp) instead of from the kill; and, after a "
            "supervisor-only kill, when the benchmark's 100 ms table poll first saw the shard "
            "released by its child.\n"
        )
        add(
            "| kill | lease | owned per shard p50 · max | kill after last heartbeat p50 · max "
            "| all owned after last heartbeat p50 · max | released seen p50 · max |"
        )
        add("|---|---|---|---|---|---|")
        for res in results["failover"]:
            row = failover_rows(res)
            p, k, h, rel = (
                row["owned_per_shard"],
                row["kill_after_last_heartbeat"],
                row["owned_after_last_heartbeat"],
                row["released_seen"],
            )
            kill = "host" if res["mode"] == "host" else "supervisor alone"
            add(
                f"| {kill} | {res['setting'].replace('s', ' s')} | {fmt_s(p['p50'])} · "
                f"{fmt_s(p['max'])} | {fmt_s(k['p50'])} · {fmt_s(k['max'])} | "
                f"{fmt_s(h['p50'])} · {fmt_s(h['max'])} | {fmt_s(rel['p50'])} · "
                f"{fmt_s(rel['max'])} |"
            )
        add("")
    if results.get("handoff"):
        rows = handoff_rows(results["handoff"])
        h = results["handoff"]
        add(
            f"### Graceful hand-off on SIGTERM (defaults; feed {h['feed_rate']:g} msg/s per "
            "stream)\n"
        )
        add(
            "| moves | hand-offs (SIGTERMs) | gap p50 | p99 | max | lost | duplicated | "
            "signal → new owner's first record p50 · max |"
        )
        add("|---|---|---|---|---|---|---|---|")
        s = rows["sigterm"]
        add(
            f"| SIGTERM drain | {s['handoffs']} ({s['sigterms']}) | {fmt_ms(s['gap']['p50'])} | "
            f"{fmt_ms(s['gap']['p99'])} | {fmt_ms(s['gap']['max'])} | {s['lost']} | "
            f"{s['duplicates']} | {fmt_ms(s['signal_to_first']['p50'])} · "
            f"{fmt_ms(s['signal_to_first']['max'])} |"
        )
        r = rows["rebalance"]
        if r["handoffs"]:
            add(
                f"| rebalance (after a restart) | {r['handoffs']} | {fmt_ms(r['gap']['p50'])} | "
                f"{fmt_ms(r['gap']['p99'])} | {fmt_ms(r['gap']['max'])} | {r['lost']} | "
                f"{r['duplicates']} | — |"
            )
        parts = [
            ("old owner's last record → release logged", "stop_release_s"),
            ("release → successor's take logged", "release_take_s"),
            ("take → new owner's first record", "take_first_s"),
        ]
        add("\nWhere the gap goes (from the supervisors' logs, ms resolution), p50 · max:\n")
        add("| step | SIGTERM drain | rebalance |")
        add("|---|---|---|")
        for label, key in parts:
            a, b = s[key], r[key]
            add(
                f"| {label} | {fmt_ms(a['p50'])} · {fmt_ms(a['max'])} | "
                f"{fmt_ms(b['p50'])} · {fmt_ms(b['max'])} |"
            )
        add(
            f"\nWhole run: {h['missing_records']} records missing, {h['rewritten_records']} "
            f"written twice; SIGTERM → exit p50 {fmt_s(s['exit']['p50'])}, max "
            f"{fmt_s(s['exit']['max'])}, exit codes {s['exit_codes']}.\n"
        )
    if results.get("requests"):
        add("### DynamoDB requests per worker-minute (counted on the wire, steady state)\n")
        add(
            "| shards | checkpoint interval | total | reads (Get / Query / BatchGet / Scan) "
            "| lease writes (heartbeat) | checkpoint writes | other | KCL lease renewals |"
        )
        add("|---|---|---|---|---|---|---|---|")
        for r in results["requests"]:
            p = r["per_minute"]
            ops = p["by_op"]
            reads = " / ".join(f"{ops.get(op, 0.0):.0f}" for op in READ_OPS)
            add(
                f"| {r['shards']} | {r['checkpoint_interval']:g} s | {p['total']:.0f} | "
                f"{p['reads']:.0f} ({reads}) | {p['heartbeat']:.1f} | {p['checkpoint']:.0f} | "
                f"{p['other_writes']:.1f} | {KCL_RENEWALS_PER_LEASE_MIN * r['shards']:,} |"
            )
        add("")
    if results.get("cost"):
        c = results["cost"]
        sv = c["shardvisor"]
        add(
            f"### Monthly on-demand cost, {c['shards']:,} shards over {c['workers']} workers "
            "(model from the measured rates)\n"
        )
        add("| traffic | units / month | USD / month |")
        add("|---|---|---|")
        add(
            f"| shardvisor heartbeats (lease writes) | {sv['heartbeat_wru_month'] / 1e6:,.1f} M "
            f"WRU | ${sv['heartbeat_usd_month']:,.2f} |"
        )
        add(
            f"| shardvisor reconcile + hand-off poll + full-scan reads | "
            f"{sv['read_rru_month'] / 1e6:,.1f} M RRU | ${sv['read_usd_month']:,.2f} |"
        )
        add(f"| **shardvisor lease traffic** | | **${sv['usd_month']:,.2f}** |")
        k = c["kcl_renewals"]
        add(
            f"| **KCL lease renewals** (0.302 / lease / s) | {k['wru_month'] / 1e6:,.1f} M WRU | "
            f"**${k['usd_month']:,.2f}** |"
        )
        for interval, ck in c["checkpoints"].items():
            add(
                f"| shardvisor checkpoints every {interval} (both systems also checkpoint) | "
                f"{ck['wru_month'] / 1e6:,.1f} M WRU | ${ck['usd_month']:,.2f} |"
            )
        add("")
    return "\n".join(out)


# --- main ----------------------------------------------------------------------------------------


def git_state() -> dict[str, object]:
    def git(*argv: str) -> str:
        found = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
        return found.stdout.strip()

    changed = git("status", "--porcelain", "--", "supervisor", "shard_worker").splitlines()
    return {"head": git("rev-parse", "--short", "HEAD"), "uncommitted_product_files": changed}


BUSY = re.compile(r"pytest|bench_\w+\.py")


def busy_with_tests() -> list[str]:
    """Other test or benchmark runs on this machine (pytest, scripts/bench_*.py), not ours."""
    parents, commands = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                raw = (entry / "cmdline").read_bytes()
                commands[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace")

    def ours(pid: int) -> bool:
        seen = set()
        while pid > 1 and pid not in seen:
            if pid == os.getpid():
                return True
            seen.add(pid)
            pid = parents.get(pid, 0)
        return False

    return [
        f"{pid} {cmd.strip()}"[:200]
        for pid, cmd in sorted(commands.items())
        if BUSY.search(cmd) and not ours(pid)
    ]


async def wait_idle(limit: float) -> tuple[bool, float]:
    """Wait (up to ``limit`` seconds) until no test run is active; (idle, seconds waited)."""
    started = time.monotonic()
    while busy_with_tests():
        waited = time.monotonic() - started
        if waited >= limit:
            return False, waited
        if int(waited) % 60 < 5:
            print(f"a test run is active; waiting for the machine ({waited:.0f} s)", flush=True)
        await trio.sleep(5)
    return True, time.monotonic() - started


async def run_lanes(lanes: Sequence[Sequence[Callable[[], Any]]]) -> None:
    """Each lane runs its jobs one after the other; the lanes run side by side."""

    async def lane(jobs: Sequence[Callable[[], Any]]) -> None:
        for job in jobs:
            try:
                await job()
            except Exception as exc:  # noqa: BLE001 - one failed part must not lose the others
                name = getattr(job, "__qualname__", "job")
                print(f"FAILED: {name}: {exc!r}", flush=True)
                ERRORS.append({"job": name, "error": repr(exc)})

    async with trio.open_nursery() as nursery:
        for jobs in lanes:
            nursery.start_soon(lane, jobs)


async def run_all(args: argparse.Namespace, results: dict[str, Any]) -> None:
    quick = args.quick
    trials = args.trials or (1 if quick else 20)
    results.update(
        {
            "command": " ".join([".venv/bin/python scripts/bench_fleet.py", *sys.argv[1:]]),
            "server": args.server,
            "machine": machine(),
            "quick": quick,
            "failover": [],
            "errors": ERRORS,
        }
    )
    if not quick:
        idle, waited = await wait_idle(args.wait_idle)
        results["idle_at_start"], results["waited_for_idle_s"] = idle, waited
    results["busy_at_start"] = busy_with_tests()
    results["git"] = git_state()
    results["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    t0 = time.monotonic()
    stages: dict[str, float] = {}
    window = 15.0 if quick else 60.0
    shard_counts = (1, 16) if quick else REQUEST_SHARDS

    def failover(mode: str, setting: str, server: ServerProcess) -> Callable[[], Any]:
        async def job() -> None:
            results["failover"].append(await failover_fleet(mode, setting, trials, server.url))

        return job

    def handoff(server: ServerProcess) -> Callable[[], Any]:
        async def job() -> None:
            results["handoff"] = await handoff_fleet(3 if quick else max(20, trials), server.url)

        return job

    def requests(servers: Sequence[ServerProcess], checkpoints: Sequence[float]):
        async def job() -> None:
            found = await request_configs(window, servers, checkpoints, shard_counts)
            results.setdefault("requests", []).extend(found)

        return job

    async def stage(name: str, lanes: Sequence[Sequence[Callable[[], Any]]]) -> None:
        print(f"{name} ({time.monotonic() - t0:.0f} s)", flush=True)
        started = time.monotonic()
        await run_lanes(lanes)
        stages[name] = time.monotonic() - started

    async def parts() -> None:
        if quick:  # three lanes side by side: the smoke test stays under a minute
            n = 2 + len(shard_counts) * len(REQUEST_CHECKPOINTS)
            s = await start_servers(args.server, n)
            await stage(
                "all parts at once (quick)",
                [
                    [
                        handoff(s[0]),
                        failover("host", "3s", s[0]),
                        failover("supervisor", "3s", s[0]),
                    ],
                    [failover("host", "10s", s[1]), failover("supervisor", "10s", s[1])],
                    [requests(s[2:], REQUEST_CHECKPOINTS)],
                ],
            )
            return
        s = await start_servers(args.server, len(REQUEST_SHARDS))
        await stage("stage 1/4: graceful hand-off on SIGTERM", [[handoff(s[0])]])
        await stage(
            "stage 2/4: failover after SIGKILL (two fleets side by side)",
            [
                [failover("host", "10s", s[0])],
                [
                    failover("host", "3s", s[1]),
                    failover("supervisor", "3s", s[1]),
                    failover("supervisor", "10s", s[1]),
                ],
            ],
        )
        for i, ckpt in enumerate(REQUEST_CHECKPOINTS):
            await stage(
                f"stage {3 + i}/4: DynamoDB requests per worker-minute, checkpoint {ckpt:g} s",
                [[requests(s, [ckpt])]],
            )

    overlap: dict[str, float] = {}  # other test/benchmark runs seen meanwhile: first seen at
    results["busy_during"] = overlap

    async def watch_others() -> None:
        while True:
            for line in await trio.to_thread.run_sync(busy_with_tests):
                overlap.setdefault(line, round(time.monotonic() - t0, 1))
            await trio.sleep(10)

    async with trio.open_nursery() as watcher:
        watcher.start_soon(watch_others)
        await parts()
        watcher.cancel_scope.cancel()
    if overlap:
        print(f"other runs seen meanwhile: {len(overlap)} processes", flush=True)
    order = {("host", "3s"): 0, ("host", "10s"): 1, ("supervisor", "3s"): 2}
    results["failover"].sort(key=lambda r: order.get((r["mode"], r["setting"]), 3))
    if results.get("requests"):
        results["cost"] = cost_model(results["requests"])
    results["stages_s"] = stages
    results["elapsed_s"] = time.monotonic() - t0
    results["busy_at_end"] = busy_with_tests()


def feed_main(argv: list[str]) -> None:
    """``bench_fleet.py _feed --rate R --streams a,b``: a feed process; prints its port."""
    from supervisor.devtools.feed import FeedServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--streams", required=True)
    args = parser.parse_args(argv)

    async def serve() -> None:
        feed = FeedServer(args.rate, stream_names=args.streams.split(","))
        async with trio.open_nursery() as nursery:
            port = await nursery.start(feed.serve, "127.0.0.1", 0)
            print(port, flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve)


def prune_old_runs(keep: int = 3) -> None:
    """Remove the logs of finished runs but the newest ``keep`` (a run's directory name ends
    with its process id: those of live processes stay)."""
    runs = sorted(p for p in WORK_ROOT.glob("*-*-*") if p.is_dir() and not p.is_symlink())
    for run in runs[:-keep] if keep else runs:
        pid = run.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(run, ignore_errors=True)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the finally blocks end every process this run started


def main() -> None:
    if sys.argv[1:2] == ["_feed"]:
        feed_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test (under a minute)")
    parser.add_argument("--trials", type=int, default=0, help="failover trials per setting")
    parser.add_argument("--server", choices=("moto", "dynalite"), default="moto")
    parser.add_argument("--keep-sinks", action="store_true", help="keep the sink files")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=900.0,
        help="full run: wait up to this many seconds for other test/benchmark runs to end",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started in background
    signal.signal(signal.SIGTERM, _terminate)
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_DYNAMODB",
    ):
        os.environ.pop(name, None)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "bench_fleet.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("another bench_fleet run holds out/bench_fleet.lock: waiting", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        prune_old_runs()
        WORK.mkdir(parents=True)
        latest = WORK_ROOT / "latest"
        with contextlib.suppress(OSError):
            latest.unlink(missing_ok=True)
            latest.symlink_to(WORK.name)
        results: dict[str, Any] = {"workdir": str(WORK.relative_to(ROOT))}
        try:
            trio.run(run_all, args, results)
        finally:
            REAPER.cleanup()
            if not args.keep_sinks:
                for sink in WORK.glob("*/out"):
                    shutil.rmtree(sink, ignore_errors=True)
            text = json.dumps(results, indent=1, default=str)
            RESULTS.write_text(text)
            (WORK / "results.json").write_text(text)  # kept with the run's logs
    m = results["machine"]
    print()
    print(markdown(results))
    print(
        f"machine: {m['nproc']} CPUs ({m['cpu']}), Python {m['python']}, server {args.server}; "
        f"ran {results.get('elapsed_s', math.nan):.0f} s; results in "
        f"{RESULTS.relative_to(ROOT)}, logs in {WORK.relative_to(ROOT)}/"
    )
    if results.get("busy_at_start") or results.get("busy_at_end"):
        print("note: another test or benchmark run was active on this machine meanwhile")
    if ERRORS:
        print(f"{len(ERRORS)} part(s) failed: {ERRORS}")
        sys.exit(1)


if __name__ == "__main__":
    main()
