"""Real supervisor processes for end-to-end tests: configs, processes, and a view of the table."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore
from supervisor.core.items import Snapshot
from supervisor.devtools.sink_audit import StreamAudit, audit_sink_dir

SHARDS = {"s1": ["s1-a", "s1-b"], "s2": ["s2-a"], "s3": ["s3-a"], "s4": ["s4-a"]}
STREAMS = [s for streams in SHARDS.values() for s in streams]

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
    overrides: dict[str, dict[str, object]] = attrs.field(factory=dict)  # config sections
    feed: Any = None  # the FeedServer the streams come from

    _store: DynamoLeaseStore | None = None

    @property
    def store(self) -> DynamoLeaseStore:
        if self._store is None:
            self._store = DynamoLeaseStore(self.table, "us-east-1", self.ddb_url)
        return self._store

    def config_text(self, worker: str) -> str:
        sections: dict[str, dict[str, object]] = {
            "worker": {"id": worker},
            "dynamodb": {"table": self.table, "endpoint_url": self.ddb_url},
            "lease": {
                "duration": f"{DURATION}s",
                "heartbeat_interval": f"{HEARTBEAT}s",
                "reconcile_interval": f"{RECONCILE}s",
            },
            "supervisor": {
                "shutdown_timeout": "5s",
                "checkpoint_interval": "200ms",
                "restart_backoff_initial": "50ms",
            },
            "sink": {"path": "out/{shard}/{stream}.{epoch}.jsonl"},
            "log": {"level": "debug"},
            "http": {"listen": "127.0.0.1:0"},  # several supervisors share this host
        }
        for section, values in self.overrides.items():
            sections.setdefault(section, {}).update(values)
        lines = []
        for section, values in sections.items():
            lines.append(f"[{section}]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        for shard, streams in self.shards.items():
            lines.append(f'[[shards]]\nid = "{shard}"')
            for stream in streams:
                url = f"{self.feed_url}/{stream}?after={{after}}"
                lines.append(f'[[shards.streams]]\nid = "{stream}"\nurl = "{url}"')
                lines.append('sequence = "seq"')
        return "\n".join(lines) + "\n"

    async def start(
        self, worker: str, env: dict[str, str] | None = None, stdout: Path | None = None
    ) -> trio.Process:
        """Start a supervisor; its stdout and stderr go to ``<worker>.log``, or its stdout to
        ``stdout`` when given (a stdout sink's records)."""
        config = self.workdir / f"{worker}.toml"
        config.write_text(self.config_text(worker))
        with (
            (self.workdir / f"{worker}.log").open("ab") as log,
            stdout.open("ab") if stdout is not None else contextlib.nullcontext(log) as out,
        ):
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "supervisor", "run", "-c", str(config)],
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                start_new_session=True,  # its own process group, for group-wide signals
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


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def child_pids(supervisor_pid: int) -> list[int]:
    """The shard workers of a supervisor: its children when spawned fresh, the zygote's
    children when forked by the zygote (the zygote process itself is not a worker)."""
    parents = _parents()
    zygotes = {
        pid
        for pid, ppid in parents.items()
        if ppid == supervisor_pid and "shard_worker.zygote" in _cmdline(pid)
    }
    return sorted(
        pid
        for pid, ppid in parents.items()
        if (ppid == supervisor_pid and pid not in zygotes) or ppid in zygotes
    )


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
