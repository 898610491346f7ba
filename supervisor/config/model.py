"""The configuration model: frozen, validated once by ``loading``, then passed around.

Each key of the file is a field here, with its default and its check (``setting``): the loader,
the renderer and the did-you-mean list all read them from ``attrs.fields``, so a new key is one
line. ``[sink]`` and ``[[shards.streams]]`` are the children's ``SinkSpec`` and ``StreamSpec``
(``shard_worker.contract.pipe``), whose checks are a table in ``schema``.
"""

from __future__ import annotations

from typing import Any

import attrs

from shard_worker.contract.pipe import (
    DEFAULT_DEAD_LETTER_PATH,
    TRANSPORTS,
    SinkSpec,
    StreamSpec,
    header_secrets,
)
from supervisor.config import checks
from supervisor.config.checks import Check

CHECK = "shardvisor.check"  # the attrs metadata key that holds a field's check


def setting(default: Any, check: Check) -> Any:
    """A key of the file: its default and the check its value must pass."""
    return attrs.field(default=default, metadata={CHECK: check})


@attrs.frozen
class WorkerConfig:
    # "" = derive at start: ECS task id, else $POD_NAME (Kubernetes), else "<hostname>-<pid>"
    id: str = setting(
        "",
        checks.matching(
            r"(?:[A-Za-z0-9_.:-]{1,128})?",
            'be "" (derive at start) or 1-128 characters of A-Z a-z 0-9 _ . : -',
        ),
    )
    max_shards: int = setting(0, checks.integer(0, 100_000))  # most shards at once; 0 = no cap
    # Most standby children at once (0 = no cap): a budget of its own, beside max_shards.
    max_standbys: int = setting(0, checks.integer(0, 100_000))


@attrs.frozen
class DynamoConfig:
    table: str = setting(
        "shardvisor",
        checks.matching(r"[A-Za-z0-9_.-]{3,255}", "be 3-255 characters of A-Z a-z 0-9 _ . -"),
    )
    region: str = setting("us-east-1", checks.string)
    # "" = boto3's default (AWS_ENDPOINT_URL_DYNAMODB also works)
    endpoint_url: str = setting("", checks.HTTP_URL)
    create_table: bool = setting(True, checks.boolean)


@attrs.frozen
class LeaseConfig:
    duration: float = setting(10.0, checks.duration())
    heartbeat_interval: float = setting(2.0, checks.duration())
    reconcile_interval: float = setting(2.0, checks.duration())
    # The owner stops writing at (heartbeat sent + duration - safety_margin). 0 = derive:
    # a fifth of the duration, so a peer can never take a shard its old owner still writes.
    safety_margin: float = setting(0.0, checks.duration(allow_zero=True))
    # Between full scans a reconcile round reads only the worker items and the vacant shards
    # (sparse index); a full scan still runs this often (at most once a round), and whenever
    # the fleet changes.
    full_scan_interval: float = setting(60.0, checks.duration())
    # How often to look for shards handed to this worker by name (0 = only at reconcile).
    handoff_poll_interval: float = setting(0.25, checks.duration(allow_zero=True))
    # A make-before-break hand-off waits this long for the successor's standby child to be
    # connected; then the owner stops first (break-before-make), logged and counted.
    handoff_timeout: float = setting(5.0, checks.duration())

    @property
    def effective_safety_margin(self) -> float:
        return self.safety_margin or self.duration / 5


@attrs.frozen
class SupervisorConfig:
    shutdown_timeout: float = setting(20.0, checks.duration())
    checkpoint_interval: float = setting(1.0, checks.duration())
    restart_backoff_initial: float = setting(0.1, checks.duration())
    restart_backoff_max: float = setting(30.0, checks.duration())
    restart_reset_after: float = setting(60.0, checks.duration())
    # Crashes allowed within restart_window; one more quarantines the shard.
    max_restarts: int = setting(5, checks.integer(1, 1000))
    restart_window: float = setting(60.0, checks.duration())
    # No heartbeat from a child this long: SIGKILL, restart (reason hang).
    hang_timeout: float = setting(5.0, checks.duration())
    # zygote: fork from a warm pre-imported process | fresh: python -m shard_worker
    spawn: str = setting("zygote", checks.one_of(("zygote", "fresh")))
    # The command that runs a shard worker with spawn = "fresh" (to wrap it in nice, taskset,
    # prlimit, another interpreter...). Empty: python -m shard_worker with this interpreter.
    worker_command: tuple[str, ...] = setting((), checks.command)


@attrs.frozen
class StandbyConfig:
    # Warm standby children per shard, on other workers (0 = none): connected and buffering,
    # so a dead owner's shard resumes from the buffer instead of the feed's present.
    count: int = setting(0, checks.integer(0, 100))
    # How much of the recent feed a standby keeps; at least lease.duration + 2 x
    # lease.reconcile_interval + supervisor.checkpoint_interval (the longest outage to cover).
    buffer: float = setting(30.0, checks.duration())
    # Per standby child; past it the oldest records go (counted).
    max_buffer_bytes: int = setting(64 * 1024 * 1024, checks.integer(1024, 1 << 40))


@attrs.frozen
class DeadLetterConfig:
    # JSON lines of what could not be delivered (malformed or too large messages, batches a
    # sink or handler gave up on): the record format plus "reason" and "error".
    path: str = setting(DEFAULT_DEAD_LETTER_PATH, checks.dead_letter_path)


@attrs.frozen
class LogConfig:
    level: str = setting("info", checks.one_of(("debug", "info", "warning", "error")))
    # json: one object per line (log search) | text: for terminals
    format: str = setting("json", checks.one_of(("json", "text")))


@attrs.frozen
class HttpConfig:
    # /healthz, /readyz, /metrics. "" disables; port 0 picks a free one (logged). Loopback by
    # default: expose it beyond the host only on purpose.
    listen: str = setting(
        "127.0.0.1:9400",
        checks.matching(
            r"(?:(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5})?",
            'be "" (disabled) or HOST:PORT like "127.0.0.1:9400" (port 0 picks a free one)',
        ),
    )


@attrs.frozen
class CloudWatchConfig:
    # true: every ``interval`` the supervisor writes CloudWatch Embedded Metric Format lines
    # (one JSON object each) on its log stream; the awslogs driver, the CloudWatch agent or
    # Fluent Bit turn them into metrics. No API call, no extra IAM permission.
    emf: bool = setting(False, checks.boolean)
    # CloudWatch's rules: 1-255 characters of A-Z a-z 0-9 . - _ / # :, not starting "AWS/".
    namespace: str = setting(
        "shardvisor",
        checks.matching(
            r"(?!AWS/)[A-Za-z0-9.\-_/#:]{1,255}",
            "be 1-255 characters of A-Z a-z 0-9 . - _ / # : (not starting with AWS/)",
        ),
    )
    interval: float = setting(60.0, checks.duration())


@attrs.frozen
class TlsConfig:
    # PEM file of CAs for wss:// feeds; "" = the system's trust store. That the file exists
    # and parses is an environment check (``environment``), not part of validation.
    ca_bundle: str = setting("", checks.string)
    # false: no certificate check (logged loudly; for test feeds only)
    verify: bool = setting(True, checks.boolean)


@attrs.frozen
class WebSocketConfig:
    # The client library under the feeds: websockets (its Sans-I/O protocol: faster, and
    # permessage-deflate) | trio-websocket (no extension). Why the default: docs/benchmarks.md.
    transport: str = setting("websockets", checks.one_of(TRANSPORTS))
    # deflate: offer permessage-deflate (used when the server agrees) | none. A stream may
    # override it, and the three timers below ([[shards.streams]]).
    compression: str = setting("deflate", checks.one_of(checks.COMPRESSIONS))
    # Ping when nothing was received for this long; 0 = no pings.
    ping_interval: float = setting(20.0, checks.duration(allow_zero=True))
    # No pong (or any frame) this long after a ping: reconnect (reason "ping_timeout").
    ping_timeout: float = setting(20.0, checks.duration(allow_zero=True))
    # No message this long: reconnect (reason "idle"); 0 = off. A stream silent longer than
    # this shows as stale in `status` until it flows again.
    idle_timeout: float = setting(0.0, checks.duration(allow_zero=True))


@attrs.frozen
class ShardConfig:
    id: str = attrs.field(metadata={CHECK: checks.IDENTIFIER})
    streams: tuple[StreamSpec, ...]  # [[shards.streams]], checked by ``schema.STREAM``
    # Standby children of this shard; None = standby.count. Not part of the definition: a
    # change applies at a reload without restarting the shard.
    standbys: int | None = attrs.field(default=None, metadata={CHECK: checks.integer(0, 100)})

    def standby_count(self, default: int) -> int:
        """This shard's standbys: its own setting, else ``default`` (standby.count)."""
        return default if self.standbys is None else self.standbys


@attrs.frozen
class Config:
    """The whole file: each field of an attrs type is a section, in the order rendered."""

    worker: WorkerConfig = attrs.field(factory=WorkerConfig)
    dynamodb: DynamoConfig = attrs.field(factory=DynamoConfig)
    lease: LeaseConfig = attrs.field(factory=LeaseConfig)
    supervisor: SupervisorConfig = attrs.field(factory=SupervisorConfig)
    standby: StandbyConfig = attrs.field(factory=StandbyConfig)
    # [sink]; its ``dead_letter`` field is unused here: [dead_letter] is ``dead_letter`` below,
    # joined into the spec each child gets (supervisor/drivers/shard_runner.py, ``_start_message``).
    sink: SinkSpec = attrs.field(factory=SinkSpec)
    dead_letter: DeadLetterConfig = attrs.field(factory=DeadLetterConfig)
    log: LogConfig = attrs.field(factory=LogConfig)
    http: HttpConfig = attrs.field(factory=HttpConfig)
    tls: TlsConfig = attrs.field(factory=TlsConfig)
    websocket: WebSocketConfig = attrs.field(factory=WebSocketConfig)
    cloudwatch: CloudWatchConfig = attrs.field(factory=CloudWatchConfig)
    shards: tuple[ShardConfig, ...] = ()
    # Values written with ${NAME} in the file: (key path, the text as written), so that
    # check-config prints the reference, never the value...
    templates: tuple[tuple[str, str], ...] = ()
    # ...and the values substituted for them: secrets, never written to any log line.
    secrets: frozenset[str] = frozenset()

    @property
    def redacted(self) -> frozenset[str]:
        """Every string that must never appear in a log line or the output of a command: the
        substituted values, and the stream header values (headers carry tokens)."""
        headers = header_secrets(s for shard in self.shards for s in shard.streams)
        return frozenset(v for v in self.secrets.union(headers) if v)
