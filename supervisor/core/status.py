"""``shardvisor status``: the fleet as the table shows it, for humans and for scripts (--json)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.config.model import Config
from supervisor.core.items import ShardItem, Snapshot


def fleet_status(
    snapshot: Snapshot,
    config: Config,
    wall_now: float,
    read_ago: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The public ``status --json`` document.

    ``heartbeat_age_s`` compares the worker's own wall-clock stamp with ours: good enough for a
    human, never used for lease decisions (those watch the counter on a monotonic clock).
    ``read_ago`` (a supervisor's own view, the fleet page): seconds since each worker item was
    read, for a view that reads a peer's item only after a membership change (a peer it
    does not watch). Ages are then as of that read (``read_ago_s`` says how old it is), and
    a worker is shown dead for an old heartbeat only when the read was fresh, or by its
    watchers' death notice.
    """
    owned: dict[str, list[str]] = {}
    for shard in snapshot.shards:
        if shard.owner:
            owned.setdefault(shard.owner, []).append(shard.id)
    workers = []
    standing_by: dict[str, list[str]] = {}  # shard -> workers with a ready standby of it
    for w in snapshot.workers:
        ago = read_ago.get(w.id, 0.0) if read_ago is not None else 0.0
        age = max(0.0, wall_now - ago - w.heartbeat_at)
        state = w.state
        if state != "stopped" and age > config.lease.duration:
            state = "dead"
        elif state == "running" and w.drain_requested:
            state = "draining"  # requested; the worker confirms at its next heartbeat
        standbys = sorted(w.standbys) if state not in ("dead", "stopped") else []
        for shard_id in standbys:
            standing_by.setdefault(shard_id, []).append(w.id)
        row = {
            "id": w.id,
            "state": state,
            "heartbeat_age_s": round(age, 3),
            "heartbeat_counter": w.counter,
            "host": w.host,
            "pid": w.pid,
            "shards": sorted(owned.get(w.id, [])),
            "standbys": standbys,  # shards whose standby child is ready there
        }
        if read_ago is not None:
            row["read_ago_s"] = round(ago, 3)
        workers.append(row)
    shards = [
        {
            "id": s.id,
            "owner": s.owner or None,
            "epoch": s.epoch,
            "checkpoint": dict(sorted(s.checkpoint.items())),
            "state": _shard_state(s),
            "source": "table" if s.spec else "config",  # `shards add`, or [[shards]] in TOML
            # Streams silent past their timeout, as the owner last published (none unowned).
            "stale": list(s.stale) if s.owner else [],
            # The owner's reconnects since its take, per stream and reason (a few seconds late).
            "reconnects": dict(sorted(s.reconnects.items())) if s.owner else {},
            "standbys": sorted(standing_by.get(s.id, [])),  # workers with a ready standby
        }
        for s in snapshot.shards
    ]
    return {"workers": workers, "shards": shards}


def _shard_state(shard: ShardItem) -> str:
    if shard.retired_at:
        return "retired" if not shard.owner else "retiring"
    if shard.owner and (shard.release_requested or shard.handoff_stage):
        return "handing-off"  # asked to, or waiting for its successor's standby
    return shard.state or ("running" if shard.owner else "unowned")


def render_table(status: dict[str, Any]) -> str:
    lines = ["WORKER                STATE     HEARTBEAT  SHARDS"]
    for w in status["workers"]:
        shards = ",".join(w["shards"]) or "-"
        lines.append(f"{w['id']:<21} {w['state']:<9} {w['heartbeat_age_s']:>8.1f}s  {shards}")
    lines += [
        "",
        "SHARD                 OWNER                 EPOCH  STATE      STANDBYS              "
        "CHECKPOINT",
    ]
    for s in status["shards"]:
        cp = " ".join(f"{k}={v}" for k, v in s["checkpoint"].items()) or "-"
        owner = s["owner"] or "-"
        standbys = ",".join(s["standbys"]) or "-"
        row = f"{s['id']:<21} {owner:<21} {s['epoch']:>5}  {s['state']:<10} {standbys:<21}"
        lines.append(f"{row} {cp}{_stream_notes(s)}")
    return "\n".join(lines)


def _stream_notes(shard: dict[str, Any]) -> str:
    """After the checkpoint: the stale streams, and each stream's reconnects by reason."""
    notes = f"  stale: {','.join(shard['stale'])}" if shard.get("stale") else ""
    for stream, reasons in shard.get("reconnects", {}).items():
        counts = " ".join(f"{reason}={n}" for reason, n in sorted(reasons.items()))
        notes += f"  {stream} reconnects: {counts}"
    return notes
