import json
import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from supervisor.adapters.worker_id import (
    ECS_METADATA_ENV,
    POD_NAME_ENV,
    resolve_worker_id,
    sanitize,
)

TASK = {"TaskARN": "arn:aws:ecs:us-east-1:123:task/cluster/abc123", "Family": "shardvisor"}
POD = "shardvisor-6d5f7c9b8-x2k4q"  # a Deployment's pod name: <deployment>-<hash>-<suffix>


class MetadataHandler(BaseHTTPRequestHandler):
    """Serves ``server.routes``: path -> (status, body)."""

    def do_GET(self) -> None:
        status, body = self.server.routes.get(self.path, (404, b"not found"))  # type: ignore[attr-defined]
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def metadata_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetadataHandler)
    server.routes = {}  # type: ignore[attr-defined]
    server.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def base_uri(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/v4/container-1"


def resolve(configured: str = "", environ: dict[str, str] | None = None, **kwargs: object) -> str:
    return resolve_worker_id(
        configured, environ=environ or {}, hostname="host-1", pid=4242, **kwargs
    )


def test_configured_id_wins_without_asking_ecs() -> None:
    def fetch(url: str) -> bytes:
        raise AssertionError("must not fetch when an id is configured")

    env = {ECS_METADATA_ENV: "http://169.254.170.2/v4/x"}
    assert resolve("worker-7", env, fetch=fetch) == "worker-7"


def test_hostname_and_pid_without_ecs() -> None:
    assert resolve() == "host-1-4242"


def test_ecs_task_id_from_a_real_metadata_endpoint(metadata_server: ThreadingHTTPServer) -> None:
    metadata_server.routes["/v4/container-1/task"] = (200, json.dumps(TASK).encode())  # type: ignore[attr-defined]
    env = {ECS_METADATA_ENV: base_uri(metadata_server)}
    assert resolve(environ=env) == "abc123"
    assert metadata_server.requests == ["/v4/container-1/task"]  # type: ignore[attr-defined]


def test_failing_ecs_endpoint_falls_back_with_a_warning(
    metadata_server: ThreadingHTTPServer, caplog: pytest.LogCaptureFixture
) -> None:
    metadata_server.routes["/v4/container-1/task"] = (500, b"boom")  # type: ignore[attr-defined]
    env = {ECS_METADATA_ENV: base_uri(metadata_server)}
    with caplog.at_level(logging.WARNING, logger="shardvisor.worker_id"):
        assert resolve(environ=env) == "host-1-4242"
    [record] = caplog.records
    assert record.name == "shardvisor.worker_id"
    assert record.levelno == logging.WARNING
    assert "HTTP Error 500" in record.getMessage()


def test_unreachable_ecs_endpoint_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {ECS_METADATA_ENV: f"http://127.0.0.1:{port}/v4/x"}
    with caplog.at_level(logging.WARNING, logger="shardvisor.worker_id"):
        assert resolve(environ=env) == "host-1-4242"
    assert "cannot read the ECS task id" in caplog.text


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        b"[]",
        b"{}",
        b'{"TaskARN": 5}',
        b'{"TaskARN": "arn:aws:ecs:us-east-1:123:task/cluster/"}',
    ],
)
def test_bad_metadata_falls_back(body: bytes, caplog: pytest.LogCaptureFixture) -> None:
    urls: list[str] = []

    def fetch(url: str) -> bytes:
        urls.append(url)
        return body

    env = {ECS_METADATA_ENV: "http://169.254.170.2/v4/abc/"}
    with caplog.at_level(logging.WARNING, logger="shardvisor.worker_id"):
        assert resolve(environ=env, fetch=fetch) == "host-1-4242"
    assert urls == ["http://169.254.170.2/v4/abc/task"]
    assert len(caplog.records) == 1


def test_unexpected_fetch_errors_are_not_swallowed() -> None:
    def fetch(url: str) -> bytes:
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError, match="bug"):
        resolve(environ={ECS_METADATA_ENV: "http://x"}, fetch=fetch)


def test_empty_ecs_variable_is_ignored() -> None:
    assert resolve(environ={ECS_METADATA_ENV: ""}) == "host-1-4242"


@pytest.mark.parametrize(
    ("configured", "hostname", "expected"),
    [
        ("my worker/1", "h", "my-worker-1"),
        ("", "ip-10-0-0-1.ec2.internal", "ip-10-0-0-1.ec2.internal-4242"),
        ("", "hôst name", "h-st-name-4242"),
    ],
)
def test_sanitized(configured: str, hostname: str, expected: str) -> None:
    result = resolve_worker_id(configured, environ={}, hostname=hostname, pid=4242)
    assert result == expected


def test_ecs_task_id_is_sanitized() -> None:
    def fetch(url: str) -> bytes:
        return json.dumps({"TaskARN": "arn:aws:ecs:r:1:task/c/a b"}).encode()

    assert resolve(environ={ECS_METADATA_ENV: "http://x"}, fetch=fetch) == "a-b"


def test_sanitize_keeps_the_worker_id_alphabet() -> None:
    assert sanitize("Az09_.:-") == "Az09_.:-"


# --- Kubernetes: the pod name from the downward API -------------------------------------------


def test_pod_name_without_ecs() -> None:
    assert resolve(environ={POD_NAME_ENV: POD}) == POD


def test_configured_id_beats_the_pod_name() -> None:
    assert resolve("worker-7", {POD_NAME_ENV: POD}) == "worker-7"


def test_ecs_task_id_beats_the_pod_name() -> None:
    def fetch(url: str) -> bytes:
        return json.dumps(TASK).encode()

    env = {ECS_METADATA_ENV: "http://169.254.170.2/v4/x", POD_NAME_ENV: POD}
    assert resolve(environ=env, fetch=fetch) == "abc123"


def test_failing_ecs_endpoint_falls_back_to_the_pod_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fetch(url: str) -> bytes:
        raise OSError("connection refused")

    env = {ECS_METADATA_ENV: "http://169.254.170.2/v4/x", POD_NAME_ENV: POD}
    with caplog.at_level(logging.WARNING, logger="shardvisor.worker_id"):
        assert resolve(environ=env, fetch=fetch) == POD
    [record] = caplog.records
    assert POD_NAME_ENV in record.getMessage()


@pytest.mark.parametrize("pod_name", ["", "   "])
def test_empty_pod_name_is_ignored(pod_name: str) -> None:
    assert resolve(environ={POD_NAME_ENV: pod_name}) == "host-1-4242"


def test_pod_name_is_sanitized() -> None:
    assert resolve(environ={POD_NAME_ENV: "pod name/1"}) == "pod-name-1"
