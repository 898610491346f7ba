"""A real supervisor process for the deployment tests, without an event loop in the test.

The deploy tests check files operators use (Kubernetes manifests, Prometheus rules, a Grafana
dashboard) against a running supervisor: its probe paths, its /metrics, what a Prometheus
server scrapes from it. Module-scoped fixtures need it synchronous (pytest-trio fixtures are
per test), so this is plain subprocesses and bounded polling: the reference feed
(`python -m supervisor feed`) and `python -m supervisor run` on a config rendered here.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from supervisor.devtools.fleet import render_toml

T = TypeVar("T")

START_DEADLINE = 30.0  # seconds for a process to come up (a loaded 2-core machine)
STOP_DEADLINE = 25.0  # seconds for a SIGTERM drain (shutdown_timeout 20 s + margin)
_ENDPOINT = re.compile(r"HTTP endpoint on ([\d.]+):(\d+)")
_FEED = re.compile(r"feed listening on (ws://[\d.]+:\d+/feed)/")


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, poll: float = 0.1) -> T:
    """``probe()``'s first truthy result, polled until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        time.sleep(poll)


def free_port() -> int:
    """A loopback port free a moment ago (a server that loses the race fails to bind)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body); (0, b"") when nothing answers."""
    match = re.fullmatch(r"http://([^/:]+):(\d+)(/.*)", url)
    assert match, url
    conn = http.client.HTTPConnection(match.group(1), int(match.group(2)), timeout=timeout)
    with contextlib.closing(conn):
        try:
            conn.request("GET", match.group(3))
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            return 0, b""


def supervisor_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a supervisor under test: dummy credentials, nothing that reaches AWS."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"}
        and not k.startswith("AWS_ENDPOINT_URL_")
    }
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


class LiveProcess:
    """A started process whose stdout and stderr go to ``log``; always reaped by ``stop``."""

    def __init__(self, argv: list[str], log: Path, cwd: Path, env: dict[str, str]) -> None:
        self.log_path = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,  # its own process group: a "host" to kill at once
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, pattern: re.Pattern[str], what: str) -> re.Match[str]:
        def probe() -> re.Match[str] | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited {self.proc.returncode} before {what}:\n{self.log()}")
            return pattern.search(self.log())

        return wait_for(probe, START_DEADLINE, what)

    def kill_host(self) -> None:
        """SIGKILL to the whole process group (supervisor, zygote, children): a host dies and
        no last will runs."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = STOP_DEADLINE) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; the exit code (negative: a signal)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextlib.contextmanager
def running_feed(workdir: Path, rate: float) -> Iterator[str]:
    """The reference feed on a free loopback port; yields ``ws://127.0.0.1:PORT/feed``
    (any stream name after it is a stream numbering its messages 1, 2, 3...)."""
    argv = [sys.executable, "-m", "supervisor", "feed", "--port", "0", "--streams", "1"]
    argv += ["--rate", str(rate)]
    feed = LiveProcess(argv, workdir / "feed.log", workdir, supervisor_env())
    try:
        yield feed.wait_log(_FEED, "feed listening").group(1)
    finally:
        feed.stop(timeout=5)


class LiveSupervisor(LiveProcess):
    """`python -m supervisor run` on ``config`` in ``workdir`` (its sinks' out/ lands there)."""

    def __init__(
        self, workdir: Path, config: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> None:
        self.workdir = workdir
        self.config_path = workdir / "shardvisor.toml"
        self.config_path.write_text(render_toml(config))
        argv = [sys.executable, "-m", "supervisor", "run", "-c", str(self.config_path)]
        super().__init__(argv, workdir / "supervisor.log", workdir, supervisor_env(env))
        self._base = ""

    @property
    def base_url(self) -> str:
        """http://HOST:PORT of its HTTP endpoint, once it has logged where it listens."""
        if not self._base:
            found = self.wait_log(_ENDPOINT, "HTTP endpoint")
            self._base = f"http://{found.group(1)}:{found.group(2)}"
        return self._base

    def get(self, path: str) -> tuple[int, bytes]:
        return http_get(self.base_url + path)

    def wait_status(self, path: str, status: int, timeout: float = START_DEADLINE) -> bytes:
        def probe() -> tuple[bytes] | None:
            got, body = self.get(path)
            return (body,) if got == status else None

        return wait_for(probe, timeout, f"{status} from {path}")[0]

    def status_json(self) -> dict[str, Any]:
        """`shardvisor status --json` on the same config: the fleet as the table sees it."""
        result = subprocess.run(
            [sys.executable, "-m", "supervisor", "status", "--json", "-c", str(self.config_path)],
            capture_output=True,
            text=True,
            timeout=60,
            env=supervisor_env(),
            check=True,
        )
        return json.loads(result.stdout)
