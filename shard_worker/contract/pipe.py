"""Pipe protocol v1 between the supervisor and a shard worker: messages and a sans-IO codec.

Both processes import this module, so it depends only on attrs and the standard library.
Framing is one JSON object per line (``\\n``-terminated, UTF-8); every object has a ``type``.
The codec never touches a file descriptor: feed it bytes, take messages out (like h11).
See docs/pipe-protocol.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar, get_args

import attrs

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 1 << 20  # a control message is small; a longer line means a broken peer


class ProtocolError(Exception):
    """The peer sent something that is not protocol v1."""


# --- Shard definition, shared by the supervisor's config and the start message ---------------


def _header_pairs(
    value: Mapping[str, str] | Iterable[Iterable[str]],
) -> tuple[tuple[str, str], ...]:
    """Headers as a tuple of (name, value) pairs: from a mapping, or from the JSON list of
    pairs a start message carries. Frozen and hashable, like the rest of a StreamSpec."""
    items = value.items() if isinstance(value, Mapping) else value
    pairs = []
    for pair in items:
        if isinstance(pair, str):
            raise TypeError("a header is a pair of strings")
        name, text = pair
        if not isinstance(name, str) or not isinstance(text, str):
            raise TypeError("a header is a pair of strings")  # (no value: it may be a secret)
        pairs.append((name, text))
    return tuple(pairs)


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError("expected a list of strings")  # (no value: they are secrets)
    return tuple(value)


@attrs.frozen
class StreamSpec:
    """One WebSocket feed of a shard."""

    id: str
    url: str
    sequence: str = ""  # dotted path to the sequence number in a JSON message; "" = unsequenced
    subscribe: str = ""  # text sent after connecting; "" = nothing
    # Sent with the opening handshake (e.g. Authorization); optional (added in v1): absent = none.
    # Values are secrets: never logged. JSON: a list of [name, value] pairs.
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_header_pairs)
    # This stream's own [websocket] settings (optional, added in v1): None = WorkerSettings'.
    # Seconds; 0 = off. See WorkerSettings for what each means.
    ping_interval: float | None = None
    ping_timeout: float | None = None
    idle_timeout: float | None = None
    compression: str | None = None  # "deflate" | "none"


# Header values are kept out of every log line (headers carry tokens), except very short ones:
# "on", "1", "gzip" cannot be credentials, and masking them would garble every line.
MIN_SECRET_HEADER = 6


def header_secrets(streams: Iterable[StreamSpec]) -> tuple[str, ...]:
    """The header values of ``streams`` that logs must never show."""
    values = {v for spec in streams for _, v in spec.headers if len(v) >= MIN_SECRET_HEADER}
    return tuple(sorted(values))


DEFAULT_DEAD_LETTER_PATH = "out/{shard}/dead-letter.{epoch}.jsonl"
DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024


@attrs.frozen
class SinkSpec:
    """Where the worker writes records (the child builds the sink from this); the supervisor's
    ``[sink]`` section, plus ``dead_letter`` (the ``[dead_letter] path``).

    Every field but the first three was added in v1 with a default, so a Start message of an
    older supervisor still decodes (and means what it meant: jsonl, no rotation)."""

    kind: str = "jsonl"  # jsonl | stdout | kinesis | sqs | handler
    path: str = "out/{shard}/{stream}.{epoch}.jsonl"  # jsonl
    fsync: bool = False  # jsonl: fsync at every checkpoint (and before a rotation)
    rotate_bytes: int = 0  # jsonl: start a new file once one reaches this size; 0 = never
    stream: str = ""  # kinesis: stream name or ARN
    partition_key: str = "{shard}:{stream}"  # kinesis
    queue_url: str = ""  # sqs (FIFO when it ends in .fifo)
    region: str = ""  # kinesis, sqs ("" = boto3's default)
    endpoint_url: str = ""  # kinesis, sqs ("" = AWS)
    handler: str = ""  # handler: "package.module:callable"
    batch_max_records: int = 0  # batch sinks; 0 = the sink's own limit
    batch_max_bytes: int = 0  # batch sinks; 0 = the sink's own limit
    batch_max_wait: float = 0.5  # batch sinks: seconds a batch waits for more records
    max_attempts: int = 8  # batch sinks: deliveries of a batch before on_failure applies
    on_failure: str = "dead_letter"  # batch sinks: dead_letter | crash
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE  # bytes of one WebSocket message
    dead_letter: str = DEFAULT_DEAD_LETTER_PATH  # jsonl path template of the dead letters


TRANSPORTS = ("websockets", "trio-websocket")  # WorkerSettings.transport, the default first


@attrs.frozen
class WorkerSettings:
    """What the child needs besides the shard: timings (all in seconds), log format, TLS."""

    checkpoint_interval: float = 1.0
    heartbeat_interval: float = 1.0  # liveness + progress to the supervisor
    reconnect_initial: float = 0.1
    reconnect_max: float = 5.0
    connect_timeout: float = 5.0
    # Optional (added in v1; absent = the defaults, as before):
    log_format: str = "text"  # "json": one JSON object per stderr line (the supervisor merges it)
    # Strings never written to the log (config secrets, header values): replaced by "***".
    redact: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    ca_bundle: str = ""  # PEM file of CAs for wss:// feeds; "" = the system's trust store
    verify_tls: bool = True  # False: no certificate check (logged as a warning at connect)
    # [websocket] (optional, added in v1; absent = these defaults). A stream may override the
    # last four (StreamSpec). Seconds; 0 = off.
    transport: str = "websockets"  # websockets | trio-websocket
    compression: str = "deflate"  # offer permessage-deflate | "none"
    ping_interval: float = 20.0  # ping when nothing was received for this long
    ping_timeout: float = 20.0  # no frame this long after a ping: reconnect ("ping_timeout")
    idle_timeout: float = 0.0  # no message this long: reconnect ("idle")


# What verify_tls = False means, logged by the supervisor at start and by the child at connect.
VERIFY_OFF_WARNING = (
    "[tls] verify = false: feed certificates are NOT checked; anyone on the path can"
    " impersonate a feed"
)


@attrs.frozen
class LastWill:
    """Where the lease lives, so that a child whose supervisor died (EOF on the control pipe)
    can release its own shard, conditional on owner and epoch, instead of leaving it to
    expire. ``session`` is the supervisor's: the child marks that incarnation orphaned."""

    table: str
    region: str
    endpoint_url: str = ""
    session: str = ""
    # The released shard's protocol-2 index key (its vacant bucket, from the supervisor's
    # supervisor/core/partition_keys.py); "" leaves the attribute alone (added in v1).
    fleet: str = ""


ACTIVE = "active"  # Start.mode: an owner child (connected, writing, checkpointing)
STANDBY = "standby"  # Start.mode: connected, buffering the recent feed, writing nothing
MODES = (ACTIVE, STANDBY)


@attrs.frozen
class StandbySettings:
    """How much of the recent feed a standby child keeps (added in v1 for warm standbys and
    make-before-break hand-offs; docs/pipe-protocol.md)."""

    buffer: float = 30.0  # seconds: records received longer ago than this are dropped
    # The buffer's memory, all streams (each record: its message's length + ~173 bytes of
    # Python objects); past it the oldest records go.
    max_bytes: int = 64 * 1024 * 1024
    quiet: float = 1.0  # seconds a connected stream may stay silent before it counts as ready


# --- Parent -> child ---------------------------------------------------------------------------


@attrs.frozen
class Start:
    type: ClassVar[str] = "start"
    shard: str
    epoch: int
    worker: str
    streams: tuple[StreamSpec, ...]
    checkpoint: dict[str, int]
    sink: SinkSpec
    settings: WorkerSettings
    fence_deadline: float  # time.monotonic() of this host; no sink write at or after it
    version: int = PROTOCOL_VERSION
    last_will: LastWill | None = None  # optional (added in v1): absent = exit without release
    # Optional (added in v1; absent = an owner child, as before). A standby renders {epoch}
    # with ``epoch`` (the one it expects to take) and {after} with ``checkpoint``.
    mode: str = attrs.field(default=ACTIVE, validator=attrs.validators.in_(MODES))
    standby: StandbySettings = attrs.field(factory=StandbySettings)


@attrs.frozen
class Fence:
    """Moves the fence deadline; sent after each successful lease heartbeat."""

    type: ClassVar[str] = "fence"
    deadline: float


@attrs.frozen
class Stop:
    """Finish the message in hand, flush, report the final checkpoint, exit 0."""

    type: ClassVar[str] = "stop"
    reason: str
    deadline: float  # time.monotonic() by which the child must have exited
    # Optional (added in v1; absent = {}): an owner child reads on until it has written at
    # least min_cut[s] on every stream s (or until the deadline minus its margins): the cut
    # of a make-before-break hand-off (a standby holds everything after it).
    min_cut: dict[str, int] = attrs.field(factory=dict)


@attrs.frozen
class Promote:
    """To a standby child only: become the owner child at ``epoch``. The sink is opened for
    that epoch, every buffered record after ``checkpoint`` is written in order, then ``ready``
    and everything an owner child does. No reconnect."""

    type: ClassVar[str] = "promote"
    epoch: int
    checkpoint: dict[str, int]
    fence_deadline: float  # time.monotonic() of this host; no sink write at or after it


# --- Child -> parent ---------------------------------------------------------------------------

# Why a stream reconnected, counted per stream in Heartbeat.streams as "reconnect.<reason>":
# the feed closed (or dropped) the connection; it could not be opened; a message was over
# max_message_size; no answer to a ping; no message for idle_timeout.
RECONNECT_REASONS = ("closed", "connect_failed", "too_large", "ping_timeout", "idle")
RECONNECT_PREFIX = "reconnect."


@attrs.frozen
class Hello:
    type: ClassVar[str] = "hello"
    version: int
    pid: int


@attrs.frozen
class Ready:
    """The sink is open and every stream task has started."""

    type: ClassVar[str] = "ready"


@attrs.frozen
class Checkpoint:
    """Last sequence per stream that the sink has durably written (flushed)."""

    type: ClassVar[str] = "checkpoint"
    checkpoint: dict[str, int]
    written: int  # records written since start, all streams


@attrs.frozen
class StandbyReady:
    """Sent once by a standby child: every stream is connected and, per sequenced stream, it
    holds a message (``first_seq[s]``: the oldest it holds) or the stream was quiet for
    ``standby.quiet`` seconds (then absent: it puts no constraint on the cut). The records from
    ``first_seq[s]`` on are kept for ``standby.buffer`` seconds (unless ``max_bytes`` forces
    them out: counted in ``dropped``)."""

    type: ClassVar[str] = "standby_ready"
    first_seq: dict[str, int]


@attrs.frozen
class StandbyStats:
    """A standby child's buffer, in its heartbeats."""

    buffered: int = 0  # records held, all streams
    bytes: int = 0  # their memory (as counted against max_bytes)
    dropped: int = 0  # records dropped from a full buffer (max_bytes) since start
    first_seq: dict[str, int] = attrs.field(factory=dict)  # oldest seq held per stream
    connected: tuple[str, ...] = attrs.field(default=(), converter=_strings)  # streams now
    received: int = 0  # messages from the feeds since start, all streams
    malformed: int = 0  # messages that cannot be records (dead-lettered only if promoted)


@attrs.frozen
class Heartbeat:
    """Sent every ``heartbeat_interval`` by a task of the child's event loop: if the loop is
    blocked (CPU-bound code, a deadlock) heartbeats stop and the supervisor kills the child."""

    type: ClassVar[str] = "heartbeat"
    written: int  # records written since start, all streams
    last_seq: dict[str, int]  # last sequence written per stream (flushed or not)
    loop_lag: float  # seconds the heartbeat's own sleep overran: event-loop saturation
    duplicates: int = 0  # sequenced messages dropped as already written
    gaps: int = 0  # sequence numbers the feed skipped
    malformed: int = 0  # messages that could not be read (dead-lettered)
    # Per stream, counts since this child started (added in v1; absent = {}): received,
    # written (delivered, for batch sinks), duplicates, gaps, malformed (too large included),
    # reconnects, dead_lettered; and (optional, added in v1) "reconnect.<reason>" for each
    # reason a stream reconnected for (RECONNECT_REASONS). The supervisor turns them into
    # metrics.
    streams: dict[str, dict[str, int]] = attrs.field(factory=dict)
    # Streams silent for longer than their timeout now (optional, added in v1; absent = none):
    # ``status`` shows them stale until they flow again.
    stale: list[str] = attrs.field(factory=list)
    # Only from a standby child (added in v1; absent = None: an owner child). A standby writes
    # nothing: its written, last_seq, counts and streams are 0 and empty.
    standby: StandbyStats | None = None


@attrs.frozen
class Stopped:
    type: ClassVar[str] = "stopped"
    checkpoint: dict[str, int]
    written: int
    reason: str


@attrs.frozen
class Error:
    """Something the supervisor should log; ``fatal`` means the child is about to exit non-zero."""

    type: ClassVar[str] = "error"
    message: str
    fatal: bool = False


Message = (
    Start
    | Fence
    | Stop
    | Promote
    | Hello
    | Ready
    | StandbyReady
    | Checkpoint
    | Heartbeat
    | Stopped
    | Error
)
_TYPES: dict[str, type] = {cls.type: cls for cls in get_args(Message)}


# Fields added for standbys (issue 14) and a heartbeat's stale streams (issue 15), left out of a
# line while they hold their default: what an older peer can read, and fewer bytes per beat.
_OMITTED_AT_DEFAULT: dict[str, dict[str, Any]] = {
    "start": {"mode": ACTIVE, "standby": StandbySettings()},
    "stop": {"min_cut": {}},
    "heartbeat": {"standby": None, "stale": []},
}


def _to_jsonable(msg: Message) -> dict[str, Any]:
    body = attrs.asdict(msg, recurse=True)  # tuples stay tuples; json writes them as lists
    for name, default in _OMITTED_AT_DEFAULT.get(msg.type, {}).items():
        if getattr(msg, name) == default:
            del body[name]
    return {"type": msg.type, **body}


def _from_jsonable(obj: Any) -> Message:
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        raise ProtocolError(f"expected an object with a string 'type', got {obj!r:.200}")
    cls = _TYPES.get(obj["type"])
    if cls is None:
        raise ProtocolError(f"unknown message type {obj['type']!r}")
    fields = {k: v for k, v in obj.items() if k != "type"}
    try:
        if cls is Start:
            fields["streams"] = tuple(StreamSpec(**s) for s in fields["streams"])
            fields["sink"] = SinkSpec(**fields["sink"])
            fields["settings"] = WorkerSettings(**fields["settings"])
            fields["checkpoint"] = {str(k): int(v) for k, v in fields["checkpoint"].items()}
            if fields.get("last_will") is not None:
                fields["last_will"] = LastWill(**fields["last_will"])
            if "standby" in fields:
                fields["standby"] = StandbySettings(**fields["standby"])
        elif cls is Heartbeat and fields.get("standby") is not None:
            fields["standby"] = StandbyStats(**fields["standby"])
        elif cls is Promote:
            fields["checkpoint"] = _seqs(fields["checkpoint"])
        elif cls is Stop and "min_cut" in fields:
            fields["min_cut"] = _seqs(fields["min_cut"])
        elif cls is StandbyReady:
            fields["first_seq"] = _seqs(fields["first_seq"])
        return cls(**fields)
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"bad {obj['type']!r} message: {exc}") from exc


def _seqs(value: Mapping[str, Any]) -> dict[str, int]:
    """A {stream: seq} map of a message, its numbers checked."""
    return {str(k): int(v) for k, v in value.items()}


def encode(msg: Message) -> bytes:
    """One message as one line."""
    return json.dumps(_to_jsonable(msg), separators=(",", ":")).encode() + b"\n"


@attrs.define
class Decoder:
    """Bytes in, messages out. ``feed(b"")`` marks EOF; a partial last line is then an error."""

    _buffer: bytearray = attrs.field(factory=bytearray)
    _eof: bool = False

    def feed(self, data: bytes | bytearray) -> None:
        if self._eof:
            raise ProtocolError("data after EOF")
        if not data:
            self._eof = True
            return
        self._buffer += data

    @property
    def at_eof(self) -> bool:
        """True once EOF was fed and every complete line has been taken out."""
        return self._eof and b"\n" not in self._buffer

    def __iter__(self) -> Iterator[Message]:
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                if len(self._buffer) > MAX_LINE_BYTES:
                    raise ProtocolError(f"line longer than {MAX_LINE_BYTES} bytes")
                if self._eof and self._buffer:
                    raise ProtocolError("EOF in the middle of a message")
                return
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise ProtocolError(f"not JSON: {line[:200]!r}") from exc
            yield _from_jsonable(obj)
