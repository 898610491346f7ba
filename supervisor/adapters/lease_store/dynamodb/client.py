"""boto3's low-level DynamoDB client, and the one path every request of the store takes.

``DynamoClient.request`` runs one client call in a trio worker thread under a capacity limiter,
counts it, reports it to the metrics observer and maps botocore's errors to the store's, once,
at this boundary (as httpx's ``map_httpcore_exceptions``): nothing above sees botocore.
"""

from __future__ import annotations

import collections
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import boto3
import botocore.loaders
import botocore.session
import trio
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from shard_worker.contract.table import LOCAL_CREDENTIALS
from supervisor.adapters.lease_store.base import (
    LeaseConflict,
    LeaseStoreError,
    StoreUnavailable,
    TableMissing,
)

log = logging.getLogger("shardvisor.store")

THROTTLING = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)


class TableInUse(LeaseStoreError):
    """ResourceInUseException: the table is being created or changed (a concurrent CreateTable
    won the race). Only table administration expects it."""


def client_config(max_concurrency: int) -> Config:
    # Short timeouts: a lease store that does not answer within seconds is as good as down,
    # and the caller must learn it well before its leases run out.
    return Config(
        connect_timeout=1,
        read_timeout=3,
        retries={"mode": "standard", "max_attempts": 3},
        max_pool_connections=max(max_concurrency, 1),
    )


@functools.cache
def _data_loader() -> botocore.loaders.Loader:
    """Parse botocore's service models once per process, not once per store (~60 ms each)."""
    return botocore.loaders.create_loader()


def make_boto_client(region: str, endpoint_url: str, max_concurrency: int) -> Any:
    """One client per store; dummy credentials for a local endpoint when boto3 has none."""
    core = botocore.session.get_session()  # a fresh session: credentials as of now
    core.register_component("data_loader", _data_loader())
    session = boto3.session.Session(region_name=region, botocore_session=core)
    kwargs: dict[str, Any] = {}
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
        if session.get_credentials() is None:
            # Local DynamoDB servers check the signature's presence, not the credentials.
            log.debug("no AWS credentials found; using dummy ones for %s", endpoint_url)
            kwargs.update(LOCAL_CREDENTIALS)
    return session.client("dynamodb", config=client_config(max_concurrency), **kwargs)


def error_kind(exc: ClientError | BotoCoreError, translated: LeaseStoreError) -> str:
    """A metric label: throttled, unavailable, conflict or other."""
    code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else ""
    if code in THROTTLING:
        return "throttled"
    if isinstance(translated, StoreUnavailable):
        return "unavailable"
    if isinstance(translated, LeaseConflict | TableInUse):
        return "conflict"
    return "other"


class DynamoClient:
    """One table's client: where it is, how many requests may run at once, what was asked."""

    def __init__(self, table: str, region: str, endpoint_url: str, max_concurrency: int) -> None:
        self.table = table
        self.region = region
        self._boto = make_boto_client(region, endpoint_url, max_concurrency)
        self.endpoint = str(self._boto.meta.endpoint_url)
        self._limiter = trio.CapacityLimiter(max_concurrency)
        # DynamoDB requests made, per store method (a scan counts one per page).
        self.request_counts: collections.Counter[str] = collections.Counter()
        # Called after every request: (operation, seconds, error kind or ""); for metrics.
        self.observer: Callable[[str, float, str], None] | None = None

    async def request(self, op: str, api: str, /, **params: Any) -> dict[str, Any]:
        """Call the client's ``api`` method (``"update_item"``...) on behalf of the store's
        ``op``, in a worker thread.

        abandon_on_cancel: a cancelled caller (shutdown, a lease deadline) returns at once
        instead of waiting out the read timeout and retries; the thread keeps its limiter
        token until the call really ends, so the concurrency stays bounded.
        """
        self.request_counts[op] += 1
        call = functools.partial(getattr(self._boto, api), **params)
        started = time.monotonic()
        error = ""
        try:
            response: dict[str, Any] = await trio.to_thread.run_sync(
                call, limiter=self._limiter, abandon_on_cancel=True
            )
            return response
        except (ClientError, BotoCoreError) as exc:
            translated = self.translate(op, exc)
            error = error_kind(exc, translated)
            raise translated from exc
        finally:
            if self.observer is not None:
                self.observer(op, time.monotonic() - started, error)

    def translate(self, op: str, exc: ClientError | BotoCoreError) -> LeaseStoreError:
        """The one mapping from botocore's errors to the store's."""
        if isinstance(exc, BotoCoreError):
            return StoreUnavailable(f"{op}: {self.endpoint} unreachable: {exc}")
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code == "ConditionalCheckFailedException":
            return LeaseConflict(f"{op}: condition failed on table {self.table}")
        if code == "ResourceNotFoundException":
            return TableMissing(
                f"table {self.table} does not exist in {self.region} at {self.endpoint}; "
                "run `shardvisor init-table` or set dynamodb.create_table = true"
            )
        if code in THROTTLING or status >= 500:
            return StoreUnavailable(
                f"{op}: {self.endpoint} refused for now: {code} (HTTP {status})"
            )
        failed = f"{op}: {self.endpoint} failed: {code}: {error.get('Message', '')}"
        if code == "ResourceInUseException":
            return TableInUse(failed)
        return LeaseStoreError(failed)
