"""Real supervisor processes for end-to-end tests: configs, processes, and a view of the table."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from supervisor.dynamo_store import DynamoLeaseStore
from supervisor.sink_audit import StreamAudit, audit_sink_dir
from supervisor.store import Snapshot

# Short leases keep the tests fast; the same code runs with production values.
DURATION, HEARTBEAT, RECONCILE = 2.0, 0.5, 0.5


@attrs.define
class Fleet:
    workdir: Path
    ddb_url: str
    table: str
    feed_url: str
    shards: dict[str, Sequence[str]]  # shard -> stream ids
    procs: dict[str, trio.Process] = attrs.field(factory=dict)
    extra: str = ""  # more TOML, appended to every worker's config
    feed: Any = None  # the FeedServer the streams come from

    _store: DynamoLeaseStore | None = None

    @property
    def store(self) -> DynamoLeaseStore:
        if self._store is None:
            self._store = DynamoLeaseStore(self.table, "us-east-1", self.ddb_url)
        return self._store

    def config_text(self, worker: str) -> str:
        lines = [
            f'[worker]\nid = "{worker}"',
            f'[dynamodb]\ntable = "{self.table}"\nendpoint_url = "{self.ddb_url}"',
            f'[lease]\nduration = "{DURATION}s"\nheartbeat_interval = "{HEARTBEAT}s"',
            f'reconcile_interval = "{RECONCILE}s"',
            '[supervisor]\nshutdown_timeout = "5s"\ncheckpoint_interval = "200ms"',
            'restart_backoff_initial = "50ms"',
            '[sink]\npath = "out/{shard}/{stream}.{epoch}.jsonl"',
            '[log]\nlevel = "debug"',
            self.extra,
        ]
        for shard, streams in self.shards.items():
            lines.append(f'[[shards]]\nid = "{shard}"')
            for stream in streams:
                url = f"{self.feed_url}/{stream}?after={{after}}"
                lines.append(f'[[shards.streams]]\nid = "{stream}"\nurl = "{url}"')
                lines.append('sequence = "seq"')
        return "\n".join(lines) + "\n"

    async def start(self, worker: str) -> trio.Process:
        config = self.workdir / f"{worker}.toml"
        config.write_text(self.config_text(worker))
        with (self.workdir / f"{worker}.log").open("ab") as log:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "supervisor", "run", "-c", str(config)],
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.procs[worker] = proc
        return proc

    def log(self, worker: str) -> str:
        return (self.workdir / f"{worker}.log").read_text(errors="replace")

    async def snapshot(self) -> Snapshot:
        return await self.store.snapshot()

    async def owners(self) -> dict[str, str]:
        return {s.id: s.owner for s in (await self.snapshot()).shards}

    async def wait_until_owned(self, *, by: Sequence[str] | None = None, timeout: float) -> float:
        """Seconds until every shard has an owner (among ``by`` if given)."""
        start = trio.current_time()
        with trio.fail_after(timeout):
            while True:
                owners = await self.owners()
                if len(owners) == len(self.shards) and all(
                    o and (by is None or o in by) for o in owners.values()
                ):
                    return trio.current_time() - start
                await trio.sleep(0.05)

    async def wait_written(self, stream: str, seq: int, timeout: float) -> None:
        with trio.fail_after(timeout):
            while self.audit().get(stream, StreamAudit(stream)).max_seq < seq:
                await trio.sleep(0.05)

    def audit(self) -> dict[str, StreamAudit]:
        return audit_sink_dir(self.workdir / "out")

    def kill(self, worker: str, signum: int = signal.SIGKILL) -> None:
        self.procs[worker].send_signal(signum)

    async def stop_all(self) -> None:
        with trio.CancelScope(shield=True):
            for proc in self.procs.values():
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
            with trio.move_on_after(8):
                for proc in self.procs.values():
                    await proc.wait()
            for proc in self.procs.values():
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


def child_pids(parent_pid: int) -> list[int]:
    """Direct children of a process, from /proc (Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent_pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
