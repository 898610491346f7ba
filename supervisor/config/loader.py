"""Read the TOML config file into ``supervisor.config.Config``, reporting every problem at once.

Each problem is one line that starts with its key path (``shards[1].streams[0].url: ...``), so
an operator can fix the whole file in one pass instead of meeting one error per restart.
``render_config`` prints the effective config back as TOML that this module reads again.

Any string value may hold ``${NAME}`` references to environment variables, substituted at load
time (``$${`` is a literal ``${``). The substituted values are secrets: the config remembers
the text as written (``render_config`` prints that) and the values (``Config.secrets``), which
the logs redact; no problem line ever shows one.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import ssl
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from shard_worker.contract.pipe import SinkSpec, StreamSpec
from supervisor.adapters.logs import Redactor
from supervisor.config.durations import format_duration, parse_duration
from supervisor.config.model import (
    Config,
    DeadLetterConfig,
    DynamoConfig,
    HttpConfig,
    LeaseConfig,
    LogConfig,
    ShardConfig,
    SupervisorConfig,
    TlsConfig,
    WorkerConfig,
)

_SECTIONS = (
    "worker",
    "dynamodb",
    "lease",
    "supervisor",
    "sink",
    "dead_letter",
    "log",
    "http",
    "tls",
    "shards",
)
_LOG_LEVELS = ("debug", "info", "warning", "error")
_SINK_KINDS = ("jsonl", "stdout", "kinesis", "sqs", "handler")
_BATCH_KINDS = ("stdout", "kinesis", "sqs", "handler")
# The [sink] keys that mean something only for some kinds (the others apply to every kind).
_SINK_KEY_KINDS = {
    "path": ("jsonl",),
    "rotate_bytes": ("jsonl",),
    "stream": ("kinesis",),
    "partition_key": ("kinesis",),
    "queue_url": ("sqs",),
    "region": ("kinesis", "sqs"),
    "endpoint_url": ("kinesis", "sqs"),
    "handler": ("handler",),
    "batch_max_records": _BATCH_KINDS,
    "batch_max_bytes": _BATCH_KINDS,
    "batch_max_wait": _BATCH_KINDS,
    "max_attempts": _BATCH_KINDS,
    "on_failure": _BATCH_KINDS,
}
# What one request of each destination takes (0 = that much).
_BATCH_LIMITS = {"kinesis": (500, 5 * 1024 * 1024), "sqs": (10, 1024 * 1024)}
MIN_ROTATE_BYTES = 64 * 1024  # one write of the jsonl sink
_SINK_PLACEHOLDERS = ("shard", "stream", "epoch", "worker")
_URL_PLACEHOLDERS = ("after", "shard", "stream", "epoch", "worker")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
# "$${" is a literal "${"; "${NAME}" a reference; any other "${" is a mistake.
_REFERENCE = re.compile(r"\$\$\{|\$\{(?:([A-Za-z_][A-Za-z0-9_]*)\})?")
# RFC 9110 token characters.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HANDSHAKE_HEADERS = (
    "host",
    "upgrade",
    "connection",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
)
_DURATION_EXPECTED = 'expected a duration (number of seconds or a string like "250ms", "10s", "2m")'
_UNIQUE_STREAMS_WHY = (
    "; stream ids must be unique across all shards because sink files and checkpoints"
    " are keyed by stream"
)


class ConfigError(Exception):
    """The config is unusable. ``problems`` has one line per problem; ``source`` names the file."""

    def __init__(self, problems: Sequence[str], source: str = "<config>") -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__("\n".join(self.problems))


class _Invalid(Exception):
    """A value failed its check; the message follows the key path in the problem line."""


Check = Callable[[Any], Any]


# --- Value checks: each returns the converted value or raises _Invalid -------------------------


def _show(value: object) -> str:
    """A value as the operator wrote it (TOML's true/false, not Python's True/False)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str | int | float):
        return repr(value)
    return f"a date/time ({value})"


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"expected a string, got {_show(value)}")
    return value


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"expected true or false, got {_show(value)}")
    return value


def _duration(*, allow_zero: bool = False) -> Check:
    def check(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise _Invalid(f"{_DURATION_EXPECTED}, got {_show(value)}")
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise _Invalid(str(exc)) from None
        if seconds == 0 and not allow_zero:
            raise _Invalid(f"must be greater than 0 (got {_show(value)})")
        return seconds

    return check


def _integer(low: int, high: int) -> Check:
    def check(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(f"expected a whole number, got {_show(value)}")
        if not low <= value <= high:
            raise _Invalid(f"must be from {low} to {high} (got {value})")
        return value

    return check


def _command(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _Invalid(f"expected an array of non-empty strings, got {_show(value)}")
    return tuple(value)


def _matching(pattern: str, must: str) -> Check:
    compiled = re.compile(pattern)

    def check(value: object) -> str:
        text = _string(value)
        if not compiled.fullmatch(text):
            raise _Invalid(f"must {must} (got {text!r})")
        return text

    return check


def _one_of(options: Sequence[str]) -> Check:
    def check(value: object) -> str:
        text = _string(value)
        if text not in options:
            raise _Invalid(f"must be one of {', '.join(options)} (got {text!r})")
        return text

    return check


def _check_placeholders(text: str, allowed: Sequence[str]) -> None:
    bad = sorted({m.group(0) for m in _PLACEHOLDER.finditer(text) if m.group(1) not in allowed})
    if bad:
        known = " ".join(f"{{{name}}}" for name in allowed)
        raise _Invalid(f"unknown placeholder {', '.join(bad)} (allowed: {known})")


def _templated(value: object) -> str:
    text = _string(value)
    _check_placeholders(text, _URL_PLACEHOLDERS)
    return text


def _stream_url(value: object) -> str:
    text = _string(value)
    if not text.startswith(("ws://", "wss://")):
        raise _Invalid(f"must start with ws:// or wss:// (got {text!r})")
    return _templated(text)


def _headers(value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise _Invalid(
            'expected a table of header names to strings, like { Authorization = "Bearer'
            f' ${{FEED_TOKEN}}" }}, got {_show(value)}'
        )
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, text in value.items():
        if not _HEADER_NAME.fullmatch(name):
            raise _Invalid(
                f"header name {name!r} is not an HTTP token (letters, digits, !#$%&'*+-.^_`|~)"
            )
        if name.lower() in _HANDSHAKE_HEADERS:
            raise _Invalid(f"header {name!r} is set by the WebSocket handshake itself")
        if name.lower() in seen:
            raise _Invalid(f"header {name!r} is given twice (names are case-insensitive)")
        seen.add(name.lower())
        if not isinstance(text, str):
            raise _Invalid(f"header {name!r}: expected a string, got {_show(text)}")
        if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in text):
            raise _Invalid(f"header {name!r}: the value must not contain control characters")
        pairs.append((name, text))
    return tuple(pairs)


def _ca_bundle(value: object) -> str:
    text = _string(value)
    if not text:
        return text
    try:
        with Path(text).open("rb"):
            pass
        ssl.create_default_context(cafile=text)
    except IsADirectoryError:
        raise _Invalid(f"{text!r} is a directory, not a PEM file of CA certificates") from None
    except FileNotFoundError:
        raise _Invalid(f"no such file {text!r} (a PEM file of CA certificates)") from None
    except PermissionError:
        raise _Invalid(f"{text!r} is not readable by this user") from None
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise _Invalid(f"{text!r} is not a PEM file of CA certificates: {exc}") from None
    return text


def _sink_path(value: object) -> str:
    return _path_template(
        value,
        ("{stream}", "{epoch}"),
        "each stream of each lease epoch needs its own file, so a shard's new owner never"
        " appends to a file that its previous owner may still be writing",
    )


def _rotate_bytes(value: object) -> int:
    size = _integer(0, 1 << 50)(value)
    if 0 < size < MIN_ROTATE_BYTES:
        raise _Invalid(f"must be 0 (never rotate) or at least {MIN_ROTATE_BYTES} (got {size})")
    return size


def _partition_key(value: object) -> str:
    text = _string(value)
    if not text:
        raise _Invalid('must not be empty (the default is "{shard}:{stream}")')
    _check_placeholders(text, _SINK_PLACEHOLDERS)
    return text


_HANDLER_REFERENCE = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*"
    r"(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
)


def _handler_reference(value: object) -> str:
    """Only the form here; whether it imports is checked with the kind (see _sink)."""
    text = _string(value)
    if text and not _HANDLER_REFERENCE.fullmatch(text):
        raise _Invalid(
            f'must be "package.module:callable", like "my_handlers:handle" (got {text!r})'
        )
    return text


def _dead_letter_path(value: object) -> str:
    return _path_template(
        value,
        ("{shard}", "{epoch}"),
        "each shard's lease epoch needs its own file, so two writers never share one",
    )


def _path_template(value: object, required: tuple[str, ...], why: str) -> str:
    text = _string(value)
    if not text:
        raise _Invalid("must not be empty")
    _check_placeholders(text, _SINK_PLACEHOLDERS)
    missing = [p for p in required if p not in text]
    if missing:
        raise _Invalid(
            f"must contain {' and '.join(required)} (missing {' and '.join(missing)}): {why}"
        )
    return text


def _import_handler(reference: str) -> str | None:
    """Why ``reference`` cannot be loaded in this interpreter (None: it can). The children
    import it the same way, so a typo is a config error at start, not a crash loop."""
    from shard_worker.adapters.sinks.handler import load_handler

    try:
        load_handler(reference)
    except ValueError as exc:
        return str(exc)
    return None


_ID = _matching(r"[A-Za-z0-9_.:-]+", "be non-empty and use only A-Z a-z 0-9 _ . : -")

_CHECKS: dict[str, dict[str, Check]] = {
    "worker": {
        "id": _matching(
            r"(?:[A-Za-z0-9_.:-]{1,128})?",
            'be "" (derive at start) or 1-128 characters of A-Z a-z 0-9 _ . : -',
        ),
        "max_shards": _integer(0, 100_000),
    },
    "dynamodb": {
        "table": _matching(r"[A-Za-z0-9_.-]{3,255}", "be 3-255 characters of A-Z a-z 0-9 _ . -"),
        "region": _string,
        "endpoint_url": _matching(r"(?:https?://.+)?", 'be "" or start with http:// or https://'),
        "create_table": _boolean,
    },
    "lease": {
        "duration": _duration(),
        "heartbeat_interval": _duration(),
        "reconcile_interval": _duration(),
        "safety_margin": _duration(allow_zero=True),
        "full_scan_interval": _duration(),
        "handoff_poll_interval": _duration(allow_zero=True),
    },
    "supervisor": {
        "shutdown_timeout": _duration(),
        "checkpoint_interval": _duration(),
        "restart_backoff_initial": _duration(),
        "restart_backoff_max": _duration(),
        "restart_reset_after": _duration(),
        "max_restarts": _integer(1, 1000),
        "restart_window": _duration(),
        "hang_timeout": _duration(),
        "spawn": _one_of(("zygote", "fresh")),
        "worker_command": _command,
    },
    "sink": {
        "kind": _one_of(_SINK_KINDS),
        "path": _sink_path,
        "fsync": _boolean,
        "rotate_bytes": _rotate_bytes,
        "stream": _matching(
            r"(?:[A-Za-z0-9_.-]{1,128}|arn:.+)?",
            "be a Kinesis stream name (1-128 characters of A-Z a-z 0-9 _ . -) or an ARN",
        ),
        "partition_key": _partition_key,
        "queue_url": _matching(r"(?:https?://.+)?", 'be "" or an SQS queue URL (https://...)'),
        "region": _string,
        "endpoint_url": _matching(r"(?:https?://.+)?", 'be "" or start with http:// or https://'),
        "handler": _handler_reference,
        "batch_max_records": _integer(0, 100_000),
        "batch_max_bytes": _integer(0, 1 << 30),
        "batch_max_wait": _duration(allow_zero=True),
        "max_attempts": _integer(1, 1000),
        "on_failure": _one_of(("dead_letter", "crash")),
        "max_message_size": _integer(1024, 1 << 30),
    },
    "dead_letter": {"path": _dead_letter_path},
    "log": {"level": _one_of(_LOG_LEVELS), "format": _one_of(("json", "text"))},
    "http": {
        "listen": _matching(
            r"(?:(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5})?",
            'be "" (disabled) or HOST:PORT like "127.0.0.1:9400" (port 0 picks a free one)',
        )
    },
    "tls": {"ca_bundle": _ca_bundle, "verify": _boolean},
}
_STREAM_CHECKS: dict[str, Check] = {
    "url": _stream_url,
    "sequence": _matching(
        r"(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)?",
        'be "" or a dotted path of identifiers like "seq" or "meta.seq"',
    ),
    "subscribe": _templated,
    "headers": _headers,
}


# --- ${NAME} substitution ----------------------------------------------------------------------


@attrs.define
class _Substitution:
    """Replaces ``${NAME}`` in every string of the document, remembering what it did."""

    environ: Mapping[str, str] | None  # None: references are refused (registered shards)
    problems: list[str] = attrs.Factory(list)
    failed: set[str] = attrs.Factory(set)  # key paths whose value could not be substituted
    templates: list[tuple[str, str]] = attrs.Factory(list)  # (key path, text as written)
    secrets: set[str] = attrs.Factory(set)

    def caused(self, problem: str) -> bool:
        """Whether a validation problem only follows from a failed substitution (a value
        still holding its ``${NAME}``): reporting it too would be noise."""
        path = problem.split(": ", 1)[0]
        return any(f == path or f.startswith((f"{path}.", f"{path}[")) for f in self.failed)

    def walk(self, value: Any, path: str) -> Any:
        if isinstance(value, str):
            return self.text(value, path)
        if isinstance(value, dict):
            return {k: self.walk(v, _key_path(path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.walk(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return value

    def text(self, text: str, path: str) -> str:
        if "${" not in text:
            return text
        if self.environ is None:
            self.failed.add(path)
            self.problems.append(
                f"{path}: ${{...}} is substituted only in config files: a registered shard is"
                " stored in the table as given, where `shards list` shows it; define a shard"
                " that needs a secret in [[shards]] of the config file"
            )
            return text
        environ = self.environ
        used: list[str] = []
        problems: list[str] = []

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if match.group(0) == "$${":
                return "${"
            if name is None:
                problems.append(
                    f'{path}: "${{" must start a reference like ${{NAME}} (NAME: letters,'
                    " digits, _; not starting with a digit); write $${ for a literal ${"
                )
            elif name not in environ:
                problems.append(f"{path}: environment variable {name} is not set")
            else:
                used.append(environ[name])
                return environ[name]
            return match.group(0)

        result = _REFERENCE.sub(replace, text)
        if problems:
            self.failed.add(path)
            self.problems += dict.fromkeys(problems)  # once each, in order
        if used:
            self.templates.append((path, text))
            self.secrets.update(v for v in used if v)
        return result


def _escape(text: str) -> str:
    """The inverse of substitution for a plain value: a literal ``${`` is written ``$${``."""
    return text.replace("${", "$${")


# --- Walking the tables --------------------------------------------------------------------


def _key_path(path: str, key: str) -> str:
    shown = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
    return f"{path}.{shown}" if path else shown


def _unknown_key(key: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key (known keys: {', '.join(known)})"


@attrs.define
class _Reader:
    """Collects problems while the sections are read, so all of them are reported together."""

    problems: list[str] = attrs.Factory(list)

    def report(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def table(self, value: object, path: str, known: Sequence[str]) -> dict[str, Any] | None:
        """The table at ``path`` with unknown keys reported, or None if it is not a table."""
        if not isinstance(value, dict):
            self.report(path, f"expected a table, got {_show(value)}")
            return None
        for key in value:
            if key not in known:
                self.report(_key_path(path, key), _unknown_key(key, known))
        return value

    def fields(
        self, table: Mapping[str, Any], path: str, checks: Mapping[str, Check]
    ) -> tuple[dict[str, Any], set[str]]:
        """Checked values of the keys present, and the names of the keys that failed."""
        values: dict[str, Any] = {}
        bad: set[str] = set()
        for key, check in checks.items():
            if key in table:
                try:
                    values[key] = check(table[key])
                except _Invalid as exc:
                    self.report(f"{path}.{key}", str(exc))
                    bad.add(key)
        return values, bad

    def section(self, data: Mapping[str, Any], name: str) -> tuple[dict[str, Any], set[str]]:
        checks = _CHECKS[name]
        table = self.table(data.get(name, {}), name, list(checks))
        return self.fields(table or {}, name, checks)


def _lease(reader: _Reader, data: Mapping[str, Any]) -> LeaseConfig:
    """Cross-key rules run only on keys that passed their own checks (no follow-on noise)."""
    values, bad = reader.section(data, "lease")
    lease = LeaseConfig(**values)
    duration, heartbeat, margin = lease.duration, lease.heartbeat_interval, lease.safety_margin
    d, hb = format_duration(duration), format_duration(heartbeat)
    if (
        bad.isdisjoint({"duration", "heartbeat_interval"}) and heartbeat * 3 > duration + 1e-9
    ):  # 1e-9: float rounding
        problem = f"must be at most lease.duration / 3 (got {hb} with duration {d})"
        reader.report("lease.heartbeat_interval", problem)
    reconcile = lease.reconcile_interval
    if bad.isdisjoint({"duration", "reconcile_interval"}) and reconcile > duration:
        problem = (
            f"must be at most lease.duration (got {format_duration(reconcile)} with duration {d})"
        )
        reader.report("lease.reconcile_interval", problem)
    margin_ok = not margin or margin < duration - heartbeat  # 0 = derived, always fits
    if bad.isdisjoint({"duration", "heartbeat_interval", "safety_margin"}) and not margin_ok:
        problem = (
            "must be less than lease.duration - lease.heartbeat_interval"
            f" (got {format_duration(margin)} with duration {d} and heartbeat_interval {hb})"
        )
        reader.report("lease.safety_margin", problem)
    return lease


def _supervisor(reader: _Reader, data: Mapping[str, Any]) -> SupervisorConfig:
    values, bad = reader.section(data, "supervisor")
    sup = SupervisorConfig(**values)
    initial, maximum = sup.restart_backoff_initial, sup.restart_backoff_max
    if bad.isdisjoint({"restart_backoff_initial", "restart_backoff_max"}) and initial > maximum:
        problem = (
            "must be at most supervisor.restart_backoff_max"
            f" (got {format_duration(initial)} with restart_backoff_max {format_duration(maximum)})"
        )
        reader.report("supervisor.restart_backoff_initial", problem)
    if sup.worker_command and sup.spawn != "fresh" and "spawn" not in bad:
        reader.report(
            "supervisor.worker_command",
            'needs supervisor.spawn = "fresh" (the zygote forks the built-in worker)',
        )
    return sup


def _sink(reader: _Reader, data: Mapping[str, Any]) -> SinkSpec:
    """[sink]: the kind's own keys must be there, the other kinds' keys must not be set."""
    values, bad = reader.section(data, "sink")
    spec = SinkSpec(**values)
    if "kind" in bad:
        return spec
    kind = spec.kind
    default = SinkSpec()
    for key, kinds in _SINK_KEY_KINDS.items():
        if (
            key in values
            and key not in bad
            and kind not in kinds
            and values[key] != getattr(default, key)
        ):
            reader.report(
                f"sink.{key}",
                f"applies only to kind = {' or '.join(kinds)} (this sink is {kind!r});"
                " remove it or change sink.kind",
            )
    if kind == "kinesis" and not spec.stream and "stream" not in bad:
        reader.report("sink.stream", 'missing: kind = "kinesis" needs the stream name or ARN')
    if kind == "sqs" and not spec.queue_url and "queue_url" not in bad:
        reader.report("sink.queue_url", 'missing: kind = "sqs" needs the queue URL')
    if kind == "handler" and "handler" not in bad:
        if not spec.handler:
            reader.report(
                "sink.handler", 'missing: kind = "handler" needs "package.module:callable"'
            )
        elif (problem := _import_handler(spec.handler)) is not None:
            reader.report("sink.handler", problem)
    if kind in _BATCH_LIMITS:
        max_records, max_bytes = _BATCH_LIMITS[kind]
        if spec.batch_max_records > max_records and "batch_max_records" not in bad:
            reader.report(
                "sink.batch_max_records",
                f"must be at most {max_records} for {kind} (got {spec.batch_max_records})",
            )
        if spec.batch_max_bytes > max_bytes and "batch_max_bytes" not in bad:
            reader.report(
                "sink.batch_max_bytes",
                f"must be at most {max_bytes} for {kind} (got {spec.batch_max_bytes})",
            )
    return spec


def _dead_letter(reader: _Reader, data: Mapping[str, Any], sink: SinkSpec) -> DeadLetterConfig:
    values, bad = reader.section(data, "dead_letter")
    config = DeadLetterConfig(**values)
    if "path" not in bad and config.path == sink.path:
        reader.report("dead_letter.path", "must differ from sink.path")
    return config


def _unique_id(
    reader: _Reader, table: Mapping[str, Any], path: str, seen: dict[str, str], what: str
) -> str | None:
    """The checked id of a shard or stream; ``seen`` maps ids to where they first appeared."""
    key = f"{path}.id"
    if "id" not in table:
        reader.report(key, f"missing (every {what} needs an id)")
        return None
    try:
        ident = _ID(table["id"])
    except _Invalid as exc:
        reader.report(key, str(exc))
        return None
    if ident in seen:
        why = _UNIQUE_STREAMS_WHY if what == "stream" else ""
        reader.report(key, f"duplicate {what} id {ident!r} (also at {seen[ident]}){why}")
        return None
    seen[ident] = key
    return ident


def _array_of_tables(reader: _Reader, value: object, path: str, header: str) -> list[Any] | None:
    if not isinstance(value, list):
        reader.report(path, f"expected an array of tables ({header}), got {_show(value)}")
        return None
    return value


def _streams(
    reader: _Reader, shard: Mapping[str, Any], path: str, seen: dict[str, str]
) -> tuple[StreamSpec, ...]:
    value = shard.get("streams", [])
    items = _array_of_tables(reader, value, f"{path}.streams", "[[shards.streams]]")
    if items is None:
        return ()
    if not items:
        reader.report(f"{path}.streams", "a shard needs at least one [[shards.streams]] table")
    streams = []
    for index, item in enumerate(items):
        stream_path = f"{path}.streams[{index}]"
        table = reader.table(item, stream_path, ["id", *_STREAM_CHECKS])
        if table is None:
            continue
        ident = _unique_id(reader, table, stream_path, seen, "stream")
        values, _ = reader.fields(table, stream_path, _STREAM_CHECKS)
        if "url" not in table:
            reader.report(
                f"{stream_path}.url", "missing (every stream needs a ws:// or wss:// url)"
            )
        if ident is not None and "url" in values:
            streams.append(StreamSpec(id=ident, **values))
    return tuple(streams)


def _shards(reader: _Reader, data: Mapping[str, Any]) -> tuple[ShardConfig, ...]:
    shard_ids: dict[str, str] = {}
    stream_ids: dict[str, str] = {}
    shards = []
    items = _array_of_tables(reader, data.get("shards", []), "shards", "[[shards]]")
    for index, item in enumerate(items or []):
        path = f"shards[{index}]"
        table = reader.table(item, path, ["id", "streams"])
        if table is None:
            continue
        ident = _unique_id(reader, table, path, shard_ids, "shard")
        streams = _streams(reader, table, path, stream_ids)
        if ident is not None:
            shards.append(ShardConfig(id=ident, streams=streams))
    return tuple(shards)


# --- Public API --------------------------------------------------------------------------------


def parse_config(
    data: dict[str, Any],
    source: str = "<config>",
    *,
    environ: Mapping[str, str] | None = None,
    substitute: bool = True,
) -> Config:
    """Validate the parsed TOML document; raise ConfigError listing every problem found.

    ``${NAME}`` in a string is replaced from ``environ`` (default: os.environ); with
    ``substitute`` false a reference is a problem (definitions stored in the table)."""
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: expected a table of sections, got {_show(data)}"], source)
    substitution = _Substitution(
        (os.environ if environ is None else environ) if substitute else None
    )
    data = substitution.walk(data, "")
    reader = _Reader()
    reader.table(data, "", _SECTIONS)
    worker, _ = reader.section(data, "worker")
    dynamodb, _ = reader.section(data, "dynamodb")
    lease = _lease(reader, data)
    supervisor = _supervisor(reader, data)
    sink = _sink(reader, data)
    dead_letter = _dead_letter(reader, data, sink)
    log, _ = reader.section(data, "log")
    http, _ = reader.section(data, "http")
    tls, _ = reader.section(data, "tls")
    config = Config(
        worker=WorkerConfig(**worker),
        dynamodb=DynamoConfig(**dynamodb),
        lease=lease,
        supervisor=supervisor,
        sink=sink,
        dead_letter=dead_letter,
        log=LogConfig(**log),
        http=HttpConfig(**http),
        tls=TlsConfig(**tls),
        shards=_shards(reader, data),
        templates=tuple(sorted(substitution.templates)),
        secrets=frozenset(substitution.secrets),
    )
    problems = substitution.problems + [p for p in reader.problems if not substitution.caused(p)]
    if problems:
        # A problem may quote a bad value: never one that came from the environment.
        redactor = Redactor()
        redactor.add(substitution.secrets)
        raise ConfigError([redactor(problem) for problem in problems], source)
    return config


def load_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> Config:
    """Read and validate a TOML config file; every failure is a ConfigError naming the file."""
    name = os.fspath(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError([f"{name}: cannot read: {exc.strerror or exc}"], name) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{name}: not UTF-8 text: {exc}"], name) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{name}: invalid TOML: {exc}"], name) from exc
    return parse_config(data, source=name, environ=environ)


def _toml_value(value: object) -> str:
    """TOML text for a model value; every float in the model is a duration in seconds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        value = format_duration(value)
    # JSON escapes are TOML escapes, except that TOML also forbids a raw DEL character.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


@attrs.define
class _Renderer:
    """Model values as TOML, with every substituted value shown as written (``${NAME}``)."""

    templates: dict[str, str]

    def value(self, value: object, path: str) -> str:
        if path in self.templates:
            return _toml_value(self.templates[path])
        if isinstance(value, str):
            return _toml_value(_escape(value))
        if isinstance(value, tuple):
            return "[" + ", ".join(self.value(v, f"{path}[{i}]") for i, v in enumerate(value)) + "]"
        return _toml_value(value)

    def table(self, header: str, obj: object, path: str, skip: Sequence[str] = ()) -> list[str]:
        lines = [header]
        for field in attrs.fields(type(obj)):
            if field.name not in skip:
                key_path = _key_path(path, field.name)
                value = getattr(obj, field.name)
                text = self.pairs(value, key_path) if field.name == "headers" else None
                lines.append(f"{field.name} = {text or self.value(value, key_path)}")
        return [*lines, ""]

    def pairs(self, pairs: tuple[tuple[str, str], ...], path: str) -> str:
        """(name, value) pairs as an inline table."""
        items = [f"{_key_path('', k)} = {self.value(v, _key_path(path, k))}" for k, v in pairs]
        return "{ " + ", ".join(items) + " }" if items else "{}"


def render_config(config: Config) -> str:
    """The effective config as TOML: every key, defaults filled in, readable by parse_config.
    A value that came from ``${NAME}`` is shown as written: a secret is never printed."""
    render = _Renderer(dict(config.templates))
    lines = ["# Effective shardvisor configuration (every key, defaults filled in).", ""]
    for name in _SECTIONS[:-1]:
        # [sink]'s spec also carries the dead-letter path for the children: [dead_letter] says it.
        skip = ("dead_letter",) if name == "sink" else ()
        lines += render.table(f"[{name}]", getattr(config, name), name, skip=skip)
    if not config.shards:
        lines.append("# No [[shards]]: shards may be registered later.")
    for i, shard in enumerate(config.shards):
        lines += render.table("[[shards]]", shard, f"shards[{i}]", skip=["streams"])
        for j, stream in enumerate(shard.streams):
            lines += render.table("[[shards.streams]]", stream, f"shards[{i}].streams[{j}]")
    return "\n".join(lines).rstrip("\n") + "\n"
