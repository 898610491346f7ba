"""The shard worker's lifecycle: hello, start, read and write until stop, fence or EOF.

A child started in standby mode (``start.mode``) first stands by (drivers/standby.py):
connected, buffering, writing nothing, until ``promote`` makes it an owner child in place (its
buffer written after the promotion's checkpoint, its connections kept) or ``stop`` ends it.

Exit codes: 0 stopped (or the parent went away), 1 unexpected error, 2 protocol error,
3 fence deadline passed, 4 the sink failed for good (``on_failure = "crash"``), 5 the sink
cannot be opened (a handler that does not import, a bad sink setting). See
docs/pipe-protocol.md.
"""

from __future__ import annotations

import os
import time
import traceback
from functools import partial
from urllib.parse import urlsplit

import attrs
import trio

from shard_worker.adapters.last_will import give_last_will
from shard_worker.adapters.log import Log
from shard_worker.adapters.pipes import MessageChannel, PipeClosed
from shard_worker.adapters.sinks.jsonl import DeadLetterSink, open_sink
from shard_worker.contract.exit_codes import ChildExit
from shard_worker.contract.pipe import (
    ACTIVE,
    PROTOCOL_VERSION,
    STANDBY,
    Checkpoint,
    Error,
    Hello,
    Promote,
    ProtocolError,
    Start,
    Stop,
    Stopped,
    header_secrets,
)
from shard_worker.core.sequence import SequencePath
from shard_worker.drivers.fence import FenceExpired, FenceGuard, trio_deadline
from shard_worker.drivers.owner import (
    STOP_MARGIN,
    ControlClosed,
    Output,
    own,
    report,
    resume_checkpoint,
    run_readers,
    start_readers,
)
from shard_worker.drivers.pipeline import BatchPipeline, SinkFailed
from shard_worker.drivers.reader import StreamReader
from shard_worker.drivers.recorder import Recorder
from shard_worker.drivers.standby import Standby

START_TIMEOUT = 10.0
FATAL_REPORT_TIMEOUT = 1.0  # best effort on the way out
LAST_WILL_TIMEOUT = 5.0  # the release on the way out; then the lease expires as it would


class SinkSetupFailed(Exception):
    """The sink of the start message cannot be opened (import, settings, credentials)."""


@attrs.define
class _Shard:
    """What this child runs: the start (once a standby is promoted, with the promotion's
    epoch, checkpoint and fence) and the output (None while standing by)."""

    start: Start
    output: Output | None = None


async def run_worker(channel: MessageChannel, log: Log) -> int:
    """Run one shard epoch over ``channel``; returns the process exit code."""
    try:
        return await _lifecycle(channel, log)
    except Exception as exc:  # noqa: BLE001 - every failure must become an exit code
        return await _fail(channel, log, exc)


async def _lifecycle(channel: MessageChannel, log: Log) -> int:
    await report(channel, Hello(version=PROTOCOL_VERSION, pid=os.getpid()))
    first = await _receive_start(channel)
    if isinstance(first, Stop):
        log.info(f"stopped before start: {first.reason}")
        await _send_stopped(channel, first, {}, 0, log)
        return ChildExit.OK
    start = first
    settings = start.settings
    log.configure(
        shard=start.shard,
        epoch=start.epoch,
        log_format=settings.log_format,
        redact=(*settings.redact, *header_secrets(start.streams)),
    )
    shard = _Shard(start, None if start.mode == STANDBY else _open_output(start, log))
    try:
        try:
            stop = await _run_shard(shard, channel, log)
        except Exception as exc:
            output = shard.output
            if _find(exc, ControlClosed) is None and _find(exc, PipeClosed) is None:
                if output is not None and (
                    _find(exc, SinkFailed) is not None or _find(exc, FenceExpired) is not None
                ):
                    # The close below writes out what the sink holds: report it first, or a
                    # restart in this epoch would write those records a second time.
                    await _report_delivered(channel, output, log)
                raise
            if output is None:
                log.info(f"supervisor gone ({exc!r}); a standby holds no lease: exiting")
                return ChildExit.OK
            # The supervisor is gone: nothing more is written; hand the shard on.
            checkpoint = output.flush()
            await output.aclose()
            log.warning(f"supervisor gone ({exc!r}); last will at checkpoint {checkpoint}")
            await _last_will(shard.start, checkpoint, log)
            return ChildExit.OK
        checkpoint = shard.output.flush() if shard.output is not None else {}
    finally:
        if shard.output is not None:
            with trio.CancelScope(shield=True):
                await shard.output.aclose()
    written = shard.output.written if shard.output is not None else 0
    log.info(f"stopped ({stop.reason}): written={written} checkpoint={checkpoint}")
    await _send_stopped(channel, stop, checkpoint, written, log)
    return ChildExit.OK


def _open_output(start: Start, log: Log) -> Output:
    """The Recorder (jsonl) or the BatchPipeline of the start message's sink, with the
    dead-letter sink, behind one fence guard."""
    spec = start.sink
    fence = FenceGuard(start.fence_deadline)
    dead_letters = DeadLetterSink(
        spec.dead_letter,
        shard=start.shard,
        epoch=start.epoch,
        worker=start.worker,
        fsync=spec.fsync,
    )
    checkpoint = resume_checkpoint(start)
    if spec.kind == "jsonl":
        jsonl = open_sink(
            spec,
            shard=start.shard,
            epoch=start.epoch,
            worker=start.worker,
            streams=[stream.id for stream in start.streams],
        )
        return Recorder(jsonl, fence, checkpoint, dead_letters)
    from shard_worker.adapters.sinks import open_batch_sink

    pipeline: BatchPipeline | None = None

    def on_retry(exc: BaseException, attempt: int, delay: float) -> None:
        if pipeline is not None:
            pipeline.on_retry(exc, attempt, delay)

    try:
        sink = open_batch_sink(spec, on_retry=on_retry)
    except Exception as exc:
        raise SinkSetupFailed(f"cannot open the {spec.kind} sink: {exc}") from exc
    pipeline = BatchPipeline(
        sink,
        spec=spec,
        fence=fence,
        checkpoint=checkpoint,
        dead_letters=dead_letters,
        log=log,
        measure_frames=spec.kind == "handler",
    )
    log.info(
        f"sink {spec.kind}: batches of up to {sink.max_records} records / {sink.max_bytes}"
        f" bytes / {spec.batch_max_wait:g}s, channel of {pipeline.capacity},"
        f" on_failure={spec.on_failure}"
    )
    return pipeline


async def _report_delivered(channel: MessageChannel, output: Output, log: Log) -> None:
    """Before a crash exit: report what was delivered, so the restart resends the least."""
    with trio.move_on_after(FATAL_REPORT_TIMEOUT):
        try:
            checkpoint = output.flush()
            await channel.send(Checkpoint(checkpoint=checkpoint, written=output.written))
        except (PipeClosed, OSError) as exc:
            log.warning(f"could not report the checkpoint before exiting: {exc!r}")


async def _last_will(start: Start, checkpoint: dict[str, int], log: Log) -> None:
    """Release our shard (conditional on owner and epoch) and mark the supervisor's session
    orphaned, so peers take over within a reconcile interval instead of a lease duration.
    Best effort and bounded: if it fails, the lease simply expires."""
    will = start.last_will
    if will is None:
        return
    with trio.move_on_after(LAST_WILL_TIMEOUT) as scope:
        await give_last_will(
            will,
            shard=start.shard,
            worker=start.worker,
            epoch=start.epoch,
            checkpoint=checkpoint,
            wall_now=time.time(),
            log=log,
        )
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


async def _run_shard(shard: _Shard, channel: MessageChannel, log: Log) -> Stop:
    """Readers, sink task and checkpoints run until Stop; raises ControlClosed, FenceExpired
    or SinkFailed otherwise. A standby first stands by, until promoted (or stopped)."""
    start = shard.start
    reading = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        if shard.output is None:
            promoted = await _stand_by(shard, reading, nursery, channel, log)
            if isinstance(promoted, Stop):
                nursery.cancel_scope.cancel()
                return promoted
            readers = promoted
        else:
            readers = await start_readers(start, shard.output, reading, nursery, log)
        assert shard.output is not None
        stop = await own(shard.start, shard.output, readers, reading, nursery, channel, log)
        nursery.cancel_scope.cancel()
    return stop


async def _stand_by(
    shard: _Shard,
    reading: trio.CancelScope,
    nursery: trio.Nursery,
    channel: MessageChannel,
    log: Log,
) -> list[StreamReader] | Stop:
    """A standby's readers, reading (in ``reading``) into its buffer until ``promote`` (then
    they read into the promoted output: returned) or ``stop`` (returned)."""
    start = shard.start
    standby = Standby(start, log)
    await nursery.start(run_readers, standby.readers, reading)
    log.info(f"standby: epoch={start.epoch} streams={len(standby.readers)} {start.standby}")
    message = await standby.serve(channel.receive, partial(report, channel))
    if message is None:
        raise ControlClosed("control pipe closed")
    if isinstance(message, Promote):
        await _promote(shard, standby, message, nursery, log)
        return list(standby.readers)
    return message


async def _promote(
    shard: _Shard, standby: Standby, promote: Promote, nursery: trio.Nursery, log: Log
) -> None:
    """The standby becomes the owner child of the promotion's epoch: its sink opened, its
    buffer written after the promotion's checkpoint, its readers on the sink (no reconnect)."""
    start = shard.start = attrs.evolve(
        shard.start,
        epoch=promote.epoch,
        checkpoint=promote.checkpoint,
        fence_deadline=promote.fence_deadline,
        mode=ACTIVE,
    )
    log.configure(shard=start.shard, epoch=start.epoch, log_format=start.settings.log_format)
    output = shard.output = _open_output(start, log)
    pipeline = output if isinstance(output, BatchPipeline) else None
    if pipeline is not None:
        await nursery.start(pipeline.run)
    await standby.promote(promote, output, pipeline)


async def _fail(channel: MessageChannel, log: Log, exc: Exception) -> int:
    """Log ``exc``, tell the parent when it can still listen, and pick the exit code."""
    fence = _find(exc, FenceExpired)
    protocol = _find(exc, ProtocolError)
    closed = _find(exc, ControlClosed) or _find(exc, PipeClosed)
    sink_failed = _find(exc, SinkFailed)
    setup_failed = _find(exc, SinkSetupFailed)
    if fence is not None:
        code, message = ChildExit.FENCE, str(fence)
    elif sink_failed is not None:
        code, message = ChildExit.SINK, f"sink failed: {sink_failed}"
    elif setup_failed is not None:
        code, message = ChildExit.SINK_SETUP, str(setup_failed)
    elif protocol is not None:
        code, message = ChildExit.PROTOCOL, f"protocol error: {protocol}"
    elif closed is not None:
        log.info(str(closed))  # the parent is gone or done with us: nobody to report to
        return ChildExit.OK
    else:
        code, message = ChildExit.ERROR, f"unexpected error: {exc!r}"
    # The traceback goes through the log (one JSON line in json mode, and redacted).
    trace = "".join(traceback.format_exception(exc)) if code == ChildExit.ERROR else ""
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


_trio_deadline = trio_deadline
