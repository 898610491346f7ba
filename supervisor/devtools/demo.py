"""``shardvisor demo``: the whole system on one machine, with no AWS account.

moto's DynamoDB server (in this process, on a free loopback port), the reference feed, and three
real supervisor processes over six shards. It kills one supervisor with SIGKILL, stops another with
SIGTERM, and then reads every sink file back to prove nothing was lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs
import trio

from supervisor.devtools.feed import FeedServer
from supervisor.devtools.sink_audit import StreamAudit, audit_sink_dir

WORKERS = ("w1", "w2", "w3")
SHARDS = {f"s{i}": (f"s{i}-a", f"s{i}-b") for i in range(1, 7)}
RATE = 50.0  # messages/s per stream
DURATION, HEARTBEAT, RECONCILE = 3.0, 1.0, 1.0
OVERALL_DEADLINE = 55.0


@attrs.define
class DemoRun:
    workdir: Path
    ddb_url: str
    feed_url: str
    started: float = attrs.field(factory=time.monotonic)
    procs: dict[str, trio.Process] = attrs.field(factory=dict)
    last_view: str = ""

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.1f}s] {text}", flush=True)


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
    feed = FeedServer(rate=RATE, stream_names=streams)
    with trio.fail_after(OVERALL_DEADLINE):
        async with trio.open_nursery() as nursery:
            feed_port = await nursery.start(feed.serve, "127.0.0.1", 0)
            run = DemoRun(workdir, ddb_url, f"ws://127.0.0.1:{feed_port}/feed")
            try:
                code = await _scenario(run)
            finally:
                with trio.CancelScope(shield=True):
                    await _stop_all(run)
            nursery.cancel_scope.cancel()
    return code


async def _scenario(run: DemoRun) -> int:
    from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore

    run.say(f"DynamoDB (moto) at {run.ddb_url}, feed at {run.feed_url}, files in {run.workdir}")
    store = DynamoLeaseStore("shardvisor-demo", "us-east-1", run.ddb_url)
    await store.ensure_table(True)
    for worker in WORKERS:
        await _start_supervisor(run, worker)
        await trio.sleep(0.3)
    await _wait_owned(run, store, exclude=(), timeout=15)
    await _wait_balanced(run, store, timeout=20)
    await _watch(run, store, 2.0)

    victim = _owner_of_most(await store.snapshot())
    victim_shards = _shards_of(await store.snapshot(), victim)
    run.say(
        f"SIGKILL host {victim}: supervisor and children at once "
        f"(holding {', '.join(victim_shards)}); peers wait for its lease to expire"
    )
    killed_at = time.time()
    os.killpg(run.procs[victim].pid, signal.SIGKILL)
    await run.procs.pop(victim).wait()
    await _wait_owned(run, store, exclude=(victim,), timeout=DURATION + RECONCILE + 8)
    await _watch(run, store, 2.0)

    snapshot = await store.snapshot()
    drained = next(w for w in WORKERS if w in run.procs and _shards_of(snapshot, w))
    drained_shards = _shards_of(snapshot, drained)
    run.say(f"SIGTERM supervisor {drained} (holding {', '.join(drained_shards)})")
    termed_at = time.time()
    proc = run.procs.pop(drained)
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(10):
        code = await proc.wait()
    run.say(f"{drained} exited with code {code} after {time.time() - termed_at:.2f}s")
    await _wait_owned(run, store, exclude=(victim, drained), timeout=5)
    await _watch(run, store, 2.0)
    await _stop_all(run)

    audits = audit_sink_dir(run.workdir / "out")
    ok = _summary(run, audits, victim_shards, killed_at, drained_shards, termed_at) and code == 0
    run.say("demo passed: nothing lost" if ok else "demo FAILED: see the table above")
    return 0 if ok else 1


def _config_text(run: DemoRun, worker: str) -> str:
    lines = [
        f'[worker]\nid = "{worker}"\n',
        f'[dynamodb]\ntable = "shardvisor-demo"\nendpoint_url = "{run.ddb_url}"\n',
        f'[lease]\nduration = "{DURATION}s"\nheartbeat_interval = "{HEARTBEAT}s"',
        f'reconcile_interval = "{RECONCILE}s"\n',
        '[supervisor]\nshutdown_timeout = "5s"\ncheckpoint_interval = "250ms"\n',
        '[sink]\nkind = "jsonl"\npath = "out/{shard}/{stream}.{epoch}.jsonl"\n',
        '[http]\nlisten = "127.0.0.1:0"\n',  # three supervisors on one host
    ]
    for shard, streams in SHARDS.items():
        lines.append(f'[[shards]]\nid = "{shard}"')
        for stream in streams:
            url = f"{run.feed_url}/{stream}?after={{after}}"
            lines.append(f'  [[shards.streams]]\n  id = "{stream}"\n  url = "{url}"')
            lines.append('  sequence = "seq"')
    return "\n".join(lines) + "\n"


async def _start_supervisor(run: DemoRun, worker: str) -> None:
    config = run.workdir / f"{worker}.toml"
    config.write_text(_config_text(run, worker))
    logfile = (run.workdir / f"{worker}.log").open("ab")
    run.procs[worker] = await trio.lowlevel.open_process(
        [sys.executable, "-m", "supervisor", "run", "-c", str(config)],
        cwd=run.workdir,
        stdin=subprocess.DEVNULL,
        stdout=logfile,
        stderr=logfile,
        start_new_session=True,  # its own process group: the "host" the demo kills
    )
    logfile.close()
    run.say(f"started supervisor {worker} (pid {run.procs[worker].pid}, log {worker}.log)")


async def _stop_all(run: DemoRun) -> None:
    for proc in run.procs.values():
        proc.send_signal(signal.SIGTERM)
    with trio.move_on_after(10):
        for proc in run.procs.values():
            await proc.wait()
    for proc in run.procs.values():
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    run.procs.clear()
    await trio.sleep(1.2)  # children of a killed supervisor exit within 1 s of pipe EOF


def _shards_of(snapshot, worker: str) -> list[str]:
    return sorted(s.id for s in snapshot.shards if s.owner == worker)


def _owner_of_most(snapshot) -> str:
    return max(WORKERS, key=lambda w: (len(_shards_of(snapshot, w)), w))


def _view(snapshot) -> str:
    owners = {w: _shards_of(snapshot, w) for w in WORKERS}
    parts = [f"{w}: {' '.join(s) or '-'}" for w, s in owners.items()]
    unowned = [s.id for s in snapshot.shards if not s.owner]
    return " | ".join(parts) + (f" | unowned: {' '.join(unowned)}" if unowned else "")


async def _watch(run: DemoRun, store, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        view = _view(await store.snapshot())
        if view != run.last_view:
            run.say(view)
            run.last_view = view
        await trio.sleep(0.2)


async def _wait_owned(run: DemoRun, store, *, exclude: tuple[str, ...], timeout: float) -> None:
    start = time.monotonic()
    with trio.fail_after(timeout):
        while True:
            snapshot = await store.snapshot()
            view = _view(snapshot)
            if view != run.last_view:
                run.say(view)
                run.last_view = view
            owners = [s.owner for s in snapshot.shards]
            if len(owners) == len(SHARDS) and all(o and o not in exclude for o in owners):
                run.say(f"all {len(SHARDS)} shards owned ({time.monotonic() - start:.1f}s)")
                return
            await trio.sleep(0.1)


async def _wait_balanced(run: DemoRun, store, timeout: float) -> None:
    """The first supervisor up takes everything; the others get their share by hand-off."""
    start = time.monotonic()
    with trio.fail_after(timeout):
        while True:
            snapshot = await store.snapshot()
            loads = [len(_shards_of(snapshot, w)) for w in run.procs]
            view = _view(snapshot)
            if view != run.last_view:
                run.say(view)
                run.last_view = view
            if max(loads) - min(loads) <= 1 and sum(loads) == len(SHARDS):
                run.say(f"balanced by graceful hand-offs ({time.monotonic() - start:.1f}s)")
                return
            await trio.sleep(0.1)


def _summary(run, audits: dict[str, StreamAudit], killed, killed_at, drained, termed_at) -> bool:
    print()
    header = f"{'stream':<8} {'delivered':>9} {'gaps':>5} {'rewritten':>9}  {'failover':>8}"
    print(header + f"  {'hand-off':>8}  epochs")
    ok = True
    for stream, audit in sorted(audits.items()):
        shard = stream.rsplit("-", 1)[0]
        failover = audit.first_write_after(killed_at) - killed_at if shard in killed else None
        handoff = audit.switch_gap_after(termed_at) if shard in drained else None
        ok &= audit.gaps == 0 and audit.delivered > 0
        print(
            f"{stream:<8} {audit.delivered:>9} {audit.gaps:>5} {audit.rewritten:>9}  "
            f"{_secs(failover):>8}  {_secs(handoff):>8}  {','.join(map(str, audit.epochs))}"
        )
    print(
        "\nrewritten = records written again by the next owner after a crash (at-least-once;"
        "\n            readers drop them by (stream, seq) and reject older epochs)."
        f"\nfailover  = SIGKILL -> next record by the new owner (lease duration {DURATION:g}s)."
        "\nhand-off  = old owner's last record -> new owner's first record after SIGTERM.\n"
    )
    if len(audits) != sum(len(s) for s in SHARDS.values()):
        expected = sum(len(s) for s in SHARDS.values())
        print(f"missing streams: expected {expected}, saw {len(audits)}")
        ok = False
    return ok


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"
