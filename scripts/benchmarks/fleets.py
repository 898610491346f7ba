"""The benchmarks' fleets: ``supervisor.devtools.fleet`` with a run's settings, and the waits and
readings of a measurement (settled, registered, first and last records, JSON logs).

A benchmark fleet lives in the run's work directory, logs JSON (the hand-off's decomposition
parses it), serves HTTP on a free port, and is stopped with every process of its groups.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from benchmarks.harness import run_dir
from supervisor.adapters.lease_store.base import LeaseStoreError
from supervisor.config.model import LeaseConfig
from supervisor.core.items import Snapshot
from supervisor.devtools.fleet import Fleet, child_pids
from supervisor.devtools.servers import ServerProcess, start_dynamodb, start_feed
from supervisor.devtools.sink_audit import StreamAudit

DEFAULT_LEASE = LeaseConfig()
LEASES = {  # name -> (duration, heartbeat, reconcile); "10s" is the default
    "3s": (3.0, 1.0, 1.0),
    "10s": (
        DEFAULT_LEASE.duration,
        DEFAULT_LEASE.heartbeat_interval,
        DEFAULT_LEASE.reconcile_interval,
    ),
}
STOP_GRACE = 25.0  # seconds between SIGTERM and SIGKILL (a draining supervisor with many shards)


def bench_fleet(
    name: str,
    server_url: str,
    feed_url: str,
    shards: Mapping[str, Sequence[str]],
    *,
    lease: str = "10s",
    supervisor: dict[str, object] | None = None,
    endpoint: str = "",
    live_feed: bool = False,
    sections: Mapping[str, Mapping[str, object]] | None = None,
) -> Fleet:
    """A fleet on its own new table. ``endpoint``: where the supervisors reach DynamoDB (a
    counting proxy) when not ``server_url``, which the benchmark itself reads. ``live_feed``:
    the feed is live-only (stream URLs without ``?after=``); ``sections``: more config
    sections (e.g. ``{"standby": {"count": 1}}``)."""
    settings: dict[str, dict[str, object]] = {
        "supervisor": dict(supervisor or {}),
        "log": {"level": "info", "format": "json"},
        "http": {"listen": "127.0.0.1:0"},  # several supervisors on one host
        **{name: dict(values) for name, values in (sections or {}).items()},
    }
    if lease != "10s":
        duration, heartbeat, reconcile = LEASES[lease]
        settings["lease"] = {
            "duration": f"{duration:g}s",
            "heartbeat_interval": f"{heartbeat:g}s",
            "reconcile_interval": f"{reconcile:g}s",
        }
    if endpoint:
        settings["dynamodb"] = {"endpoint_url": endpoint}
    table = "bench-" + uuid.uuid4().hex[:10]
    workdir = run_dir() / name
    live = {"live_feed": live_feed}
    return Fleet(workdir, server_url, table, feed_url, shards, settings=settings, **live)


@contextlib.contextmanager
def servers(kind: str, count: int) -> Iterator[list[ServerProcess]]:
    """``count`` DynamoDB servers of ``kind`` (started side by side), stopped on the way out."""
    with contextlib.ExitStack() as stack:
        pool = concurrent.futures.ThreadPoolExecutor(max(1, count))
        futures = [pool.submit(start_dynamodb, kind) for _ in range(count)]
        try:
            concurrent.futures.wait(futures)
        finally:  # also on Ctrl-C: every server that started is stopped on the way out
            pool.shutdown(wait=True)
            started = [stack.enter_context(f.result()) for f in futures if not f.exception()]
        for future in futures:
            if error := future.exception():
                raise error
        yield started


async def feed_for(
    shards: Mapping[str, Sequence[str]], rate: float, *, live: bool = False
) -> ServerProcess:
    """The reference feed in its own process, generating every stream of ``shards``; with
    ``live``, live-only (a client gets only what is generated after it connected)."""
    streams = [stream for names in shards.values() for stream in names]
    return await trio.to_thread.run_sync(functools.partial(start_feed, rate, streams, live=live))


async def stop(fleet: Fleet) -> dict[str, int | None]:
    """Every supervisor stopped (SIGTERM, then SIGKILL) and whatever is left in their process
    groups ended; their exit codes."""
    codes = await fleet.stop_all(grace=STOP_GRACE)
    await fleet.end_groups()
    return codes


async def snapshot(fleet: Fleet, attempts: int = 5) -> Snapshot:
    """The table, read again after a short pause when the server is too busy to answer."""
    for attempt in range(attempts):
        try:
            return await fleet.snapshot()
        except LeaseStoreError:
            if attempt == attempts - 1:
                raise
            await trio.sleep(0.2)
    raise AssertionError("unreachable")


def fleet_totals(
    workers: int, shards: int, rate: float, audits: Mapping[str, StreamAudit]
) -> dict[str, Any]:
    """What every fleet benchmark reports besides its own samples: the fleet's size and feed
    rate, and from the sink audit the records missing and the records written twice."""
    return {
        "workers": workers,
        "shards": shards,
        "feed_rate": rate,
        "missing_records": sum(a.gaps for a in audits.values()),
        "rewritten_records": sum(a.rewritten for a in audits.values()),
    }


# --- sink files ---------------------------------------------------------------------------------


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


def newest_sink(fleet: Fleet, shard: str, stream: str) -> Path | None:
    directory = fleet.workdir / "out" / shard
    try:
        names = [p.name for p in directory.iterdir() if p.name.startswith(f"{stream}.")]
    except OSError:
        return None
    epochs = [int(n.split(".")[-2]) for n in names if n.endswith(".jsonl")]
    return fleet.sink(shard, stream, max(epochs)) if epochs else None


def flowing(fleet: Fleet, window: float) -> bool:
    """Every stream's newest sink file has a record written within ``window`` seconds."""
    now = time.time()
    for shard, streams in fleet.shards.items():
        for stream in streams:
            path = newest_sink(fleet, shard, stream)
            ts = last_record_ts(path) if path else None
            if ts is None or now - ts > window:
                return False
    return True


# --- waits --------------------------------------------------------------------------------------


def settled(
    fleet: Fleet, snap: Snapshot, window: float, standbys: int = 0, balanced: bool = False
) -> bool:
    """Every live worker registered (its item names its pid) and running, every shard owned by
    a live worker that runs a child for each shard it holds (and each standby it advertises),
    every stream flowing; with ``standbys``, each shard has that many ready standbys on other
    live workers (as many as there are); with ``balanced``, the live workers' loads differ by
    one at most."""
    live = {w: fleet.procs[w].pid for w in fleet.live()}
    items = {w.id: w for w in snap.workers}
    for worker, pid in live.items():
        item = items.get(worker)
        if item is None or item.pid != pid or item.state != "running":
            return False
    owners = {s.id: s.owner for s in snap.shards}
    if any(owners.get(shard) not in live for shard in fleet.shards):
        return False
    held = Counter(owners.values())
    if balanced and max(held[w] for w in live) - min(held[w] for w in live) > 1:
        return False
    for worker, pid in live.items():
        if len(child_pids(pid)) != held[worker] + len(items[worker].standbys):
            return False
    wanted = min(standbys, len(live) - 1)
    for shard in fleet.shards:
        ready = [w for w in live if shard in items[w].standbys and w != owners[shard]]
        if len(ready) < wanted:
            return False
    return flowing(fleet, window)


async def wait_settled(
    fleet: Fleet,
    timeout: float,
    window: float,
    stable: float = 0.0,
    standbys: int = 0,
    balanced: bool = False,
) -> Snapshot:
    """Settled (``settled``'s ``standbys`` and ``balanced`` too), and no shard changed owner or
    epoch for ``stable`` seconds."""
    with trio.fail_after(timeout):
        since, last = trio.current_time(), None
        while True:
            snap = await snapshot(fleet)
            key = {s.id: (s.owner, s.epoch) for s in snap.shards}
            if key != last:
                since, last = trio.current_time(), key
            done = settled(fleet, snap, window, standbys, balanced)
            if done and trio.current_time() - since >= stable:
                return snap
            await trio.sleep(0.5)


# --- logs ---------------------------------------------------------------------------------------


def logged_at(log: list[dict[str, Any]], prefix: str, shard: str, epoch: int) -> float | None:
    """When the supervisor logged an event starting with ``prefix`` for (shard, epoch)."""
    for entry in log:
        if (
            str(entry.get("event", "")).startswith(prefix)
            and entry.get("shard") == shard
            and entry.get("epoch") == epoch
        ):
            return float(entry["t"])
    return None
