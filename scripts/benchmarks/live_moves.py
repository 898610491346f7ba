"""Every move of every stream of a row-8 fleet, read back from its sink files and logs.

A move is a change of epoch in a stream's records. Lost = the sequence numbers between the old
epoch's last record and the new one's first that nobody wrote: on a live-only feed the feed's
numbering runs on while no one is connected, so what no child read shows as a jump. Written
twice = numbers in both epochs (a standby taking over a dead owner's shard writes again what
the owner wrote after its last checkpoint: at-least-once). The writer gap = the new epoch's
first record's ``ts`` minus the old one's last (both are write times). For a graceful hand-off
the supervisors' logs (ms resolution) split the hand-off into its steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from supervisor.devtools.fleet import Fleet
from supervisor.devtools.sink_audit import EpochChange, StreamAudit, epoch_changes

# A hand-off's steps as the logs show them: (name, whose log, event prefix(es), whose epoch).
# "released" and "seen": a release and the successor's take of it, or (a successor that
# adopts) the hand-over and the successor's adoption; "taken" is the take's or the adoption's
# "took shard" line.
STEPS: tuple[tuple[str, str, str | tuple[str, ...], str | None], ...] = (
    ("request", "old", "handing off make-before-break", "old"),
    ("ready", "new", "standby ready for a hand-off", None),
    ("stop_sent", "old", "successor ", "old"),  # "successor N ready: stopping at the cut"
    ("stopped", "old", "stopped (", "old"),  # the child's own line
    ("released", "old", ("released at the child's stop", "handed over at the child's stop"), "old"),
    ("seen", "new", ("released to us: taking", "handed over to us: adopting"), None),
    ("taken", "new", "took shard", "new"),
)
Log = list[dict[str, Any]]


def analyse(fleet: Fleet, events: list[dict[str, Any]], audits: dict[str, StreamAudit]) -> dict:
    """The moves of every stream, each with its cause (the trial's kill, or a rebalance)."""
    logs = {w: fleet.log_events(w) for w in fleet.procs}
    killed = [ev for ev in events if "shards" in ev]
    cause = {(sid, e): ev["kill"] for ev in killed for sid, e in ev["shards"].items()}
    moves = [
        _move(change, cause.get((change.shard, change.old), "rebalance"), logs)
        for change in epoch_changes(fleet.shards, audits)
    ]
    return {
        "events": events,
        "moves": moves,
        "lost_total": sum(a.lost for a in audits.values()),
        "delivered": sum(a.delivered for a in audits.values()),
        "rewritten": sum(a.rewritten for a in audits.values()),
        "interleaved": sum(len(a.interleavings()) for a in audits.values()),
    }


def _move(change: EpochChange, cause: str, logs: dict[str, Log]) -> dict[str, Any]:
    shard, stream, old, new = change.shard, change.stream, change.old, change.new
    epochs = (old, new)
    a, b = change.before, change.after
    a_last, b_first = max(r.ts for r in a), min(r.ts for r in b)
    a_seqs, b_seqs = {r.seq for r in a}, {r.seq for r in b}
    who = {"old": a[0].worker, "new": b[0].worker}
    found: dict[str, Any] = {
        "shard": shard,
        "stream": stream,
        "old_epoch": old,
        "new_epoch": new,
        "from": who["old"],
        "to": who["new"],
        "cause": cause,
        "gap_s": b_first - a_last,
        "lost": max(0, min(b_seqs) - max(a_seqs) - 1),
        "duplicates": len(a_seqs & b_seqs),
    }
    if cause == "host":
        return found
    released = _first(logs.get(who["old"], []), "released:", shard, old)
    found["mode"] = (
        "make_before_break"
        if released and "make_before_break" in released["event"]
        else "break_before_make"
    )
    steps = _steps(shard, epochs, who, logs)
    steps["old_last_write"], steps["new_first_write"] = a_last, b_first
    found["steps"] = steps
    return found


def _steps(shard: str, epochs: tuple[int, int], who: dict[str, str], logs: dict[str, Log]) -> dict:
    """When each step of the hand-off was logged (unix seconds; None when not found)."""
    epoch = {"old": epochs[0], "new": epochs[1]}
    at: dict[str, float | None] = {}
    after = 0.0
    for name, side, prefix, whose in STEPS:
        entry = _first(
            logs.get(who[side], []), prefix, shard, epoch[whose] if whose else None, after
        )
        at[name] = entry["t"] if entry else None
        if entry and name == "request":
            after = entry["t"]  # the answer to this request, not to an earlier one
    return at


def _first(
    log: Sequence[dict[str, Any]],
    prefix: str | tuple[str, ...],
    shard: str,
    epoch: int | None,
    after: float = 0.0,
) -> dict[str, Any] | None:
    """The first entry of ``log`` for ``shard`` (and ``epoch``, unless None) whose event
    starts with ``prefix``, logged at ``after`` or later."""
    for entry in log:
        if (
            entry.get("shard") == shard
            and (epoch is None or entry.get("epoch") == epoch)
            and entry["t"] >= after
            and str(entry.get("event", "")).startswith(prefix)
        ):
            return entry
    return None
