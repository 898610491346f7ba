"""Servers on 127.0.0.1 as child processes: moto's DynamoDB, dynalite, the reference feed.

The tests and the benchmarks start every server they talk to this one way: a child process on a
free port, ready once it answers, always reaped by ``stop()``. Clients reach them over the
network exactly as they would reach DynamoDB or a real feed. A missing server is an error, never
a skip: CI installs both DynamoDB servers (pip for moto, `npm ci` for dynalite).

Nothing here imports moto: its server runs as ``python -m supervisor.devtools.local_dynamodb``.
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
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DYNALITE = REPO_ROOT / "node_modules" / "dynalite" / "cli.js"  # from `npm ci` (package.json)
# Keeps dynalite up when a client resets a request (a SIGKILLed supervisor): see the file.
DYNALITE_PRELOAD = Path(__file__).with_name("dynalite_preload.js")
START_DEADLINE = 20.0  # seconds for a server to answer
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

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
    # moto's app served one request at a time: its threaded server is not atomic under
    # concurrent conditional writes (see supervisor/devtools/local_dynamodb.py).
    return start_server(
        "moto",
        lambda port: [
            sys.executable, "-m", "supervisor.devtools.local_dynamodb", "--port", str(port)
        ],
    )  # fmt: skip


def start_dynalite() -> ServerProcess:
    """dynalite in memory, with tables ACTIVE at once, that outlives a client's reset."""
    if not DYNALITE.exists():
        raise RuntimeError(f"dynalite is not installed: run `npm ci` in {REPO_ROOT}")
    return start_server(
        "dynalite",
        lambda port: [
            "node", "--require", str(DYNALITE_PRELOAD), str(DYNALITE),
            "--port", str(port),
            "--host", "127.0.0.1",
            "--createTableMs", "0",
            "--deleteTableMs", "0",
            "--updateTableMs", "0",
        ],
    )  # fmt: skip


DYNAMODB_SERVERS = {"moto": start_moto_server, "dynalite": start_dynalite}


def start_dynamodb(kind: str) -> ServerProcess:
    """``kind`` "moto" or "dynalite" (the benchmarks' ``--server`` choices)."""
    return DYNAMODB_SERVERS[kind]()


def start_feed(rate: float, streams: Sequence[str] = (), *, live: bool = False) -> ServerProcess:
    """The reference feed (``supervisor.devtools.feed``) in a process of its own; ``url`` is
    its ``ws://127.0.0.1:PORT/feed`` base (a stream is ``{url}/<name>?after=N``). ``live``: a
    live-only feed (no replay: ``after`` is ignored)."""
    return start_server(
        "feed",
        lambda port: [
            sys.executable, "-m", "supervisor.devtools.feed",
            "--port", str(port), "--rate", f"{rate:g}", "--streams", ",".join(streams),
            *(["--live"] if live else []),
        ],
        url=lambda port: f"ws://127.0.0.1:{port}/feed",
    )  # fmt: skip


def answers_http(port: int, path: str = "/") -> bool:
    """Any HTTP answer at all to a GET of ``path`` (a WebSocket server answers with 400)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    with contextlib.closing(conn):
        try:
            conn.request("GET", path)
            conn.getresponse().read()
        except (OSError, http.client.HTTPException):
            return False
        return True


def accepts_tcp(port: int) -> bool:
    """The port accepts a connection (for servers that speak no HTTP before a handshake)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def start_server(
    name: str,
    argv_for_port: Callable[[int], list[str]],
    *,
    url: Callable[[int], str] = lambda port: f"http://127.0.0.1:{port}",
    ready: Callable[[int], bool] = answers_http,
) -> ServerProcess:
    """Start ``argv_for_port(port)`` on a free port, until ``ready(port)``; a server that dies
    at start (its port taken meanwhile) is tried again on another port."""
    log_dir = Path(tempfile.mkdtemp(prefix=f"shardvisor-{name}-"))
    failures: list[str] = []
    for attempt in range(START_ATTEMPTS):
        port = _free_port()
        log_path = log_dir / f"{name}-{attempt}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv_for_port(port), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        server = ServerProcess(name, proc, url(port), log_dir)
        try:
            if _wait_ready(proc, port, ready):
                return server
        except BaseException:  # interrupted while waiting: the process is not left behind
            server.stop()
            raise
        server.proc.kill()
        server.proc.wait()
        failures.append(f"port {port}: exit {proc.returncode}: {_tail(log_path)}")
    shutil.rmtree(log_dir, ignore_errors=True)
    raise RuntimeError(f"{name} did not start:\n" + "\n".join(failures))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(proc: subprocess.Popen[bytes], port: int, ready: Callable[[int], bool]) -> bool:
    """True once ``ready``; False if the process dies or the deadline passes."""
    deadline = time.monotonic() + START_DEADLINE
    while time.monotonic() < deadline and proc.poll() is None:
        if ready(port):
            return proc.poll() is None
        time.sleep(0.05)
    return False


def _tail(path: Path, limit: int = 2000) -> str:
    return path.read_bytes()[-limit:].decode(errors="replace")
