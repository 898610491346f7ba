"""The pipe protocol codec: round trips, framing across reads, and every way a peer can break it."""

from __future__ import annotations

import itertools
import json

import attrs
import pytest
import trio
from helpers.worker_helpers import pipe_channel_pair
from hypothesis import given
from hypothesis import strategies as st

from shard_worker.contract.pipe import (
    MAX_LINE_BYTES,
    STANDBY,
    Checkpoint,
    Decoder,
    Error,
    Fence,
    Heartbeat,
    Hello,
    Message,
    Promote,
    ProtocolError,
    Ready,
    SinkSpec,
    StandbyReady,
    StandbySettings,
    StandbyStats,
    Start,
    Stop,
    Stopped,
    StreamSpec,
    WorkerSettings,
    encode,
)

START = Start(
    shard="shard-1",
    epoch=7,
    worker="w-1",
    streams=(
        StreamSpec(id="a", url="ws://h/feed/a?after={after}", sequence="meta.seq"),
        StreamSpec(id="b", url="ws://h/b", subscribe='{"op": "sub", "x": "{shard}"}'),
    ),
    checkpoint={"a": 41},
    sink=SinkSpec(path="out/{shard}/{stream}.{epoch}.jsonl", fsync=True),
    settings=WorkerSettings(checkpoint_interval=0.5),
    fence_deadline=12345.678,
)
EVERY_MESSAGE: list[Message] = [
    START,
    Fence(deadline=99.5),
    Stop(reason="shutdown", deadline=100.25),
    Hello(version=1, pid=4242),
    Ready(),
    Checkpoint(checkpoint={"a": 5, "b": 6}, written=11),
    Stopped(checkpoint={"a": 5}, written=5, reason="rebalance"),
    Error(message="boom \u00e9\n", fatal=True),
    Error(message="just saying"),
    attrs.evolve(START, mode=STANDBY, standby=StandbySettings(buffer=12.5, max_bytes=4096)),
    Stop(reason="handoff", deadline=3.5, min_cut={"a": 41, "b": 7}),
    Promote(epoch=8, checkpoint={"a": 41}, fence_deadline=200.5),
    StandbyReady(first_seq={"a": 42}),
    StandbyReady(first_seq={}),
    Heartbeat(written=3, last_seq={"a": 3}, loop_lag=0.001, streams={"a": {"received": 3}}),
    Heartbeat(
        written=0,
        last_seq={},
        loop_lag=0.0,
        standby=StandbyStats(
            buffered=5, bytes=500, dropped=2, first_seq={"a": 40}, connected=("a", "b")
        ),
    ),
]


def decode_all(*chunks: bytes) -> list[Message]:
    decoder = Decoder()
    out: list[Message] = []
    for chunk in chunks:
        decoder.feed(chunk)
        out.extend(decoder)
    return out


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_round_trip(message: Message) -> None:
    assert decode_all(encode(message), b"") == [message]


async def test_round_trip_over_pipes() -> None:
    parent, child = pipe_channel_pair()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for message in EVERY_MESSAGE:
                nursery.start_soon(parent.send, message)  # concurrent senders: whole lines
            received = [await child.receive() for _ in EVERY_MESSAGE]
        await parent.aclose()
        assert await child.receive() is None  # EOF is clean between messages
        await child.aclose()
    assert sorted(map(repr, received)) == sorted(map(repr, EVERY_MESSAGE))


def test_partial_lines_across_feeds() -> None:
    data = encode(Hello(version=1, pid=1)) + encode(Ready())
    cut = len(data) // 3
    decoder = Decoder()
    decoder.feed(data[:cut])
    assert list(decoder) == []
    decoder.feed(data[cut:-1])
    assert list(decoder) == [Hello(version=1, pid=1)]
    decoder.feed(data[-1:])
    assert list(decoder) == [Ready()]
    decoder.feed(b"")
    assert decoder.at_eof


def test_eof_mid_line_is_an_error() -> None:
    decoder = Decoder()
    decoder.feed(encode(Ready())[:-1])
    decoder.feed(b"")
    with pytest.raises(ProtocolError, match="EOF"):
        list(decoder)


@pytest.mark.parametrize(
    "line",
    [
        b'{"type":"launch"}\n',
        b'{"kind":"ready"}\n',
        b"[1,2]\n",
        b"not json\n",
        b'{"type":"hello","version":1}\n',
        b'{"type":"fence","deadline":1,"extra":2}\n',
    ],
)
def test_bad_lines_are_errors(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_all(line)


def test_unknown_type_is_an_error() -> None:
    with pytest.raises(ProtocolError, match="unknown message type"):
        decode_all(b'{"type":"launch"}\n')


def test_oversize_line_is_an_error() -> None:
    decoder = Decoder()
    decoder.feed(b'{"type":"error","message":"' + b"x" * MAX_LINE_BYTES)
    with pytest.raises(ProtocolError, match="longer than"):
        list(decoder)


messages = st.lists(
    st.one_of(
        st.builds(Hello, version=st.integers(0, 3), pid=st.integers(1, 2**22)),
        st.builds(Ready),
        st.builds(Fence, deadline=st.floats(allow_nan=False, allow_infinity=False)),
        st.builds(
            Checkpoint,
            checkpoint=st.dictionaries(st.text(max_size=5), st.integers(0, 2**53)),
            written=st.integers(0, 2**40),
        ),
        st.builds(Error, message=st.text(), fatal=st.booleans()),
    ),
    max_size=8,
)


@given(messages=messages, data=st.data())
def test_any_split_decodes_the_same(messages: list[Message], data: st.DataObject) -> None:
    stream = b"".join(encode(m) for m in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    bounds = [0, *cuts, len(stream)]
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    assert decode_all(*chunks, b"") == messages


def test_every_sink_field_round_trips_and_an_older_start_still_decodes() -> None:
    sink = SinkSpec(
        kind="handler",
        handler="pkg.mod:handle",
        batch_max_records=10,
        batch_max_bytes=4096,
        batch_max_wait=0.25,
        max_attempts=3,
        on_failure="crash",
        max_message_size=65536,
        dead_letter="dl/{shard}.{epoch}.jsonl",
    )
    start = attrs.evolve(START, sink=sink)
    assert decode_all(encode(start)) == [start]
    # A start of a supervisor from before the sink kinds: only kind, path, fsync.
    old = json.loads(encode(START))
    old["sink"] = {"kind": "jsonl", "path": "out/{stream}.{epoch}.jsonl", "fsync": False}
    [decoded] = decode_all(json.dumps(old).encode() + b"\n")
    assert isinstance(decoded, Start)
    assert decoded.sink == SinkSpec(path="out/{stream}.{epoch}.jsonl")
    assert decoded.sink.on_failure == "dead_letter" and decoded.sink.rotate_bytes == 0


def line_of(message: Message) -> dict[str, object]:
    return json.loads(encode(message))


def test_an_owner_child_s_messages_carry_no_standby_field() -> None:
    """The fields added for standbys are left out at their default: an owner child's traffic
    is what it was, and an older peer reads it."""
    assert "mode" not in line_of(START) and "standby" not in line_of(START)
    assert "min_cut" not in line_of(Stop(reason="x", deadline=1.0))
    heartbeat = Heartbeat(written=1, last_seq={}, loop_lag=0.0)
    assert "standby" not in line_of(heartbeat)
    standby = attrs.evolve(START, mode=STANDBY, standby=StandbySettings(quiet=0.5))
    assert line_of(standby)["mode"] == "standby"
    assert line_of(standby)["standby"] == {"buffer": 30.0, "max_bytes": 67108864, "quiet": 0.5}


def test_messages_of_an_older_peer_decode_with_the_defaults() -> None:
    """A start, stop and heartbeat as a peer from before standbys writes them."""
    start = line_of(START)
    start.pop("mode", None)
    start.pop("standby", None)
    [decoded] = decode_all(json.dumps(start).encode() + b"\n")
    assert isinstance(decoded, Start)
    assert decoded.mode == "active" and decoded.standby == StandbySettings()
    [stop] = decode_all(b'{"type":"stop","reason":"shutdown","deadline":5.0}\n')
    assert stop == Stop(reason="shutdown", deadline=5.0, min_cut={})
    old_heartbeat = b'{"type":"heartbeat","written":4,"last_seq":{"a":4},"loop_lag":0.0}\n'
    [heartbeat] = decode_all(old_heartbeat)
    assert isinstance(heartbeat, Heartbeat) and heartbeat.standby is None


def test_partial_standby_settings_and_stats_take_the_defaults() -> None:
    start = line_of(attrs.evolve(START, mode=STANDBY))
    start["standby"] = {"buffer": 5}
    [decoded] = decode_all(json.dumps(start).encode() + b"\n")
    assert isinstance(decoded, Start)
    assert decoded.standby == StandbySettings(buffer=5, max_bytes=67108864, quiet=1.0)
    line = b'{"type":"heartbeat","written":0,"last_seq":{},"loop_lag":0,"standby":{"buffered":2}}\n'
    [heartbeat] = decode_all(line)
    assert isinstance(heartbeat, Heartbeat)
    assert heartbeat.standby == StandbyStats(buffered=2)


@pytest.mark.parametrize(
    "line",
    [
        b'{"type":"promote","epoch":2,"checkpoint":{"a":"x"},"fence_deadline":1}\n',
        b'{"type":"promote","epoch":2,"fence_deadline":1}\n',
        b'{"type":"standby_ready"}\n',
        b'{"type":"stop","reason":"r","deadline":1,"min_cut":{"a":"n"}}\n',
        b'{"type":"heartbeat","written":0,"last_seq":{},"loop_lag":0,"standby":{"x":1}}\n',
        b'{"type":"heartbeat","written":0,"last_seq":{},"loop_lag":0,"standby":{"connected":"a"}}\n',
    ],
)
def test_bad_standby_messages_are_errors(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_all(line)


def test_an_unknown_mode_is_an_error() -> None:
    start = line_of(START)
    start["mode"] = "passive"
    with pytest.raises(ProtocolError, match="mode"):
        decode_all(json.dumps(start).encode() + b"\n")
