"""One task per held shard: runs its child, writes its checkpoints fenced, restarts it, releases it.

The runner owns exactly one lease (shard + epoch). Every store write it makes is conditional on
that owner and epoch, so a runner that lost its lease can never overwrite the new owner's state.
Its lifecycle (starting, running, backoff, stopping, lost, quarantined, stopped, and those of
issue 14) is the table in ``supervisor.core.runner_state``: the runner reports events, the
table decides the state.

A runner may also start as a *standby* (``ShardRunner.standby``): it holds no lease and its
child, started in standby mode, connects and buffers, writing nothing; it is supervised like
any child (restart, backoff, hang detection, crash loop). ``promote`` turns it into the owner
runner of the lease just taken, in place. An owner that leaves make-before-break (a
``HandoffPlan``) keeps its child writing until the successor's standby is ready, then stops it
at the cut (``supervisor.drivers.handoff``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from shard_worker.contract import pipe as p
from shard_worker.contract.exit_codes import describe_exit, restart_reason
from supervisor.adapters.lease_store.base import LeaseConflict, LeaseStore, StoreUnavailable
from supervisor.adapters.metrics import Metrics
from supervisor.adapters.spawn import ChildHandle, PipeClosed, Spawn, pump_output
from supervisor.config.model import Config, ShardConfig
from supervisor.core import partition_keys
from supervisor.core.lease import OwnLease
from supervisor.core.make_before_break import Fallback, HandoffPlan, Mode, min_cut
from supervisor.core.restart_policy import RestartPolicy
from supervisor.core.runner_state import RunnerEvent, RunnerLifecycle, RunnerState
from supervisor.drivers.handoff import Abort, ShardWatch, await_successor

log = logging.getLogger("shardvisor.shard")

HELLO_TIMEOUT = 10.0
STARTUP_GRACE = 10.0  # from start to ready a child gets at least this long (stream connects)
MAX_SIGTERM_GRACE = 1.0  # after the stop deadline, SIGTERM; at most this much later, SIGKILL
RELEASE_TIMEOUT = 5.0
# Reconnect counts reach the table (for `status`) at most this often: a flapping feed must not
# cost a write per heartbeat. A change of the stale set is written at once.
RECONNECTS_PUBLISH_INTERVAL = 5.0


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
    wall: Callable[[], float] = time.time  # wall clock for humans (the hand-off request)
    watch: ShardWatch | None = None  # the shard reads of hand-offs (None: one read each)


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
    epoch: int  # a standby's: the one it expects its shard to be taken at (owner's + 1)
    checkpoint: dict[str, int]
    taken_at: float
    restarts: int = 0
    written: int = 0
    is_standby: bool = False  # no lease: its child connects and buffers, writing nothing
    _lifecycle: RunnerLifecycle = attrs.field(factory=RunnerLifecycle)
    _leaving: trio.Event = attrs.field(factory=trio.Event)  # set once the state is leaving
    _stopping: trio.Event = attrs.field(factory=trio.Event)  # set once the child is to stop
    _handing_off: trio.Event = attrs.field(factory=trio.Event)  # make-before-break asked
    _abort_handoff: Abort = attrs.field(factory=Abort)  # cuts the wait short, and says why
    _stop: StopRequest | None = None
    _min_cut: dict[str, int] = attrs.field(factory=dict)  # the stop's, after a hand-off
    _mode: Mode | None = None  # how the shard leaves for a peer, once decided
    _hand_over: bool = False  # the plan's: at the cut, hand the lease over instead of releasing
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
    # Reconnects per stream and reason since the take (all its children), and what of them
    # the table holds since when.
    _reconnects: dict[str, dict[str, int]] = attrs.field(factory=dict)
    _published: dict[str, dict[str, int]] = attrs.field(factory=dict)
    _published_at: float = -math.inf
    _policy: RestartPolicy | None = None
    _changed: trio.Event = attrs.field(factory=trio.Event)  # set (and replaced) on each change
    # A standby's: its current child's first buffered sequence per stream, once it is ready.
    first_seq: dict[str, int] = attrs.field(factory=dict)
    standby_stats: p.StandbyStats | None = None
    _dropped: int = 0  # this child's dropped records already counted in the metrics
    _delay: float = 0.0  # the restart policy's last delay
    _released: bool = False  # on the child's ``stopped``, before it exits (``_release_early``)

    def __attrs_post_init__(self) -> None:
        self._stored = dict(self.checkpoint)
        self._stored_at = self.taken_at

    @classmethod
    def standby(
        cls,
        ctx: RunnerContext,
        shard: ShardConfig,
        epoch: int,
        checkpoint: dict[str, int],
        now: float,
    ) -> ShardRunner:
        """A standby runner: ``epoch`` is the one the shard would be taken at, ``checkpoint``
        the owner's last (a replaying feed resumes the buffer from there)."""
        lifecycle = RunnerLifecycle(RunnerState.STANDBY)
        return cls(ctx, shard, epoch, dict(checkpoint), now, is_standby=True, lifecycle=lifecycle)

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

    @property
    def promotable(self) -> bool:
        """A standby whose child has been started: it can become the owner child in place."""
        child = self._child
        return (
            self.state in (RunnerState.STANDBY, RunnerState.STANDBY_READY)
            and child is not None
            and self._child_started
            and child.returncode is None
        )

    def _event(self, event: RunnerEvent) -> bool:
        """Apply ``event`` to the lifecycle; True if the state changed."""
        changed = self._lifecycle.process(event)
        state = self._lifecycle.state
        if changed:
            self._changed.set()
            self._changed = trio.Event()
        if state.leaving:
            self._leaving.set()
        if state.stops_child:
            self._stopping.set()
        if state is RunnerState.HANDING_OFF:
            self._handing_off.set()
        return changed

    def request_stop(
        self, reason: str, grace: float, *, successor: str = "", plan: HandoffPlan | None = None
    ) -> None:
        """Graceful: Stop message, wait ``grace``, then SIGTERM, then SIGKILL; then release.
        ``plan`` (``make_before_break.plan_handoff``) says whether the child first writes on
        until the successor's standby is ready; a second, fast request cuts that short."""
        plan = plan or HandoffPlan(None)
        request = StopRequest(reason, grace, successor, self.ctx.now())
        if self.state is RunnerState.HANDING_OFF:
            if grace == 0 and self._stop is not None:
                self._stop = attrs.evolve(self._stop, grace=0.0)
                self._abort_handoff.set(Fallback.FAST_SHUTDOWN)
            return
        mbb = plan.mode is Mode.MAKE_BEFORE_BREAK and self.state is RunnerState.RUNNING
        event = RunnerEvent.HAND_OFF if mbb else RunnerEvent.STOP_REQUESTED
        if not self._event(event):
            return
        self._stop = request
        if mbb:
            self._hand_over = plan.hand_over
            log.info(
                "handing off make-before-break to %s: waiting for its standby",
                successor,
                extra=self._extra(),
            )
        elif plan.mode is not None:
            self._fall_back(plan.fallback or Fallback.NOT_RUNNING)

    @property
    def handing_off_to(self) -> str:
        """The successor a make-before-break wait is for ("" when not waiting)."""
        if self.state is not RunnerState.HANDING_OFF or self._stop is None:
            return ""
        return self._stop.successor

    def successor_left(self) -> None:
        """The successor we wait for stopped taking (a drain, a SIGTERM, a death): its standby
        will not come, so stop waiting for it and release to anyone rather than to it."""
        if self.state is RunnerState.HANDING_OFF:
            self._abort_handoff.set(Fallback.SUCCESSOR_LEFT)

    def _fall_back(self, why: Fallback) -> None:
        """Logged once and counted: this move to a peer is break-before-make."""
        self._mode = Mode.BREAK_BEFORE_MAKE
        self.ctx.metrics.handoff_fallbacks.labels(why.value).inc()
        successor = self._stop.successor if self._stop is not None else ""
        log.warning(
            "hand-off to %s falls back to break-before-make: %s",
            successor,
            why.value,
            extra=self._extra(reason=why.value),
        )

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
            and not self.is_standby
            and self._child_started
            and child.returncode is None
            and self.state is not RunnerState.LOST
        ):
            # A child that is exiting cannot take the fence; the runner sees EOF and wait().
            with contextlib.suppress(PipeClosed):
                await child.send(p.Fence(deadline=deadline))

    async def promote(self, epoch: int, checkpoint: dict[str, int], now: float) -> None:
        """The lease was just taken at ``epoch``: this standby's child becomes the owner child
        in place (``promotable`` must hold). It writes its buffer after ``checkpoint``, then
        goes on live. A child that died meanwhile is restarted as an owner child."""
        self.is_standby, self.epoch, self.taken_at = False, epoch, now
        self.checkpoint, self._stored, self._stored_at = dict(checkpoint), dict(checkpoint), now
        self._policy = self._new_policy()  # a standby's crashes do not count against the lease
        self._ready = False
        self._event(RunnerEvent.PROMOTE)
        child = self._child
        assert child is not None
        message = p.Promote(epoch, dict(checkpoint), self.ctx.lease.valid_until)
        with contextlib.suppress(PipeClosed):
            await child.send(message)

    async def wait_standby_ready(self) -> dict[str, int] | None:
        """A standby's first buffered sequences once its child is ready (through restarts);
        None if it stops being a standby first."""
        while self.state is not RunnerState.STANDBY_READY:
            if not self.state.standing_by:
                return None
            await self._changed.wait()
        return dict(self.first_seq)

    def _new_policy(self) -> RestartPolicy:
        cfg = self.ctx.config.supervisor
        return RestartPolicy(
            cfg.restart_backoff_initial,
            cfg.restart_backoff_max,
            cfg.restart_reset_after,
            max_restarts=cfg.max_restarts,
            window=cfg.restart_window,
            rng=random.random,
        )

    def _may_run(self) -> bool:
        """Another child may start: not leaving, and a lease still valid (a standby needs
        none: it writes nothing)."""
        if self.state.leaving:
            return False
        return self.is_standby or self.ctx.lease.is_valid(self.ctx.now())

    async def run(self) -> None:
        self._policy = self._new_policy()
        try:
            while self._may_run():
                if self.state.backing_off:
                    self._event(RunnerEvent.RESTART)
                self._policy.child_started(self.ctx.now())
                code = await self._run_child_once()
                if self.state.leaving:
                    break
                if not self._child_crashed(code):
                    break
                with trio.move_on_after(self._delay):
                    await self._leaving.wait()
        finally:
            with trio.CancelScope(shield=True):
                await self._finish()

    def _child_crashed(self, code: int | None) -> bool:
        """The restart policy's verdict; False: a crash loop (quarantined, or for a standby:
        stopped, the owner untouched)."""
        assert self._policy is not None
        cfg = self.ctx.config.supervisor
        decision = self._policy.child_crashed(self.ctx.now())
        self.restarts += 1
        self.ctx.metrics.restarts.labels(restart_reason(code, self._exit_reason)).inc()
        if decision.crash_loop:
            what = "stopping this standby" if self.is_standby else "quarantining the shard"
            if not self.is_standby:
                self.ctx.metrics.quarantines.inc()
            log.error(
                "crash loop: %d restarts within %ss; %s",
                cfg.max_restarts,
                cfg.restart_window,
                what,
                extra=self._extra(code=code),
            )
            self._event(RunnerEvent.CRASH_LOOP)
            return False
        self._event(RunnerEvent.CHILD_EXITED)
        log.warning(
            "%s exited with %s (%s); restarting in %.3fs",
            "standby child" if self.is_standby else "child",
            code,
            self._exit_reason or describe_exit(code),
            decision.delay,
            extra=self._extra(),
        )
        self._delay = decision.delay
        return True

    async def _finish(self) -> None:
        if self.state is RunnerState.LOST:
            return  # nothing more is written: the lease belongs to someone else
        if self.is_standby:
            self._event(RunnerEvent.RELEASED)  # a standby holds nothing to release
            log.info("standby stopped (%s)", self.state.value, extra=self._extra())
            return
        quarantined = self.crash_looped
        stop = self._stop
        successor = stop.successor if stop is not None and not quarantined else ""
        if self.state is RunnerState.HANDING_OFF:
            self._fall_back(Fallback.CHILD_EXITED)  # released as it stands, no cut
        if not self._released:
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
        mode = self._handoff_mode(successor)
        log.info(
            "%s: handed over in %.3fs (held %.1fs, reason %s, successor %s%s)",
            "quarantined" if quarantined else "released",
            handover,
            now - self.taken_at,
            reason,
            successor or "any",
            f", {mode.value}" if mode is not None else "",
            extra=self._extra(checkpoint=self.checkpoint),
        )

    async def _release_early(self) -> None:
        """Release as soon as the child reports ``stopped``: it sends that after its last
        write and its sink's close, so its exit (interpreter teardown: tens of ms, more on a
        busy host) need not delay the successor's take. The final checkpoint is the child's
        cut. After a make-before-break wait whose successor adopts hand-overs, the lease is
        handed over instead (one write: the successor owns it, no take). A release that
        fails here is tried again by ``_finish``."""
        stop = self._stop
        if stop is None or self.is_standby or self.state is RunnerState.LOST:
            return
        written, how = False, "released"
        began = trio.current_time()
        with trio.move_on_after(RELEASE_TIMEOUT):
            if self._mode is Mode.MAKE_BEFORE_BREAK and self._hand_over:
                written, how = await self._hand_over_lease(stop.successor), "handed over"
            if not written:  # refused: the item is not as the hand-off left it
                written, how = await self._release_lease(False, stop.successor), "released"
            self._released = True
        if written:
            log.info(
                "%s at the child's stop (successor %s)",
                how,
                stop.successor or "any",
                extra=self._extra(
                    checkpoint=self.checkpoint,
                    write_ms=round(1000 * (trio.current_time() - began), 1),
                ),
            )

    def _handoff_mode(self, successor: str) -> Mode | None:
        """A release to a peer is a hand-off: counted by how it went (None: not one)."""
        if not successor or successor == self.ctx.worker_id:
            return None
        mode = self._mode or Mode.BREAK_BEFORE_MAKE
        self.ctx.metrics.handoffs.labels(mode.value).inc()
        return mode

    async def _release_lease(self, quarantined: bool, successor: str) -> bool:
        """True once the release is written; False: refused (no longer ours)."""
        return await self._final_write(
            "release",
            lambda: self.ctx.store.release(
                self.shard_id,
                self.ctx.worker_id,
                self.epoch,
                self.checkpoint,
                state="quarantined" if quarantined else "released",
                successor=successor,
            ),
        )

    async def _hand_over_lease(self, successor: str) -> bool:
        """True once ``successor`` owns the shard (epoch + 1, the cut as its checkpoint);
        False: refused (not ours, or the successor's answer is gone: release instead)."""
        return await self._final_write(
            "hand-over",
            lambda: self.ctx.store.hand_over(
                self.shard_id,
                self.ctx.worker_id,
                self.epoch,
                successor,
                self.checkpoint,
                self.ctx.wall(),
            ),
        )

    async def _final_write(self, what: str, write: Callable[[], Awaitable[object]]) -> bool:
        """Retried while the store is unavailable (the caller bounds it); False: refused."""
        while True:
            try:
                await write()
                return True
            except LeaseConflict:
                log.warning("%s refused: not as we left it", what, extra=self._extra())
                return False
            except StoreUnavailable as exc:
                log.warning("%s failed, retrying: %s", what, exc, extra=self._extra())
                await trio.sleep(0.2)

    async def _run_child_once(self) -> int | None:
        child, outputs = await self.ctx.spawn(self.shard_id)
        self._child, self._child_started = child, False
        self._ready, self._exit_reason = False, ""
        self._counted = {}  # a new child counts from zero
        self.first_seq, self.standby_stats, self._dropped = {}, None, 0
        try:
            async with trio.open_nursery() as nursery:
                for name, stream in outputs:
                    nursery.start_soon(pump_output, self.shard_id, child.pid, name, stream)
                nursery.start_soon(self._stop_watcher, child)
                nursery.start_soon(self._hang_watcher, child)
                nursery.start_soon(self._handoff_watcher)
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
        standby = cfg.standby
        return p.Start(
            mode=p.STANDBY if self.is_standby else p.ACTIVE,
            standby=p.StandbySettings(buffer=standby.buffer, max_bytes=standby.max_buffer_bytes),
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
                fleet=partition_keys.vacant_key(self.shard.id),
            ),
        )

    async def _handle(self, msg: p.Message) -> None:
        if isinstance(msg, p.Heartbeat):
            self.progress = msg
            self._count_streams(msg.streams)
            if msg.standby is not None:
                self._count_standby(msg.standby)
            elif not self.is_standby:  # (a standby holds no lease: nothing to publish)
                await self._publish_streams(msg)
        elif isinstance(msg, p.StandbyReady):
            self._ready, self.first_seq = True, dict(msg.first_seq)
            self._event(RunnerEvent.STANDBY_READY)
            log.info("standby ready", extra=self._extra(first_seq=self.first_seq))
        elif isinstance(msg, p.Ready):
            self._ready = True
            self._event(RunnerEvent.CHILD_READY)
            log.info("child ready", extra=self._extra(pid=self._child and self._child.pid))
        elif isinstance(msg, p.Checkpoint):
            self.written = msg.written
            await self._write_checkpoint(msg.checkpoint)
        elif isinstance(msg, p.Stopped):
            self.written, self.checkpoint = msg.written, dict(msg.checkpoint)
            await self._release_early()
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
            deltas[stream] = delta = {k: v - before.get(k, 0) for k, v in counts.items()}
            self._counted[stream] = dict(counts)
            for key, n in delta.items():
                if n > 0 and key.startswith(p.RECONNECT_PREFIX):
                    reasons = self._reconnects.setdefault(stream, {})
                    reason = key[len(p.RECONNECT_PREFIX) :]
                    reasons[reason] = reasons.get(reason, 0) + n
        self.ctx.metrics.add_stream_counts(self.shard_id, deltas)

    def _count_standby(self, stats: p.StandbyStats) -> None:
        """A standby child's buffer, for the gauges; its dropped records, for the counter."""
        self.standby_stats = stats
        if stats.dropped > self._dropped:
            self.ctx.metrics.standby_dropped.labels(self.shard_id).inc(
                stats.dropped - self._dropped
            )
            self._dropped = stats.dropped

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

    async def _publish_streams(self, beat: p.Heartbeat) -> None:
        """The streams silent past their timeout and the reconnects by reason, on the shard
        item for ``status``: written when the stale set changes, or when the counts changed
        and RECONNECTS_PUBLISH_INTERVAL has passed; conditional on owner and epoch like a
        checkpoint."""
        stale = tuple(sorted(beat.stale))
        self.ctx.metrics.set_stale(self.shard_id, beat.streams, stale)
        now = self.ctx.now()
        counts_due = (
            self._reconnects != self._published
            and now - self._published_at >= RECONNECTS_PUBLISH_INTERVAL
        )
        if (stale == self._stale and not counts_due) or self.state is RunnerState.LOST:
            return
        reconnects = {stream: dict(reasons) for stream, reasons in self._reconnects.items()}
        try:
            await self.ctx.store.publish_streams(
                self.shard_id, self.ctx.worker_id, self.epoch, stale, reconnects
            )
            self._stale, self._published, self._published_at = stale, reconnects, now
        except LeaseConflict:
            self.lose("stream states refused: the table has another owner or epoch")
        except StoreUnavailable as exc:
            log.warning("stream states not stored (next heartbeat): %s", exc, extra=self._extra())

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

    async def _handoff_watcher(self) -> None:
        """Make-before-break, the owner's side: once asked, wait for the successor's standby
        (``handoff.await_successor``), then let the stop go out, at the cut if it came."""
        await self._handing_off.wait()
        stop = self._stop
        assert stop is not None
        watch = self.ctx.watch
        outcome = await await_successor(
            self.ctx.store,
            watch.read if watch is not None else self.ctx.store.read_shard,
            shard=self.shard_id,
            me=self.ctx.worker_id,
            epoch=self.epoch,
            successor=stop.successor,
            timeout=self.ctx.config.lease.handoff_timeout,
            wall=self.ctx.wall,
            abort=self._abort_handoff,
        )
        if outcome.lost:
            self.lose("the table shows another owner or epoch (during a hand-off)")
        elif outcome.first is not None:
            self._min_cut, self._mode = min_cut(outcome.first), Mode.MAKE_BEFORE_BREAK
            log.info(
                "successor %s ready: stopping at the cut",
                stop.successor,
                extra=self._extra(min_cut=self._min_cut),
            )
            self._event(RunnerEvent.SUCCESSOR_READY)
        else:
            why = outcome.fallback or Fallback.TIMEOUT
            self._fall_back(why)
            if why is Fallback.SUCCESSOR_LEFT and self._stop is not None:
                self._stop = attrs.evolve(self._stop, successor="")  # released to anyone
            self._event(RunnerEvent.HANDOFF_FALLBACK)

    async def _stop_watcher(self, child: ChildHandle) -> None:
        await self._stopping.wait()
        stop = self._stop
        if self.state is RunnerState.LOST or stop is None:
            child.signal(signal.SIGKILL)
            return
        grace = stop.grace
        message = p.Stop(stop.reason, self.ctx.now() + grace, min_cut=dict(self._min_cut))
        try:
            await child.send(message)
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
