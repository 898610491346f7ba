"""Row 4 of the report: messages/s per connection, each transport's child beside bare loops,
plain and with permessage-deflate (``python -m benchmarks.throughput``)."""

# ruff: noqa: RUF001 - the report uses typographic signs on purpose
from __future__ import annotations

from typing import Any

from benchmarks.report.common import Load, Rendered, heading, not_measured
from benchmarks.tables import LEFT, RIGHT, count, ratio, table

PLAIN = {
    "child → jsonl": "shardvisor child → jsonl sink (websockets transport, the default)",
    "child (trio-websocket) → jsonl": "shardvisor child → jsonl sink (trio-websocket transport)",
    "child → no-op handler": "shardvisor child → no-op handler (websockets transport)",
    "bare trio-websocket": "bare trio-websocket loop",
    "bare websockets": "bare `websockets` (asyncio) loop (peer)",
}
DEFLATE = {
    "child → jsonl, deflate": "shardvisor child → jsonl sink (websockets transport)",
    "bare websockets, deflate": "bare `websockets` (asyncio) loop (peer)",
}
# The targets (benchmarks, not asserts).
TARGET_RATIO, TARGET_CPU_US, TARGET_DEFLATE_RATIO = 1.0, 5.0, 0.8


def _p50(loops: dict[str, Any], key: str, field: str = "rate") -> float | None:
    found = loops.get(key, {}).get(field) or {}
    return found.get("p50") if found.get("n") else None


def _rows(
    data: dict[str, Any], labels: dict[str, str], against: dict[str, float | None]
) -> list[tuple[object, ...]]:
    loops, errors = data.get("loops", {}), data.get("errors", {})
    rows: list[tuple[object, ...]] = []
    for key, label in labels.items():
        found = loops.get(key)
        if not found:
            rows.append((label, errors.get(key, "not measured"), *[""] * (3 + len(against))))
            continue
        rate, cpu = found["rate"], found.get("cpu_us_per_message") or {}
        rows.append(
            (
                label,
                count(rate["p50"]),
                f"{count(rate.get('min'))} – {count(rate['max'])}",
                rate["n"],
                *(ratio(rate["p50"], base) for base in against.values()),
                f"{cpu['p50']:.1f} µs" if cpu.get("n") else "—",
            )
        )
    return rows


def _verdict(found: float | None, target: float, above: bool, shown: str) -> str:
    if found is None:
        return f"not measured (target {shown})"
    met = found >= target if above else found <= target
    return f"{'met' if met else '**missed**'} (target {shown})"


def throughput(load: Load) -> Rendered:
    data = load("throughput")
    out = [heading(4, data)]
    add = out.append
    if not data:
        add(not_measured("no out/bench/throughput.json"))
        return "\n".join(out), []
    loops = data.get("loops", {})
    wire = data.get("wire_bytes_per_message", {})
    add(
        f"Messages/s of {data['message_bytes']}-byte JSON text messages (a trade: symbol, side,"
        f" price, size) from a local feed process ({data['feed']}) that sends as fast as TCP"
        f" takes them, so the receiver is the bottleneck. Each figure: {data['warm_up_s']:g} s"
        f" of warm-up, then {data['seconds_per_measurement']:g} s counted; {data['runs']} runs"
        " of each, interleaved, median shown; the feed on one CPU, every receiver pinned to the"
        " other. The shardvisor child is a real `python -m shard_worker` driven over its pipes"
        " as the supervisor does (sequence checked, checkpoints every second; its rate from its"
        " heartbeats' `written` counter), once per `[websocket] transport`. Peers in the same"
        " run: a bare trio-websocket receive loop with the worker's connection settings, and a"
        " bare `websockets` (asyncio) client loop, defaults, as a user might write it instead.\n"
    )
    bare_trio, bare_ws = _p50(loops, "bare trio-websocket"), _p50(loops, "bare websockets")
    against = {"÷ bare trio-websocket": bare_trio, "÷ bare websockets": bare_ws}
    header = ("receiver", "messages/s (median)", "min – max", "runs", *against, "CPU per message")
    add(table(header, _rows(data, PLAIN, against), LEFT + RIGHT * 6))
    bare_deflate = _p50(loops, "bare websockets, deflate")
    add(
        "\n**With permessage-deflate** (the feed compresses each message with context takeover,"
        " as RFC 7692 feeds do; trio-websocket negotiates no extension, so only the websockets"
        f" transport takes part). On the wire: {wire.get('plain', 0):.1f} bytes per message"
        f" plain, {wire.get('deflate', 0):.1f} deflated (the feed's own frames, counted).\n"
    )
    deflate_against = {"÷ bare websockets with deflate": bare_deflate}
    header = ("receiver", "messages/s (median)", "min – max", "runs", *deflate_against, "CPU")
    add(table(header, _rows(data, DEFLATE, deflate_against), LEFT + RIGHT * 5))
    child = _p50(loops, "child → jsonl")
    child_cpu = _p50(loops, "child → jsonl", "cpu_us_per_message")
    child_deflate = _p50(loops, "child → jsonl, deflate")
    ratio_ws = child / bare_ws if child and bare_ws else None
    ratio_deflate = child_deflate / bare_deflate if child_deflate and bare_deflate else None
    versions = data.get("versions", {})
    add(
        "\nTargets (issue 15): child → jsonl ÷ bare websockets"
        f" {ratio(child, bare_ws)}: {_verdict(ratio_ws, TARGET_RATIO, True, '≥ 1.0×')}; CPU per"
        f" message {child_cpu or 0:.1f} µs: {_verdict(child_cpu, TARGET_CPU_US, False, '≤ 5 µs')};"
        f" with deflate {ratio(child_deflate, bare_deflate)}:"
        f" {_verdict(ratio_deflate, TARGET_DEFLATE_RATIO, True, '≥ 0.8×')}. trio-websocket"
        f" {versions.get('trio-websocket', '?')}, websockets"
        f" {versions.get('websockets (transport)', '?')} (transport) and"
        f" {versions.get('websockets', '?')} (peer). The default transport is `websockets`: its"
        " Sans-I/O protocol, driven by trio, with the simple frames cut and the deflated ones"
        " inflated per socket read, not per message (docs/benchmarks.md, *WebSocket transport*)."
        "\n"
    )
    summary_rows = []
    for key, label, base, peer in (
        ("child → jsonl", "to jsonl", bare_ws, "bare websockets"),
        ("child (trio-websocket) → jsonl", "to jsonl, trio-websocket", bare_ws, "bare websockets"),
        ("child → no-op handler", "to no-op handler", bare_ws, "bare websockets"),
        ("child → jsonl, deflate", "to jsonl, deflate", bare_deflate, "bare websockets+deflate"),
    ):
        found = _p50(loops, key)
        if found is not None:
            runs = loops[key]["rate"]["n"]
            summary_rows.append(
                (
                    f"4. Throughput per child {label}",
                    f"{count(found)} msg/s",
                    f"{peer} {count(base)}; bare trio-websocket {count(bare_trio)}",
                    f"{ratio(found, base)} ({ratio(found, bare_trio)} of trio-ws)",
                    f"{runs} runs",
                )
            )
    return "\n".join(out), summary_rows
