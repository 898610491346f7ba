"""Rows 1 and 2 of the report: failover after SIGKILL, graceful hand-off on SIGTERM."""

# ruff: noqa: RUF001 - the report uses typographic signs on purpose
from __future__ import annotations

from typing import Any

from benchmarks.anchors import KCL_FAILOVER
from benchmarks.report.common import Load, Rendered, heading, not_measured
from benchmarks.stats import summary
from benchmarks.tables import lat, ms, ratio, s, table

LEASES = {"3s": "3 s / 1 s / 1 s", "10s": "10 s / 2 s / 2 s (defaults)"}


def failover_stats(result: dict[str, Any]) -> dict[str, Any]:
    ok = [t for t in result.get("samples", []) if "error" not in t]
    return {
        "trials": len(ok),
        "failed": len(result.get("samples", [])) - len(ok),
        "first": summary(v for t in ok for v in t["first_record_s"].values()),
        "owned": summary(v for t in ok for v in t["owned_per_shard_s"].values()),
    }


def failover(load: Load) -> Rendered:
    fleet, lock = load("fleet"), load("peers_lock")
    out = [heading(1, fleet)]
    add = out.append
    add(
        "Three supervisors (real processes) over six shards of one stream each (feed 50 msg/s "
        "per stream), on moto's DynamoDB server. A trial SIGKILLs the whole process group of "
        "the most loaded supervisor (supervisor, zygote and children at once: a dead host, no "
        "last will) and measures, per orphaned stream, from the kill to the `ts` of the first "
        'record the new owner writes; "owned" is the new owner\'s `owner_since` in the table. '
        "The victim comes back under the same worker id before the next trial.\n\n"
        "Peer, side by side in the same run: **python-dynamodb-lock** (PyPI) on its own server "
        "of the same kind, at the same lease duration and heartbeat. A holder process acquires "
        "a lock and heartbeats; a waiting client polls every heartbeat period (the library's "
        "default retry period; shardvisor's reconcile interval is the same); the holder is "
        "SIGKILLed at a random phase of its heartbeat; the figure is the kill → the waiter's "
        "`acquire_lock` returned. It only takes a lock: it writes no record, so the closest "
        "shardvisor figure is *owned*; the *first record* column adds the child's start and "
        "WebSocket connect.\n"
    )
    if not fleet or not fleet.get("failover"):
        add(not_measured("no out/bench/fleet.json"))
        return "\n".join(out), []
    peers = {x["setting"]: x for x in (lock or {}).get("settings", [])}
    rows, summary_rows, kcl_row = [], [], None
    for res in fleet["failover"]:
        st = failover_stats(res)
        peer = peers.get(res["setting"]) if res["mode"] == "host" else None
        kill = "host (process group)" if res["mode"] == "host" else "supervisor alone (last will)"
        failed = f", **{st['failed']} failed**" if st["failed"] else ""
        if peer:
            take = peer["takeover"]
            pf = f", {peer['trials_failed']} failed" if peer.get("trials_failed") else ""
            peer_cell = f"{lat(take)} ({peer['trials_ok']}{pf})"
            r_first = ratio(st["first"]["p50"], take["p50"])
            r_owned = ratio(st["owned"]["p50"], take["p50"])
        else:
            peer_cell = "— (no peer for a last will)" if res["mode"] != "host" else "—"
            r_first = r_owned = "—"
        rows.append(
            (
                kill,
                LEASES.get(res["setting"], res["setting"]),
                f"{st['trials']}{failed} ({st['first']['n']})",
                lat(st["first"]),
                lat(st["owned"]),
                peer_cell,
                r_first,
                r_owned,
            )
        )
        first = f"{s(st['first']['p50'])} · {s(st['first']['p99'])}"
        if res["mode"] == "host" and res["setting"] == "10s":
            kcl_row = (
                "1. Failover, SIGKILL of a host, lease 10 s, against KCL",
                first,
                f"KCL reference (model, failover 10 s): p50 ≈ {KCL_FAILOVER['p50']:g} s, "
                f"max ≈ {KCL_FAILOVER['max']:g} s",
                ratio(st["first"]["p50"], KCL_FAILOVER["p50"]),
                "reference, not run here",
            )
        if res["mode"] == "host":
            summary_rows.append(
                (
                    f"1. Failover, SIGKILL of a host, lease {res['setting'].rstrip('s')} s",
                    first,
                    f"python-dynamodb-lock {lat(peer['takeover'])}" if peer else "—",
                    r_first,
                    f"{st['trials']} kills, {st['first']['n']} streams"
                    + (f"; peer {peer['trials_ok']}" if peer else ""),
                )
            )
    if kcl_row:
        summary_rows.append(kcl_row)
    rows.append(
        (
            "KCL 2.x at its defaults (reference, cannot run here)",
            "failover 10 s, renew 3.3 s, taker scan 20 s",
            "model",
            f"p50 ≈ {KCL_FAILOVER['p50']:g} s, max ≈ {KCL_FAILOVER['max']:g} s",
            *("—",) * 4,
        )
    )
    header = (
        "kill",
        "lease / heartbeat / reconcile",
        "trials (orphaned streams)",
        "shardvisor: new owner's first record p50 · p99",
        "shardvisor: owned p50 · p99",
        "python-dynamodb-lock: takeover p50 · p99 (trials)",
        "ratio at p50, first record ÷ peer",
        "owned ÷ peer",
    )
    add(table(header, rows))
    add(_failover_notes(fleet, lock))
    return "\n".join(out), summary_rows


def _failover_notes(fleet: dict[str, Any], lock: dict[str, Any] | None) -> str:
    missing = sum(r.get("missing_records") or 0 for r in fleet["failover"])
    rewritten = sum(r.get("rewritten_records") or 0 for r in fleet["failover"])
    out = [
        f"\nRecords missing across all failover fleets: **{missing}**; written again after a "
        f"kill (replayed from the last checkpoint, kept apart by the epoch): {rewritten}.\n"
    ]
    for server, found in (lock or {}).get("other_servers", {}).items():
        cells = ", ".join(
            f"{x['setting'].rstrip('s')} s lease: {lat(x['takeover'])} ({x['trials_ok']} trials)"
            for x in found
        )
        out.append(f"The same peer on **{server}** in the same run, p50 · p99: {cells}.\n")
    if lock:
        sides = {x.get("side_by_side") for x in lock.get("settings", [])}
        out.append(
            f"python-dynamodb-lock {lock.get('version', '?')}: trials ran in batches of "
            f"{', '.join(str(x) for x in sorted(sides))} side by side, each on its own lock key "
            "and holder process, one waiter process with a thread per key; `safe_period` = 0.8 × "
            "lease. Its waiter declares a lock abandoned when the record version number has not "
            "changed for one lease *since the waiter last saw it change*, on its own clock, so "
            "its takeover is about one lease after the last heartbeat it saw, plus up to one "
            "retry period.\n\n"
            "Both declare a holder dead by the same rule: its heartbeat has not changed for one "
            "lease, on the observer's own clock. The peer then writes its lock in the same poll; "
            "shardvisor's watchers run a round when the lease falls due and take the shard, "
            "then fork the child, which connects and writes. What the peer does not do: "
            "fence. A holder that was only paused (GC, swap, a partition) goes on acting on a lock "
            "it lost, and nothing in the table stops its writes; shardvisor's owner stops writing "
            "`safety_margin` (lease / 5) before any peer may take over, and every write is "
            "conditional on the shard's epoch.\n"
        )
    out.append(
        "KCL cannot run here (Java, jars from Maven). Its figures replay its default timers "
        "with zero network latency (a lower bound): kill -9 with one survivor, p50 28.9 s, max "
        "40.9 s at its 10 s failover time; field reports: 27 s (awslabs/amazon-kinesis-client "
        'issue #845), "up to 40s" (PR #1005), "up to 2 minutes" (PR #1482). Source: '
        "`../shared/reference/anchors.md`.\n\n"
        "Why shardvisor is faster than one lease plus a scan: each worker watches two peers' "
        "heartbeat counters (the watch ring; eventually consistent reads timed on their "
        "heartbeats, so it sees each within tens of ms of landing), runs a "
        "round when a watched peer's lease falls due, confirms it with a strongly consistent "
        "read and takes its part; its death notice and death marker bring the death to the "
        "other workers within a hand-off poll (in this fleet of three both survivors watch "
        "the victim). The new child starts from a warm zygote and resumes from the "
        "checkpoint. Where the time goes: the lease runs from the watcher's first sight of "
        "the victim's last counter (tens of ms after it landed); the "
        "kill itself comes 0 to one heartbeat after that heartbeat, so at the median the take "
        "comes before a lease has passed since the kill; then the round's reads (side by side; "
        "a round that only lost a member takes before it scans), the take, "
        "the child's start; a trial waits for the slower of the two survivors. A supervisor "
        "killed alone leaves "
        "its children alive: they release their shards themselves (the last will), so peers "
        "take over within about a reconcile interval instead of a lease; the will names no "
        "successor (no 250 ms hand-off poll), and each orphaned child first builds its "
        "DynamoDB client (about half a second, several children at once on 2 cores).\n"
    )
    return "\n".join(out)


def failover_detail(load: Load) -> Rendered:
    """Not published: where the time goes per orphan, from the victim's last heartbeat, and
    when a last will's release became visible (``python -m benchmarks.fleet`` prints it)."""
    fleet = load("fleet") or {}
    rows = []
    for res in fleet.get("failover", []):
        ok = [t for t in res.get("samples", []) if "error" not in t]

        def p50_max(key: str, samples: list[dict[str, Any]] = ok) -> str:
            found = summary(
                v
                for t in samples
                for v in (t[key].values() if isinstance(t.get(key), dict) else [t.get(key)])
                if v is not None
            )
            return f"{s(found['p50'])} · {s(found['max'])}"

        rows.append(
            (
                "host" if res["mode"] == "host" else "supervisor alone",
                res["setting"].replace("s", " s"),
                p50_max("owned_per_shard_s"),
                p50_max("kill_after_last_heartbeat_s"),
                p50_max("owned_after_last_heartbeat_s"),
                p50_max("released_seen_s"),
            )
        )
    if not rows:
        return "", []
    header = (
        "kill",
        "lease",
        "owned per orphan p50 · max",
        "kill after the victim's last heartbeat p50 · max",
        "all owned after the last heartbeat p50 · max",
        "last-will release visible p50 · max",
    )
    return "Failover in detail (not published):\n\n" + table(header, rows) + "\n", []


def handoff(load: Load) -> Rendered:
    fleet = load("fleet")
    out = [heading(2, fleet)]
    add = out.append
    h = (fleet or {}).get("handoff")
    if not h:
        add(not_measured("no hand-off in out/bench/fleet.json"))
        return "\n".join(out), []
    add(
        f"{h['workers']} supervisors over {h['shards']} shards (one stream each, feed "
        f"{h['feed_rate']:g} msg/s per stream), every setting at its default. Repeatedly: "
        "SIGTERM the most loaded supervisor, wait until its shards have new owners, start it "
        "again. Per stream of each handed-off shard, the gap is the new epoch's first record "
        "minus the old epoch's last record; lost = sequence numbers skipped between them, "
        "duplicates = sequence numbers written in both.\n"
    )
    moves = [t for t in h["transitions"] if t["cause"] == "sigterm"]
    others = [t for t in h["transitions"] if t["cause"] != "sigterm"]
    gap = summary(t["gap_s"] for t in moves)
    lost = sum(t["lost"] for t in moves)
    dup = sum(t["duplicates"] for t in moves)
    sig = summary(t["signal_to_first_s"] for t in moves if t.get("signal_to_first_s") is not None)
    exits = summary(e["exit_s"] for e in h["events"])
    ok = "✓" if lost == 0 and dup == 0 else "**✗ must be 0**"
    header = (
        "hand-offs (SIGTERMs)",
        "gap p50",
        "gap p99",
        "gap max",
        "lost",
        "duplicates",
        "SIGTERM → new owner's first record p50 · p99",
        "SIGTERM → exit p50 · max",
    )
    cells = (
        f"{len(moves)} ({len(h['events'])})",
        ms(gap["p50"]),
        ms(gap["p99"]),
        ms(gap["max"]),
        f"{lost} {ok}",
        f"{dup} {ok}",
        lat(sig, ms),
        f"{s(exits['p50'])} · {s(exits['max'])}",
    )
    add(table(header, [cells]))
    if others:
        og = summary(t["gap_s"] for t in others)
        add(
            f"\nRebalancing moves in the same fleet (a restarted supervisor taking its share "
            f"back; also handed over, never stolen): {len(others)}, gap p50 {ms(og['p50'])}, "
            f"p99 {ms(og['p99'])}, lost {sum(t['lost'] for t in others)}, duplicates "
            f"{sum(t['duplicates'] for t in others)}."
        )
    add(
        "\nWhere the gap goes (supervisors' logs, ms resolution), p50 · p99. Every move is "
        "make-before-break (issue 14): the successor first gets a standby child connected, "
        "the old child stops at the cut, the old owner releases on its child's `stopped`, and "
        "the successor, reading the shard item every 20 ms meanwhile, takes it and promotes "
        "the standby (no spawn, no connect). What is left is DynamoDB requests one after "
        "another (release, read, take), several shards at once on moto's one-request-at-a-"
        "time server:\n"
    )
    steps = (
        ("old owner's last record → release logged", "stop_release_s"),
        ("release → successor's take logged", "release_take_s"),
        ("take → new owner's first record", "take_first_s"),
    )
    add(
        table(
            ("step", "SIGTERM hand-off"),
            [
                (label, lat(summary(t[key] for t in moves if t.get(key) is not None), ms))
                for label, key in steps
            ],
        )
    )
    add(
        f"\nWhole fleet over the run: {h['missing_records']} records missing, "
        f"{h['rewritten_records']} written twice.\n\n"
        "Peer: KCL does not release leases on graceful shutdown (issues #845, #1452): every "
        "shard of a stopped worker waits for a full failover (above: ≈ 29 s median at its "
        'defaults); PR #1005 (releasing on shutdown) got the hand-over "below 1s". shardvisor '
        "hands each shard to a successor whose standby child is already connected (row 8: the "
        "same on a feed that does not replay).\n"
    )
    row = (
        "2. Hand-off gap on SIGTERM",
        f"{ms(gap['p50'])} · {ms(gap['p99'])}; lost {lost}, dup {dup}",
        "KCL reference: a full failover, ≈ 29 s",
        ratio(gap["p50"], KCL_FAILOVER["p50"]),
        f"{len(moves)} hand-offs",
    )
    return "\n".join(out), [row]
