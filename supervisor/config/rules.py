"""Rules between keys of a section (or of two sections), run once the keys passed their own
checks. Pure: each takes the sections read so far and the names of the section's keys that
failed their check, and returns problems as (key path, message).

A rule looks only at keys that passed their own check: a failed key stands at its default,
and a rule comparing against that would report noise that the operator did not write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from typing import Any

from shard_worker.contract.pipe import SinkSpec
from supervisor.config.durations import format_duration
from supervisor.config.model import (
    Config,
    DeadLetterConfig,
    LeaseConfig,
    SupervisorConfig,
    WebSocketConfig,
)
from supervisor.config.schema import SECTIONS, Problem

Rule = Callable[[Mapping[str, Any], Set[str]], list[Problem]]

# What one request of each destination takes.
BATCH_LIMITS = {"kinesis": (500, 5 * 1024 * 1024), "sqs": (10, 1024 * 1024)}


def lease_rules(sections: Mapping[str, Any], bad: Set[str]) -> list[Problem]:
    lease: LeaseConfig = sections["lease"]
    duration, heartbeat, margin = lease.duration, lease.heartbeat_interval, lease.safety_margin
    d, hb = format_duration(duration), format_duration(heartbeat)
    problems = []
    # 1e-9: float rounding
    if bad.isdisjoint({"duration", "heartbeat_interval"}) and heartbeat * 3 > duration + 1e-9:
        problem = f"must be at most lease.duration / 3 (got {hb} with duration {d})"
        problems.append(("lease.heartbeat_interval", problem))
    reconcile = lease.reconcile_interval
    if bad.isdisjoint({"duration", "reconcile_interval"}) and reconcile > duration:
        problem = (
            f"must be at most lease.duration (got {format_duration(reconcile)} with duration {d})"
        )
        problems.append(("lease.reconcile_interval", problem))
    margin_ok = not margin or margin < duration - heartbeat  # 0 = derived, always fits
    if bad.isdisjoint({"duration", "heartbeat_interval", "safety_margin"}) and not margin_ok:
        problem = (
            "must be less than lease.duration - lease.heartbeat_interval"
            f" (got {format_duration(margin)} with duration {d} and heartbeat_interval {hb})"
        )
        problems.append(("lease.safety_margin", problem))
    return problems


def supervisor_rules(sections: Mapping[str, Any], bad: Set[str]) -> list[Problem]:
    sup: SupervisorConfig = sections["supervisor"]
    initial, maximum = sup.restart_backoff_initial, sup.restart_backoff_max
    problems = []
    if bad.isdisjoint({"restart_backoff_initial", "restart_backoff_max"}) and initial > maximum:
        problem = (
            "must be at most supervisor.restart_backoff_max"
            f" (got {format_duration(initial)} with restart_backoff_max {format_duration(maximum)})"
        )
        problems.append(("supervisor.restart_backoff_initial", problem))
    if sup.worker_command and sup.spawn != "fresh" and "spawn" not in bad:
        problem = 'needs supervisor.spawn = "fresh" (the zygote forks the built-in worker)'
        problems.append(("supervisor.worker_command", problem))
    return problems


def standby_buffer(config: Config) -> list[Problem]:
    """Where standbys are in use (``standby.count``, or a shard's ``standbys``), a standby's
    buffer must cover the longest outage it is for: a dead owner's lease (``lease.duration``),
    the rounds until its standby takes over (two reconcile intervals) and what the owner wrote
    after its last checkpoint (one checkpoint interval). Without standbys it does not matter
    (a make-before-break hand-off buffers for well under a second)."""
    standby, lease = config.standby, config.lease
    if not standby.count and not any(shard.standbys for shard in config.shards):
        return []
    needed = lease.duration + 2 * lease.reconcile_interval + config.supervisor.checkpoint_interval
    if standby.buffer + 1e-6 >= needed:  # 1e-6: float rounding of the sum
        return []
    problem = (
        "must be at least lease.duration + 2 x lease.reconcile_interval +"
        f" supervisor.checkpoint_interval = {format_duration(needed)}"
        f" (got {format_duration(standby.buffer)})"
    )
    return [("standby.buffer", problem)]


def sink_rules(sections: Mapping[str, Any], bad: Set[str]) -> list[Problem]:
    """The kind's own keys must be there, the other kinds' keys must not be set."""
    spec: SinkSpec = sections["sink"]
    if "kind" in bad:
        return []
    problems = _other_kinds_keys(spec) + _missing_for_kind(spec, bad)
    if spec.kind in BATCH_LIMITS:
        problems += _batch_limits(spec, bad)
    return problems


def _other_kinds_keys(spec: SinkSpec) -> list[Problem]:
    """Keys of other kinds set to something else than their default (a key that failed its
    check stands at its default, so it is never reported twice)."""
    default = SinkSpec()
    return [
        (
            f"sink.{key.name}",
            f"applies only to kind = {' or '.join(key.kinds)} (this sink is {spec.kind!r});"
            " remove it or change sink.kind",
        )
        for key in SECTIONS["sink"].keys.values()
        if key.kinds
        and spec.kind not in key.kinds
        and getattr(spec, key.name) != getattr(default, key.name)
    ]


def _missing_for_kind(spec: SinkSpec, bad: Set[str]) -> list[Problem]:
    kind, problems = spec.kind, []
    if kind == "kinesis" and not spec.stream and "stream" not in bad:
        problems.append(("sink.stream", 'missing: kind = "kinesis" needs the stream name or ARN'))
    if kind == "sqs" and not spec.queue_url and "queue_url" not in bad:
        problems.append(("sink.queue_url", 'missing: kind = "sqs" needs the queue URL'))
    if kind == "handler" and not spec.handler and "handler" not in bad:
        problem = 'missing: kind = "handler" needs "package.module:callable"'
        problems.append(("sink.handler", problem))
    return problems


def _batch_limits(spec: SinkSpec, bad: Set[str]) -> list[Problem]:
    max_records, max_bytes = BATCH_LIMITS[spec.kind]
    problems = []
    if spec.batch_max_records > max_records and "batch_max_records" not in bad:
        problem = f"must be at most {max_records} for {spec.kind} (got {spec.batch_max_records})"
        problems.append(("sink.batch_max_records", problem))
    if spec.batch_max_bytes > max_bytes and "batch_max_bytes" not in bad:
        problem = f"must be at most {max_bytes} for {spec.kind} (got {spec.batch_max_bytes})"
        problems.append(("sink.batch_max_bytes", problem))
    return problems


def dead_letter_rules(sections: Mapping[str, Any], bad: Set[str]) -> list[Problem]:
    config: DeadLetterConfig = sections["dead_letter"]
    if "path" not in bad and config.path == sections["sink"].path:
        return [("dead_letter.path", "must differ from sink.path")]
    return []


def websocket_rules(sections: Mapping[str, Any], bad: Set[str]) -> list[Problem]:
    config: WebSocketConfig = sections["websocket"]
    if bad & {"ping_interval", "ping_timeout"}:
        return []
    return _pings_need_a_timeout("websocket", config.ping_interval, config.ping_timeout)


def stream_liveness(
    path: str, values: Mapping[str, Any], section: WebSocketConfig
) -> list[Problem]:
    """A stream's timers with the section's for what it does not set: pings need a timeout.
    ``values``: the stream's keys that passed their checks."""
    interval = values.get("ping_interval", section.ping_interval)
    timeout = values.get("ping_timeout", section.ping_timeout)
    if "ping_interval" not in values and "ping_timeout" not in values:
        return []  # the section's own problem, reported there
    return _pings_need_a_timeout(path, interval, timeout)


def _pings_need_a_timeout(path: str, interval: float, timeout: float) -> list[Problem]:
    if interval and not timeout:
        problem = (
            "must be greater than 0 when pings are on"
            f" (ping_interval = {format_duration(interval)}; set ping_interval = 0 for no pings)"
        )
        return [(f"{path}.ping_timeout", problem)]
    return []


MIN_EMF_INTERVAL = 1.0  # CloudWatch stores at most one value per second (high resolution)


def cloudwatch_rules(sections: Mapping[str, Any], bad: Set[str]) -> list[Problem]:
    interval = sections["cloudwatch"].interval
    if "interval" not in bad and interval < MIN_EMF_INTERVAL:
        got = format_duration(interval)
        problem = f"must be at least 1s: CloudWatch keeps one value a second (got {got})"
        return [("cloudwatch.interval", problem)]
    return []


# Run right after their section is read (in Config's order, so [sink] is read before
# [dead_letter]): the problems stay in the order of the file's sections.
RULES: Mapping[str, Rule] = {
    "lease": lease_rules,
    "supervisor": supervisor_rules,
    "sink": sink_rules,
    "dead_letter": dead_letter_rules,
    "websocket": websocket_rules,
    "cloudwatch": cloudwatch_rules,
}

# Run once the whole file is read (the shards too); a key that failed its own check is not
# compared again (it stands at its default).
CONFIG_RULES: tuple[Callable[[Config], list[Problem]], ...] = (standby_buffer,)
