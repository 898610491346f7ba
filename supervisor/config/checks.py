"""Value checks: each takes a value as TOML gave it and returns the converted value or raises
``Invalid``, whose message follows the key path in a problem line.

Pure: no check opens a file or imports a module (those are in ``environment``), so validating
a config has no side effect and a check can be called anywhere, any number of times.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from supervisor.config.durations import parse_duration

Check = Callable[[Any], Any]

SINK_PLACEHOLDERS = ("shard", "stream", "epoch", "worker")
URL_PLACEHOLDERS = ("after", "shard", "stream", "epoch", "worker")
MIN_ROTATE_BYTES = 64 * 1024  # one write of the jsonl sink
COMPRESSIONS = ("deflate", "none")  # [websocket] compression: permessage-deflate offered, or not

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
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
_HANDLER_REFERENCE = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*"
    r"(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
)
_DURATION_EXPECTED = 'expected a duration (number of seconds or a string like "250ms", "10s", "2m")'


class Invalid(Exception):
    """A value failed its check; the message follows the key path in the problem line."""


def show(value: object) -> str:
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


# --- Building blocks --------------------------------------------------------------------------


def string(value: object) -> str:
    if not isinstance(value, str):
        raise Invalid(f"expected a string, got {show(value)}")
    return value


def boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"expected true or false, got {show(value)}")
    return value


def duration(*, allow_zero: bool = False) -> Check:
    """Seconds (see ``durations``); 0 only where it means something (``allow_zero``)."""

    def check(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise Invalid(f"{_DURATION_EXPECTED}, got {show(value)}")
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        if seconds == 0 and not allow_zero:
            raise Invalid(f"must be greater than 0 (got {show(value)})")
        return seconds

    return check


def integer(low: int, high: int) -> Check:
    def check(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"expected a whole number, got {show(value)}")
        if not low <= value <= high:
            raise Invalid(f"must be from {low} to {high} (got {value})")
        return value

    return check


def command(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise Invalid(f"expected an array of non-empty strings, got {show(value)}")
    return tuple(value)


def matching(pattern: str, must: str) -> Check:
    """A string matching ``pattern`` in full; ``must`` completes "must ..." in the problem."""
    compiled = re.compile(pattern)

    def check(value: object) -> str:
        text = string(value)
        if not compiled.fullmatch(text):
            raise Invalid(f"must {must} (got {text!r})")
        return text

    return check


def one_of(options: Sequence[str]) -> Check:
    def check(value: object) -> str:
        text = string(value)
        if text not in options:
            raise Invalid(f"must be one of {', '.join(options)} (got {text!r})")
        return text

    return check


def _check_placeholders(text: str, allowed: Sequence[str]) -> None:
    bad = sorted({m.group(0) for m in _PLACEHOLDER.finditer(text) if m.group(1) not in allowed})
    if bad:
        known = " ".join(f"{{{name}}}" for name in allowed)
        raise Invalid(f"unknown placeholder {', '.join(bad)} (allowed: {known})")


def _path_template(value: object, required: tuple[str, ...], why: str) -> str:
    text = string(value)
    if not text:
        raise Invalid("must not be empty")
    _check_placeholders(text, SINK_PLACEHOLDERS)
    missing = [p for p in required if p not in text]
    if missing:
        raise Invalid(
            f"must contain {' and '.join(required)} (missing {' and '.join(missing)}): {why}"
        )
    return text


HTTP_URL = matching(r"(?:https?://.+)?", 'be "" or start with http:// or https://')
IDENTIFIER = matching(r"[A-Za-z0-9_.:-]+", "be non-empty and use only A-Z a-z 0-9 _ . : -")


# --- Streams ------------------------------------------------------------------------------------


def templated(value: object) -> str:
    """A string that the child fills in per stream: only the URL placeholders."""
    text = string(value)
    _check_placeholders(text, URL_PLACEHOLDERS)
    return text


def stream_url(value: object) -> str:
    text = string(value)
    if not text.startswith(("ws://", "wss://")):
        raise Invalid(f"must start with ws:// or wss:// (got {text!r})")
    return templated(text)


def headers(value: object) -> tuple[tuple[str, str], ...]:
    """A table of handshake headers, as (name, value) pairs in the order written."""
    if not isinstance(value, dict):
        raise Invalid(
            'expected a table of header names to strings, like { Authorization = "Bearer'
            f' ${{FEED_TOKEN}}" }}, got {show(value)}'
        )
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, text in value.items():
        _check_header(name, text, seen)
        seen.add(name.lower())
        pairs.append((name, text))
    return tuple(pairs)


def _check_header(name: str, text: object, seen: set[str]) -> None:
    if not _HEADER_NAME.fullmatch(name):
        raise Invalid(
            f"header name {name!r} is not an HTTP token (letters, digits, !#$%&'*+-.^_`|~)"
        )
    if name.lower() in _HANDSHAKE_HEADERS:
        raise Invalid(f"header {name!r} is set by the WebSocket handshake itself")
    if name.lower() in seen:
        raise Invalid(f"header {name!r} is given twice (names are case-insensitive)")
    if not isinstance(text, str):
        raise Invalid(f"header {name!r}: expected a string, got {show(text)}")
    if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in text):
        raise Invalid(f"header {name!r}: the value must not contain control characters")


# --- Sinks --------------------------------------------------------------------------------------


def sink_path(value: object) -> str:
    return _path_template(
        value,
        ("{stream}", "{epoch}"),
        "each stream of each lease epoch needs its own file, so a shard's new owner never"
        " appends to a file that its previous owner may still be writing",
    )


def dead_letter_path(value: object) -> str:
    return _path_template(
        value,
        ("{shard}", "{epoch}"),
        "each shard's lease epoch needs its own file, so two writers never share one",
    )


def rotate_bytes(value: object) -> int:
    size = integer(0, 1 << 50)(value)
    if 0 < size < MIN_ROTATE_BYTES:
        raise Invalid(f"must be 0 (never rotate) or at least {MIN_ROTATE_BYTES} (got {size})")
    return size


def partition_key(value: object) -> str:
    text = string(value)
    if not text:
        raise Invalid('must not be empty (the default is "{shard}:{stream}")')
    _check_placeholders(text, SINK_PLACEHOLDERS)
    return text


def handler_reference(value: object) -> str:
    """Only the form: whether it imports is an environment check (``environment``)."""
    text = string(value)
    if text and not _HANDLER_REFERENCE.fullmatch(text):
        raise Invalid(
            f'must be "package.module:callable", like "my_handlers:handle" (got {text!r})'
        )
    return text
