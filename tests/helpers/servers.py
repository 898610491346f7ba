"""Real DynamoDB-compatible servers (moto's, dynalite) as child processes on 127.0.0.1.

Tests talk to them over HTTP like to DynamoDB itself. A missing server is an error, never a
skip: CI installs both (pip for moto, `npm ci` for dynalite).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DYNALITE = REPO_ROOT / "node_modules" / ".bin" / "dynalite"
START_DEADLINE = 20.0  # seconds for a server to answer HTTP
START_ATTEMPTS = 3  # fresh ports to try when a server dies at start (port taken meanwhile)


class ServerProcess:
    """A started server: its URL, and control over its process (always reaped by ``stop``)."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], url: str, log_dir: Path) -> None:
        self.name = name
        self.proc = proc
        self.url = url
        self.log_dir = log_dir

    def __repr__(self) -> str:
        return f"ServerProcess({self.name!r}, {self.url!r}, pid={self.proc.pid})"

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing answers (a hung store)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.resume()  # a stopped process would only act on SIGTERM once continued
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.log_dir, ignore_errors=True)


def start_moto_server() -> ServerProcess:
    return _start(
        "moto",
        # moto's app served one request at a time: its threaded server is not atomic under
        # concurrent conditional writes (see supervisor/devtools/local_dynamodb.py).
        lambda port: [
            sys.executable,
            "-m",
            "supervisor.devtools.local_dynamodb",
            "--port",
            str(port),
        ],
    )


def start_dynalite() -> ServerProcess:
    """dynalite in memory, with tables ACTIVE at once."""
    if not DYNALITE.exists():
        raise RuntimeError(f"dynalite is not installed: run `npm ci` in {REPO_ROOT}")
    return _start(
        "dynalite",
        lambda port: [
            str(DYNALITE),
            "--port", str(port),
            "--host", "127.0.0.1",
            "--createTableMs", "0",
            "--deleteTableMs", "0",
            "--updateTableMs", "0",
        ],
    )  # fmt: skip


def _start(name: str, argv_for_port: Callable[[int], list[str]]) -> ServerProcess:
    log_dir = Path(tempfile.mkdtemp(prefix=f"shardvisor-{name}-"))
    failures: list[str] = []
    for attempt in range(START_ATTEMPTS):
        port = _free_port()
        log_path = log_dir / f"{name}-{attempt}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv_for_port(port), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        server = ServerProcess(name, proc, f"http://127.0.0.1:{port}", log_dir)
        if _wait_answering(proc, port):
            return server
        server.proc.kill()
        server.proc.wait()
        failures.append(f"port {port}: exit {proc.returncode}: {_tail(log_path)}")
    shutil.rmtree(log_dir, ignore_errors=True)
    raise RuntimeError(f"{name} did not start:\n" + "\n".join(failures))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_answering(proc: subprocess.Popen[bytes], port: int) -> bool:
    """True once any HTTP answer comes back; False if the process dies or the deadline passes."""
    deadline = time.monotonic() + START_DEADLINE
    while time.monotonic() < deadline and proc.poll() is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        with contextlib.closing(conn):
            try:
                conn.request("GET", "/")
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                time.sleep(0.05)
                continue
            return True
    return False


def _tail(path: Path, limit: int = 2000) -> str:
    return path.read_bytes()[-limit:].decode(errors="replace")
