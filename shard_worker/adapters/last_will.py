"""A child's last will: its supervisor died, so it releases its own shard and marks that
supervisor's session orphaned, and peers take over within a reconcile interval instead of a
lease duration (docs/lease-protocol.md, "Time to take over").

The two writes are the table contract's builders (``shard_worker.contract.table``), the same
the supervisor's store sends. boto3 is imported here only when a will runs (it costs ~0.2 s;
only a child whose supervisor died pays for it), in a worker thread like each request. Short
timeouts, two retries at most; the caller bounds the whole will, after which the lease simply
expires as it would have.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import trio

from shard_worker.adapters.log import Log
from shard_worker.contract import table
from shard_worker.contract.pipe import LastWill

# As the supervisor's store: a store that does not answer within seconds is as good as down.
CONNECT_TIMEOUT = 1.0
READ_TIMEOUT = 3.0
MAX_ATTEMPTS = 3  # botocore's "standard" retries: the first attempt and two retries


class Superseded(Exception):
    """The write's condition failed: the item moved on (a peer took the shard; a sibling
    marked the supervisor already, or it came back as a new session)."""


class WillFailed(Exception):
    """The write did not happen: the endpoint is unreachable or refused it."""


async def give_last_will(
    will: LastWill,
    *,
    shard: str,
    worker: str,
    epoch: int,
    checkpoint: Mapping[str, int],
    wall_now: float,
    log: Log,
) -> None:
    """Release ``shard`` (fenced on ``worker`` and ``epoch``, with the final checkpoint, state
    ``last-will``), then mark ``will.session`` orphaned. Every outcome is logged, none raised."""
    try:
        client = await trio.to_thread.run_sync(_open_client, will, abandon_on_cancel=True)
    except ImportError as exc:
        log.warning(f"last will unavailable: {exc}")
        return
    release = table.release_shard(
        shard, worker, epoch, checkpoint, table.LAST_WILL, fleet=will.fleet or None
    )
    try:
        await _update(client, release.params(will.table))
    except Superseded:
        log.info("last will: the shard has moved on already")
    except WillFailed as exc:
        log.warning(f"last will: release failed: {exc}")
    else:
        log.info(f"last will: released at epoch {epoch}")
    if not will.session:
        return
    orphaned = table.mark_orphaned(worker, will.session, wall_now)
    try:
        await _update(client, orphaned.params(will.table))
    except Superseded:
        pass  # a sibling did it, or the supervisor came back as a new session
    except WillFailed as exc:
        log.warning(f"last will: could not mark the supervisor orphaned: {exc}")


def _open_client(will: LastWill) -> Any:
    """boto3's DynamoDB client for the will's table (in a worker thread: the import is slow)."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(region_name=will.region)
    kwargs: dict[str, Any] = {}
    if will.endpoint_url:
        kwargs["endpoint_url"] = will.endpoint_url
        if session.get_credentials() is None:
            kwargs.update(table.LOCAL_CREDENTIALS)
    config = Config(
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
    )
    return session.client("dynamodb", config=config, **kwargs)


async def _update(client: Any, params: dict[str, Any]) -> None:
    """One UpdateItem in a worker thread, botocore's errors mapped to ours."""
    call = functools.partial(_update_item, client, params)
    await trio.to_thread.run_sync(call, abandon_on_cancel=True)


def _update_item(client: Any, params: dict[str, Any]) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    endpoint = client.meta.endpoint_url
    try:
        client.update_item(**params)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = error.get("Code", "")
        if code == "ConditionalCheckFailedException":
            raise Superseded(code) from exc
        raise WillFailed(f"{endpoint} failed: {code}: {error.get('Message', '')}") from exc
    except BotoCoreError as exc:
        raise WillFailed(f"{endpoint} unreachable: {exc}") from exc
