"""One task per held shard: runs its child, writes its checkpoints fenced, restarts it, releases it.

The runner owns exactly one lease (shard + epoch). Every store write it makes is conditional on
that owner and epoch, so a runner that lost its lease can never overwrite the new owner's state.
Its lifecycle (starting, running, backoff, stopping, lost, quarantined, stopped) is the table in
``supervisor.core.runner_state``: the runner reports events, the table decides the state.
"""

from __future__ import annotations

import contextlib
import logging
import random
import signal
from collections.abc import Callable
from typing import Any

import attrs
import trio

from shard_worker.contract import pipe as p
from shard_worker.contract.exit_codes import describe_exit, restart_reason
from supervisor.adapters.lease_store.base import LeaseConflict, LeaseStore, StoreUnavailable
from supervisor.adapters.metrics import Metrics
from supervisor.adapters.spawn import ChildHandle, PipeClosed, Spawn, pump_output
from supervisor.config.model import Config, ShardConfig
from supervisor.core.lease import OwnLease
from supervisor.core.restart_policy import RestartPolicy
from supervisor.core.runner_state import RunnerEvent, RunnerLifecycle, RunnerState

log = logging.getLogger("shardvisor.shard")

HELLO_TIMEOUT = 10.0
STARTUP_GRACE = 10.0  # from start to ready a child gets at least this long (stream connects)
MAX_SIGTERM_GRACE = 1.0  # after the stop deadline, SIGTERM; at most this much later, SIGKILL
RELEASE_TIMEOUT = 5.0


class ChildGone(Exception):
    """The child broke the protocol or went away before the handshake ended."""


@attrs.define
class RunnerContext:
    """What all runners of one supervisor share."""

    config: Config
    worker_id: str
    store: LeaseStore
    lease: OwnLease
    spawn: Spawn
    now: Callable[[], float]  # time.monotonic in production: fence deadlines cross processes
    session: str = ""  # the supervisor's, for the children's last will
    metrics: Metrics = attrs.field(factory=Metrics)


@attrs.frozen
class StopRequest:
    """How to hand the shard off: the first request stands (later ones change nothing)."""

    reason: str  # logged, and the releases metric's label
    grace: float  # the child's time to flush before SIGTERM
    successor: str  # named in the released item: this peer takes the shard first ("" = any)
    at: float  # when it was asked (the hand-off time is measured from here)


@attrs.define(eq=False)
class ShardRunner:
    ctx: RunnerContext
    shard: ShardConfig
    epoch: int
    checkpoint: dict[str, int]
    taken_at: float
    restarts: int = 0
    written: int = 0
    _lifecycle: RunnerLifecycle = attrs.field(factory=RunnerLifecycle)
    _leaving: trio.Event = attrs.field(factory=trio.Event)  # set once the state is leaving
    _stop: StopRequest | None = None
    _child: ChildHandle | None = None
    _child_started: bool = False  # start sent: fences may follow (never before start)
    _stored: dict[str, int] = attrs.field(factory=dict)  # last checkpoint the table accepted
    _last_sign_of_life: float = 0.0
    _ready: bool = False
    _exit_reason: str = ""  # why the last child died, when we know better than its exit code
    progress: p.Heartbeat | None = None
    _stored_at: float = 0.0  # when the table last accepted our checkpoint (or the take)
    _counted: dict[str, dict[str, int]] = attrs.field(factory=dict)  # this child's, per stream
    _stale: tuple[str, ...] = ()  # the stale streams the table names (a take clears them)

    def __attrs_post_init__(self) -> None:
        self._stored = dict(self.checkpoint)
        self._stored_at = self.taken_at

    def checkpoint_metrics(self, now: float) -> dict:
        """Checkpoint age, and per stream the records written beyond it (replayed on a crash)."""
        last = self.progress.last_seq if self.progress is not None else {}
        return {
            "checkpoint_age_s": now - self._stored_at,
            "lag": {s: max(0, seq - self._stored.get(s, 0)) for s, seq in sorted(last.items())},
        }

    @property
    def shard_id(self) -> str:
        return self.shard.id

    @property
    def sigterm_grace(self) -> float:
        return min(MAX_SIGTERM_GRACE, self.ctx.config.supervisor.shutdown_timeout / 10)

    @property
    def state(self) -> RunnerState:
        """Where the runner is in its lifecycle (``.value`` is the public string)."""
        return self._lifecycle.state

    @property
    def crash_looped(self) -> bool:
        return self._lifecycle.state is RunnerState.QUARANTINED

    def _event(self, event: RunnerEvent) -> bool:
        """Apply ``event`` to the lifecycle; True if the state changed."""
        changed = self._lifecycle.process(event)
        if self._lifecycle.state.leaving:
            self._leaving.set()
        return changed

    def request_stop(self, reason: str, grace: float, *, successor: str = "") -> None:
        """Graceful: Stop message, wait ``grace``, then SIGTERM, then SIGKILL; then release."""
        request = StopRequest(reason, grace, successor, self.ctx.now())
        if self._event(RunnerEvent.STOP_REQUESTED):
            self._stop = request

    def lose(self, reason: str) -> None:
        """The lease is gone: kill the child at once and write nothing more."""
        if not self._event(RunnerEvent.LEASE_LOST):
            return
        log.warning("lease lost: %s", reason, extra=self._extra())
        self.ctx.metrics.leases_lost.inc()
        if self._child is not None:
            self._child.signal(signal.SIGKILL)

    async def fence(self, deadline: float) -> None:
        child = self._child
        if (
            child is not None
            and self._child_started
            and child.returncode is None
            and self.state is not RunnerState.LOST
        ):
            # A child that is exiting cannot take the fence; the runner sees EOF and wait().
            with contextlib.suppress(PipeClosed):
                await child.send(p.Fence(deadline=deadline))

    async def run(self) -> None:
        cfg = self.ctx.config.supervisor
        policy = RestartPolicy(
            cfg.restart_backoff_initial,
            cfg.restart_backoff_max,
            cfg.restart_reset_after,
            max_restarts=cfg.max_restarts,
            window=cfg.restart_window,
            rng=random.random,
        )
        try:
            while not self.state.leaving and self.ctx.lease.is_valid(self.ctx.now()):
                if self.state is RunnerState.BACKOFF:
                    self._event(RunnerEvent.RESTART)
                policy.child_started(self.ctx.now())
                code = await self._run_child_once()
                if self.state.leaving:
                    break
                decision = policy.child_crashed(self.ctx.now())
                self.restarts += 1
                self.ctx.metrics.restarts.labels(restart_reason(code, self._exit_reason)).inc()
                if decision.crash_loop:
                    self.ctx.metrics.quarantines.inc()
                    log.error(
                        "crash loop: %d restarts within %ss; quarantining the shard",
                        cfg.max_restarts,
                        cfg.restart_window,
                        extra=self._extra(code=code),
                    )
                    self._event(RunnerEvent.CRASH_LOOP)
                    break
                self._event(RunnerEvent.CHILD_EXITED)
                log.warning(
                    "child exited with %s (%s); restarting in %.3fs",
                    code,
                    self._exit_reason or describe_exit(code),
                    decision.delay,
                    extra=self._extra(),
                )
                with trio.move_on_after(decision.delay):
                    await self._leaving.wait()
        finally:
            with trio.CancelScope(shield=True):
                await self._finish()

    async def _finish(self) -> None:
        if self.state is RunnerState.LOST:
            return  # nothing more is written: the lease belongs to someone else
        quarantined = self.crash_looped
        stop = self._stop
        successor = stop.successor if stop is not None and not quarantined else ""
        with trio.move_on_after(RELEASE_TIMEOUT) as scope:
            await self._release_lease(quarantined, successor)
        if scope.cancelled_caught:
            log.error("release timed out; peers take over at lease expiry", extra=self._extra())
        self._event(RunnerEvent.RELEASED)
        now = self.ctx.now()
        handover = now - (stop.at if stop is not None else now)
        reason = "crash loop" if quarantined else (stop.reason if stop else "lease ended")
        self.ctx.metrics.releases.labels(reason).inc()
        if stop is not None and not quarantined:
            self.ctx.metrics.handoff.observe(handover)
        log.info(
            "%s: handed over in %.3fs (held %.1fs, reason %s, successor %s)",
            "quarantined" if quarantined else "released",
            handover,
            now - self.taken_at,
            reason,
            successor or "any",
            extra=self._extra(checkpoint=self.checkpoint),
        )

    async def _release_lease(self, quarantined: bool, successor: str) -> None:
        while True:
            try:
                await self.ctx.store.release(
                    self.shard_id,
                    self.ctx.worker_id,
                    self.epoch,
                    self.checkpoint,
                    state="quarantined" if quarantined else "released",
                    successor=successor,
                )
                return
            except LeaseConflict:
                log.warning("release refused: no longer the owner", extra=self._extra())
                return
            except StoreUnavailable as exc:
                log.warning("release failed, retrying: %s", exc, extra=self._extra())
                await trio.sleep(0.2)

    async def _run_child_once(self) -> int | None:
        child, outputs = await self.ctx.spawn(self.shard_id)
        self._child, self._child_started = child, False
        self._ready, self._exit_reason = False, ""
        self._counted = {}  # a new child counts from zero
        try:
            async with trio.open_nursery() as nursery:
                for name, stream in outputs:
                    nursery.start_soon(pump_output, self.shard_id, child.pid, name, stream)
                nursery.start_soon(self._stop_watcher, child)
                nursery.start_soon(self._hang_watcher, child)
                try:
                    await self._converse(child)
                except (
                    ChildGone,
                    p.ProtocolError,
                    PipeClosed,  # it no longer reads: it died before or during the start
                    trio.BrokenResourceError,
                    trio.TooSlowError,  # no hello in time: a crash, not the supervisor's end
                ) as exc:
                    log.error("child protocol failure: %r", exc, extra=self._extra(pid=child.pid))
                    child.signal(signal.SIGKILL)
                code = await child.wait()
                nursery.cancel_scope.cancel()
            return code
        finally:
            self._child = None
            await child.aclose()

    async def _converse(self, child: ChildHandle) -> None:
        with trio.fail_after(HELLO_TIMEOUT):
            hello = await child.receive()
        if not isinstance(hello, p.Hello) or hello.version != p.PROTOCOL_VERSION:
            raise ChildGone(f"expected hello v{p.PROTOCOL_VERSION}, got {hello!r}")
        await child.send(self._start_message())
        self._child_started = True
        self._last_sign_of_life = self.ctx.now()
        while (msg := await child.receive()) is not None:
            self._last_sign_of_life = self.ctx.now()
            await self._handle(msg)

    def _start_message(self) -> p.Start:
        from pathlib import Path

        import attrs

        from supervisor.adapters import logs
        from supervisor.adapters.spawn import relay_stdout

        cfg = self.ctx.config
        # What the child must never log: every secret of this process (a reloaded file's too,
        # registered by the CLI) and this shard's header values (registered shards' included).
        headers = p.header_secrets(self.shard.streams)
        redact = sorted({*logs.secrets(), *cfg.redacted, *headers} - {""})
        # A stdout sink's records reach our stdout verbatim (set before the child can write).
        relay_stdout(cfg.sink.kind == "stdout")
        sink = attrs.evolve(
            cfg.sink,
            dead_letter=cfg.dead_letter.path,
            # Kinesis and SQS clients need a region; "" = the table's.
            region=cfg.sink.region or cfg.dynamodb.region,
        )
        return p.Start(
            shard=self.shard_id,
            epoch=self.epoch,
            worker=self.ctx.worker_id,
            streams=self.shard.streams,
            checkpoint=dict(self.checkpoint),
            sink=sink,
            settings=p.WorkerSettings(
                checkpoint_interval=cfg.supervisor.checkpoint_interval,
                log_format=cfg.log.format,
                redact=tuple(redact),
                # Absolute: a child's working directory need not be ours.
                ca_bundle=str(Path(cfg.tls.ca_bundle).absolute()) if cfg.tls.ca_bundle else "",
                verify_tls=cfg.tls.verify,
                **attrs.asdict(cfg.websocket),  # [websocket]: the same names
            ),
            fence_deadline=self.ctx.lease.valid_until,
            last_will=p.LastWill(
                table=cfg.dynamodb.table,
                region=cfg.dynamodb.region,
                endpoint_url=cfg.dynamodb.endpoint_url,
                session=self.ctx.session,
            ),
        )

    async def _handle(self, msg: p.Message) -> None:
        if isinstance(msg, p.Heartbeat):
            self.progress = msg
            self._count_streams(msg.streams)
            await self._publish_stale(msg)
        elif isinstance(msg, p.Ready):
            self._ready = True
            self._event(RunnerEvent.CHILD_READY)
            log.info("child ready", extra=self._extra(pid=self._child and self._child.pid))
        elif isinstance(msg, p.Checkpoint):
            self.written = msg.written
            await self._write_checkpoint(msg.checkpoint)
        elif isinstance(msg, p.Stopped):
            self.written, self.checkpoint = msg.written, dict(msg.checkpoint)
        elif isinstance(msg, p.Error):
            level = logging.ERROR if msg.fatal else logging.WARNING
            log.log(level, "child reports: %s", msg.message, extra=self._extra())
        else:
            raise ChildGone(f"unexpected message from child: {msg!r}")

    def _count_streams(self, streams: dict[str, dict[str, int]]) -> None:
        """Children report totals since they started; metrics want what is new since the
        last heartbeat (a restarted child starts from zero again: see _run_child_once)."""
        deltas = {}
        for stream, counts in streams.items():
            before = self._counted.get(stream, {})
            deltas[stream] = {k: v - before.get(k, 0) for k, v in counts.items()}
            self._counted[stream] = dict(counts)
        self.ctx.metrics.add_stream_counts(self.shard_id, deltas)

    async def _write_checkpoint(self, checkpoint: dict[str, int]) -> None:
        """The child reports only what its sink flushed, so storing it never runs ahead."""
        self.checkpoint = dict(checkpoint)
        if self.state is RunnerState.LOST or checkpoint == self._stored:
            return
        try:
            await self.ctx.store.checkpoint(
                self.shard_id, self.ctx.worker_id, self.epoch, checkpoint
            )
            self._stored = dict(checkpoint)
            self._stored_at = self.ctx.now()
        except LeaseConflict:
            self.lose("checkpoint refused: the table has another owner or epoch")
        except StoreUnavailable as exc:
            # Kept in self.checkpoint: the next checkpoint or the release carries it.
            log.warning("checkpoint not stored: %s", exc, extra=self._extra())

    async def _publish_stale(self, beat: p.Heartbeat) -> None:
        """The streams silent past their timeout, on the shard item for ``status``: written
        only when the set changes, conditional on owner and epoch like a checkpoint."""
        stale = tuple(sorted(beat.stale))
        self.ctx.metrics.set_stale(self.shard_id, beat.streams, stale)
        if stale == self._stale or self.state is RunnerState.LOST:
            return
        try:
            await self.ctx.store.publish_stale(self.shard_id, self.ctx.worker_id, self.epoch, stale)
            self._stale = stale
        except LeaseConflict:
            self.lose("stale streams refused: the table has another owner or epoch")
        except StoreUnavailable as exc:
            log.warning("stale streams not stored (next heartbeat): %s", exc, extra=self._extra())

    async def _hang_watcher(self, child: ChildHandle) -> None:
        """No message for hang_timeout: the child's loop is blocked (CPU-bound code, deadlock)
        or it is frozen. SIGKILL; the restart policy counts it as a crash (reason hang)."""
        timeout = self.ctx.config.supervisor.hang_timeout
        while True:
            allowed = timeout if self._ready else max(timeout, STARTUP_GRACE)
            if self._child_started and self.ctx.now() - self._last_sign_of_life > allowed:
                break
            await trio.sleep(min(0.25, timeout / 4))
        silent = self.ctx.now() - self._last_sign_of_life
        log.error(
            "child hung: no heartbeat for %.1fs; SIGKILL",
            silent,
            extra=self._extra(pid=child.pid),
        )
        self._exit_reason = "hang"
        child.signal(signal.SIGKILL)

    async def _stop_watcher(self, child: ChildHandle) -> None:
        await self._leaving.wait()
        stop = self._stop
        if self.state is RunnerState.LOST or stop is None:
            child.signal(signal.SIGKILL)
            return
        grace = stop.grace
        try:
            await child.send(p.Stop(reason=stop.reason, deadline=self.ctx.now() + grace))
        except PipeClosed:
            return
        await trio.sleep(grace)
        log.warning("child missed its stop deadline: SIGTERM", extra=self._extra(pid=child.pid))
        child.signal(signal.SIGTERM)
        await trio.sleep(self.sigterm_grace)
        log.error("child ignored SIGTERM: SIGKILL", extra=self._extra(pid=child.pid))
        child.signal(signal.SIGKILL)

    def _extra(self, **more: Any) -> dict[str, Any]:
        return {"shard": self.shard_id, "epoch": self.epoch, **more}
