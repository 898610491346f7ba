"""The configuration model: frozen, validated once by ``config_loader``, then passed around."""

from __future__ import annotations

import attrs

from shard_worker.contract.pipe import (
    DEFAULT_DEAD_LETTER_PATH,
    SinkSpec,
    StreamSpec,
    header_secrets,
)


@attrs.frozen
class WorkerConfig:
    id: str = ""  # "" = derive at start: ECS task id, else "<hostname>-<pid>"
    max_shards: int = 0  # most shards this worker runs at once; 0 = no cap


@attrs.frozen
class DynamoConfig:
    table: str = "shardvisor"
    region: str = "us-east-1"
    endpoint_url: str = ""  # "" = boto3's default (AWS_ENDPOINT_URL_DYNAMODB also works)
    create_table: bool = True


@attrs.frozen
class LeaseConfig:
    duration: float = 10.0
    heartbeat_interval: float = 2.0
    reconcile_interval: float = 2.0
    # The owner stops writing at (heartbeat sent + duration - safety_margin). 0 = derive:
    # a fifth of the duration, so a peer can never take a shard its old owner still writes.
    safety_margin: float = 0.0
    # Between full scans a reconcile round reads only the worker items and the vacant shards
    # (sparse index); a full scan still runs this often (at most once a round), and whenever
    # the fleet changes.
    full_scan_interval: float = 60.0
    # How often to look for shards handed to this worker by name (0 = only at reconcile).
    handoff_poll_interval: float = 0.25

    @property
    def effective_safety_margin(self) -> float:
        return self.safety_margin or self.duration / 5


@attrs.frozen
class SupervisorConfig:
    shutdown_timeout: float = 20.0
    checkpoint_interval: float = 1.0
    restart_backoff_initial: float = 0.1
    restart_backoff_max: float = 30.0
    restart_reset_after: float = 60.0
    max_restarts: int = 5  # crashes allowed within restart_window; one more quarantines the shard
    restart_window: float = 60.0
    hang_timeout: float = 5.0  # no heartbeat from a child this long: SIGKILL, restart (reason hang)
    spawn: str = "zygote"  # zygote: fork from a warm pre-imported process | fresh: python -m
    # The command that runs a shard worker with spawn = "fresh" (to wrap it in nice, taskset,
    # prlimit, another interpreter...). Empty: python -m shard_worker with this interpreter.
    worker_command: tuple[str, ...] = ()


@attrs.frozen
class DeadLetterConfig:
    # JSON lines of what could not be delivered (malformed or too large messages, batches a
    # sink or handler gave up on): the record format plus "reason" and "error".
    path: str = DEFAULT_DEAD_LETTER_PATH


@attrs.frozen
class LogConfig:
    level: str = "info"  # debug | info | warning | error
    format: str = "json"  # json: one object per line (log search) | text: for terminals


@attrs.frozen
class HttpConfig:
    # /healthz, /readyz, /metrics. "" disables; port 0 picks a free one (logged). Loopback by
    # default: expose it beyond the host only on purpose.
    listen: str = "127.0.0.1:9400"


@attrs.frozen
class TlsConfig:
    ca_bundle: str = ""  # PEM file of CAs for wss:// feeds; "" = the system's trust store
    verify: bool = True  # false: no certificate check (logged loudly; for test feeds only)


@attrs.frozen
class ShardConfig:
    id: str
    streams: tuple[StreamSpec, ...]


@attrs.frozen
class Config:
    worker: WorkerConfig = attrs.field(factory=WorkerConfig)
    dynamodb: DynamoConfig = attrs.field(factory=DynamoConfig)
    lease: LeaseConfig = attrs.field(factory=LeaseConfig)
    supervisor: SupervisorConfig = attrs.field(factory=SupervisorConfig)
    # [sink]; its ``dead_letter`` field is unused here: [dead_letter] is ``dead_letter`` below,
    # joined into the spec each child gets (supervisor/drivers/shard_runner.py, ``_start_message``).
    sink: SinkSpec = attrs.field(factory=SinkSpec)
    dead_letter: DeadLetterConfig = attrs.field(factory=DeadLetterConfig)
    log: LogConfig = attrs.field(factory=LogConfig)
    http: HttpConfig = attrs.field(factory=HttpConfig)
    tls: TlsConfig = attrs.field(factory=TlsConfig)
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
