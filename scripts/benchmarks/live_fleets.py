"""Row 8's fleets: two real supervisors on a live-only feed (a client gets only what is generated
after it connected), with ``[standby] count`` 0 or 1, through repeated deploys (SIGTERM of the
most loaded one: every stream it held moves to the other) or host deaths (SIGKILL of its whole
process group). The victim comes back under the same worker id; its share comes back to it by
rebalancing (graceful hand-offs too). Read afterwards: the sink files against the feed's
numbering (``benchmarks.live_moves``) and the supervisors' logs. Run by ``benchmarks.live``.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

import attrs
import trio

from benchmarks.fleets import (
    LEASES,
    bench_fleet,
    feed_for,
    first_record_ts,
    snapshot,
    stop,
    wait_settled,
)
from benchmarks.live_moves import analyse
from benchmarks.standby_cost import standby_cost
from supervisor.devtools.fleet import Fleet

WORKERS = ("w1", "w2")
RATE = 200.0  # msg/s per stream, in 10 ms ticks: a gap is resolved to about 10 ms


@attrs.frozen
class Setup:
    kill: str  # "deploy" (SIGTERM of the supervisor) or "host" (SIGKILL of its process group)
    standbys: int  # [standby] count
    server: str  # the DynamoDB server's kind, for the report
    lease: str = "10s"  # fleets.LEASES
    shards: int = 8  # one stream each
    cost: bool = False  # also measure what a standby costs (count = 1 only)

    @property
    def name(self) -> str:
        return f"live-{self.kill}-c{self.standbys}-{self.server}"


async def live_fleet(setup: Setup, trials: int, server_url: str, quick: bool) -> dict[str, Any]:
    """``trials`` deploys or host deaths of ``setup``'s fleet on the server at ``server_url``."""
    prefix = f"{setup.kill[0]}{setup.standbys}"
    shards = {f"{prefix}s{i}": [f"{prefix}s{i}-a"] for i in range(1, setup.shards + 1)}
    feed = await feed_for(shards, RATE, live=True)
    fleet = bench_fleet(
        setup.name,
        server_url,
        feed.url,
        shards,
        lease=setup.lease,
        live_feed=True,
        sections={"standby": {"count": setup.standbys}},
    )
    events: list[dict[str, Any]] = []
    cost: dict[str, Any] | None = None
    kills: Counter[str] = Counter()
    try:
        await fleet.store.ensure_table(True)
        for worker in WORKERS:
            await fleet.start(worker)
        await _settled(fleet, setup)
        if setup.cost:
            cost = await standby_cost(fleet, RATE, quick)
        for trial in range(trials):
            try:
                events.append(await _trial(fleet, setup, kills))
            except trio.TooSlowError as exc:
                events.append({"trial": trial, "error": f"timed out: {exc!r}"})
                for worker, proc in fleet.procs.items():  # bring the fleet back to two
                    if proc.returncode is not None:
                        await fleet.start(worker)
            print(f"  {setup.name} trial {trial + 1}/{trials}: {_short(events[-1])}", flush=True)
        if not quick:
            await _settled(fleet, setup)  # the victim's share back: hand-offs too
        await trio.sleep(1.0)  # the last new owners write for a while
    finally:
        codes = await stop(fleet)
        feed.stop()
    audits = await trio.to_thread.run_sync(fleet.audit)
    return {
        **attrs.asdict(setup),
        "name": setup.name,
        "workers": len(WORKERS),
        "feed_rate": RATE,
        "duration": LEASES[setup.lease][0],
        "exit_codes": codes,
        "standby_cost": cost,
        **analyse(fleet, events, audits),
    }


async def _settled(fleet: Fleet, setup: Setup) -> None:
    duration, _, reconcile = LEASES[setup.lease]
    await wait_settled(
        fleet,
        timeout=3 * duration + 40,  # a rebalance waits for the lease duration (its dwell)
        window=2.0,
        stable=reconcile + 0.5,  # the restarted worker has been seen: it can be a successor
        standbys=setup.standbys,
        balanced=True,
    )


async def _trial(fleet: Fleet, setup: Setup, kills: Counter[str]) -> dict[str, Any]:
    """One deploy or host death of the most loaded supervisor (among equals the one hit least
    often), until its shards have new owners writing; then it starts again."""
    await _settled(fleet, setup)
    snap = await snapshot(fleet)
    loads = Counter(s.owner for s in snap.shards)
    victim = max(fleet.live(), key=lambda w: (loads[w], -kills[w], w))
    kills[victim] += 1
    moving = {s.id: s.epoch for s in snap.shards if s.owner == victim}
    proc = fleet.procs[victim]
    duration, _, reconcile = LEASES[setup.lease]
    t_kill = time.time()
    if setup.kill == "host":
        os.killpg(proc.pid, signal.SIGKILL)  # supervisor, zygote and children at once
    else:
        proc.send_signal(signal.SIGTERM)
    with trio.fail_after(30):
        code = await proc.wait()
    exit_s = time.time() - t_kill
    new = {}
    with trio.fail_after(2 * duration + reconcile + 15):
        while len(new) < len(moving):
            for item in (await snapshot(fleet)).shards:
                moved = item.id in moving and item.owner not in ("", victim)
                if moved and item.epoch > moving[item.id]:
                    new[item.id] = item
            await trio.sleep(0.1)
    first: dict[str, float] = {}
    with trio.fail_after(15):  # the new owner's first record of each moved stream
        for sid, item in new.items():
            for stream in fleet.shards[sid]:
                while (ts := first_record_ts(fleet.sink(sid, stream, item.epoch))) is None:
                    await trio.sleep(0.02)
                first[stream] = ts - t_kill
    await trio.sleep(1.0)  # written on for a while before the victim comes back
    await fleet.start(victim)
    await fleet.wait_registered(victim, timeout=30, poll=0.5)
    return {
        "victim": victim,
        "kill": setup.kill,
        "kill_wall": t_kill,
        "exit_code": code,
        "exit_s": exit_s,
        "shards": moving,
        "new_owners": {sid: [item.owner, item.epoch] for sid, item in new.items()},
        "first_record_s": first,
    }


def _short(event: dict[str, Any]) -> str:
    if "error" in event:
        return str(event["error"])
    return (
        f"{event['kill']} of {event['victim']} ({len(event['shards'])} shards, exit "
        f"{event['exit_code']} after {event['exit_s']:.2f}s) -> first records by "
        f"{max(event['first_record_s'].values()):.2f}s"
    )
