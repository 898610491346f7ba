"""``shardvisor demo``: the whole system on one machine, with no AWS account.

moto's DynamoDB server (in this process, on a free loopback port), the reference feed in its
live-only mode (a client gets only what is generated after it connected, like most real
WebSocket feeds), and three real supervisor processes over six shards, each shard with one warm
standby on another supervisor. It kills one supervisor's host with SIGKILL (its shards go to
their standbys), stops another with SIGTERM (make-before-break hand-offs), and then reads every
sink file back: per stream, what was lost (0, or the figure).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import attrs
import trio

from supervisor.core.items import Snapshot
from supervisor.devtools.feed import FeedServer
from supervisor.devtools.fleet import Fleet, owners_view, shards_of
from supervisor.devtools.sink_audit import StreamAudit

WORKERS = ("w1", "w2", "w3")
SHARDS = {f"s{i}": (f"s{i}-a", f"s{i}-b") for i in range(1, 7)}
RATE = 50.0  # messages/s per stream
DURATION, HEARTBEAT, RECONCILE = 3.0, 1.0, 1.0
OVERALL_DEADLINE = 85.0
TABLE = "shardvisor-demo"
SETTINGS: dict[str, dict[str, object]] = {
    "lease": {
        "duration": f"{DURATION}s",
        "heartbeat_interval": f"{HEARTBEAT}s",
        "reconcile_interval": f"{RECONCILE}s",
        # A SIGTERM's drain (0.9 x shutdown_timeout) must hold the wait for the successor's
        # standby plus the child's stop, or the hand-off falls back to break-before-make.
        "handoff_timeout": "2s",
    },
    "supervisor": {"shutdown_timeout": "5s", "checkpoint_interval": "250ms"},
    "standby": {"count": 1},  # one warm standby per shard, on another supervisor
    "sink": {"kind": "jsonl"},
    "http": {"listen": "127.0.0.1:0"},  # three supervisors on one host
}


@attrs.define
class DemoRun:
    fleet: Fleet
    started: float = attrs.field(factory=time.monotonic)
    last_view: str = ""

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.1f}s] {text}", flush=True)

    def show(self, snapshot: Snapshot) -> None:
        """Print who holds what, when it changed since the last time."""
        view = owners_view(snapshot, WORKERS)
        if view != self.last_view:
            self.say(view)
            self.last_view = view


def run_demo(workdir: str = "") -> int:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "demo",
        "AWS_SECRET_ACCESS_KEY": "demo",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(key, value)
    directory = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="shardvisor-demo-"))
    directory.mkdir(parents=True, exist_ok=True)
    from supervisor.devtools.local_dynamodb import LocalDynamoDB

    server = LocalDynamoDB("127.0.0.1", 0).start()
    try:
        return trio.run(_demo, directory, server.url)
    finally:
        server.stop()


async def _demo(workdir: Path, ddb_url: str) -> int:
    streams = [s for pair in SHARDS.values() for s in pair]
    feed = FeedServer(rate=RATE, stream_names=streams, live=True)
    with trio.fail_after(OVERALL_DEADLINE):
        async with trio.open_nursery() as nursery:
            feed_port = await nursery.start(feed.serve, "127.0.0.1", 0)
            feed_url = f"ws://127.0.0.1:{feed_port}/feed"
            run = DemoRun(
                Fleet(workdir, ddb_url, TABLE, feed_url, SHARDS, settings=SETTINGS, live_feed=True)
            )
            try:
                code = await _scenario(run)
            finally:
                with trio.CancelScope(shield=True):
                    await _stop_all(run)
            nursery.cancel_scope.cancel()
    return code


async def _scenario(run: DemoRun) -> int:
    fleet = run.fleet
    run.say(
        f"DynamoDB (moto) at {fleet.ddb_url}, live-only feed at {fleet.feed_url}"
        f" (nothing replayed: what no child reads is gone), files in {fleet.workdir}"
    )
    await fleet.store.ensure_table(True)
    for worker in WORKERS:
        proc = await fleet.start(worker)
        run.say(f"started supervisor {worker} (pid {proc.pid}, log {worker}.log)")
        await trio.sleep(0.3)
    await _wait_owned(run, exclude=(), timeout=15)
    await _wait_balanced(run, timeout=20)
    await _wait_standbys(run, exclude=(), timeout=15)
    await _watch(run, 2.0)

    snapshot = await fleet.snapshot()
    victim = max(WORKERS, key=lambda w: (len(shards_of(snapshot, w)), w))
    victim_shards = shards_of(snapshot, victim)
    run.say(
        f"SIGKILL host {victim}: supervisor and children at once "
        f"(holding {', '.join(victim_shards)}); when its lease expires, each shard's standby"
        " takes it and writes from its buffer"
    )
    killed_at = time.time()
    os.killpg(fleet.procs[victim].pid, signal.SIGKILL)
    await fleet.procs.pop(victim).wait()
    await _wait_owned(run, exclude=(victim,), timeout=DURATION + RECONCILE + 8)
    await _wait_standbys(run, exclude=(victim,), timeout=15)
    await _watch(run, 2.0)

    snapshot = await fleet.snapshot()
    drained = next(w for w in WORKERS if w in fleet.procs and shards_of(snapshot, w))
    drained_shards = shards_of(snapshot, drained)
    run.say(
        f"SIGTERM supervisor {drained} (holding {', '.join(drained_shards)}): each shard is"
        " handed to its standby's supervisor make-before-break"
    )
    termed_at = time.time()
    proc = fleet.procs.pop(drained)
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(10):
        code = await proc.wait()
    run.say(f"{drained} exited with code {code} after {time.time() - termed_at:.2f}s")
    await _wait_owned(run, exclude=(victim, drained), timeout=5)
    await _watch(run, 2.0)
    await _stop_all(run)

    audits = fleet.audit()
    ok = _summary(audits, victim_shards, killed_at, drained_shards, termed_at) and code == 0
    run.say(
        "demo passed: every stream lost 0 across the host kill and the deploy"
        if ok
        else "demo FAILED: see the table above"
    )
    return 0 if ok else 1


async def _stop_all(run: DemoRun) -> None:
    await run.fleet.stop_all(grace=10)
    run.fleet.procs.clear()
    await trio.sleep(1.2)  # children of a killed supervisor exit within 1 s of pipe EOF


async def _watch(run: DemoRun, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        run.show(await run.fleet.snapshot())
        await trio.sleep(0.2)


async def _wait_owned(run: DemoRun, *, exclude: tuple[str, ...], timeout: float) -> None:
    start = time.monotonic()
    with trio.fail_after(timeout):
        while True:
            snapshot = await run.fleet.snapshot()
            run.show(snapshot)
            owners = [s.owner for s in snapshot.shards]
            if len(owners) == len(SHARDS) and all(o and o not in exclude for o in owners):
                run.say(f"all {len(SHARDS)} shards owned ({time.monotonic() - start:.1f}s)")
                return
            await trio.sleep(0.1)


async def _wait_standbys(run: DemoRun, *, exclude: tuple[str, ...], timeout: float) -> None:
    """Every shard has a ready standby on a live supervisor other than its owner (as its
    worker item advertises)."""
    start = time.monotonic()
    with trio.fail_after(timeout):
        while True:
            snapshot = await run.fleet.snapshot()
            run.show(snapshot)
            ready: dict[str, set[str]] = {}
            for worker in snapshot.workers:
                if worker.id not in exclude:
                    for shard in worker.standbys:
                        ready.setdefault(shard, set()).add(worker.id)
            if all(ready.get(s.id, set()) - {s.owner} for s in snapshot.shards):
                took = time.monotonic() - start
                run.say(f"every shard has a warm standby on another supervisor ({took:.1f}s)")
                return
            await trio.sleep(0.1)


async def _wait_balanced(run: DemoRun, timeout: float) -> None:
    """The first supervisor up takes everything; the others get their share by hand-off."""
    start = time.monotonic()
    with trio.fail_after(timeout):
        while True:
            snapshot = await run.fleet.snapshot()
            loads = [len(shards_of(snapshot, w)) for w in run.fleet.procs]
            run.show(snapshot)
            if max(loads) - min(loads) <= 1 and sum(loads) == len(SHARDS):
                run.say(f"balanced by graceful hand-offs ({time.monotonic() - start:.1f}s)")
                return
            await trio.sleep(0.1)


def _summary(
    audits: dict[str, StreamAudit],
    killed: list[str],
    killed_at: float,
    drained: list[str],
    termed_at: float,
) -> bool:
    print()
    header = f"{'stream':<8} {'delivered':>9} {'lost':>5} {'rewritten':>9}  {'failover':>8}"
    print(header + f"  {'hand-off':>8}  epochs")
    ok, losses = True, []
    for stream, audit in sorted(audits.items()):
        shard = stream.rsplit("-", 1)[0]
        failover = audit.first_write_after(killed_at) - killed_at if shard in killed else None
        handoff = audit.switch_gap_after(termed_at) if shard in drained else None
        ok &= audit.lost == 0 and audit.delivered > 0
        if audit.lost:
            losses.append(f"{stream} lost {audit.lost}")
        print(
            f"{stream:<8} {audit.delivered:>9} {audit.lost:>5} {audit.rewritten:>9}  "
            f"{_secs(failover):>8}  {_secs(handoff):>8}  {','.join(map(str, audit.epochs))}"
        )
    print(
        "\nlost      = sequence numbers between a stream's first and last record that nobody"
        "\n            wrote: on a live-only feed, what no child was connected for (must be 0)."
        "\nrewritten = records written again by the standby that took over a killed owner's"
        "\n            shard, from its last checkpoint (at-least-once; readers drop them by"
        "\n            (stream, seq) and reject older epochs)."
        f"\nfailover  = SIGKILL -> next record by the new owner (lease duration {DURATION:g}s)."
        "\nhand-off  = old owner's last record -> new owner's first record after SIGTERM.\n"
    )
    if losses:
        print("LOST: " + ", ".join(losses) + "\n")
    if len(audits) != sum(len(s) for s in SHARDS.values()):
        expected = sum(len(s) for s in SHARDS.values())
        print(f"missing streams: expected {expected}, saw {len(audits)}")
        ok = False
    return ok


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"
