"""Row 2: the gap of a graceful hand-off on SIGTERM, every setting at its default.

Three real supervisors over nine shards of one stream each. Repeatedly: SIGTERM the most loaded
supervisor, wait until its shards have new owners, start it again. Per stream of each handed-off
shard, the gap is the new epoch's first record minus the old epoch's last; lost = sequence numbers
skipped between them, duplicates = sequence numbers written in both. The supervisors' JSON logs
split the gap into release, take and first write. Run by ``benchmarks.fleet``.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from typing import Any

import trio

from benchmarks.fleets import (
    DEFAULT_LEASE,
    bench_fleet,
    feed_for,
    fleet_totals,
    logged_at,
    snapshot,
    stop,
    wait_settled,
)
from supervisor.config.model import SupervisorConfig
from supervisor.devtools.fleet import Fleet
from supervisor.devtools.sink_audit import StreamAudit, Written, epoch_changes

WORKERS = ("w1", "w2", "w3")
SHARDS = 9
RATE = 200.0  # msg/s per stream, generated in 10 ms ticks: the gap is resolved to <= 10 ms
SHUTDOWN = SupervisorConfig().shutdown_timeout


async def handoff_fleet(min_handoffs: int, server: str) -> dict[str, Any]:
    """SIGTERMs until at least ``min_handoffs`` shards were handed off."""
    shards = {f"h{i}": [f"h{i}-a"] for i in range(1, SHARDS + 1)}
    feed = await feed_for(shards, RATE)
    fleet = bench_fleet("handoff-sigterm", server, feed.url, shards)
    events: list[dict[str, Any]] = []
    try:
        await fleet.store.ensure_table(True)
        for worker in WORKERS:
            await fleet.start(worker)
        await wait_settled(fleet, timeout=40, window=2.0)
        handed = 0
        while handed < min_handoffs:
            event = await sigterm_one(fleet)
            events.append(event)
            handed += len(event["shards"])
            print(
                f"  handoff-sigterm: SIGTERM {event['victim']} ({len(event['shards'])} shards, "
                f"exit {event['exit_code']} after {event['exit_s']:.2f}s); "
                f"{handed}/{min_handoffs} hand-offs",
                flush=True,
            )
        await trio.sleep(2.0)  # let the last new owners write for a while
    finally:
        codes = await stop(fleet)
        feed.stop()
    audits = await trio.to_thread.run_sync(fleet.audit)
    return analyse(fleet, events, audits, codes)


async def sigterm_one(fleet: Fleet) -> dict[str, Any]:
    """SIGTERM the most loaded supervisor, wait for new owners of its shards, restart it."""
    reconcile = DEFAULT_LEASE.reconcile_interval
    # The restarted worker must have been seen by its peers (one reconcile round) before the
    # next SIGTERM, so that it can be named a successor.
    await trio.sleep(reconcile + 0.5)
    snap = await wait_settled(fleet, timeout=60, window=2.0, stable=0.5)
    loads = Counter(s.owner for s in snap.shards)
    victim = max(fleet.live(), key=lambda w: (loads[w], w))
    moving = {s.id: s.epoch for s in snap.shards if s.owner == victim}
    proc = fleet.procs[victim]
    t_term = time.time()
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(SHUTDOWN + 10):
        code = await proc.wait()
    exited_s = time.time() - t_term
    with trio.fail_after(reconcile * 3 + 10):
        while True:
            now = {s.id: s for s in (await snapshot(fleet)).shards}
            if all(now[sid].owner and now[sid].epoch > e for sid, e in moving.items()):
                break
            await trio.sleep(0.2)
    await fleet.start(victim)
    await fleet.wait_registered(victim, timeout=30, poll=0.5)
    return {
        "victim": victim,
        "sigterm_wall": t_term,
        "exit_code": code,
        "exit_s": exited_s,
        "shards": moving,
        "new_owners": {sid: [now[sid].owner, now[sid].epoch] for sid in moving},
    }


def analyse(
    fleet: Fleet,
    events: list[dict[str, Any]],
    audits: dict[str, StreamAudit],
    codes: dict[str, int | None],
) -> dict[str, Any]:
    """Every change of epoch of every stream: its cause, gap, losses and decomposition."""
    logs = {w: fleet.log_events(w) for w in WORKERS}
    term_at = {(sid, e): ev["sigterm_wall"] for ev in events for sid, e in ev["shards"].items()}
    transitions = [
        _transition(c.shard, c.stream, c.old, c.new, (c.before, c.after), logs, term_at)
        for c in epoch_changes(fleet.shards, audits)
    ]
    return {
        **fleet_totals(len(WORKERS), SHARDS, RATE, audits),
        "events": events,
        "transitions": transitions,
        "exit_codes": codes,
    }


def _transition(
    shard: str,
    stream: str,
    old: int,
    new: int,
    moved: tuple[list[Written], list[Written]],
    logs: dict[str, list[dict[str, Any]]],
    term_at: dict[tuple[str, int], float],
) -> dict[str, Any]:
    a, b = moved  # the old epoch's records, the new one's
    a_last, b_first = max(r.ts for r in a), min(r.ts for r in b)
    a_seqs, b_seqs = {r.seq for r in a}, {r.seq for r in b}
    cause = "sigterm" if (shard, old) in term_at else "rebalance"
    # From the supervisors' logs (ms resolution): old owner's last record -> its release logged
    # (on its child's stop; else when the child is gone) -> new owner's take logged -> first
    # record.
    old_log = logs.get(a[0].worker, [])
    released = logged_at(old_log, "released at the child's stop", shard, old) or logged_at(
        old_log, "released:", shard, old
    )
    taken = logged_at(logs.get(b[0].worker, []), "took shard", shard, new)
    return {
        "shard": shard,
        "stream": stream,
        "old_epoch": old,
        "new_epoch": new,
        "from": a[0].worker,
        "to": b[0].worker,
        "cause": cause,
        "gap_s": b_first - a_last,
        "signal_to_first_s": b_first - term_at[(shard, old)] if cause == "sigterm" else None,
        "duplicates": len(a_seqs & b_seqs),
        "lost": max(0, min(b_seqs) - max(a_seqs) - 1),
        "stop_release_s": released - a_last if released else None,
        "release_take_s": taken - released if taken and released else None,
        "take_first_s": b_first - taken if taken else None,
    }
