"""What each message of a feed becomes (pure code): every branch of the frame core, and property
tests that its fast path decides exactly as the general path does."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_worker.core.frames import (
    NOT_JSON,
    NOT_UTF8,
    DeadLetter,
    FrameDecoder,
    Gap,
    Outcome,
    as_is,
    decode_frame,
)


def test_decode_frame() -> None:
    assert decode_frame("é") == ("é", b"")
    assert decode_frame("é".encode()) == ("é", b"")
    assert decode_frame(b"\xff\xfe") == (None, b"\xff\xfe")


@pytest.mark.parametrize(
    ("text", "kept"),
    [('{"a":1}', True), (' {"a": 1} ', True), ('{"a":"é"}', False), ('{"a":\n1}', False)],
)
def test_text_is_kept_only_when_it_can_stand_in_a_json_line(text: str, kept: bool) -> None:
    assert as_is(text) == (text if kept else None)
    assert as_is('{"a":\r1}') is None


# --- Unsequenced streams: everything is a record -----------------------------------------------


@pytest.mark.parametrize(
    ("message", "outcome"),
    [
        ('{"a":[1,2]}', (None, {"a": [1, 2]}, "", '{"a":[1,2]}')),
        (b'{"a":1}', (None, {"a": 1}, "", '{"a":1}')),  # binary UTF-8 counts as text
        ('"caf\u00e9"', (None, "café", "", None)),  # not ASCII: encoded again by the sink
        ("  7 ", (None, 7, "", "  7 ")),  # whitespace around: json.loads decides
        ("hello", (None, "hello", "", None)),  # not JSON: the text itself
        ("", (None, "", "", None)),
        ("[" * 100_000, (None, "[" * 100_000, "", None)),  # too deep for the parser
        (b"\xff\x00", (None, base64.b64encode(b"\xff\x00").decode(), "base64", None)),
    ],
)
def test_unsequenced(message: str | bytes, outcome: Outcome) -> None:
    frames = FrameDecoder()
    assert frames.accept(message) == outcome
    assert frames.accept_general(message) == outcome
    assert frames.received == 2
    assert frames.path is None and frames.key is None


def test_keep_text_off_never_gives_the_text() -> None:
    frames = FrameDecoder("seq", keep_text=False)
    assert frames.accept('{"seq":1}') == (1, {"seq": 1}, "", None)
    assert frames.accept('{"seq":3}') == Gap(1, (3, {"seq": 3}, "", None))
    assert FrameDecoder(keep_text=False).accept("[1]") == (None, [1], "", None)


# --- Sequenced streams: dedup, gaps, dead letters ----------------------------------------------


def test_in_order_duplicates_and_gaps() -> None:
    frames = FrameDecoder("seq", last=10)
    assert frames.accept('{"seq":11}') == (11, {"seq": 11}, "", '{"seq":11}')
    assert frames.accept('{"seq":11}') is None  # duplicate
    assert frames.accept('{"seq":9}') is None  # older than the checkpoint
    assert frames.accept('{"seq":14,"x":"\u00e9"}') == Gap(2, (14, {"seq": 14, "x": "é"}, "", None))
    assert frames.accept(b'{"seq":15}') == (15, {"seq": 15}, "", '{"seq":15}')
    assert frames.accept('{"seq": 16,\n"x": 1}') == (16, {"seq": 16, "x": 1}, "", None)
    assert frames.accept(' {"seq":17} ') == (17, {"seq": 17}, "", ' {"seq":17} ')
    tracker = frames.tracker
    assert (tracker.last, tracker.duplicates, tracker.gaps, tracker.missing) == (17, 2, 1, 2)
    assert frames.received == 7


def test_a_dotted_path() -> None:
    frames = FrameDecoder("meta.seq")
    assert frames.key is None
    assert frames.accept('{"meta":{"seq":1}}') == (
        1,
        {"meta": {"seq": 1}},
        "",
        '{"meta":{"seq":1}}',
    )
    assert frames.accept('{"meta":{"seq":1}}') is None
    assert frames.accept('{"seq":2}') == DeadLetter("no 'meta.seq' in the message", {"seq": 2})


@pytest.mark.parametrize(
    ("message", "letter"),
    [
        ("not json", DeadLetter(NOT_JSON, "not json")),
        ('{"seq":1}{"seq":2}', DeadLetter(NOT_JSON, '{"seq":1}{"seq":2}')),
        ('{"seq":1', DeadLetter(NOT_JSON, '{"seq":1')),  # the scanner's own error
        ("[" * 100_000, DeadLetter(NOT_JSON, "[" * 100_000)),
        (b"\xff\xfe", DeadLetter(NOT_UTF8, "//4=", "base64")),
        ('{"other":1}', DeadLetter("no 'seq' in the message", {"other": 1})),
        ("[1]", DeadLetter("no 'seq' in the message", [1])),
        ('{"seq":"1"}', DeadLetter("sequence '1' is not an integer", {"seq": "1"})),
        ('{"seq":true}', DeadLetter("sequence True is not an integer", {"seq": True})),
        ('{"seq":1.0}', DeadLetter("sequence 1.0 is not an integer", {"seq": 1.0})),
        # Python's json reads these words; JSON has no such values (RFC 8259).
        ('{"seq":1,"p":NaN}', DeadLetter(NOT_JSON, '{"seq":1,"p":NaN}')),
        ('{"seq":1,"p":-Infinity}', DeadLetter(NOT_JSON, '{"seq":1,"p":-Infinity}')),
    ],
)
def test_what_cannot_be_a_record_is_a_dead_letter(message: str | bytes, letter: DeadLetter) -> None:
    frames = FrameDecoder("seq")
    assert frames.accept(message) == letter
    assert frames.accept_general(message) == letter
    assert frames.tracker.last == 0  # nothing admitted
    assert frames.accept('{"seq":1}') == (1, {"seq": 1}, "", '{"seq":1}')


@pytest.mark.parametrize("message", ["NaN", "Infinity", '{"p": -Infinity}', b"[NaN]"])
def test_an_unsequenced_message_with_nan_is_kept_as_its_text(message: str | bytes) -> None:
    """Its record stays a JSON line that strict readers accept: the text as a string."""
    text = message.decode() if isinstance(message, bytes) else message
    assert FrameDecoder("").accept(message) == (None, text, "", None)


# --- The fast path and the general path agree --------------------------------------------------

scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=4,
)
not_sequence_numbers = st.sampled_from(["3", True, 2.0, None])


@st.composite
def feeds(draw: st.DrawFn) -> list[str | bytes]:
    """What feeds send: mostly JSON objects whose sequence number (at the top level or under
    ``meta``) is the next one, sometimes a repeat, a jump or not a number, in every rendering
    JSON allows; also other JSON, text that is not JSON, and binary frames (UTF-8 or not)."""
    feed: list[str | bytes] = []
    seq = 0
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["seq", "seq", "seq", "meta", "json", "text", "binary"]))
        if kind == "text":
            feed.append(draw(st.text(max_size=12)))
            continue
        if kind == "binary":
            feed.append(draw(st.binary(max_size=12)))
            continue
        value: Any = draw(json_values)
        if kind in ("seq", "meta"):
            seq += draw(st.sampled_from([1, 1, 1, 1, 0, -1, 2, 5]))
            number: Any = draw(not_sequence_numbers) if draw(st.integers(0, 9)) == 0 else seq
            extra = draw(st.dictionaries(st.text(max_size=3), json_values, max_size=2))
            value = (
                {**extra, "seq": number} if kind == "seq" else {**extra, "meta": {"seq": number}}
            )
        text = json.dumps(
            value,
            ensure_ascii=draw(st.booleans()),
            indent=draw(st.sampled_from([None, None, None, 1])),
            separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
        )
        before = draw(st.sampled_from(["", "", " ", "\n"]))
        text = before + text + draw(st.sampled_from(["", "", " ", "\r\n"]))
        feed.append(text.encode() if draw(st.booleans()) else text)
    return feed


@given(feeds(), st.sampled_from(["", "seq", "meta.seq"]), st.integers(0, 3), st.booleans())
def test_the_fast_path_decides_as_the_general_path(
    feed: list[str | bytes], sequence: str, last: int, keep_text: bool
) -> None:
    fast = FrameDecoder(sequence, last, keep_text=keep_text)
    general = FrameDecoder(sequence, last, keep_text=keep_text)
    for message in feed:
        # By repr: a feed may send the text NaN, which JSON parses to a float never equal to itself.
        assert repr(fast.accept(message)) == repr(general.accept_general(message))
        assert fast.tracker == general.tracker
    assert fast.received == general.received == len(feed)


@given(feeds(), st.sampled_from(["", "seq", "meta.seq"]))
def test_every_record_is_what_was_sent_and_its_text_stands_as_is(
    feed: list[str | bytes], sequence: str
) -> None:
    frames = FrameDecoder(sequence)
    admitted: list[int] = []
    for message in feed:
        outcome = frames.accept(message)
        entry = outcome.entry if isinstance(outcome, Gap) else outcome
        if not isinstance(entry, tuple):
            continue
        seq, data, encoding, text = entry
        if encoding:
            assert base64.b64decode(data) == message
        elif text is not None:
            assert text.isascii() and "\n" not in text and "\r" not in text
            assert json.loads(text) == data
            assert message in (text, text.encode())
        if sequence:
            assert seq is not None
            admitted.append(seq)
        else:
            assert seq is None
    assert admitted == sorted(set(admitted))  # strictly increasing: no duplicate written
