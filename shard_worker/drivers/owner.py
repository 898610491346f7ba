"""What an owner child does once its readers read into its output (the Recorder or the
BatchPipeline): checkpoints, heartbeats and fences until ``stop``; then, at the stop's
``min_cut`` if it has one, the readers stop reading and the sink task delivers what they had
received. The same for a child started as the owner and for a promoted standby
(drivers/standby.py); the lifecycle around it is the worker's (drivers/worker.py).
"""

from __future__ import annotations

import trio

from shard_worker.adapters.log import Log
from shard_worker.adapters.pipes import MessageChannel
from shard_worker.adapters.transports import stream_transport
from shard_worker.contract.pipe import (
    Checkpoint,
    Fence,
    Heartbeat,
    Message,
    ProtocolError,
    Ready,
    Start,
    Stop,
)
from shard_worker.drivers.fence import trio_deadline
from shard_worker.drivers.pipeline import BatchPipeline
from shard_worker.drivers.reader import Placeholders, StreamReader
from shard_worker.drivers.recorder import Recorder

REPORT_TIMEOUT = 10.0  # a parent that reads nothing for this long is broken
STOP_MARGIN = 0.05  # leave the parent this much of the stop deadline to see us exit
CUT_POLL = 0.005  # seconds between looks at the streams while a stop waits for its min_cut
CUT_SHARE, CUT_SHARE_BATCH = 0.75, 0.5  # of a stop's time, at most, spent reaching min_cut

Output = Recorder | BatchPipeline


class ControlClosed(Exception):
    """EOF on the control pipe: the parent died or wants us gone now."""


def resume_checkpoint(start: Start) -> dict[str, int]:
    """The start checkpoint, restricted to this shard's sequenced streams."""
    sequenced = {spec.id for spec in start.streams if spec.sequence}
    return {stream: seq for stream, seq in start.checkpoint.items() if stream in sequenced}


async def start_readers(
    start: Start,
    output: Output,
    reading: trio.CancelScope,
    nursery: trio.Nursery,
    log: Log,
) -> list[StreamReader]:
    """An owner child's readers, reading (in ``reading``) into ``output``."""
    pipeline = output if isinstance(output, BatchPipeline) else None
    if pipeline is not None:
        await nursery.start(pipeline.run)
    readers = [
        StreamReader(
            spec,
            recorder=output,
            settings=start.settings,
            placeholders=Placeholders(start.shard, spec.id, start.epoch, start.worker),
            log=log,
            transport=stream_transport(spec, start.settings, start.sink.max_message_size),
            sender=pipeline.sender() if pipeline is not None else None,
        )
        for spec in start.streams
    ]
    if pipeline is not None:
        pipeline.seal()
    await nursery.start(run_readers, readers, reading)
    return readers


async def own(
    start: Start,
    output: Output,
    readers: list[StreamReader],
    reading: trio.CancelScope,
    nursery: trio.Nursery,
    channel: MessageChannel,
    log: Log,
) -> Stop:
    """An owner child's work once its readers read into its output: checkpoints, heartbeats,
    fences, until Stop. Then the readers stop reading (at the stop's min_cut, if it has one),
    the sink task delivers what they had received (until the stop deadline), and only then
    does this return."""
    pipeline = output if isinstance(output, BatchPipeline) else None
    settings = start.settings
    resumed = resume_checkpoint(start)
    nursery.start_soon(_checkpoint_loop, output, channel, settings.checkpoint_interval, resumed)
    nursery.start_soon(_heartbeat_loop, output, readers, channel, settings.heartbeat_interval)
    await report(channel, Ready())
    log.info(f"ready: epoch={start.epoch} streams={len(start.streams)}")
    stop = await _serve_control(channel, output)
    if pipeline is not None or stop.min_cut:
        nursery.start_soon(_serve_fences, channel, output)
    if stop.min_cut:
        await _reach_cut(readers, stop, batch=pipeline is not None, log=log)
    reading.cancel()
    if pipeline is not None:
        with trio.move_on_at(trio_deadline(stop.deadline) - 2 * STOP_MARGIN) as scope:
            await pipeline.drained()
        if scope.cancelled_caught:
            log.warning("stop deadline reached before the last batch was delivered")
    return stop


async def _reach_cut(readers: list[StreamReader], stop: Stop, *, batch: bool, log: Log) -> None:
    """Read on until every stream of ``stop.min_cut`` has read (jsonl: written; batch sinks:
    handed to the sink task, which delivers it before ``stopped``) at least its cut; at the
    latest until a part of the stop's time is left for the stop itself: a quarter (jsonl:
    flush, ``stopped``, exit), half (batch sinks: the last deliveries too). A cut not reached
    is logged: the successor will see a gap there."""
    wanted = {r: stop.min_cut[r.spec.id] for r in readers if r.path and r.spec.id in stop.min_cut}
    now, deadline = trio.current_time(), trio_deadline(stop.deadline)
    until = now + (deadline - now) * (CUT_SHARE_BATCH if batch else CUT_SHARE)
    while short := {r.spec.id: r.tracker.last for r, cut in wanted.items() if r.tracker.last < cut}:
        if trio.current_time() >= until:
            log.warning(f"stop: min_cut {stop.min_cut} not reached by the deadline: at {short}")
            return
        await trio.sleep(CUT_POLL)


async def run_readers(
    readers: list[StreamReader],
    scope: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Every reader, in a scope of their own: cancelling it stops the reading only."""
    with scope:
        async with trio.open_nursery() as nursery:
            for reader in readers:
                await nursery.start(reader.run)
            task_status.started()


async def _serve_control(channel: MessageChannel, recorder: Output) -> Stop:
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


async def _serve_fences(channel: MessageChannel, output: Output) -> None:
    """While the last batches are delivered after Stop: keep applying Fence messages."""
    while True:
        message = await channel.receive()
        if message is None:
            raise ControlClosed("control pipe closed while stopping")
        if isinstance(message, Fence):
            output.fence_deadline = message.deadline


async def _checkpoint_loop(
    recorder: Output, channel: MessageChannel, interval: float, reported: dict[str, int]
) -> None:
    """Flush, then report what the flush made durable (only when it moved from ``reported``,
    the checkpoint the child started or was promoted at)."""
    while True:
        await trio.sleep(interval)
        # Synchronous: nothing is written (or delivered) between the flush and the report.
        checkpoint = recorder.flush()
        if checkpoint != reported:
            await report(channel, Checkpoint(checkpoint=checkpoint, written=recorder.written))
            reported = checkpoint


async def _heartbeat_loop(
    recorder: Output, readers: list[StreamReader], channel: MessageChannel, interval: float
) -> None:
    """Liveness with progress. Runs on the same event loop as the readers, so a loop blocked
    by CPU-bound code stops the heartbeats, and the supervisor replaces the child."""
    while True:
        before = trio.current_time()
        await trio.sleep(interval)
        lag = max(0.0, trio.current_time() - before - interval)
        await report(
            channel,
            Heartbeat(
                written=recorder.written,
                last_seq={r.spec.id: recorder.last(r.spec.id) for r in readers if r.path},
                loop_lag=round(lag, 6),
                duplicates=sum(r.tracker.duplicates for r in readers),
                gaps=sum(r.tracker.gaps for r in readers),
                malformed=sum(r.malformed.count for r in readers),
                streams={
                    r.spec.id: r.counts(
                        recorder.written_by_stream.get(r.spec.id, 0),
                        recorder.dead_lettered_by_stream.get(r.spec.id, 0),
                    )
                    for r in readers
                },
                stale=[r.spec.id for r in readers if r.stale(trio.current_time())],
            ),
        )


async def report(channel: MessageChannel, message: Message) -> None:
    with trio.fail_after(REPORT_TIMEOUT):
        await channel.send(message)
