"""The shard worker's lifecycle: hello, start, read and write until stop, fence or EOF.

Exit codes: 0 stopped (or the parent went away), 1 unexpected error, 2 protocol error,
3 fence deadline passed. See docs/pipe-protocol.md.
"""

from __future__ import annotations

import os
import time
import traceback
from urllib.parse import urlsplit

import trio

from .control import MessageChannel, PipeClosed
from .log import Log
from .protocol import (
    PROTOCOL_VERSION,
    Checkpoint,
    Error,
    Fence,
    Heartbeat,
    Hello,
    ProtocolError,
    Ready,
    Start,
    Stop,
    Stopped,
    header_secrets,
)
from .recorder import FenceExpired, Recorder
from .sequence import SequencePath
from .sink import open_sink
from .stream_reader import Placeholders, StreamReader

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_PROTOCOL = 2
EXIT_FENCE = 3

START_TIMEOUT = 10.0
REPORT_TIMEOUT = 10.0  # a parent that reads nothing for this long is broken
FATAL_REPORT_TIMEOUT = 1.0  # best effort on the way out
STOP_MARGIN = 0.05  # leave the parent this much of the stop deadline to see us exit
LAST_WILL_TIMEOUT = 5.0  # the release on the way out; then the lease expires as it would


class ControlClosed(Exception):
    """EOF on the control pipe: the parent died or wants us gone now."""


async def run_worker(channel: MessageChannel, log: Log) -> int:
    """Run one shard epoch over ``channel``; returns the process exit code."""
    try:
        return await _lifecycle(channel, log)
    except Exception as exc:  # noqa: BLE001 - every failure must become an exit code
        return await _fail(channel, log, exc)


async def _lifecycle(channel: MessageChannel, log: Log) -> int:
    await _report(channel, Hello(version=PROTOCOL_VERSION, pid=os.getpid()))
    first = await _receive_start(channel)
    if isinstance(first, Stop):
        log.info(f"stopped before start: {first.reason}")
        await _send_stopped(channel, first, {}, 0, log)
        return EXIT_OK
    start = first
    settings = start.settings
    log.configure(
        shard=start.shard,
        epoch=start.epoch,
        log_format=settings.log_format,
        redact=(*settings.redact, *header_secrets(start.streams)),
    )
    sink = open_sink(
        start.sink,
        shard=start.shard,
        epoch=start.epoch,
        worker=start.worker,
        streams=[spec.id for spec in start.streams],
    )
    try:
        recorder = Recorder(sink, start.fence_deadline, _resume_checkpoint(start))
        try:
            stop = await _run_shard(start, recorder, channel, log)
        except Exception as exc:
            if _find(exc, ControlClosed) is None and _find(exc, PipeClosed) is None:
                raise
            # The supervisor is gone: nothing more is written; hand the shard on.
            checkpoint = recorder.flush()
            sink.close()
            log.warning(f"supervisor gone ({exc!r}); last will at checkpoint {checkpoint}")
            await _last_will(start, checkpoint, log)
            return EXIT_OK
    finally:
        sink.close()
    checkpoint, written = recorder.checkpoint(), recorder.written
    log.info(f"stopped ({stop.reason}): written={written} checkpoint={checkpoint}")
    await _send_stopped(channel, stop, checkpoint, written, log)
    return EXIT_OK


async def _last_will(start: Start, checkpoint: dict[str, int], log: Log) -> None:
    """Release our shard (conditional on owner and epoch) and mark the supervisor's session
    orphaned, so peers take over within a reconcile interval instead of a lease duration.
    Best effort and bounded: if it fails, the lease simply expires."""
    will = start.last_will
    if will is None:
        return
    with trio.move_on_after(LAST_WILL_TIMEOUT) as scope:
        try:
            # Lazy: boto3 costs ~0.2 s to import; only a child whose supervisor died needs it.
            from supervisor.dynamo_store import DynamoLeaseStore
            from supervisor.store import LeaseConflict, LeaseStoreError
        except ImportError as exc:
            log.warning(f"last will unavailable: {exc}")
            return
        store = DynamoLeaseStore(will.table, will.region, will.endpoint_url, max_concurrency=2)
        wall = time.time()
        try:
            await store.release(start.shard, start.worker, start.epoch, checkpoint, "last-will")
        except LeaseConflict:
            log.info("last will: the shard has moved on already")
        except LeaseStoreError as exc:
            log.warning(f"last will: release failed: {exc}")
        else:
            log.info(f"last will: released at epoch {start.epoch}")
        if will.session:
            try:
                await store.mark_orphaned(start.worker, will.session, wall)
            except LeaseConflict:
                pass  # a sibling did it, or the supervisor came back as a new session
            except LeaseStoreError as exc:
                log.warning(f"last will: could not mark the supervisor orphaned: {exc}")
    if scope.cancelled_caught:
        log.warning(f"last will: no answer within {LAST_WILL_TIMEOUT:g}s")


async def _send_stopped(
    channel: MessageChannel, stop: Stop, checkpoint: dict[str, int], written: int, log: Log
) -> None:
    """The final report, unless the stop deadline passes first (then we just exit)."""
    with trio.move_on_at(_trio_deadline(stop.deadline) - STOP_MARGIN) as scope:
        await channel.send(Stopped(checkpoint=checkpoint, written=written, reason=stop.reason))
    if scope.cancelled_caught:
        log.warning("stop deadline reached before 'stopped' was sent")


async def _receive_start(channel: MessageChannel) -> Start | Stop:
    with trio.move_on_after(START_TIMEOUT):
        message = await channel.receive()
        if message is None:
            raise ControlClosed("control pipe closed before start")
        if isinstance(message, Stop):
            return message
        if not isinstance(message, Start):
            raise ProtocolError(f"expected 'start', got {message.type!r}")
        if message.version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"protocol version {message.version} not supported (this worker speaks "
                f"{PROTOCOL_VERSION})"
            )
        _validate(message)
        return message
    raise ProtocolError(f"no 'start' message within {START_TIMEOUT:g}s")


def _validate(start: Start) -> None:
    """Reject a Start this worker cannot run, before anything is opened."""
    ids = [spec.id for spec in start.streams]
    if len(set(ids)) != len(ids):
        raise ProtocolError(f"duplicate stream ids in {ids}")
    for spec in start.streams:
        if urlsplit(spec.url).scheme not in ("ws", "wss"):
            raise ProtocolError(f"stream {spec.id!r}: URL must start with ws:// or wss://")
        if spec.sequence:
            try:
                SequencePath.parse(spec.sequence)
            except ValueError as exc:
                raise ProtocolError(f"stream {spec.id!r}: {exc}") from None


def _resume_checkpoint(start: Start) -> dict[str, int]:
    """The start checkpoint, restricted to this shard's sequenced streams."""
    sequenced = {spec.id for spec in start.streams if spec.sequence}
    return {stream: seq for stream, seq in start.checkpoint.items() if stream in sequenced}


async def _run_shard(start: Start, recorder: Recorder, channel: MessageChannel, log: Log) -> Stop:
    """Readers and checkpoints run until Stop; raises ControlClosed or FenceExpired otherwise."""
    async with trio.open_nursery() as nursery:
        readers = []
        for spec in start.streams:
            reader = StreamReader(
                spec,
                recorder=recorder,
                settings=start.settings,
                placeholders=Placeholders(start.shard, spec.id, start.epoch, start.worker),
                log=log,
            )
            readers.append(reader)
            await nursery.start(reader.run)
        nursery.start_soon(_checkpoint_loop, recorder, channel, start.settings.checkpoint_interval)
        nursery.start_soon(
            _heartbeat_loop, recorder, readers, channel, start.settings.heartbeat_interval
        )
        await _report(channel, Ready())
        log.info(f"ready: epoch={start.epoch} streams={len(start.streams)}")
        stop = await _serve_control(channel, recorder)
        nursery.cancel_scope.cancel()
    return stop


async def _serve_control(channel: MessageChannel, recorder: Recorder) -> Stop:
    """Apply Fence messages until a Stop arrives (returned) or the pipe closes (raised)."""
    while True:
        message = await channel.receive()
        if message is None:
            raise ControlClosed("control pipe closed")
        if isinstance(message, Fence):
            recorder.fence_deadline = message.deadline
        elif isinstance(message, Stop):
            return message
        else:
            raise ProtocolError(f"unexpected {message.type!r} message after start")


async def _checkpoint_loop(recorder: Recorder, channel: MessageChannel, interval: float) -> None:
    """Flush, then report what the flush made durable (only when it moved)."""
    reported = recorder.checkpoint()
    while True:
        await trio.sleep(interval)
        checkpoint = recorder.flush()  # synchronous: nothing is written between the two
        if checkpoint != reported:
            await _report(channel, Checkpoint(checkpoint=checkpoint, written=recorder.written))
            reported = checkpoint


async def _heartbeat_loop(
    recorder: Recorder, readers: list[StreamReader], channel: MessageChannel, interval: float
) -> None:
    """Liveness with progress. Runs on the same event loop as the readers, so a loop blocked
    by CPU-bound code stops the heartbeats, and the supervisor replaces the child."""
    while True:
        before = trio.current_time()
        await trio.sleep(interval)
        lag = max(0.0, trio.current_time() - before - interval)
        await _report(
            channel,
            Heartbeat(
                written=recorder.written,
                last_seq={r.spec.id: recorder.last(r.spec.id) for r in readers if r.path},
                loop_lag=round(lag, 6),
                duplicates=sum(r.tracker.duplicates for r in readers),
                gaps=sum(r.tracker.gaps for r in readers),
                malformed=sum(r.malformed.count for r in readers),
                streams={
                    r.spec.id: r.counts(recorder.written_by_stream.get(r.spec.id, 0))
                    for r in readers
                },
            ),
        )


async def _report(channel: MessageChannel, message: Hello | Ready | Checkpoint | Heartbeat) -> None:
    with trio.fail_after(REPORT_TIMEOUT):
        await channel.send(message)


async def _fail(channel: MessageChannel, log: Log, exc: Exception) -> int:
    """Log ``exc``, tell the parent when it can still listen, and pick the exit code."""
    fence = _find(exc, FenceExpired)
    protocol = _find(exc, ProtocolError)
    closed = _find(exc, ControlClosed) or _find(exc, PipeClosed)
    if fence is not None:
        code, message = EXIT_FENCE, str(fence)
    elif protocol is not None:
        code, message = EXIT_PROTOCOL, f"protocol error: {protocol}"
    elif closed is not None:
        log.info(str(closed))  # the parent is gone or done with us: nobody to report to
        return EXIT_OK
    else:
        code, message = EXIT_ERROR, f"unexpected error: {exc!r}"
    # The traceback goes through the log (one JSON line in json mode, and redacted).
    trace = "".join(traceback.format_exception(exc)) if code == EXIT_ERROR else ""
    log.error(message, exc=trace)
    with trio.move_on_after(FATAL_REPORT_TIMEOUT):
        try:
            await channel.send(Error(message=log.redact(message), fatal=True))
        except PipeClosed as closed:
            log.warning(str(closed))
    return code


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first ``kind`` in ``exc``, looking inside (nested) exception groups."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


def _trio_deadline(monotonic_deadline: float) -> float:
    """A time.monotonic() deadline on trio's clock (which has a random offset)."""
    return trio.current_time() + (monotonic_deadline - time.monotonic())
