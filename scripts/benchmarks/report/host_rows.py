"""Rows 3, 5 and 7 of the report: one host's restart, memory and scale (row 4: throughput_rows)."""

# ruff: noqa: RUF001 - the report uses typographic signs on purpose
from __future__ import annotations

from typing import Any

from benchmarks.report.common import Load, Rendered, heading, not_measured
from benchmarks.tables import LEFT, RIGHT, lat, mib, ms, ratio, s, table

SERVERS = {"moto": "moto's DynamoDB server", "dynalite": "dynalite"}


def restart(load: Load) -> Rendered:
    data, peer = load("restart"), load("peers_supervisord")
    out = [heading(3, data)]
    add = out.append
    if not data:
        add(not_measured("no out/bench/restart.json"))
        return "\n".join(out), []
    sv = data["shardvisor"]
    add(
        "shardvisor: a real supervisor, one shard, one stream from the reference feed at "
        f"{sv['settings']['feed_rate']:,.0f} msg/s (`python -m benchmarks.restart`); each "
        "trial SIGKILLs the shard worker and "
        "measures from the kill to the `ts` of the first record the restarted worker writes "
        "(new interpreter or fork, pipes, Start, WebSocket connect, replay from the checkpoint, "
        "write). The child runs longer than `restart_reset_after` (200 ms here) between trials, "
        "so each is the first crash after a healthy run, restarted at once; repeated crashes "
        "back off (100 ms → 30 s, full jitter).\n"
    )
    if peer:
        add(
            f"Peer, same run: **supervisord** {peer.get('version', '?')} (its own virtualenv; "
            "`startsecs=0`, `autorestart=true`, `startretries` 100,000) restarting a Python "
            "program that stamps the time as its first statement, imports trio and "
            "trio-websocket (what a shard worker starts with), prints its first line, runs "
            f"{peer['settings']['run_for_s']:g} s, stamps the crash and `os._exit(1)`s. "
            "supervisord never connects to a feed nor writes a record, so its figure is a lower "
            "bound for the same work. It runs during the fleet stage: its restart time is its "
            "main loop's timers, not CPU; shardvisor's rows run alone.\n"
        )
    else:
        add(not_measured("the peer: no out/bench/peers_supervisord.json"))
    warm, fresh = sv["warm"], sv["fresh"]
    first = (peer or {}).get("crash_to_first_output", {"p50": None, "p99": None, "n": 0})

    def cells(label: str, found: dict[str, Any], against: str) -> tuple[object, ...]:
        return (label, ms(found["p50"]), ms(found["p99"]), ms(found["max"]), found["n"], against)

    header = (
        "restart",
        "p50",
        "p99",
        "max",
        "trials",
        "ratio at p50 to supervisord's first output (same run)",
    )
    rows = [
        cells(
            "shardvisor, warm (zygote fork, the default) → first record",
            warm,
            ratio(warm["p50"], first["p50"]),
        ),
        cells(
            "shardvisor, fresh (`python -m shard_worker`) → first record",
            fresh,
            ratio(fresh["p50"], first["p50"]),
        ),
    ]
    if peer:
        rows.append(cells("supervisord → program's first statement", peer["crash_to_exec"], "—"))
        rows.append(cells("supervisord → program's first output (trio imported)", first, "1.00×"))
    add(table(header, rows))
    add(
        f"\nWarm is {ratio(fresh['p50'], warm['p50'])} faster than fresh at the median. "
        "supervisord notices an exit in its main loop (a poll of up to 1 s) and starts the "
        "program again on a later pass of the loop; it backs off by +1 s per try when a program "
        "dies before `startsecs` (here 0, so never) and gives up after `startretries` (3 by "
        "default). KCL's MultiLangDaemon does not restart a crashed child at all: the whole JVM "
        "exits, every shard of the host with it (anchors: amazon-kinesis-client MultiLangDaemon "
        "behaviour).\n"
    )
    summary_rows = [
        (
            f"3. Child crash → writing again, {mode}",
            f"{ms(found['p50'])} · {ms(found['p99'])}",
            f"supervisord {lat(first, ms)}",
            ratio(found["p50"], first["p50"]),
            f"{found['n']}; peer {first['n']}",
        )
        for mode, found in (("warm", warm), ("fresh", fresh))
    ]
    return "\n".join(out), summary_rows


def memory(load: Load) -> Rendered:
    data = load("memory") or load("scale")
    out = [heading(5, data)]
    add = out.append
    found = (data or {}).get("memory")
    settings = (data or {}).get("settings", {})
    if not found:
        add(not_measured("no out/bench/memory.json"))
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
    by: dict[tuple[str, int], dict[str, Any]] = {}
    rows = []
    for spawn, sizes in found.items():
        for r in sizes:
            by[(spawn, r["shards"])] = r
            rows.append(
                (
                    "warm (zygote)" if spawn == "zygote" else "fresh",
                    r["shards"],
                    mib(r["supervisor_rss_mib"]),
                    mib(r["supervisor_pss_mib"]),
                    mib(r["child_pss_mean_mib"]),
                    mib(r["zygote_pss_mib"]) if spawn == "zygote" else "—",
                    mib(r["per_shard_with_zygote_mib"]),
                    mib(r["host_total_pss_mib"]),
                )
            )
    header = (
        "spawn",
        "shards",
        "supervisor RSS",
        "supervisor PSS",
        "PSS per child (mean)",
        "zygote PSS",
        "per shard incl. zygote",
        "whole host (PSS)",
    )
    add(table(header, rows, LEFT + RIGHT * 7))
    add(
        "\nNo peer runs here: KCL's MultiLangDaemon also runs one interpreter per lease (a "
        "fresh start each, like `fresh` above) beside a JVM; supervisord runs whatever it is "
        "given, with no shared warm parent.\n"
    )
    summary_rows = []
    counts = sorted({n for _, n in by})
    if counts:
        n = counts[-1]
        warm, fresh = by.get(("zygote", n)), by.get(("fresh", n))
        if warm and fresh:
            summary_rows.append(
                (
                    f"5. Memory, {n} shards, per shard incl. zygote",
                    f"warm {mib(warm['per_shard_with_zygote_mib'])}",
                    f"fresh {mib(fresh['per_shard_with_zygote_mib'])} (not a peer)",
                    ratio(warm["per_shard_with_zygote_mib"], fresh["per_shard_with_zygote_mib"]),
                    "1 host per mode",
                )
            )
    return "\n".join(out), summary_rows


def scale(load: Load) -> Rendered:
    data = load("scale")
    out = [heading(7, data)]
    add = out.append
    sc = (data or {}).get("scale")
    if not sc:
        add(not_measured("no out/bench/scale.json"))
        return "\n".join(out), []
    add(
        f"One supervisor at its defaults (warm spawn, lease 10 s, checkpoint 1 s) with "
        f"{sc['shards']} shards × {sc['streams_per_shard']} streams ({sc['streams']} WebSocket "
        f"connections, {sc['feed_rate_per_stream']:g} msg/s each) on moto's server, from a "
        "cold start: the time from starting the process to every stream's first record "
        "(`ts`), and the supervisor's CPU (utime + stime of `/proc/<pid>/stat`) over "
        f"{sc['cpu_window_s']:.0f} s of steady state, starting 5 s after all streams flow.\n"
    )
    mem = sc["memory"]
    rows = [
        (f"start → all {sc['streams']} streams flowing", s(sc["start_to_all_flowing_s"])),
        ("start → a stream flowing, p50 · p99", lat(sc["start_to_stream_flowing"])),
        ("supervisor CPU at steady state", f"{sc['supervisor_cpu_percent']:.1f} % of one core"),
    ]
    cc = sc.get("child_cpu_percent", {})
    if cc.get("n"):
        rows.append(("each child's CPU, p50 · max", f"{cc['p50']:.1f} % · {cc['max']:.1f} %"))
    rows += [
        ("supervisor RSS", mib(mem["supervisor_rss_mib"])),
        (
            "PSS per child (mean) · zygote",
            f"{mib(mem['child_pss_mean_mib'])} · {mib(mem['zygote_pss_mib'])}",
        ),
        ("whole host (PSS)", mib(mem["host_total_pss_mib"])),
    ]
    add(table(("measure", "figure"), rows, LEFT + RIGHT))
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


def backpressure(load: Load) -> Rendered:
    """Not published (docs/benchmarks.md keeps a run's figures by hand): a child's RSS while its
    handler takes a tenth of the feed (``python -m benchmarks.throughput --backpressure S``)."""
    bp = (load("throughput") or {}).get("backpressure")
    if not bp:
        return "", []
    rss = bp["rss_mib"]
    return (
        f"Backpressure: feed {bp['feed_rate']:,.0f} msg/s, handler {bp['handler_rate']:,.0f} "
        "msg/s (it sleeps), batches of 100; the child's VmRSS:\n\n"
        + table(
            ("t (s)", *(f"{t:.0f}" for t, _ in rss)),
            [("VmRSS (MiB)", *(f"{m:.1f}" for _, m in rss))],
        )
        + f"\n\nThe handler took {bp['handled']:,} records while the feed offered "
        f"{bp['offered']:,}; the final checkpoint is {bp['checkpoint']:,}; missing or repeated "
        f"below it: {bp['missing_or_repeated']}.\n",
        [],
    )


SPAWN_ROWS = (
    ("spawn → hello p50", "hello_p50", "ms"),
    ("spawn → hello p99", "hello_p99", "ms"),
    ("PSS per idle child, {n} running", "pss_{n}", "MiB"),
    ("SIGKILL → pidfd readable p50", "seen_p50", "ms"),
    ("SIGKILL → pidfd readable p99", "seen_p99", "ms"),
    ("SIGKILL → `wait()` returns p50", "death_p50", "ms"),
    ("SIGKILL → `wait()` returns p99", "death_p99", "ms"),
)


def spawn(load: Load) -> Rendered:
    """Not published (docs/benchmarks.md keeps a run's figures by hand): warm against fresh
    spawns (``python -m benchmarks.spawn``)."""
    data = load("spawn")
    if not data:
        return "", []
    warm, fresh = data["warm"], data["fresh"]
    rows = []
    for label, key, unit in SPAWN_ROWS:
        for n in data["counts"] if "{n}" in key else [0]:
            k = key.format(n=n)
            rows.append(
                (
                    label.format(n=n),
                    f"{warm[k]:.2f} {unit}",
                    f"{fresh[k]:.2f} {unit}",
                    ratio(fresh[k], warm[k]),
                )
            )
    return (
        f"Spawns, {data['trials']} trials (not published):\n\n"
        + table(("metric", "warm (zygote)", "fresh", "fresh / warm"), rows, LEFT + RIGHT * 3)
        + f"\n\nThe zygote itself (shared by all warm children): PSS "
        f"{mib(data['zygote_pss_mib'])}.\n",
        [],
    )
