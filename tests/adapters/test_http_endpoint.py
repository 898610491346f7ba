"""The HTTP endpoint: the server on its own, then a real supervisor whose store goes away."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import trio
from helpers.fleet import Fleet, running_fleet, wait_for_log
from prometheus_client.parser import text_string_to_metric_families

from supervisor.adapters.http_endpoint import ListenError, Response, serve_http
from supervisor.config.loading import ConfigError, parse_config
from supervisor.devtools.servers import start_moto_server


def get(url: str, method: str = "GET") -> tuple[int, bytes, str]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read(), response.headers["content-type"]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers["content-type"]


async def fetch(url: str, method: str = "GET") -> tuple[int, bytes, str]:
    return await trio.to_thread.run_sync(get, url, method)


async def test_routes_methods_and_keep_alive(nursery):
    calls = []

    def ok() -> Response:
        calls.append(1)
        return Response(200, b'{"ok":true}\n')

    port = await nursery.start(serve_http, "127.0.0.1:0", {"/ok": ok})
    base = f"http://127.0.0.1:{port}"
    assert await fetch(f"{base}/ok") == (200, b'{"ok":true}\n', "application/json")
    assert (await fetch(f"{base}/ok?x=1"))[0] == 200
    assert (await fetch(f"{base}/nope"))[0] == 404
    assert (await fetch(f"{base}/ok", "POST"))[0] == 405
    status, body, _ = await fetch(f"{base}/ok", "HEAD")
    assert (status, body) == (200, b"")
    stream = await trio.open_tcp_stream("127.0.0.1", port)  # two requests, one connection
    request = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"
    await stream.send_all(request + request)
    received = b""
    with trio.fail_after(5):
        while received.count(b"HTTP/1.1 200") < 2:
            received += await stream.receive_some(4096)
    await stream.aclose()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"NONSENSE\r\n\r\n")
    with trio.fail_after(5):
        assert (await stream.receive_some(4096)).startswith(b"HTTP/1.1 400")
    await stream.aclose()


async def test_an_address_in_use_is_a_clear_error(nursery):
    port = await nursery.start(serve_http, "127.0.0.1:0", {})
    message = f"http.listen = '127.0.0.1:{port}': cannot listen"
    with pytest.raises(ListenError, match=re.escape(message)):
        await serve_http(f"127.0.0.1:{port}", {})


@pytest.mark.parametrize("listen", ["9400", "localhost", "http://x:1", "a b:1"])
def test_listen_must_be_host_and_port(listen):
    with pytest.raises(ConfigError, match=re.escape("http.listen: must be")):
        parse_config({"http": {"listen": listen}})


@pytest.mark.slow
async def test_readiness_follows_the_lease_store_and_metrics_move(tmp_path, table_name, nursery):
    server = start_moto_server()  # its own: this test pauses it
    try:
        h1 = running_fleet(nursery, tmp_path, server.url, table_name, {"h1": ["h1-a"]}, rate=100.0)
        async with h1 as fleet:
            fleet.overrides["lease"] = {"duration": "3s", "heartbeat_interval": "500ms"}
            await fleet.start("w1")
            with trio.fail_after(60):
                base = await _endpoint(fleet, "w1")
                await _wait_status(f"{base}/readyz", 200)
                status, body, _ = await fetch(f"{base}/healthz")
                assert status == 200 and json.loads(body)["worker"] == "w1"
                await fleet.wait_until_owned(by=["w1"], timeout=10)
                await fleet.wait_written("h1-a", 5, timeout=10)
                first = await _metrics(base)
                await fleet.wait_written("h1-a", fleet.feed.last_seq("h1-a") + 50, timeout=10)
                second = await _metrics(base)
                assert second["shardvisor_shards_held"] == 1
                assert second["shardvisor_children_up"] == 1
                heartbeats = "shardvisor_dynamodb_requests_total{operation=heartbeat}"
                assert second[heartbeats] > first[heartbeats]
                assert second["shardvisor_heartbeat_seconds_count"] > 0
                assert second["shardvisor_epoch_changes_total{source=unowned}"] == 1
                # Children report per-stream counts with their heartbeat (every second).
                written = "shardvisor_stream_messages_total{outcome=written,shard=h1,stream=h1-a}"
                received = written.replace("written", "received", 1)
                counts = [await _wait_metric(base, written, above=0)]
                counts.append(await _wait_metric(base, written, above=counts[0]))
                assert counts[1] > counts[0] > 0
                assert (await _metrics(base))[received] >= counts[1]
                assert "shardvisor_checkpoint_age_seconds{shard=h1}" in second

                server.pause()  # the store hangs: heartbeats time out
                body = await _wait_status(f"{base}/readyz", 503)
                assert not json.loads(body)["ready"]
                assert (await fetch(f"{base}/healthz"))[0] == 200  # alive, just not ready
                server.resume()
                await _wait_status(f"{base}/readyz", 200)
                failures = (await _metrics(base))["shardvisor_heartbeat_failures_total"]
                assert failures >= 1
                fleet.kill("w1", signal.SIGTERM)
                assert await fleet.procs["w1"].wait() == 0
    finally:
        server.stop()


async def _endpoint(fleet: Fleet, worker: str) -> str:
    found = await wait_for_log(fleet, worker, r"HTTP endpoint on ([\d.]+):(\d+)", timeout=20)
    return f"http://{found.group(1)}:{found.group(2)}"


async def _wait_metric(base: str, name: str, above: float) -> float:
    with trio.fail_after(10):
        while (value := (await _metrics(base)).get(name, 0.0)) <= above:
            await trio.sleep(0.2)
    return value


async def _wait_status(url: str, status: int) -> bytes:
    with trio.fail_after(20):
        while True:
            got, body, _ = await fetch(url)
            if got == status:
                return body
            await trio.sleep(0.1)


async def _metrics(base: str) -> dict[str, float]:
    status, body, content_type = await fetch(f"{base}/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return samples


def test_check_config_shows_the_http_section():
    result = subprocess.run(
        [sys.executable, "-m", "supervisor", "check-config", "-c", "conf/shardvisor.example.toml"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert '[http]\nlisten = "127.0.0.1:9400"' in result.stdout
