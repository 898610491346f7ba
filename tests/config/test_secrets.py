"""${ENV_VAR} substitution, stream headers, and the promise that a secret never appears in any
output: not in check-config, status, shards list, nor any log line of a supervisor or a child."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest
import trio
from helpers.fleet import start_supervisor, supervisor_toml
from helpers.worker_helpers import make_start, read_records, spawn_worker, stop_in
from trio_websocket import WebSocketRequest, serve_websocket

from shard_worker.contract.pipe import Decoder as ProtocolDecoder
from shard_worker.contract.pipe import (
    Ready,
    SinkSpec,
    Start,
    Stopped,
    StreamSpec,
    WorkerSettings,
    encode,
)
from supervisor.config.loading import ConfigError, parse_config
from supervisor.config.model import Config, ShardConfig
from supervisor.config.rendering import render_config
from supervisor.config.shard_spec import decode_spec, encode_spec, shard_from_streams
from supervisor.core.items import ShardItem, Snapshot
from supervisor.devtools.feed import FeedServer
from supervisor.drivers.registry import registry_rows

REPO = Path(__file__).resolve().parents[2]
ENV = {"FEED_TOKEN": "t0k3n-value", "FEED_HOST": "feed.example:8443", "EMPTY": ""}

STREAM = """
[[shards]]
id = "s1"
[[shards.streams]]
id = "a"
"""


def parse(text: str, environ: dict[str, str] | None = None) -> Config:
    return parse_config(tomllib.loads(text), environ=ENV if environ is None else environ)


def problems_of(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(text, environ)
    return caught.value.problems


# --- Substitution ------------------------------------------------------------------------------


def test_references_are_replaced_from_the_environment() -> None:
    config = parse(
        STREAM + 'url = "wss://${FEED_HOST}/a?after={after}&token=${FEED_TOKEN}"\n'
        'headers = { Authorization = "Bearer ${FEED_TOKEN}", "X-Trace" = "on",'
        ' "X-Key" = "written-in-the-file" }\n'
        '[dynamodb]\nregion = "eu-${EMPTY}west-1"\n'
    )
    (stream,) = config.shards[0].streams
    assert stream.url == "wss://feed.example:8443/a?after={after}&token=t0k3n-value"
    assert stream.headers == (
        ("Authorization", "Bearer t0k3n-value"),
        ("X-Trace", "on"),
        ("X-Key", "written-in-the-file"),
    )
    assert config.dynamodb.region == "eu-west-1"
    assert config.secrets == {"t0k3n-value", "feed.example:8443"}  # "" is nothing to hide
    assert dict(config.templates) == {
        "shards[0].streams[0].url": "wss://${FEED_HOST}/a?after={after}&token=${FEED_TOKEN}",
        "shards[0].streams[0].headers.Authorization": "Bearer ${FEED_TOKEN}",
        "dynamodb.region": "eu-${EMPTY}west-1",
    }
    # Header values are redacted like secrets, even those written in the file as they are,
    # unless too short to be a credential ("on" would garble every line).
    assert config.redacted == {
        "t0k3n-value",
        "feed.example:8443",
        "Bearer t0k3n-value",
        "written-in-the-file",
    }


def test_dollar_dollar_brace_is_a_literal_and_braces_stay_placeholders() -> None:
    config = parse(STREAM + 'url = "ws://h/{stream}?after={after}"\nsubscribe = "$${x $$ $"\n')
    (stream,) = config.shards[0].streams
    assert stream.url == "ws://h/{stream}?after={after}"  # single braces: placeholders
    assert stream.subscribe == "${x $$ $"
    assert config.templates == () and config.secrets == frozenset()


def test_an_unset_variable_names_the_key_and_the_variable() -> None:
    text = STREAM + 'url = "ws://h/a"\nheaders = { Authorization = "Bearer ${FEED_TOKEN}" }\n'
    assert problems_of(text, {}) == [
        "shards[0].streams[0].headers.Authorization: environment variable FEED_TOKEN is not set"
    ]


def test_a_bad_reference_says_how_to_write_a_literal() -> None:
    (problem,) = problems_of('[dynamodb]\nregion = "${1X}"\n')
    assert problem.startswith('dynamodb.region: "${" must start a reference like ${NAME}')
    assert "write $${ for a literal ${" in problem


def test_no_follow_on_problem_for_a_value_that_could_not_be_substituted() -> None:
    # Unsubstituted, the url would also be an "unknown placeholder {NOPE}" or not ws://.
    assert problems_of(STREAM + 'url = "${NOPE}"\n') == [
        "shards[0].streams[0].url: environment variable NOPE is not set"
    ]


def test_a_problem_never_shows_a_substituted_value() -> None:
    problems = problems_of(STREAM + 'url = "http://x/?t=${FEED_TOKEN}"\n')
    assert problems == [
        "shards[0].streams[0].url: must start with ws:// or wss:// (got 'http://x/?t=***')"
    ]


def test_only_strings_are_substituted() -> None:
    assert (
        "expected a whole number" in problems_of('[worker]\nmax_shards = "${N}"\n', {"N": "3"})[0]
    )


def test_check_config_shows_the_reference_and_reads_back_to_the_same_config() -> None:
    text = (
        STREAM + 'url = "wss://${FEED_HOST}/a?t=${FEED_TOKEN}&lit=$${x"\n'
        'headers = { Authorization = "Bearer ${FEED_TOKEN}", "X-Lit" = "a$${b" }\n'
        '[worker]\nid = "w-${EMPTY}1"\n'
        '[supervisor]\nspawn = "fresh"\nworker_command = ["nice", "${FEED_TOKEN}"]\n'
    )
    config = parse(text)
    rendered = render_config(config)
    for value in ("t0k3n-value", "feed.example:8443"):
        assert value not in rendered
    assert 'url = "wss://${FEED_HOST}/a?t=${FEED_TOKEN}&lit=$${x"' in rendered
    assert 'headers = { Authorization = "Bearer ${FEED_TOKEN}", X-Lit = "a$${b" }' in rendered
    assert 'worker_command = ["nice", "${FEED_TOKEN}"]' in rendered
    assert parse(rendered) == config


def test_render_escapes_a_literal_dollar_brace_it_did_not_substitute() -> None:
    config = Config(shards=(ShardConfig("s", (StreamSpec("a", "ws://h/${x", subscribe="$${"),)),))
    rendered = render_config(config)
    assert 'url = "ws://h/$${x"' in rendered and 'subscribe = "$$${"' in rendered
    assert parse(rendered, {}) == config


# --- Headers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ('"Bearer x"', "expected a table of header names to strings"),
        ('{ "Bad Name" = "x" }', "'Bad Name' is not an HTTP token"),
        ('{ "Sec-WebSocket-Key" = "x" }', "set by the WebSocket handshake itself"),
        ('{ host = "x" }', "set by the WebSocket handshake itself"),
        ('{ A = "1", a = "2" }', "'a' is given twice"),
        ("{ A = 1 }", "header 'A': expected a string, got 1"),
        ('{ A = "x\\r\\nInjected: 1" }', "must not contain control characters"),
    ],
)
def test_invalid_headers(headers: str, problem: str) -> None:
    (found,) = problems_of(STREAM + f'url = "ws://h"\nheaders = {headers}\n')
    assert found.startswith("shards[0].streams[0].headers: ") and problem in found


def test_headers_survive_the_pipe_and_old_start_messages_still_decode() -> None:
    spec = StreamSpec("a", "ws://h", headers={"Authorization": "Bearer x", "X-A": "1"})
    assert spec.headers == (("Authorization", "Bearer x"), ("X-A", "1"))
    assert hash(spec) == hash(
        StreamSpec("a", "ws://h", headers=[["Authorization", "Bearer x"], ["X-A", "1"]])
    )
    start = Start(
        shard="s",
        epoch=1,
        worker="w",
        streams=(spec,),
        checkpoint={},
        sink=SinkSpec(),
        settings=WorkerSettings(
            log_format="json", redact=("x",), ca_bundle="/ca.pem", verify_tls=False
        ),
        fence_deadline=1.0,
    )
    decoder = ProtocolDecoder()
    decoder.feed(encode(start))
    assert list(decoder) == [start]
    # A start message from a supervisor that knows none of these fields.
    old = json.loads(encode(start))
    del old["streams"][0]["headers"]
    old["settings"] = {"checkpoint_interval": 1.0}
    decoder.feed(json.dumps(old).encode() + b"\n")
    (decoded,) = list(decoder)
    assert decoded.streams[0].headers == ()
    assert decoded.settings == WorkerSettings()
    assert decoded.settings.log_format == "text" and decoded.settings.verify_tls


async def test_the_child_sends_the_headers_and_never_logs_them(tmp_path: Path, nursery) -> None:
    seen: list[dict[str, str]] = []

    async def handler(request: WebSocketRequest) -> None:
        seen.append({k.decode().lower(): v.decode() for k, v in request.headers})
        ws = await request.accept()
        await ws.send_message('{"seq": 1}')
        await trio.sleep_forever()

    server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
    url = f"ws://127.0.0.1:{server.port}/feed"
    spec = StreamSpec("a", url, sequence="seq", headers={"Authorization": "Bearer hd-secret"})
    async with spawn_worker() as worker:
        await worker.send(make_start([spec], tmp_path))
        await worker.expect(Ready)
        with trio.fail_after(5):
            while not read_records(tmp_path / "shard-1" / "a.1.jsonl"):
                await trio.sleep(0.02)
        await worker.send(stop_in())
        await worker.wait_for(Stopped)
    assert seen and seen[0]["authorization"] == "Bearer hd-secret"
    assert "hd-secret" not in worker.log


# --- Registered shards (`shards add`) ----------------------------------------------------------


def test_shards_add_refuses_references_and_stores_what_it_was_given() -> None:
    with pytest.raises(ConfigError) as caught:
        shard_from_streams("n1", [{"id": "a", "url": "ws://h/?t=${FEED_TOKEN}"}], "shards add")
    (problem,) = caught.value.problems
    assert problem.startswith(
        "shards[0].streams[0].url: ${...} is substituted only in config files"
    )
    shard = shard_from_streams("n1", [{"id": "a", "url": "ws://h", "headers": {"A": "x"}}], "t")
    assert decode_spec("n1", encode_spec(shard)) == shard


def test_shards_list_hides_header_values() -> None:
    spec = encode_spec(ShardConfig("n1", (StreamSpec("a", "ws://h", headers={"A": "hush"}),)))
    item = ShardItem(id="n1", owner="", epoch=0, spec=spec)
    (row,) = registry_rows(Snapshot(workers=(), shards=(item,)))
    assert row["streams"] == [{"id": "a", "url": "ws://h", "headers": {"A": "***"}}]


# --- A real fleet: the secret appears in no output ---------------------------------------------


def cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=env,
        check=False,
    )


def test_check_config_as_a_command_prints_the_reference_not_the_value(tmp_path: Path) -> None:
    secret = "ck-" + uuid.uuid4().hex
    config = tmp_path / "c.toml"
    config.write_text(
        STREAM + 'url = "wss://h/a?token=${FEED_TOKEN}"\n'
        'headers = { Authorization = "Bearer ${FEED_TOKEN}" }\n'
    )
    env = {**os.environ, "FEED_TOKEN": secret, "PYTHONPATH": str(REPO)}
    result = cli("check-config", "-c", str(config), env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert secret not in result.stdout + result.stderr
    assert "${FEED_TOKEN}" in result.stdout
    del env["FEED_TOKEN"]
    result = cli("check-config", "-c", str(config), env=env, cwd=tmp_path)
    assert result.returncode == 78
    assert f"{config}: shards[0].streams[0].url: environment variable FEED_TOKEN is not set" in (
        result.stderr.splitlines()
    )


@pytest.mark.slow
async def test_a_secret_never_appears_in_any_output(tmp_path, moto_server, table_name, nursery):
    secret = "sv-" + uuid.uuid4().hex  # recognizable, and in no feed message
    feed = FeedServer(rate=200.0, stream_names=["n1-a"])
    port = await nursery.start(feed.serve, "127.0.0.1", 0)
    with socket.socket() as dead:  # a port nothing listens on: refused connects
        dead.bind(("127.0.0.1", 0))
        dead_port = dead.getsockname()[1]
    # The secret in the URL's user info (which the child's "connected to" line shows), in its
    # query (which it strips), and in a header (never logged): redaction must catch the first.
    user = "feed:${FEED_TOKEN}@127.0.0.1"
    streams = [
        {
            "id": "n1-a",
            "sequence": "seq",
            "url": f"ws://{user}:{port}/feed/n1-a?after={{after}}&token=${{FEED_TOKEN}}",
            "headers": {"Authorization": "Bearer ${FEED_TOKEN}"},
        },
        {"id": "n1-dead", "url": f"ws://{user}:{dead_port}/x"},
    ]
    config = tmp_path / "w1.toml"
    config.write_text(
        supervisor_toml(
            table_name,
            moto_server.url,
            [{"id": "n1", "streams": streams}],
            log={"level": "debug", "format": "json"},
        )
    )
    env = {**os.environ, "FEED_TOKEN": secret, "PYTHONPATH": str(REPO)}
    stdout, stderr = tmp_path / "stdout.log", tmp_path / "stderr.log"
    proc = await start_supervisor(config, stdout, stderr, env={"FEED_TOKEN": secret})
    try:
        sink = tmp_path / "out" / "n1" / "n1-a.1.jsonl"
        with trio.fail_after(30):
            while len(read_records(sink)) < 50 or stderr.read_text().count("cannot connect") < 2:
                await trio.sleep(0.1)
        await trio.sleep(2.0)
        commands = {
            name: await trio.to_thread.run_sync(
                lambda args=args: cli(*args, "-c", str(config), env=env, cwd=tmp_path)
            )
            for name, args in {
                "check-config": ["check-config"],
                "status": ["status", "--json"],
                "shards list": ["shards", "list", "--json"],
            }.items()
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            code = await proc.wait()
    assert code == 0, stderr.read_text()[-3000:]
    outputs = {"stdout": stdout.read_text(), "stderr": stderr.read_text()}
    for name, result in commands.items():
        assert result.returncode == 0, (name, result.stderr)
        outputs[f"{name} stdout"], outputs[f"{name} stderr"] = result.stdout, result.stderr
    outputs["sink"] = "".join(p.read_text() for p in (tmp_path / "out").rglob("*.jsonl"))
    for name, text in outputs.items():
        assert secret not in text, f"the secret leaked into {name}"
    assert "${FEED_TOKEN}" in outputs["check-config stdout"]
    assert json.loads(outputs["status stdout"])["shards"][0]["id"] == "n1"

    # Every log line is one JSON object; the children's lines are merged with their shard.
    events = [json.loads(line) for line in outputs["stderr"].splitlines()]
    assert all({"ts", "level", "logger", "event"} <= set(e) for e in events)
    assert all(e.get("worker") == "w1" for e in events)
    child = [e for e in events if e["logger"] == "child"]
    connected = [
        e for e in child if e["event"].startswith("connected to") and e["stream"] == "n1-a"
    ]
    assert connected and connected[0]["shard"] == "n1" and isinstance(connected[0]["pid"], int)
    assert "ws://feed:***@127.0.0.1" in connected[0]["event"]  # redacted, not just absent
    refused = [e for e in child if "cannot connect" in e["event"]]
    assert refused[0]["stream"] == "n1-dead" and refused[0]["level"] == "warning"
    assert any(e.get("shard") == "n1" and "epoch" in e and e["logger"] != "child" for e in events)
