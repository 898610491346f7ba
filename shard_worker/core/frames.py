"""What each message of a feed becomes: a record, a dead letter, or nothing (a duplicate).

A pure core (no I/O, no clock): frames in, decisions out. ``FrameDecoder.accept`` decodes one
WebSocket message (a text frame; a binary frame, which counts as text when it is UTF-8, else is
kept as base64), parses its JSON, finds its sequence number (``core/sequence.py``), drops
duplicates and counts gaps. It returns one of:

- an ``Entry``, the plain tuple ``(seq, data, encoding, text)``: write this record. ``encoding``
  is ``""`` or ``"base64"``; ``text`` is the message itself when it can stand in a JSON line
  as the record's data as is (JSON, ASCII, no line break: the same value, not encoded a second
  time), else None. A tuple, not a class: this is built once per message on the hot path;
- ``Gap``: write ``entry``, after ``skipped`` sequence numbers that never came;
- ``DeadLetter``: the message cannot be a record (why, and what to keep of it);
- None: a duplicate, dropped (counted by the tracker).

One fast path serves every sink: a text frame that is exactly one JSON object whose top-level
sequence number is the next one (a busy sequenced stream, nearly every message) is decided
with one scan by the C JSON scanner. Everything else takes the general path, which decides the
same for every message (``accept_general``; the property tests check that they agree).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any, TypeAlias

import attrs

from shard_worker.core.sequence import MalformedMessage, SequencePath, SequenceTracker

Entry: TypeAlias = tuple[int | None, Any, str, str | None]
"""A record to write: ``(seq, data, encoding, text)`` (see the module docstring)."""


def _not_json(constant: str) -> Any:
    """Python's json reads NaN, Infinity and -Infinity; RFC 8259 has no such values, and a
    record holding one would be a line that strict readers (jq, JSON.parse) reject. Called
    only for those three words, so the hot path pays nothing."""
    raise ValueError(f"{constant} is not a JSON value")


_decoder = json.JSONDecoder(parse_constant=_not_json)
_loads = _decoder.decode
# The C scanner alone: decode adds two regex passes for the whitespace around the value.
# A JSONDecoder holds no state between calls, so one scanner serves every decoder.
_scan: Callable[[str, int], tuple[Any, int]] = _decoder.scan_once  # type: ignore[attr-defined]

NOT_UTF8 = "binary frame is not UTF-8"
NOT_JSON = "not JSON"


@attrs.frozen
class DeadLetter:
    """A message that cannot be a record: ``error`` says why, ``data`` is what is kept of it
    (the parsed JSON, else the text, else base64 with ``encoding``)."""

    error: str
    data: Any
    encoding: str = ""


@attrs.frozen
class Gap:
    """``entry`` is admitted, but ``skipped`` sequence numbers before it never came."""

    skipped: int
    entry: Entry


Outcome: TypeAlias = Entry | Gap | DeadLetter | None


def decode_frame(message: str | bytes) -> tuple[str | None, bytes]:
    """Text of a frame (binary frames that are UTF-8 count as text), else None and the bytes."""
    if isinstance(message, str):
        return message, b""
    try:
        return message.decode("utf-8"), b""
    except UnicodeDecodeError:
        return None, message


def as_is(text: str) -> str | None:
    """``text`` when it can stand in a JSON line unchanged (ASCII, one line), else None."""
    return text if text.isascii() and "\n" not in text and "\r" not in text else None


class FrameDecoder:
    """The messages of one stream, in the order received; ``sequence`` is the stream's dotted
    path to its sequence number ("" = unsequenced), ``last`` the checkpoint it resumes after.
    ``keep_text``: give an Entry its ``text`` when it qualifies (a sink that writes JSON lines
    uses it; for the others, checking would be time lost on every message)."""

    def __init__(self, sequence: str = "", last: int = 0, *, keep_text: bool = True) -> None:
        path = self.path = SequencePath.parse(sequence) if sequence else None
        # A one-part path ("seq") is looked up inline; dotted ones through SequencePath.
        self.key = path.parts[0] if path is not None and len(path.parts) == 1 else None
        self.tracker = SequenceTracker(last=last)
        self.keep_text = keep_text
        self.received = 0  # messages accepted, whatever became of them

    def accept(self, message: str | bytes) -> Outcome:
        """What ``message`` becomes: the fast path, else the general one."""
        self.received += 1
        key = self.key
        if key is None or type(message) is not str:
            return self._decode(message)
        try:
            data, end = _scan(message, 0)
        except (StopIteration, ValueError, RecursionError):
            return self._decode(message)  # not one JSON value at 0: the general path decides
        if end != len(message):
            return self._decode(message)  # whitespace after it, or more than one value
        tracker = self.tracker
        if type(data) is dict and type(seq := data.get(key)) is int and seq == tracker.last + 1:
            tracker.last = seq
            if self.keep_text and message.isascii() and "\n" not in message and "\r" not in message:
                return seq, data, "", message
            return seq, data, "", None
        return self._admit(message, data)

    def accept_general(self, message: str | bytes) -> Outcome:
        """``accept`` without its fast path: the reference the fast path must agree with."""
        self.received += 1
        return self._decode(message)

    def _decode(self, message: str | bytes) -> Outcome:
        """The frame's text and JSON value; a frame that has none is a dead letter on a
        sequenced stream, else a record of the text (or of its base64)."""
        text, raw = decode_frame(message)
        if text is None:
            encoded = base64.b64encode(raw).decode()
            if self.path is not None:
                return DeadLetter(NOT_UTF8, encoded, "base64")
            return None, encoded, "base64", None
        try:
            try:
                data, end = _scan(text, 0)
            except StopIteration:  # not a JSON value at 0 (perhaps leading whitespace)
                end = -1
            if end != len(text):  # whitespace around it, or not JSON: json.loads decides
                data = _loads(text)
        except (ValueError, RecursionError):
            if self.path is not None:
                return DeadLetter(NOT_JSON, text)
            return None, text, "", None
        return self._admit(text, data)

    def _admit(self, text: str, data: Any) -> Outcome:
        """The record of a JSON message, unless its sequence number makes it a duplicate."""
        path = self.path
        seq: int | None = None
        skipped = 0
        if path is not None:
            key = self.key
            if key is None or type(data) is not dict or type(seq := data.get(key)) is not int:
                try:
                    seq = path.extract(data)
                except MalformedMessage as exc:
                    return DeadLetter(str(exc), data)
            admitted = self.tracker.admit(seq)
            if admitted is None:
                return None
            skipped = admitted
        entry = seq, data, "", as_is(text) if self.keep_text else None
        return Gap(skipped, entry) if skipped else entry
