"""Real supervisor processes on one machine: their config files, processes, a view of the table.

The end-to-end tests, ``shardvisor demo`` and the benchmarks start supervisors this one way:
``python -m supervisor run -c <worker>.toml`` in the fleet's work directory, each in a process
group of its own (a "host": a group-wide SIGKILL takes its zygote and children with it), its
output in ``<worker>.log``, its sink files under ``out/``. What differs between them is only the
config they render (``settings``) and how they wait.

The process helpers at the end read ``/proc`` (Linux), as the supervisor itself does.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from supervisor.adapters.lease_store.base import LeaseStoreError
from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore
from supervisor.core.items import Snapshot
from supervisor.devtools.sink_audit import SinkFollower, StreamAudit, audit_sink_dir

SINK_PATH = "out/{shard}/{stream}.{epoch}.jsonl"  # relative to the work directory
REGION = "us-east-1"
ZYGOTE_MODULE = "shard_worker.zygote"


@attrs.define
class Fleet:
    """Supervisors sharing one table and one feed; ``shards`` maps each shard to its streams."""

    workdir: Path
    ddb_url: str  # the table as the fleet's own reads see it (a supervisor's may differ)
    table: str
    feed_url: str  # ws://HOST:PORT/feed: a stream is <feed_url>/<stream>?after={after}
    shards: Mapping[str, Sequence[str]]
    # Config sections besides [worker] and [shards], e.g. {"lease": {"duration": "3s"}};
    # ``overrides`` is merged over them, section by section (a test's or a run's tweak).
    settings: dict[str, dict[str, object]] = attrs.field(factory=dict)
    overrides: dict[str, dict[str, object]] = attrs.field(factory=dict)
    # The feed is live-only (FeedServer(live=True), start_feed(live=True)): stream URLs then
    # carry no ``?after={after}``, as a real live-only feed takes no position.
    live_feed: bool = False
    procs: dict[str, trio.Process] = attrs.field(factory=dict)
    _groups: set[int] = attrs.field(factory=set, init=False)  # every group ever started
    _store: DynamoLeaseStore | None = attrs.field(default=None, init=False)
    _written: SinkFollower = attrs.field(init=False)

    @_written.default
    def _follow_sinks(self) -> SinkFollower:
        return SinkFollower(self.workdir / "out")

    @property
    def store(self) -> DynamoLeaseStore:
        if self._store is None:
            self._store = DynamoLeaseStore(self.table, REGION, self.ddb_url)
        return self._store

    # --- config and processes -------------------------------------------------------------

    def config(self, worker: str) -> dict[str, Any]:
        """``worker``'s config as TOML's tables (``render_toml`` writes it)."""
        return fleet_config(
            worker,
            table=self.table,
            ddb_url=self.ddb_url,
            feed_url=self.feed_url,
            shards=self.shards,
            sections=(self.settings, self.overrides),
            live_feed=self.live_feed,
        )

    def config_text(self, worker: str) -> str:
        return render_toml(self.config(worker))

    def write_config(self, worker: str) -> Path:
        path = self.workdir / f"{worker}.toml"
        path.write_text(self.config_text(worker))
        return path

    async def start(
        self, worker: str, env: dict[str, str] | None = None, stdout: Path | None = None
    ) -> trio.Process:
        """Start a supervisor; its stdout and stderr go to ``<worker>.log``, or its stdout to
        ``stdout`` when given (a stdout sink's records)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.write_config(worker)
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
        self._groups.add(proc.pid)
        return proc

    def reload(self, worker: str) -> None:
        """Rewrite the worker's file from ``shards`` and the settings, then SIGHUP it."""
        self.write_config(worker)
        self.procs[worker].send_signal(signal.SIGHUP)

    def kill(self, worker: str, signum: int = signal.SIGKILL) -> None:
        self.procs[worker].send_signal(signum)

    def live(self) -> list[str]:
        return [worker for worker, proc in self.procs.items() if proc.returncode is None]

    def log(self, worker: str) -> str:
        return (self.workdir / f"{worker}.log").read_text(errors="replace")

    async def stop_all(self, grace: float = 8.0) -> dict[str, int | None]:
        """SIGTERM every live supervisor at once (draining peers take nothing), SIGKILL those
        still running after ``grace`` seconds; their exit codes. Children of a supervisor killed
        alone are left to exit by themselves (see ``end_groups``)."""
        with trio.CancelScope(shield=True):
            for proc in self.procs.values():
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
            with trio.move_on_after(grace):
                for proc in self.procs.values():
                    await proc.wait()
            for proc in self.procs.values():
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        return {worker: proc.returncode for worker, proc in self.procs.items()}

    async def end_groups(self, grace: float = 5.0) -> list[int]:
        """After ``stop_all``: wait up to ``grace`` seconds for what is left in the fleet's
        process groups (zygotes, children of a supervisor killed alone), then SIGKILL it;
        returns the pids that had to be killed."""
        with trio.CancelScope(shield=True):
            with trio.move_on_after(grace):
                while any(group_members(pgid) for pgid in self._groups):
                    await trio.sleep(0.1)
            killed = [pid for pgid in sorted(self._groups) for pid in group_members(pgid)]
            for pid in killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return killed

    # --- the table and the sink files -------------------------------------------------------

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

    def sink(self, shard: str, stream: str, epoch: int) -> Path:
        return self.workdir / SINK_PATH.format(shard=shard, stream=stream, epoch=epoch)

    def audit(self) -> dict[str, StreamAudit]:
        return audit_sink_dir(self.workdir / "out")

    async def wait_registered(self, worker: str, timeout: float, poll: float = 0.1) -> None:
        """Until ``worker``'s item names its current process and says it is running (it is
        up and watching its peers); a store too busy to answer is asked again."""
        pid = self.procs[worker].pid
        with trio.fail_after(timeout):
            while True:
                with contextlib.suppress(LeaseStoreError):
                    workers = (await self.snapshot()).workers
                    item = next((w for w in workers if w.id == worker), None)
                    if item is not None and item.pid == pid and item.state == "running":
                        return
                await trio.sleep(poll)

    def log_events(self, worker: str) -> list[dict[str, Any]]:
        """``worker``'s log as events (``json_log``)."""
        return json_log(self.workdir / f"{worker}.log")

    async def wait_written(self, stream: str, seq: int, timeout: float) -> None:
        with trio.fail_after(timeout):
            while self._written.max_seq(stream) < seq:
                await trio.sleep(0.05)


# --- config files ---------------------------------------------------------------------------


def fleet_config(
    worker: str,
    *,
    table: str,
    ddb_url: str,
    feed_url: str,
    shards: Mapping[str, Sequence[str]],
    sections: Sequence[Mapping[str, Mapping[str, object]]] = (),
    live_feed: bool = False,
) -> dict[str, Any]:
    """The config of one supervisor of a fleet: its id, the table, the sink under ``out/``,
    then each of ``sections`` merged over them (section by section), and every shard with its
    streams read from ``<feed_url>/<stream>`` (asking to resume after the checkpoint unless the
    feed is ``live_feed``: a live-only feed ignores what it is asked)."""
    config: dict[str, Any] = {
        "worker": {"id": worker},
        "dynamodb": {"table": table, "endpoint_url": ddb_url},
        "sink": {"path": SINK_PATH},
    }
    for extra in sections:
        for section, values in extra.items():
            config.setdefault(section, {}).update(values)
    resume = "" if live_feed else "?after={after}"
    config["shards"] = [
        {
            "id": shard,
            "streams": [
                {"id": stream, "url": f"{feed_url}/{stream}{resume}", "sequence": "seq"}
                for stream in streams
            ],
        }
        for shard, streams in shards.items()
    ]
    return config


def render_toml(config: Mapping[str, Any]) -> str:
    """A config file from TOML's tables: sections of scalars, lists and inline tables (JSON's
    strings, numbers, booleans and arrays are TOML values; a dict becomes ``{ "k" = v }``),
    then ``shards`` as [[shards]], each with its ``streams`` as [[shards.streams]]."""
    lines: list[str] = []
    for section, values in config.items():
        if section != "shards":
            lines.append(f"[{section}]")
            lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    for shard in config.get("shards", []):
        lines.append("[[shards]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in shard.items() if k != "streams"]
        for stream in shard["streams"]:
            lines.append("[[shards.streams]]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in stream.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, Mapping):
        pairs = ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items())
        return f"{{ {pairs} }}"
    return json.dumps(value)


def json_log(path: Path) -> list[dict[str, Any]]:
    """A supervisor's JSON log lines (others skipped), with ``t`` = unix seconds of ``ts``."""
    found = []
    with contextlib.suppress(OSError), path.open(errors="replace") as fh:
        for line in fh:
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entry = json.loads(line)
                stamp = datetime.datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ")
                entry["t"] = stamp.replace(tzinfo=datetime.UTC).timestamp()
                found.append(entry)
    return found


def shards_of(snapshot: Snapshot, worker: str) -> list[str]:
    return sorted(s.id for s in snapshot.shards if s.owner == worker)


def owners_view(snapshot: Snapshot, workers: Sequence[str]) -> str:
    """``w1: s1 s4 | w2: s2 | w3: - | unowned: s3``: who holds what, in one line."""
    parts = [f"{w}: {' '.join(shards_of(snapshot, w)) or '-'}" for w in workers]
    unowned = [s.id for s in snapshot.shards if not s.owner]
    return " | ".join(parts) + (f" | unowned: {' '.join(unowned)}" if unowned else "")


def epochs_view(snapshot: Snapshot) -> str:
    """``s1=w1@3 s2=-@1``: every shard's owner and epoch, in one line."""
    return " ".join(f"{s.id}={s.owner or '-'}@{s.epoch}" for s in snapshot.shards)


# --- processes (from /proc) -----------------------------------------------------------------


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name: state, ppid, pgrp, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parents[int(entry.name)] = int(_stat_fields(entry.name)[1])
    return parents


def zygote_pids(supervisor_pid: int) -> list[int]:
    return sorted(
        pid
        for pid, ppid in _parents().items()
        if ppid == supervisor_pid and ZYGOTE_MODULE in _cmdline(pid)
    )


def child_pids(supervisor_pid: int) -> list[int]:
    """The shard workers of a supervisor: its children when spawned fresh, the zygote's
    children when forked by the zygote (the zygote process itself is not a worker)."""
    parents = _parents()
    zygotes = {
        pid
        for pid, ppid in parents.items()
        if ppid == supervisor_pid and ZYGOTE_MODULE in _cmdline(pid)
    }
    return sorted(
        pid
        for pid, ppid in parents.items()
        if (ppid == supervisor_pid and pid not in zygotes) or ppid in zygotes
    )


def alive(pid: int) -> bool:
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def is_fleet_process(pid: int) -> bool:
    """A supervisor, zygote or shard worker (and not a pid reused by a stranger)."""
    command = _cmdline(pid)
    return "supervisor" in command or "shard_worker" in command


def group_members(pgid: int) -> list[int]:
    """Live fleet processes in process group ``pgid`` (a supervisor's group: it, its zygote and
    its children, which stay in the group even after the supervisor died)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _ppid, group = _stat_fields(entry.name)[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state != "Z" and is_fleet_process(int(entry.name)):
            found.append(int(entry.name))
    return found
