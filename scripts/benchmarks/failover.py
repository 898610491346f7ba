"""Row 1: failover after a SIGKILL, in a fleet of three real supervisors over six shards.

Mode "host": SIGKILL of a supervisor's whole process group (supervisor, zygote and children at
once: a dead host, no last will). Mode "supervisor": SIGKILL of the supervisor alone, whose
children release their shards themselves (the last will). Per trial, from the kill: until every
orphaned shard is owned by a live peer (the taker's ``owner_since``), and until the new owner's
first record of each orphaned stream (the record's ``ts``). The victim, the most loaded worker,
comes back under the same worker id before the next trial. Run by ``benchmarks.fleet``.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections import Counter
from typing import Any

import trio

from benchmarks.fleets import (
    LEASES,
    bench_fleet,
    feed_for,
    first_record_ts,
    fleet_totals,
    snapshot,
    stop,
    wait_settled,
)
from supervisor.config.model import SupervisorConfig
from supervisor.devtools.fleet import Fleet, alive, child_pids

WORKERS = ("w1", "w2", "w3")
SHARDS = 6
RATE = 50.0  # msg/s per stream; the new owner replays from its checkpoint at once
# Sinks flush at each checkpoint: a stream is flowing when it wrote within this window.
WINDOW = SupervisorConfig().checkpoint_interval + 1.5


async def failover_fleet(mode: str, setting: str, trials: int, server: str) -> dict[str, Any]:
    """``trials`` kills of ``mode`` at lease ``setting`` ("3s" or "10s") on the server at
    ``server``; every trial's sample, and the records missing or written twice overall."""
    duration, heartbeat, reconcile = LEASES[setting]
    name = f"failover-{mode}-{setting}"
    shards = {f"{mode}-{setting}-k{i}": [f"{mode}-{setting}-k{i}-a"] for i in range(1, SHARDS + 1)}
    feed = await feed_for(shards, RATE)
    fleet = bench_fleet(name, server, feed.url, shards, lease=setting)
    samples: list[dict[str, Any]] = []
    kills: Counter[str] = Counter()
    try:
        await fleet.store.ensure_table(True)
        for worker in WORKERS:
            await fleet.start(worker)
        await wait_settled(fleet, timeout=30 + duration, window=2.0)
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
        codes = await stop(fleet)
        feed.stop()
    audits = await trio.to_thread.run_sync(fleet.audit)
    return {
        "name": name,
        "mode": mode,
        "setting": setting,
        "duration": duration,
        "heartbeat": heartbeat,
        "reconcile": reconcile,
        **fleet_totals(len(WORKERS), SHARDS, RATE, audits),
        "samples": samples,
        "exit_codes": codes,
    }


def short(sample: dict[str, Any]) -> str:
    if "error" in sample:
        return str(sample["error"])
    return (
        f"killed {sample['victim']} ({len(sample['orphans'])} shards) -> owned "
        f"{sample['owned_s']:.2f}s, first record {max(sample['first_record_s'].values()):.2f}s"
    )


async def failover_trial(
    fleet: Fleet, mode: str, trial: int, kills: Counter[str], duration: float, reconcile: float
) -> dict[str, Any]:
    snap = await wait_settled(fleet, timeout=3 * duration + 20, window=WINDOW, stable=0.5)
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
    new, seen_at, released_at = await _taken_over(fleet, victim, orphans, duration, reconcile)
    owned = {sid: item.owner_since - t_kill for sid, item in new.items()}
    snap = await snapshot(fleet)  # the victim's item keeps its last heartbeat's wall-clock stamp
    last_hb = next((w.heartbeat_at for w in snap.workers if w.id == victim), math.nan)
    first: dict[str, float] = {}
    with trio.fail_after(15):  # the new owner's first record of each orphaned stream
        for sid, item in new.items():
            for stream in fleet.shards[sid]:
                while (ts := first_record_ts(fleet.sink(sid, stream, item.epoch))) is None:
                    await trio.sleep(0.02)
                first[stream] = ts - t_kill
    kids_exit_s = None
    if mode == "supervisor":  # the last will: the children exit by themselves
        with trio.fail_after(10):
            while [pid for pid in kids if alive(pid)]:
                await trio.sleep(0.05)
        kids_exit_s = time.time() - t_kill
    snap = await snapshot(fleet)
    state = next((w.state for w in snap.workers if w.id == victim), "")  # "orphaned" after a will
    await fleet.start(victim)  # the same worker id: a restarted host
    await fleet.wait_registered(victim, timeout=30, poll=0.5)
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
        "victim_state_after": state,
        "kill_wall": t_kill,
    }


async def _taken_over(
    fleet: Fleet, victim: str, orphans: dict[str, int], duration: float, reconcile: float
) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
    """Poll the table (every 100 ms) until every orphan is owned by a peer with a new epoch:
    the new items, when each was first seen so, and when each was first seen unowned."""
    new: dict[str, Any] = {}
    seen_at: dict[str, float] = {}
    released_at: dict[str, float] = {}  # seen unowned (the last will released it)
    with trio.fail_after(2 * duration + reconcile + 15):
        while len(new) < len(orphans):
            snap = await snapshot(fleet)
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
    return new, seen_at, released_at
