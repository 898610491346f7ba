"""What every benchmark program shares: where results go, the facts of a run, the environment of
the processes it starts, parts side by side, and an orderly stop on SIGTERM.

A program is ``python -m benchmarks.<name>``; it records its figures with ``recorded(name)``,
which writes ``out/bench/<name>.json`` for ``python -m benchmarks.report``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"  # on PYTHONPATH: where ``benchmarks`` is found
OUT = ROOT / "out" / "bench"
LOCK_VENV = OUT / "venv-dynamodb-lock"  # the peers' own virtualenvs, made by scripts/bench.sh
SUPERVISORD_VENV = OUT / "venv-supervisord"
# Work directories of earlier runs kept under out/bench/runs/: a full scripts/bench.sh makes
# about nine (one per benchmark process), so the last full run stays whole for diagnosis.
KEEP_RUNS = 12
BUSY = re.compile(r"pytest|benchmarks\.")  # other test or benchmark runs on this machine
AWS_DROPPED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB")
AWS_LOCAL = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}

Job = tuple[str, Callable[[], Awaitable[None]]]  # (name, what it runs)


def use_local_aws() -> None:
    """Dummy credentials and nothing of a developer's AWS setup, for this process and every
    process it starts: all requests go to the servers on 127.0.0.1."""
    for name in AWS_DROPPED:
        os.environ.pop(name, None)
    os.environ.update(AWS_LOCAL)


def benchmarks_env(**extra: str) -> dict[str, str]:
    """The environment of a process that imports ``benchmarks`` (a peer's helper under its own
    virtualenv, a shard worker loading a benchmark's handler): PYTHONPATH names ``scripts/``."""
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **AWS_LOCAL, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def interruptible() -> None:
    """SIGTERM acts like Ctrl-C (KeyboardInterrupt), so every ``finally`` stops what it started;
    SIGINT too when started in the background by a shell (which ignores it there)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))


def arguments(description: str, **defaults: Any) -> argparse.ArgumentParser:
    """The options every program has: --quick (a smoke run), --trials, --server."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: figures mean nothing")
    parser.add_argument("--trials", type=int, default=0, help="trials per measurement")
    parser.add_argument("--server", choices=("moto", "dynalite"), default="moto")
    parser.set_defaults(**defaults)
    return parser


# --- results ------------------------------------------------------------------------------------


def write_json(name: str, data: dict[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=str))
    return path


def load_json(name: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads((OUT / f"{name}.json").read_text()))
    except (OSError, ValueError):
        return None


def command() -> str:
    main = sys.modules["__main__"]
    module = main.__spec__.name if main.__spec__ else Path(sys.argv[0]).name
    return " ".join(["python -m", module.removesuffix(".__main__"), *sys.argv[1:]])


@contextlib.contextmanager
def recorded(name: str, quick: bool) -> Iterator[dict[str, Any]]:
    """The results of a program: the facts of the run, then what the body adds; written to
    out/bench/<name>.json when the body returns (parts that failed are in ``errors``). The sink
    files of its fleets are removed on the way out (they can be large), unless
    BENCH_KEEP_SINKS is set."""
    results: dict[str, Any] = {
        "command": command(),
        "machine": machine(),
        "quick": quick,
        "git": git_state(),
        "busy_at_start": busy_with_tests(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "errors": [],
    }
    busy0, t0 = cpu_busy(), time.monotonic()
    try:
        yield results
    finally:
        if _RUN and not os.environ.get("BENCH_KEEP_SINKS"):  # logs and configs stay
            for sinks in _RUN[0].glob("*/out"):
                shutil.rmtree(sinks, ignore_errors=True)
    busy1 = cpu_busy()
    results["elapsed_s"] = time.monotonic() - t0
    results["machine_cpu_busy_percent"] = (
        100.0 * (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])
    )
    results["busy_at_end"] = busy_with_tests()
    path = write_json(name, results)
    print(f"  -> {path.relative_to(ROOT)} ({results['elapsed_s']:.0f} s)", flush=True)


_RUN: list[Path] = []


def run_dir() -> Path:
    """This process's work directory, out/bench/runs/<time>-<pid> (linked as runs/latest):
    supervisors' configs and logs, sink files. Earlier runs' but the newest few are removed."""
    if not _RUN:
        root = OUT / "runs"
        root.mkdir(parents=True, exist_ok=True)
        finished = [p for p in sorted(root.glob("*-*-*")) if not _alive_pid(p.name)]
        for old in finished[:-KEEP_RUNS]:
            shutil.rmtree(old, ignore_errors=True)
        _RUN.append(root / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        _RUN[0].mkdir()
        latest = root / "latest"
        with contextlib.suppress(OSError):
            latest.unlink(missing_ok=True)
            latest.symlink_to(_RUN[0].name)
    return _RUN[0]


def _alive_pid(run_name: str) -> bool:
    pid = run_name.rsplit("-", 1)[-1]
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


# --- the machine --------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def version(dist: str, python: Path | None = None) -> str:
    """The installed version of ``dist`` here, or in another virtualenv's ``python``."""
    if python is None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "?"
    if not python.exists():
        return "?"
    found = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() or "?"


def peer_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"{venv} is missing: run scripts/bench.sh (it creates the peer venvs)")
    return python


def git_state() -> dict[str, object]:
    def git(*argv: str) -> str:
        found = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
        return found.stdout.strip()

    changed = git("status", "--porcelain", "--", "supervisor", "shard_worker").splitlines()
    return {"head": git("rev-parse", "--short", "HEAD"), "uncommitted_product_files": changed}


def cpu_busy() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def busy_with_tests() -> list[str]:
    """Other test or benchmark runs on this machine (pytest, python -m benchmarks.*): not this
    process, what started it, nor anything it started."""
    parents, commands = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                raw = (entry / "cmdline").read_bytes()
                commands[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace")

    def line(pid: int) -> set[int]:
        """``pid`` and its ancestors."""
        found = set()
        while pid > 1 and pid not in found:
            found.add(pid)
            pid = parents.get(pid, 0)
        return found

    mine = line(os.getpid())

    def ours(pid: int) -> bool:
        return pid in mine or os.getpid() in line(pid)

    return [
        f"{pid} {cmd.strip()}"[:200]
        for pid, cmd in sorted(commands.items())
        if BUSY.search(cmd) and not ours(pid)
    ]


# --- processes started from threads -------------------------------------------------------------

SPAWNED: list[subprocess.Popen[Any]] = []  # ended by end_spawned(), also if their thread was
# abandoned (a part run with trio.to_thread.run_sync(..., abandon_on_cancel=True) on Ctrl-C)


def spawn(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    proc = subprocess.Popen(argv, **kwargs)
    SPAWNED.append(proc)
    return proc


def stop_process(
    proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10
) -> None:
    """Signal ``proc`` (if it still runs) and reap it, with SIGKILL after ``timeout``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def end_spawned() -> None:
    """SIGTERM every spawned process still running (supervisord then stops its program), and
    SIGKILL after 5 s."""
    for proc in SPAWNED:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
    deadline = time.monotonic() + 5
    for proc in SPAWNED:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    SPAWNED.clear()


# --- parts side by side -------------------------------------------------------------------------


async def run_lanes(lanes: Sequence[Sequence[Job]], errors: list[dict[str, str]]) -> None:
    """Each lane runs its jobs one after the other; the lanes run side by side. A job that
    fails is recorded in ``errors`` and its lane goes on: one failed part loses no other."""

    async def lane(jobs: Sequence[Job]) -> None:
        for name, job in jobs:
            try:
                await job()
            except Exception as exc:  # noqa: BLE001 - recorded and reported, never silent
                print(f"FAILED: {name}: {exc!r}", flush=True)
                errors.append({"job": name, "error": repr(exc)})

    async with trio.open_nursery() as nursery:
        for jobs in lanes:
            nursery.start_soon(lane, jobs)
