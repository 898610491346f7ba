#!/usr/bin/env python3
"""Render out/bench/*.json (written by scripts/bench.sh's measuring scripts) as Markdown.

    .venv/bin/python scripts/bench_report.py [--publish] [--run-seconds S] [--mode full|quick]

Writes out/bench/benchmarks.md; with ``--publish`` also docs/benchmarks.md (scripts/bench.sh
passes it on a full run, never with --quick). Publishing replaces the generated part of
docs/benchmarks.md (everything above ``KEPT_MARKER``) and keeps what follows the marker: the
detailed measurements of single scripts, written by hand with their commands. A part whose
JSON is missing is shown as not measured, never left out, so every row heading is always there.
"""

# ruff: noqa: RUF001 - the report uses typographic signs on purpose
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "out" / "bench"
DOCS = ROOT / "docs" / "benchmarks.md"
KEPT_MARKER = "<!-- Generated above by scripts/bench.sh; kept below as written. -->"

# KCL's lease renewals: every lease every failover/3 - 25 ms = 3.308 s at its defaults
# (../shared/reference/anchors.md).
KCL_RENEWALS_PER_LEASE_S = 0.302
KCL_FAILOVER = {"p50": 28.9, "max": 40.9}  # KCL 2.x, kill -9, 1 survivor, defaults (model)

HEADINGS = (
    "## 1. Failover after SIGKILL",
    "## 2. Graceful hand-off on SIGTERM",
    "## 3. Child crash → writing again",
    "## 4. Throughput per child",
    "## 5. Memory per host",
    "## 6. DynamoDB requests per worker-minute",
    "## 7. Scale on one host",
)

SERVERS = {"moto": "moto's DynamoDB server", "dynalite": "dynalite"}
READS = ("GetItem", "Query", "BatchGetItem", "Scan")
STACK = ("trio", "trio-websocket", "wsproto")
NOT_MEASURED = "_Not measured in this run ({why})._\n"


# --- formatting ---------------------------------------------------------------------------------


def load(name: str) -> dict[str, Any] | None:
    path = OUT / f"{name}.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def nan(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def s(value: Any, digits: int = 2) -> str:
    return "—" if nan(value) else f"{value:.{digits}f} s"


def ms(value: Any) -> str:
    if nan(value):
        return "—"
    return f"{value * 1e3:.0f} ms" if value >= 0.1 else f"{value * 1e3:.1f} ms"


def mib(value: Any) -> str:
    return "—" if nan(value) else f"{value:.1f} MiB"


def rate(value: Any) -> str:
    return "—" if nan(value) else f"{value:,.0f}"


def ratio(a: Any, b: Any) -> str:
    if nan(a) or nan(b) or not b:
        return "—"
    return f"{a / b:.2f}×"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else math.nan,
    }


def lat(summ: dict[str, Any] | None, fmt: Any = s) -> str:
    """``p50 · p99`` of a summary."""
    if not summ or not summ.get("n"):
        return "—"
    return f"{fmt(summ['p50'])} · {fmt(summ['p99'])}"


def quick_note(data: dict[str, Any] | None) -> str:
    return " **(quick smoke run: not a measurement)**" if data and data.get("quick") else ""


# --- machine ------------------------------------------------------------------------------------


def machine() -> list[tuple[str, str]]:
    cpu, ram = "?", "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    node = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        node = subprocess.run(
            ["node", "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    dynalite = "?"
    with contextlib.suppress(OSError, ValueError):
        package = ROOT / "node_modules" / "dynalite" / "package.json"
        dynalite = json.loads(package.read_text())["version"]
    python = f"{platform.python_implementation()} {platform.python_version()}"
    return [
        ("CPUs (nproc)", str(os.cpu_count())),
        ("CPU model", cpu),
        ("RAM", ram),
        ("kernel", f"Linux {platform.release()}"),
        ("Python", python),
        (
            "trio · trio-websocket · wsproto",
            " · ".join(version(d) for d in ("trio", "trio-websocket", "wsproto")),
        ),
        ("boto3", version("boto3")),
        ("moto (its DynamoDB server, one request at a time)", version("moto")),
        ("dynalite · Node.js", f"{dynalite} · {node}"),
    ]


# --- the rows -----------------------------------------------------------------------------------


def failover_stats(result: dict[str, Any]) -> dict[str, Any]:
    ok = [t for t in result.get("samples", []) if "error" not in t]
    first = [v for t in ok for v in t["first_record_s"].values()]
    owned = [v for t in ok for v in t["owned_per_shard_s"].values()]
    return {
        "trials": len(ok),
        "failed": len(result.get("samples", [])) - len(ok),
        "first": summary(first),
        "owned": summary(owned),
        "missing": result.get("missing_records"),
        "rewritten": result.get("rewritten_records"),
    }


def row_failover(fleet: dict[str, Any] | None, lock: dict[str, Any] | None) -> tuple[str, list]:
    out = [HEADINGS[0] + quick_note(fleet) + "\n"]
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
    summary_rows = []
    if not fleet or not fleet.get("failover"):
        add(NOT_MEASURED.format(why="no out/bench/fleet.json"))
        return "\n".join(out), summary_rows
    peers = {x["setting"]: x for x in (lock or {}).get("settings", [])}
    add(
        "| kill | lease / heartbeat / reconcile | trials (orphaned streams) | shardvisor: new "
        "owner's first record p50 · p99 | shardvisor: owned p50 · p99 | python-dynamodb-lock: "
        "takeover p50 · p99 (trials) | ratio at p50, first record ÷ peer | owned ÷ peer |"
    )
    add("|---|---|---|---|---|---|---|---|")
    labels = {"3s": "3 s / 1 s / 1 s", "10s": "10 s / 2 s / 2 s (defaults)"}
    kcl_row = None
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
        add(
            f"| {kill} | {labels.get(res['setting'], res['setting'])} | {st['trials']}{failed} "
            f"({st['first']['n']}) | {lat(st['first'])} | {lat(st['owned'])} | {peer_cell} | "
            f"{r_first} | {r_owned} |"
        )
        if res["mode"] == "host" and res["setting"] == "10s":
            kcl_row = (
                "1. Failover, SIGKILL of a host, lease 10 s, against KCL",
                f"{s(st['first']['p50'])} · {s(st['first']['p99'])}",
                f"KCL reference (model, failover 10 s): p50 ≈ {KCL_FAILOVER['p50']:g} s, "
                f"max ≈ {KCL_FAILOVER['max']:g} s",
                ratio(st["first"]["p50"], KCL_FAILOVER["p50"]),
                "reference, not run here",
            )
        if res["mode"] == "host":
            summary_rows.append(
                (
                    f"1. Failover, SIGKILL of a host, lease {res['setting'].rstrip('s')} s",
                    f"{s(st['first']['p50'])} · {s(st['first']['p99'])}",
                    f"python-dynamodb-lock {lat(peer['takeover'])}" if peer else "—",
                    r_first,
                    f"{st['trials']} kills, {st['first']['n']} streams"
                    + (f"; peer {peer['trials_ok']}" if peer else ""),
                )
            )
    if kcl_row:
        summary_rows.append(kcl_row)
    add(
        f"| KCL 2.x at its defaults (reference, cannot run here) | failover 10 s, renew "
        f"3.3 s, taker scan 20 s | model | p50 ≈ {KCL_FAILOVER['p50']:g} s, max ≈ "
        f"{KCL_FAILOVER['max']:g} s | — | — | — | — |"
    )
    missing = sum(r.get("missing_records") or 0 for r in fleet["failover"])
    rewritten = sum(r.get("rewritten_records") or 0 for r in fleet["failover"])
    add(
        f"\nRecords missing across all failover fleets: **{missing}**; written again after a "
        f"kill (replayed from the last checkpoint, kept apart by the epoch): {rewritten}.\n"
    )
    for server, found in (lock or {}).get("other_servers", {}).items():
        cells = ", ".join(
            f"{x['setting'].rstrip('s')} s lease: {lat(x['takeover'])} ({x['trials_ok']} trials)"
            for x in found
        )
        add(f"The same peer on **{server}** in the same run, p50 · p99: {cells}.\n")
    if lock:
        sides = {x.get("side_by_side") for x in lock.get("settings", [])}
        add(
            f"python-dynamodb-lock {lock.get('version', '?')}: trials ran in batches of "
            f"{', '.join(str(x) for x in sorted(sides))} side by side, each on its own lock key "
            "and holder process, one waiter process with a thread per key; `safe_period` = 0.8 × "
            "lease. Its waiter declares a lock abandoned when the record version number has not "
            "changed for one lease *since the waiter last saw it change*, on its own clock, so "
            "its takeover is about one lease after the last heartbeat it saw, plus up to one "
            "retry period.\n\n"
            "Both declare a holder dead by the same rule: its heartbeat has not changed for one "
            "lease, on the observer's own clock. The peer then writes its lock in the same poll; "
            "shardvisor takes the shard in its next reconcile round (up to one reconcile interval "
            "later), then forks the child, which connects and writes. What the peer does not do: "
            "fence. A holder that was only paused (GC, swap, a partition) goes on acting on a lock "
            "it lost, and nothing in the table stops its writes; shardvisor's owner stops writing "
            "`safety_margin` (lease / 5) before any peer may take over, and every write is "
            "conditional on the shard's epoch.\n"
        )
    add(
        "KCL cannot run here (Java, jars from Maven). Its figures replay its default timers "
        "with zero network latency (a lower bound): kill -9 with one survivor, p50 28.9 s, max "
        "40.9 s at its 10 s failover time; field reports: 27 s (awslabs/amazon-kinesis-client "
        'issue #845), "up to 40s" (PR #1005), "up to 2 minutes" (PR #1482). Source: '
        "`../shared/reference/anchors.md`.\n\n"
        "Why shardvisor is faster than one lease plus a scan: every worker watches its peers' "
        "heartbeat counters at each reconcile round (a sparse index: worker items and vacant "
        "shards only), so an orphan is taken in the first round after the lease lapses, and "
        "the new child starts from a warm zygote and resumes from the checkpoint. Where the "
        "time beyond the lease goes: a peer sees the victim's last counter change only at its "
        "next round and declares it dead at a round, so a shard moves one lease plus 0 to one "
        "reconcile period (the loop sleeps its interval *after* each round) after the victim's "
        "last heartbeat; the kill itself comes 0 to one heartbeat after that heartbeat, and a "
        "trial waits for the slower of the two survivors. A supervisor killed alone leaves "
        "its children alive: they release their shards themselves (the last will), so peers "
        "take over within about a reconcile interval instead of a lease; the will names no "
        "successor (no 250 ms hand-off poll), and each orphaned child first builds its "
        "DynamoDB client (about half a second, several children at once on 2 cores).\n"
    )
    return "\n".join(out), summary_rows


def row_handoff(fleet: dict[str, Any] | None) -> tuple[str, list]:
    out = [HEADINGS[1] + quick_note(fleet) + "\n"]
    add = out.append
    h = (fleet or {}).get("handoff")
    if not h:
        add(NOT_MEASURED.format(why="no hand-off in out/bench/fleet.json"))
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
    gap = summary([t["gap_s"] for t in moves])
    lost = sum(t["lost"] for t in moves)
    dup = sum(t["duplicates"] for t in moves)
    sig = summary([t["signal_to_first_s"] for t in moves if t.get("signal_to_first_s") is not None])
    exits = summary([e["exit_s"] for e in h["events"]])
    ok = "✓" if lost == 0 and dup == 0 else "**✗ must be 0**"
    add(
        "| hand-offs (SIGTERMs) | gap p50 | gap p99 | gap max | lost | duplicates | SIGTERM → "
        "new owner's first record p50 · p99 | SIGTERM → exit p50 · max |"
    )
    add("|---|---|---|---|---|---|---|---|")
    add(
        f"| {len(moves)} ({len(h['events'])}) | {ms(gap['p50'])} | {ms(gap['p99'])} | "
        f"{ms(gap['max'])} | {lost} {ok} | {dup} {ok} | {lat(sig, ms)} | "
        f"{s(exits['p50'])} · {s(exits['max'])} |"
    )
    if others:
        og = summary([t["gap_s"] for t in others])
        add(
            f"\nRebalancing moves in the same fleet (a restarted supervisor taking its share "
            f"back; also handed over, never stolen): {len(others)}, gap p50 {ms(og['p50'])}, "
            f"p99 {ms(og['p99'])}, lost {sum(t['lost'] for t in others)}, duplicates "
            f"{sum(t['duplicates'] for t in others)}."
        )
    parts = [
        ("old owner's last record → release logged", "stop_release_s"),
        ("release → successor's take logged", "release_take_s"),
        ("take → new owner's first record", "take_first_s"),
    ]
    add(
        "\nWhere the gap goes (supervisors' logs, ms resolution), p50 · p99. Most of it is "
        "the successor's 250 ms hand-off poll, then its takes one after another (a successor "
        "handed several shards takes them some tens of ms apart):\n"
    )
    add("| step | SIGTERM hand-off |")
    add("|---|---|")
    for label, key in parts:
        add(f"| {label} | {lat(summary([t[key] for t in moves if t.get(key) is not None]), ms)} |")
    add(
        f"\nWhole fleet over the run: {h['missing_records']} records missing, "
        f"{h['rewritten_records']} written twice.\n\n"
        "Peer: KCL does not release leases on graceful shutdown (issues #845, #1452): every "
        "shard of a stopped worker waits for a full failover (above: ≈ 29 s median at its "
        'defaults); PR #1005 (releasing on shutdown) got the hand-over "below 1s". shardvisor '
        "drains each child (final flush and checkpoint), names a successor in the release, and "
        "the successor's hand-off poll (250 ms) takes it.\n"
    )
    row = (
        "2. Hand-off gap on SIGTERM",
        f"{ms(gap['p50'])} · {ms(gap['p99'])}; lost {lost}, dup {dup}",
        "KCL reference: a full failover, ≈ 29 s",
        ratio(gap["p50"], KCL_FAILOVER["p50"]),
        f"{len(moves)} hand-offs",
    )
    return "\n".join(out), [row]


def row_restart(data: dict[str, Any] | None, peer: dict[str, Any] | None) -> tuple[str, list]:
    out = [HEADINGS[2] + quick_note(data) + "\n"]
    add = out.append
    if not data or not peer:
        missing = "restart.json" if not data else "peers_supervisord.json"
        add(NOT_MEASURED.format(why=f"no out/bench/{missing}"))
        return "\n".join(out), []
    sv = data["shardvisor"]
    add(
        "shardvisor: a real supervisor, one shard, one stream from the reference feed at "
        f"{sv['settings']['feed_rate']:,.0f} msg/s (scripts/bench_restart.py's code); each "
        "trial SIGKILLs the shard worker and "
        "measures from the kill to the `ts` of the first record the restarted worker writes "
        "(new interpreter or fork, pipes, Start, WebSocket connect, replay from the checkpoint, "
        "write). The child runs longer than `restart_reset_after` (200 ms here) between trials, "
        "so each is the first crash after a healthy run, restarted at once; repeated crashes "
        "back off (100 ms → 30 s, full jitter).\n\n"
        f"Peer, same run: **supervisord** {peer.get('version', '?')} (its own virtualenv; "
        "`startsecs=0`, `autorestart=true`, `startretries` 100,000) restarting a Python "
        "program that stamps the time as its first statement, imports trio and trio-websocket "
        "(what a shard worker starts with), prints its first line, runs "
        f"{peer['settings']['run_for_s']:g} s, stamps the "
        "crash and `os._exit(1)`s. supervisord never connects to a feed nor writes a record, "
        "so its figure is a lower bound for the same work. It runs during the fleet stage: "
        "its restart time is its main loop's timers, not CPU; shardvisor's rows run alone.\n"
    )
    warm, fresh = sv["warm"], sv["fresh"]
    first, exec_ = peer["crash_to_first_output"], peer["crash_to_exec"]
    add(
        "| restart | p50 | p99 | max | trials | ratio at p50 to supervisord's first output "
        "(same run) |"
    )
    add("|---|---|---|---|---|---|")
    add(
        f"| shardvisor, warm (zygote fork, the default) → first record | {ms(warm['p50'])} | "
        f"{ms(warm['p99'])} | {ms(warm['max'])} | {warm['n']} | "
        f"{ratio(warm['p50'], first['p50'])} |"
    )
    add(
        f"| shardvisor, fresh (`python -m shard_worker`) → first record | {ms(fresh['p50'])} | "
        f"{ms(fresh['p99'])} | {ms(fresh['max'])} | {fresh['n']} | "
        f"{ratio(fresh['p50'], first['p50'])} |"
    )
    add(
        f"| supervisord → program's first statement | {ms(exec_['p50'])} | {ms(exec_['p99'])} "
        f"| {ms(exec_['max'])} | {exec_['n']} | — |"
    )
    add(
        f"| supervisord → program's first output (trio imported) | {ms(first['p50'])} | "
        f"{ms(first['p99'])} | {ms(first['max'])} | {first['n']} | 1.00× |"
    )
    add(
        f"\nWarm is {ratio(fresh['p50'], warm['p50'])} faster than fresh at the median. "
        "supervisord notices an exit in its main loop (a poll of up to 1 s) and starts the "
        "program again on a later pass of the loop; it backs off by +1 s per try when a program "
        "dies before `startsecs` (here 0, so never) and gives up after `startretries` (3 by "
        "default). KCL's MultiLangDaemon does not restart a crashed child at all: the whole JVM "
        "exits, every shard of the host with it (anchors: amazon-kinesis-client MultiLangDaemon "
        "behaviour).\n"
    )
    rows = [
        (
            "3. Child crash → writing again, warm",
            f"{ms(warm['p50'])} · {ms(warm['p99'])}",
            f"supervisord {lat(first, ms)}",
            ratio(warm["p50"], first["p50"]),
            f"{warm['n']}; peer {first['n']}",
        ),
        (
            "3. Child crash → writing again, fresh",
            f"{ms(fresh['p50'])} · {ms(fresh['p99'])}",
            f"supervisord {lat(first, ms)}",
            ratio(fresh["p50"], first["p50"]),
            f"{fresh['n']}; peer {first['n']}",
        ),
    ]
    return "\n".join(out), rows


def row_throughput(data: dict[str, Any] | None) -> tuple[str, list]:
    out = [HEADINGS[3] + quick_note(data) + "\n"]
    add = out.append
    if not data:
        add(NOT_MEASURED.format(why="no out/bench/throughput.json"))
        return "\n".join(out), []
    loops = data.get("loops", {})
    add(
        f"Messages/s of {data['message_bytes']}-byte text messages from a local feed process "
        f"({data['feed']}) that sends as fast as TCP takes them, so the receiver is the "
        f"bottleneck. Each figure: {data['warm_up_s']:g} s of warm-up, then "
        f"{data['seconds_per_measurement']:g} s counted; {data['runs']} runs of each, "
        "interleaved, median shown; the feed on one CPU, every receiver pinned to the other. "
        "The shardvisor child is a real `python -m shard_worker` "
        "driven over its pipes as the supervisor does (sequence checked, checkpoints every "
        "second; its rate from its heartbeats' `written` counter). Peers in the same run: a "
        "bare trio-websocket receive loop with the worker's connection settings (the ceiling "
        "of our stack) and a bare `websockets` (asyncio) client loop, defaults, as a user "
        "might write it instead.\n"
    )
    bare = loops.get("bare trio-websocket", {}).get("rate", {}).get("p50")
    other = loops.get("bare websockets", {}).get("rate", {}).get("p50")
    add(
        "| receiver | messages/s (median) | min – max | runs | ÷ bare trio-websocket | "
        "÷ bare websockets | CPU per message (median) |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|")
    names = {
        "child → jsonl": "shardvisor child → jsonl sink",
        "child → no-op handler": "shardvisor child → no-op handler",
        "bare trio-websocket": "bare trio-websocket loop (ceiling)",
        "bare websockets": "bare `websockets` loop (peer)",
    }
    for key, label in names.items():
        found = loops.get(key)
        if not found:
            why = data.get("errors", {}).get(key) or data.get("errors", {}).get(
                "shardvisor child", "not measured"
            )
            add(f"| {label} | {why} | | | | | |")
            continue
        r = found["rate"]
        cpu = found.get("cpu_us_per_message") or {}
        cpu_cell = f"{cpu['p50']:.1f} µs" if cpu.get("n") else "—"
        add(
            f"| {label} | {rate(r['p50'])} | {rate(r.get('min'))} – {rate(r['max'])} | {r['n']} "
            f"| {ratio(r['p50'], bare)} | {ratio(r['p50'], other)} | {cpu_cell} |"
        )
    versions = data.get("versions", {})
    add(
        f"\ntrio-websocket {versions.get('trio-websocket', '?')}, websockets "
        f"{versions.get('websockets', '?')}. A real feed rarely sends more than a few thousand "
        "messages/s per connection; the point of the ceiling is the headroom per core. "
        "`websockets` parses frames in C (its speedups module) where trio-websocket uses "
        "wsproto in pure Python: a faster client library is the lever for more per core.\n"
    )
    rows = []
    for key in ("child → jsonl", "child → no-op handler"):
        found = loops.get(key, {}).get("rate", {})
        if found:
            rows.append(
                (
                    f"4. Throughput per {key.replace('→', 'to')}",
                    f"{rate(found['p50'])} msg/s",
                    f"bare websockets {rate(other)}; bare trio-websocket {rate(bare)}",
                    f"{ratio(found['p50'], other)} ({ratio(found['p50'], bare)} of trio-ws)",
                    f"{found['n']} runs",
                )
            )
    return "\n".join(out), rows


def row_memory(data: dict[str, Any] | None) -> tuple[str, list]:
    out = [HEADINGS[4] + quick_note(data) + "\n"]
    add = out.append
    memory = (data or {}).get("memory")
    settings = (data or {}).get("settings", {})
    if not memory:
        add(NOT_MEASURED.format(why="no out/bench/memory.json"))
        return "\n".join(out), []
    add(
        "One supervisor process (`python -m supervisor run`) per spawn mode on "
        f"{SERVERS.get(settings.get('server', 'moto'), '?')}, one stream per shard at "
        f"{settings.get('feed_rate_per_stream', 10):g} msg/s, started with the smallest count "
        "and grown (at most 8 shards at a time) by rewriting its file and SIGHUP. At each size, "
        "once every stream has written and 3 s "
        "more have passed: the supervisor's RSS and PSS, and each child's PSS from "
        "`/proc/<pid>/smaps_rollup` (PSS splits shared pages between their users: what a child "
        "really costs). The zygote is shared by every warm child.\n"
    )
    add(
        "| spawn | shards | supervisor RSS | supervisor PSS | PSS per child (mean) | zygote "
        "PSS | per shard incl. zygote | whole host (PSS) |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|")
    by: dict[tuple[str, int], dict[str, Any]] = {}
    for spawn, rows in memory.items():
        for r in rows:
            by[(spawn, r["shards"])] = r
            label = "warm (zygote)" if spawn == "zygote" else "fresh"
            add(
                f"| {label} | {r['shards']} | {mib(r['supervisor_rss_mib'])} | "
                f"{mib(r['supervisor_pss_mib'])} | {mib(r['child_pss_mean_mib'])} | "
                f"{mib(r['zygote_pss_mib']) if spawn == 'zygote' else '—'} | "
                f"{mib(r['per_shard_with_zygote_mib'])} | {mib(r['host_total_pss_mib'])} |"
            )
    add(
        "\nNo peer runs here: KCL's MultiLangDaemon also runs one interpreter per lease (a "
        "fresh start each, like `fresh` above) beside a JVM; supervisord runs whatever it is "
        "given, with no shared warm parent.\n"
    )
    rows = []
    counts = sorted({n for _, n in by})
    if counts:
        n = counts[-1]
        warm, fresh = by.get(("zygote", n)), by.get(("fresh", n))
        if warm and fresh:
            rows.append(
                (
                    f"5. Memory, {n} shards, per shard incl. zygote",
                    f"warm {mib(warm['per_shard_with_zygote_mib'])}",
                    f"fresh {mib(fresh['per_shard_with_zygote_mib'])} (not a peer)",
                    ratio(warm["per_shard_with_zygote_mib"], fresh["per_shard_with_zygote_mib"]),
                    "1 host per mode",
                )
            )
    return "\n".join(out), rows


def row_requests(fleet: dict[str, Any] | None) -> tuple[str, list]:
    out = [HEADINGS[5] + quick_note(fleet) + "\n"]
    add = out.append
    requests = (fleet or {}).get("requests")
    if not requests:
        add(NOT_MEASURED.format(why="no out/bench/requests.json"))
        return "\n".join(out), []
    window = max(r["window_s"] for r in requests)
    add(
        "One supervisor per configuration, each behind its own counting reverse proxy "
        "(scripts/wire_counter.py) in front of its own moto server: every request counted on "
        f"the wire by its `X-Amz-Target`, over {window:.0f} s of steady state (after every "
        "shard is owned and flowing, and one more reconcile round). Defaults otherwise "
        "(heartbeat 2 s, reconcile 2 s, hand-off poll 250 ms, full scan every 60 s). Lease "
        "traffic = everything but checkpoint writes. KCL renews every lease every 3.3 s: "
        f"{KCL_RENEWALS_PER_LEASE_S} renewal writes per lease per second, i.e. "
        f"{KCL_RENEWALS_PER_LEASE_S * 60:.1f} per lease per minute, before its reads (a "
        "full-table taker scan every 20 s) and checkpoints.\n"
    )
    add(
        "| shards on the worker | checkpoint interval | all requests | reads (Get / Query / "
        "BatchGet / Scan) | heartbeat writes | checkpoint writes | shardvisor lease requests "
        "(all but checkpoints) | KCL renewal writes | lease requests ÷ KCL | lease writes ÷ KCL |"
    )
    add("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for r in sorted(requests, key=lambda x: (x["checkpoint_interval"], x["shards"])):
        p = r["per_minute"]
        ops = p["by_op"]
        reads = " / ".join(f"{ops.get(op, 0.0):.0f}" for op in READS)
        lease = p["total"] - p["checkpoint"]
        writes = lease - p["reads"]
        kcl = KCL_RENEWALS_PER_LEASE_S * 60 * r["shards"]
        add(
            f"| {r['shards']} | {r['checkpoint_interval']:g} s | {p['total']:.0f} | "
            f"{p['reads']:.0f} ({reads}) | {p['heartbeat']:.1f} | {p['checkpoint']:.0f} | "
            f"{lease:.0f} | {kcl:,.0f} | {ratio(lease, kcl)} | {ratio(writes, kcl)} |"
        )
        if r["checkpoint_interval"] == 1.0:
            n = r["shards"]
            rows.append(
                (
                    f"6. DynamoDB lease requests / worker-minute, {n} shard{'s' * (n != 1)}",
                    f"{lease:.0f} ({writes:.0f} writes)",
                    f"KCL renewal writes {kcl:,.0f}",
                    f"{ratio(lease, kcl)} ({ratio(writes, kcl)} writes)",
                    f"{r['window_s']:.0f} s on the wire",
                )
            )
    add(
        "\nshardvisor's reads are a fixed cost per worker (the hand-off poll, a Query on a "
        "sparse index every 250 ms, and the reconcile round's BatchGet every 2 s), whatever "
        "its shard count; its only lease write is one heartbeat per worker every 2 s. KCL's "
        "renewal writes grow with the leases a worker holds. At one shard per worker "
        "shardvisor makes more requests than KCL's renewals; from a handful of shards on, "
        "fewer. Reads cost a fifth of a write or less (a Query on the sparse index returns a "
        "few hundred bytes: half a read unit). The Queries are the hand-off poll (every 250 ms "
        "plus the query's own time) and two per reconcile round (worker items and vacant "
        "shards); BatchGetItem is one strongly consistent read of every worker item per round; "
        "Scan is the full scan every `full_scan_interval` (60 s). Checkpoint writes scale with "
        "busy shards and, at the default 1 s interval, are most of a busy worker's writes; "
        "KCL checkpoints too, so they are shown apart below.\n"
    )
    cost = (fleet or {}).get("cost")
    if cost:
        sv, kcl = cost["shardvisor"], cost["kcl_renewals"]
        add(
            f"\nMonthly on-demand cost of the lease traffic for {cost['shards']:,} shards over "
            f"{cost['workers']} workers ({cost['shards_per_worker']} shards each), from the "
            f"measured rates (30-day month; ${cost['prices']['wru_per_million']} per million "
            f"writes, ${cost['prices']['rru_per_million']} per million reads, us-east-1):\n"
        )
        add("| traffic | units / month | USD / month |")
        add("|---|---:|---:|")
        add(
            f"| shardvisor heartbeats (1 write per worker per heartbeat) | "
            f"{sv['heartbeat_wru_month'] / 1e6:,.1f} M WRU | ${sv['heartbeat_usd_month']:,.2f} |"
        )
        add(
            f"| shardvisor reconcile, hand-off poll and full-scan reads | "
            f"{sv['read_rru_month'] / 1e6:,.1f} M RRU | ${sv['read_usd_month']:,.2f} |"
        )
        add(f"| **shardvisor lease traffic** | | **${sv['usd_month']:,.2f}** |")
        add(
            f"| **KCL lease renewals alone** ({KCL_RENEWALS_PER_LEASE_S} / lease / s) | "
            f"{kcl['wru_month'] / 1e6:,.1f} M WRU | **${kcl['usd_month']:,.2f}** |"
        )
        for interval, ck in cost.get("checkpoints", {}).items():
            add(
                f"| checkpoints every {interval}, busy shards (both systems checkpoint; the "
                f"interval is yours) | {ck['wru_month'] / 1e6:,.1f} M WRU | "
                f"${ck['usd_month']:,.2f} |"
            )
            if interval == "1s":  # one write per busy shard per interval: a tenth at 10 s
                add(
                    f"| checkpoints every 10 s, busy shards (model: a tenth of the 1 s figure) "
                    f"| {ck['wru_month'] / 1e7:,.1f} M WRU | ${ck['usd_month'] / 10:,.2f} |"
                )
        add(
            f"\nshardvisor's lease traffic costs {ratio(sv['usd_month'], kcl['usd_month'])} of "
            "KCL's renewals alone: one heartbeat write per *worker* instead of one renewal per "
            "*lease*; liveness of a shard is its owner's heartbeat counter. In read units the "
            "per-round BatchGetItem of every worker item dominates (one read unit per worker "
            "item, every worker, every round): a term that grows with the square of the fleet "
            "size. Anchors: KCL 1,000 "
            "leases ≈ $490/month in renewals (../shared/reference/anchors.md).\n"
        )
        rows.append(
            (
                f"6. Monthly lease cost, {cost['shards']:,} shards / {cost['workers']} workers",
                f"${sv['usd_month']:,.2f}",
                f"KCL renewals ${kcl['usd_month']:,.2f}",
                ratio(sv["usd_month"], kcl["usd_month"]),
                "model from measured rates",
            )
        )
    return "\n".join(out), rows


def row_scale(data: dict[str, Any] | None) -> tuple[str, list]:
    out = [HEADINGS[6] + quick_note(data) + "\n"]
    add = out.append
    sc = (data or {}).get("scale")
    if not sc:
        add(NOT_MEASURED.format(why="no out/bench/scale.json"))
        return "\n".join(out), []
    add(
        f"One supervisor at its defaults (warm spawn, lease 10 s, checkpoint 1 s) with "
        f"{sc['shards']} shards × {sc['streams_per_shard']} streams ({sc['streams']} WebSocket "
        f"connections, {sc['feed_rate_per_stream']:g} msg/s each) on moto's server, from a "
        "cold start: the time from starting the process to every stream's first record "
        "(`ts`), and the supervisor's CPU (utime + stime of `/proc/<pid>/stat`) over "
        f"{sc['cpu_window_s']:.0f} s of steady state, starting 5 s after all streams flow.\n"
    )
    per = sc["start_to_stream_flowing"]
    mem = sc["memory"]
    add("| measure | figure |")
    add("|---|---:|")
    add(f"| start → all {sc['streams']} streams flowing | {s(sc['start_to_all_flowing_s'])} |")
    add(f"| start → a stream flowing, p50 · p99 | {lat(per)} |")
    add(f"| supervisor CPU at steady state | {sc['supervisor_cpu_percent']:.1f} % of one core |")
    cc = sc.get("child_cpu_percent", {})
    if cc.get("n"):
        add(f"| each child's CPU, p50 · max | {cc['p50']:.1f} % · {cc['max']:.1f} % |")
    add(f"| supervisor RSS | {mib(mem['supervisor_rss_mib'])} |")
    add(f"| PSS per child (mean) · zygote | {mib(mem['child_pss_mean_mib'])} · "
        f"{mib(mem['zygote_pss_mib'])} |")  # fmt: skip
    add(f"| whole host (PSS) | {mib(mem['host_total_pss_mib'])} |")
    add(
        "\nNo peer figure: KCL takes one lease per taker scan (every 20 s) beyond its fair "
        "share and starts one interpreter per lease; a worker cold-starting onto vacant leases "
        "takes them in its first scan, but each MultiLangDaemon child is a fresh interpreter.\n"
    )
    row = (
        f"7. Scale: {sc['shards']}×{sc['streams_per_shard']} streams, start → all flowing",
        f"{s(sc['start_to_all_flowing_s'])}; CPU {sc['supervisor_cpu_percent']:.1f} %",
        "—",
        "—",
        "1 cold start",
    )
    return "\n".join(out), [row]


# --- the document -------------------------------------------------------------------------------

STATIC = """\
## Not part of this run

**Balancing** (pure planner, simulated fleet; deterministic, so not machine-dependent):
`.venv/bin/python -m pytest tests/core/test_balance_simulation.py -s` — 1,000 shards, 20 workers,
lease 10 s, reconcile 2 s, three seeds, every worker planning from the table as it is when its
turn comes.

| change | visible in round | rounds to max − min ≤ 1 | moves (minimum) | failed takes |
|---|---|---|---|---|
| cold start (20 workers at once) | 1 | 1 | 0 (1,000 initial takes) | 0 |
| a worker joins | 1 | 2 | 47–48 (47–48) | 0 |
| a worker leaves (graceful) | 1 | 1 | 50 (50) | 0 |
| a worker dies | 5 (after the lease) | 1 | 50 (50) | 0 |

The KCL steals one lease per 20 s scan: rebalancing 48 shards onto a new worker takes it about
16 minutes.

**Spawn latency and death detection**: `.venv/bin/python scripts/bench_spawn.py` (spawn → hello,
idle PSS, SIGKILL → pidfd readable / `wait()` returned, warm and fresh). Almost all of the
few milliseconds of death detection is the kernel tearing down a Python + trio process;
supervisord, for comparison, notices exits in a loop of up to 1 s.

**Backpressure** (a slow handler's child RSS over time): `scripts/bench_throughput.py`; figures in
*Sinks: throughput and memory under backpressure* below.
"""


def render(mode: str, run_seconds: float | None) -> str:
    fleet, lock, requests = load("fleet"), load("peers_lock"), load("requests")
    restart, throughput, scale = load("restart"), load("throughput"), load("scale")
    sections, rows = [], []
    for text, found in (
        row_failover(fleet, lock),
        row_handoff(fleet),
        row_restart(restart, load("peers_supervisord")),
        row_throughput(throughput),
        row_memory(load("memory") or scale),
        row_requests(requests or fleet),
        row_scale(scale),
    ):
        sections.append(text)
        rows += found
    head = []
    add = head.append
    add("# Benchmarks\n")
    add(
        "Generated by `scripts/bench.sh` (one command: set-up included, everything on "
        "127.0.0.1 against moto's DynamoDB server and dynalite; under 10 minutes on 2 cores) "
        "through `scripts/bench_report.py` from `out/bench/*.json`. Do not edit this part by "
        "hand: change the templates in `scripts/bench_report.py` and re-run. The sections "
        "after *Further measurements* are kept as written when the report is published.\n"
    )
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head_commit = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head_commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    took = f", the whole run took {run_seconds / 60:.1f} min" if run_seconds else ""
    add(f"Run: {stamp}, commit {head_commit or '?'}, mode **{mode}**{took}.")
    if mode == "quick":
        add(
            "\n**This is a quick smoke run (`scripts/bench.sh --quick`): one or two trials "
            "each, parts side by side. Its figures show that the benchmark runs, nothing more.**"
        )
    if fleet and not fleet.get("quick"):
        busy = fleet.get("machine_cpu_busy_percent")
        add(
            "\nStage 1 runs rows 1 and 2, python-dynamodb-lock, supervisord and row 5 in three "
            "lanes side by side: their figures are dominated by lease and loop timers (seconds), "
            "or do not depend on timing at all (memory)"
            + (f"; the machine was {busy:.0f} % busy during that stage" if busy else "")
            + ". Rows 6, 3, 4 and 7 then run one at a time, alone."
        )
        others = sorted(
            {line for part in (fleet, requests) if part for line in part.get("busy_at_end", [])}
            | {line for part in (fleet, requests) if part for line in part.get("busy_at_start", [])}
        )
        if others:
            add(
                "\n**Note: other test or benchmark processes were running during the run:** "
                + "; ".join(f"`{line[:80]}`" for line in others[:5])
            )
    failed = [e for part in (fleet, requests) if part for e in part.get("errors", [])]
    if failed:
        add(
            "\n**Parts that failed in this run:** "
            + "; ".join(f"`{e.get('job', '?')}`: {str(e.get('error', '?'))[:200]}" for e in failed)
        )
    add(
        "\nPercentiles are nearest-rank: with fewer than 100 samples p99 is the largest "
        "sample. Ratios are shardvisor ÷ peer: below 1 means shardvisor takes less time (rows "
        "1–3, 6), above 1 means it moves more messages (row 4).\n"
    )
    add("## Summary\n")
    add("| row | shardvisor (p50 · p99) | peer (same run, unless a reference) | ratio | trials |")
    add("|---|---|---|---|---|")
    for row in rows:
        add("| " + " | ".join(row) + " |")
    add("\n## Machine\n")
    add("| | |")
    add("|---|---|")
    for key, value in machine():
        add(f"| {key} | {value} |")
    peers = []
    if lock:
        peers.append(f"python-dynamodb-lock {lock.get('version', '?')}")
    if supervisord := load("peers_supervisord"):
        peers.append(f"supervisor (supervisord) {supervisord.get('version', '?')}")
    if throughput:
        peers.append(f"websockets {throughput.get('versions', {}).get('websockets', '?')}")
    add(f"| peers (own virtualenvs under out/bench/) | {', '.join(peers) or '—'} |")
    add("")
    return "\n".join(head) + "\n" + "\n".join(sections) + "\n" + STATIC


def published(generated: str, current: str) -> str:
    """The new generated part, then whatever ``current`` keeps after the marker."""
    _, marker, kept = current.partition(KEPT_MARKER)
    return generated.rstrip("\n") + "\n\n" + KEPT_MARKER + (kept if marker else "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publish", action="store_true", help="also write docs/benchmarks.md")
    parser.add_argument("--run-seconds", type=float, default=0.0)
    parser.add_argument("--mode", choices=("full", "quick"), default="")
    args = parser.parse_args()
    mode = args.mode
    if not mode:
        parts = ("fleet", "requests", "restart", "throughput", "memory", "scale")
        quick = any((load(n) or {}).get("quick") for n in parts)
        mode = "quick" if quick else "full"
    if args.publish and mode == "quick":
        sys.exit("bench_report.py: a quick run is never published to docs/benchmarks.md")
    text = render(mode, args.run_seconds or None)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "benchmarks.md").write_text(text)
    print(f"report: {(OUT / 'benchmarks.md').relative_to(ROOT)}")
    if args.publish:
        DOCS.write_text(published(text, DOCS.read_text() if DOCS.exists() else ""))
        print(f"published: {DOCS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
