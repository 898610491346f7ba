"""The ``shardvisor`` command line. Each subcommand is a thin shell around a library call.

Exit codes are in ``supervisor.exit_codes`` (a public contract); a bad config file prints one
line per problem and exits 78, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from functools import partial

import trio

from supervisor import exit_codes
from supervisor.adapters.lease_store.base import LeaseConflict, LeaseStoreError
from supervisor.adapters.logs import add_secrets, redact_std_streams, setup_logging
from supervisor.config.loading import ConfigError, load_config
from supervisor.config.model import Config
from supervisor.config.rendering import render_config

log = logging.getLogger("shardvisor.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardvisor",
        description="Keeps one worker process per leased stream shard alive across a fleet.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(name: str, help_text: str, parent=sub) -> argparse.ArgumentParser:
        cmd = parent.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("-c", "--config", required=True, metavar="FILE", help="TOML config file")
        return cmd

    with_config("run", "run the supervisor (foreground; SIGTERM drains)")
    with_config("check-config", "validate a config file and print the effective config")
    init = with_config("init-table", "create the DynamoDB table if it does not exist")
    init.add_argument(
        "--protocol",
        type=int,
        choices=(1, 2),
        help="2: add protocol 2's indexes and attributes, then switch the fleet to it if every "
        "live worker advertises p2 (else exit 76); 1: switch back (compatibility mode)",
    )
    status = with_config("status", "show workers and shards as the table has them")
    shown = status.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="machine-readable output")
    shown.add_argument(
        "--watch", action="store_true", help="redraw the table every second (Ctrl-C ends)"
    )
    drain = with_config("drain", "a worker hands off all its shards and takes none")
    drain.add_argument("worker", metavar="WORKER", help="worker id (see `status`)")
    drain.add_argument("--undo", action="store_true", help="let the worker take shards again")
    release = with_config("release", "the owner of a shard hands it off to a peer")
    release.add_argument("shard", metavar="SHARD", help="shard id")

    shards = sub.add_parser(
        "shards",
        help="register, retire and list shards in the table while the fleet runs",
        description="Shards registered here run on any worker, beside the [[shards]] of the "
        "TOML files; a new one is owned within one reconcile interval.",
    )
    shards_sub = shards.add_subparsers(dest="shards_command", required=True, metavar="ACTION")
    add = with_config("add", "register a shard (unowned; a worker takes it)", shards_sub)
    add.add_argument("shard", metavar="SHARD", help="shard id")
    add.add_argument(
        "--stream",
        action="append",
        default=[],
        metavar="ID=URL",
        help="a WebSocket feed of the shard (repeat for several)",
    )
    add.add_argument("--sequence", default="", metavar="PATH", help="sequence path, every stream")
    add.add_argument("--subscribe", default="", metavar="TEXT", help="sent after connecting")
    add.add_argument(
        "--spec",
        default="",
        metavar="JSON",
        help='the streams as JSON instead: [{"id": ..., "url": ..., "sequence": ...}, ...]',
    )
    remove = with_config("remove", "retire a registered shard: its child stops", shards_sub)
    remove.add_argument("shard", metavar="SHARD", help="shard id")
    listing = with_config("list", "list the shards in the table", shards_sub)
    listing.add_argument("--json", action="store_true", help="machine-readable output")

    feed = sub.add_parser("feed", help="run the reference sequenced WebSocket feed")
    feed.add_argument("--host", default="127.0.0.1")
    feed.add_argument("--port", type=int, default=9000)
    feed.add_argument("--streams", type=int, default=4, help="streams named s1..sN")
    feed.add_argument("--rate", type=float, default=100.0, help="messages/s per stream")
    feed.add_argument(
        "--live",
        action="store_true",
        help="live-only: a client gets only what is generated after it connected (no replay)",
    )

    demo = sub.add_parser("demo", help="3 supervisors, 6 shards, a kill and a drain, locally")
    demo.add_argument("--workdir", default="", help="keep the demo's files here")
    return parser


DEMO_NEEDS_MOTO = (
    "shardvisor demo needs moto's DynamoDB server, an optional part: "
    "pip install 'shardvisor[demo]' (scripts/demo.sh installs it)"
)


def _cmd_demo(args: argparse.Namespace) -> int:
    # moto is a development extra: a production install has none, and says so in one line.
    if importlib.util.find_spec("moto") is None:
        print(DEMO_NEEDS_MOTO, file=sys.stderr)
        return exit_codes.UNAVAILABLE
    from supervisor.devtools.demo import run_demo

    return run_demo(workdir=args.workdir)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "feed":
        return _cmd_feed(args)
    if args.command == "demo":
        return _cmd_demo(args)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        for problem in exc.problems:
            prefixed = problem.startswith(str(args.config))
            print(problem if prefixed else f"{args.config}: {problem}", file=sys.stderr)
        return exit_codes.CONFIG
    if args.command == "check-config":
        sys.stdout.write(render_config(config))  # ${NAME} as written: no secret in it
        return exit_codes.OK
    # Substituted values and header values never reach a log line, nor stdout/stderr.
    add_secrets(config.redacted)
    if config.redacted:
        redact_std_streams()
    setup_logging(config.log.level, fmt=config.log.format)
    handlers = {
        "run": _cmd_run,
        "init-table": _cmd_init_table,
        "status": _cmd_status,
        "drain": _cmd_drain,
        "release": _cmd_release,
        "shards": _cmd_shards,
    }
    try:
        return handlers[args.command](config, args)
    except LeaseStoreError as exc:
        print(f"shardvisor: lease store: {exc}", file=sys.stderr)
        return exit_codes.STORE_UNAVAILABLE


def _store(config: Config):
    from supervisor.adapters.lease_store.dynamodb import DynamoLeaseStore

    db = config.dynamodb
    return DynamoLeaseStore(db.table, db.region, db.endpoint_url)


def _cmd_init_table(config: Config, args: argparse.Namespace) -> int:
    table = config.dynamodb.table
    if args.protocol is None:
        created = trio.run(_store(config).ensure_table, True)
        print(f"table {table}: {'created' if created else 'already exists'}")
        return exit_codes.OK
    change = trio.run(_store(config).set_protocol, args.protocol)
    print(f"table {table}: {'created' if change.created else 'already exists'}")
    if args.protocol == 2:
        print(f"table {table}: protocol 2's keys written on {change.backfilled} items")
        if change.registrations:
            print(f"table {table}: {change.registrations} registration items made to match")
    if change.refused:
        print(
            f"shardvisor: init-table: protocol 2 refused: {len(change.refused)} live worker(s) "
            f"do not advertise the feature p2: {', '.join(change.refused)}; upgrade or stop "
            "them, then run this again (the table stays at protocol "
            f"{change.protocol})",
            file=sys.stderr,
        )
        return exit_codes.FLEET_NOT_READY
    print(f"table {table}: protocol {change.protocol}")
    return exit_codes.OK


def _cmd_status(config: Config, args: argparse.Namespace) -> int:
    from supervisor.core.status import fleet_status, render_table

    store = _store(config)

    async def read():
        await store.ensure_table(False)
        return await store.snapshot()

    if args.watch:
        return _watch_status(config, read)
    status = fleet_status(trio.run(read), config, time.time())
    print(json.dumps(status, indent=2) if args.json else render_table(status))
    return exit_codes.OK


WATCH_INTERVAL = 1.0  # seconds between redraws of `status --watch`
_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: plain ANSI, any terminal


def _watch_status(config: Config, read) -> int:
    """Redraw the table every second until Ctrl-C; a failed read shows on the screen and the
    next second tries again (an operator watching an outage wants to see it end)."""
    from supervisor.core.status import fleet_status, render_table

    async def loop() -> None:
        while True:
            started, read_at = trio.current_time(), time.localtime()
            try:
                with trio.fail_after(10 * WATCH_INTERVAL):
                    table = render_table(fleet_status(await read(), config, time.time()))
            except (LeaseStoreError, trio.TooSlowError) as exc:
                table = f"shardvisor: lease store: {exc or 'no answer within 10 s'}"
            stamp = time.strftime("%H:%M:%S", read_at)  # when the read began: one a second
            header = f"shardvisor status --watch  table {config.dynamodb.table}  {stamp}"
            print(f"{_CLEAR}{header}\n\n{table}", flush=True)
            await trio.sleep_until(started + WATCH_INTERVAL)

    # Ctrl-C ends the watch even when SIGINT came ignored (a shell starts background jobs so,
    # and Python then keeps it ignored): `kill -INT` from a script must end it too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        trio.run(loop)
    except KeyboardInterrupt:
        return exit_codes.OK
    return exit_codes.OK


def _cmd_drain(config: Config, args: argparse.Namespace) -> int:
    verb = "may take shards again" if args.undo else "hands off its shards at its next reconcile"
    return _mark_in_table(
        config,
        lambda store: store.request_drain(args.worker, time.time(), undo=args.undo),
        missing=f"no worker {args.worker!r}",
        done=f"worker {args.worker} {verb}",
    )


def _cmd_release(config: Config, args: argparse.Namespace) -> int:
    return _mark_in_table(
        config,
        lambda store: _release_and_poke(store, args.shard),
        missing=f"shard {args.shard!r} has no owner",
        done=f"shard {args.shard}: its owner hands it off at its next reconcile",
    )


async def _release_and_poke(store, shard_id: str) -> None:
    """The mark, then a poke: the owner re-reads the table at its next reconcile (it does
    not scan every round), so the hand-off starts within one reconcile interval."""
    owner = await store.request_release(shard_id, time.time())
    with contextlib.suppress(LeaseConflict):  # the owner's item is gone: nobody to tell
        await store.poke(owner)


def _mark_in_table(config: Config, request, *, missing: str, done: str) -> int:
    """An operator request is a mark in the table; the owning supervisor acts on it."""
    store = _store(config)

    async def mark() -> None:
        await store.ensure_table(False)
        await request(store)

    try:
        trio.run(mark)
    except LeaseConflict:
        print(f"shardvisor: {missing} in table {config.dynamodb.table}", file=sys.stderr)
        return exit_codes.NOT_FOUND
    print(done)
    return exit_codes.OK


def _cmd_shards(config: Config, args: argparse.Namespace) -> int:
    from supervisor.drivers import registry as shard_registry

    store = _store(config)
    if args.shards_command == "add":
        return shard_registry.add(store, config, args)
    if args.shards_command == "remove":
        return shard_registry.remove(store, config, args.shard)
    return shard_registry.listing(store, config, as_json=args.json)


def _cmd_run(config: Config, args: argparse.Namespace) -> int:
    from supervisor.adapters.worker_id import resolve_worker_id
    from supervisor.adapters.zygote_client import ZygoteSpawner
    from supervisor.drivers.daemon import Supervisor

    worker_id = resolve_worker_id(
        config.worker.id, environ=os.environ, hostname=socket.gethostname(), pid=os.getpid()
    )
    setup_logging(config.log.level, worker_id, config.log.format)
    if not config.tls.verify:
        from shard_worker.contract.pipe import VERIFY_OFF_WARNING

        log.warning(VERIFY_OFF_WARNING)
    # zygote: children fork from a warm pre-imported process (ms, shared memory); fresh: exec each.
    spawner = ZygoteSpawner() if config.supervisor.spawn == "zygote" else None
    # None: the supervisor spawns fresh, with supervisor.worker_command if one is set.
    spawn = spawner.spawn if spawner is not None else None
    supervisor = Supervisor(config, worker_id, _store(config), spawn=spawn)

    async def main_task() -> int:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:

                async def forward_signals() -> None:
                    async for signum in signals:
                        log.info("received %s", signal.Signals(signum).name)
                        if signum == signal.SIGHUP:
                            await _reload(supervisor, args.config)
                        else:
                            supervisor.request_shutdown()

                if config.http.listen:
                    from supervisor.adapters.http_endpoint import ListenError, serve_http

                    try:
                        routes = supervisor.http_routes()
                        await nursery.start(serve_http, config.http.listen, routes)
                    except ListenError as exc:
                        log.error("%s (another supervisor on this host? set another port)", exc)
                        return exit_codes.CONFIG
                nursery.start_soon(forward_signals)
                if spawner is not None:
                    await nursery.start(spawner.run)
                code = await supervisor.run()
                nursery.cancel_scope.cancel()  # also stops the zygote, after the drain
        return code

    return trio.run(main_task)


async def _reload(supervisor, path: str) -> None:
    """SIGHUP: a config file that no longer parses is reported and changes nothing."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        log.error(
            "reload: %s is invalid, keeping the running config: %s", path, "; ".join(exc.problems)
        )
        return
    add_secrets(config.redacted)  # before any runner is told about the new definitions
    try:
        await supervisor.reload(config)
    except LeaseStoreError as exc:
        log.error("reload: lease store: %s (send SIGHUP again to retry)", exc)


def _cmd_feed(args: argparse.Namespace) -> int:
    from supervisor.devtools.feed import run_feed

    try:
        trio.run(partial(run_feed, args.host, args.port, args.streams, args.rate, live=args.live))
    except KeyboardInterrupt:
        return exit_codes.OK
    return exit_codes.OK


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
