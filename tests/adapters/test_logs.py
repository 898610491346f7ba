"""Log lines: JSON by default (one object per line, every context field), text for terminals,
child lines merged with their shard, and secrets redacted in every format."""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trio
from helpers.worker_helpers import FAST_SETTINGS, make_start, spawn_worker

from shard_worker.adapters.log import Log
from shard_worker.contract.pipe import Ready, StreamSpec
from supervisor.adapters.logs import (
    REDACTOR,
    JsonFormatter,
    RedactingWriter,
    Redactor,
    TextFormatter,
    setup_logging,
)
from supervisor.adapters.spawn import forward_line

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def record(
    msg: str = "lease taken", *args, level: int = logging.INFO, **extra
) -> logging.LogRecord:
    rec = logging.LogRecord("shardvisor.daemon", level, __file__, 1, msg, args, None)
    rec.__dict__.update(extra)
    return rec


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """The "shardvisor" loggers writing JSON into a buffer; the set-up restored afterwards."""
    logger = logging.getLogger("shardvisor")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter("w1", Redactor()))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, out
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved


def lines(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


# --- The supervisor's formatters ---------------------------------------------------------------


def test_a_json_line_carries_every_field() -> None:
    rec = record(
        "took %s at epoch %d",
        "s1",
        4,
        shard="s1",
        stream="s1-a",
        epoch=4,
        checkpoint={"s1-a": 17},
        pid=1234,
        code=None,  # None fields are left out
        reason="rebalance",
    )
    line = JsonFormatter("w1").format(rec)
    assert "\n" not in line
    event = json.loads(line)
    assert TS.fullmatch(event.pop("ts"))
    assert event == {
        "level": "info",
        "logger": "daemon",
        "event": "took s1 at epoch 4",
        "worker": "w1",
        "shard": "s1",
        "stream": "s1-a",
        "epoch": 4,
        "checkpoint": {"s1-a": 17},
        "pid": 1234,
        "reason": "rebalance",
    }
    assert list(json.loads(line))[:4] == ["ts", "level", "logger", "event"]


def _fail() -> None:
    raise RuntimeError("boom\nsecond line")


def test_an_exception_is_one_json_line_with_exc() -> None:
    try:
        _fail()
    except RuntimeError:
        rec = logging.LogRecord(
            "shardvisor.cli", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    line = JsonFormatter().format(rec)
    assert len(line.splitlines()) == 1
    event = json.loads(line)
    assert event["level"] == "error" and event["event"] == "failed"
    assert "worker" not in event  # not set: left out, never ""
    assert "Traceback" in event["exc"] and "RuntimeError: boom" in event["exc"]


def test_values_that_are_not_json_are_written_as_text() -> None:
    event = json.loads(JsonFormatter().format(record(path=Path("/x/y"), ids={"b", "a"})))
    assert event["path"] == "/x/y"
    assert sorted(event["ids"]) == ["a", "b"]


def test_an_extra_cannot_replace_the_core_fields() -> None:
    event = json.loads(JsonFormatter().format(record("real", event="fake", level_="x")))
    assert event["event"] == "real"


def test_text_format_is_unchanged() -> None:
    rec = record("child ready", shard="s1", epoch=2, pid=77, stream="s1-a")
    rec.created, rec.msecs = 1700000000.5, 500.0
    assert TextFormatter("w1").format(rec) == (
        "2023-11-14T22:13:20.500Z info daemon child ready worker=w1 shard=s1 epoch=2 pid=77"
    )


@pytest.mark.parametrize("formatter", [JsonFormatter, TextFormatter])
def test_secrets_are_redacted_in_both_formats(formatter) -> None:
    redactor = Redactor()
    secret = 'tok"en\\é-42'  # quotes, backslashes, non-ASCII: JSON would escape them
    redactor.add([secret, "", f"Bearer {secret}"])
    rec = record(
        "connect ws://u:%s@h/x",
        secret,
        shard="s1",
        checkpoint={secret: 1},
        url=f"wss://h/?t={secret}",
    )
    line = formatter("w1", redactor).format(rec)
    assert secret not in line and json.dumps(secret)[1:-1] not in line
    assert "***" in line
    if formatter is JsonFormatter:
        event = json.loads(line)
        assert event["event"] == "connect ws://u:***@h/x"
        assert event["checkpoint"] == {"***": 1}
        assert event["url"] == "wss://h/?t=***"


def test_longer_secrets_are_redacted_first() -> None:
    redactor = Redactor()
    redactor.add(["abc", "Bearer abc-long"])
    assert redactor("x Bearer abc-long y abc") == "x *** y ***"


def test_setup_logging_json_and_text(monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logging.getLogger("shardvisor")
    root = logging.getLogger()
    saved = (logger.handlers[:], logger.level, logger.propagate, root.handlers[:])
    try:
        for fmt in ("json", "text"):
            out = io.StringIO()
            monkeypatch.setattr("sys.stderr", out)
            setup_logging("debug", "w9", fmt)
            logging.getLogger("shardvisor.daemon").debug("hello", extra={"shard": "s1"})
            logging.getLogger("botocore.test").warning("library says %s", "hi")
            logging.getLogger("botocore.test").info("below warning: not shown")
            first, second = out.getvalue().splitlines()
            if fmt == "json":
                assert json.loads(first)["worker"] == "w9"
                assert json.loads(first)["shard"] == "s1"
                assert json.loads(second)["logger"] == "botocore.test"
                assert json.loads(second)["event"] == "library says hi"
            else:
                assert first.endswith(" debug daemon hello worker=w9 shard=s1")
                assert second.endswith(" warning botocore.test library says hi worker=w9")
        with pytest.raises(ValueError, match="json, text"):
            setup_logging("info", "", "yaml")
    finally:
        logging.captureWarnings(False)
        logger.handlers[:], logger.level, logger.propagate, root.handlers[:] = saved


def test_the_redacting_writer_hides_secrets_from_prints() -> None:
    redactor = Redactor()
    redactor.add(["hunter2"])
    out = io.StringIO()
    writer = RedactingWriter(out, redactor)
    print("password: hunter2", file=writer)
    assert out.getvalue() == "password: ***\n"


def test_the_process_wide_redactor_only_grows() -> None:
    before = REDACTOR.secrets
    REDACTOR.add([])
    assert REDACTOR.secrets == before


# --- Child output, forwarded -------------------------------------------------------------------


def test_a_child_json_line_becomes_one_supervisor_event_with_its_shard(captured) -> None:
    _, out = captured
    child = {
        "ts": "2020-01-01T00:00:00.000Z",
        "level": "warning",
        "event": "disconnected: code 1001; reconnecting in 0.1s",
        "shard": "forged",  # a child cannot speak for another shard
        "stream": "s1-a",
        "epoch": 3,
        "name": "reserved by logging",  # would crash LogRecord: dropped
    }
    forward_line("s1", 4242, "stderr", json.dumps(child))
    (event,) = lines(out)
    assert TS.fullmatch(event.pop("ts"))  # the supervisor's time; the child's is dropped
    assert event == {
        "level": "warning",
        "logger": "child",
        "event": "disconnected: code 1001; reconnecting in 0.1s",
        "worker": "w1",
        "shard": "s1",
        "pid": 4242,
        "fd": "stderr",
        "stream": "s1-a",
        "epoch": 3,
    }


@pytest.mark.parametrize(
    "line",
    [
        "Traceback (most recent call last):",
        '{"not": "an event"}',
        "{broken json",
        '["a", "list"]',
        "2024-01-01T00:00:00.000+00:00 INFO shard=s1 stream=- ready: epoch=1 streams=1",
    ],
)
def test_a_line_that_is_not_a_child_event_is_forwarded_as_text(captured, line: str) -> None:
    _, out = captured
    forward_line("s1", 7, "stderr", line)
    (event,) = lines(out)
    assert event["event"] == line
    assert (event["shard"], event["pid"], event["level"]) == ("s1", 7, "info")


# --- The child's own log -----------------------------------------------------------------------


def test_the_child_writes_json_lines_once_configured() -> None:
    out = io.StringIO()
    log = Log(out=out)
    log.info("before start")  # text until the start message says otherwise
    log.configure(shard="s1", epoch=5, log_format="json", redact=("k3y",))
    log.warning("gap after k3y", stream="s1-a")
    log.error("unexpected error", exc="Traceback...\nValueError: k3y\n")
    text, *json_lines = out.getvalue().splitlines()
    assert "INFO shard=- stream=- before start" in text
    first, second = (json.loads(line) for line in json_lines)
    assert TS.fullmatch(first.pop("ts"))
    assert first == {
        "level": "warning",
        "event": "gap after ***",
        "shard": "s1",
        "stream": "s1-a",
        "epoch": 5,
    }
    assert second["exc"] == "Traceback...\nValueError: ***\n" and "stream" not in second


def test_the_child_text_format_is_unchanged_but_redacted() -> None:
    out = io.StringIO()
    log = Log(out=out)
    log.configure(shard="s1", epoch=1, log_format="text", redact=("k3y",))
    log.info("connected to ws://u:k3y@h/x (after=0)", stream="a")
    assert re.fullmatch(
        r"\S+ INFO shard=s1 stream=a connected to ws://u:\*\*\*@h/x \(after=0\)\n", out.getvalue()
    )


@pytest.mark.slow
async def test_a_real_child_in_json_mode_writes_only_json_lines(tmp_path: Path) -> None:
    """Every stderr line of a child told ``log_format = "json"`` parses, and a connect
    failure carries its stream."""
    with socket.socket() as sock:  # a port nothing listens on: connects are refused
        sock.bind(("127.0.0.1", 0))
        url = f"ws://127.0.0.1:{sock.getsockname()[1]}/feed"
        settings = attrs.evolve(FAST_SETTINGS, log_format="json")
        async with spawn_worker() as worker:
            await worker.send(make_start([StreamSpec("a", url)], tmp_path, settings=settings))
            await worker.expect(Ready)
            with trio.fail_after(5):
                while worker.log.count("cannot connect") < 2:
                    await trio.sleep(0.02)
    events = [json.loads(line) for line in worker.log.splitlines()]
    failures = [e for e in events if "cannot connect" in e["event"]]
    assert failures[0]["stream"] == "a" and failures[0]["shard"] == "shard-1"
    assert failures[0]["level"] == "warning" and failures[0]["epoch"] == 1
