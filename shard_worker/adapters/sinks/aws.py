"""What the AWS batch sinks (kinesis, sqs) share: ``AwsBatchSink`` (limits, one boto3 client,
a batch cut into requests within the limits, resending only what failed, close); a kind says
only how a record becomes an entry and how one request is sent.

boto3 is imported inside the functions: a worker that writes JSON lines never loads it.
"""

from __future__ import annotations

import abc
import functools
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs
import trio

from shard_worker.adapters.sinks.batch import DeliveryFailed
from shard_worker.core.backoff import Backoff
from shard_worker.records import Record

if TYPE_CHECKING:
    import botocore.loaders

E = TypeVar("E")  # one entry of a request, as the destination's API spells it

# Whole-call error codes worth another attempt: throttling and the service's own trouble.
RETRYABLE_CODES = frozenset(
    {
        "ThrottlingException",
        "Throttling",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "LimitExceededException",
        "KMSThrottlingException",
        "KMS.ThrottlingException",
        "InternalFailure",
        "InternalError",
        "InternalServerError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "AWS.SimpleQueueService.RequestThrottled",
        "AWS.SimpleQueueService.InternalError",
    }
)


@attrs.frozen
class EntryFailure:
    """Entry ``index`` of a request was not accepted; ``retry``: worth sending again."""

    index: int
    retry: bool
    reason: str


def is_retryable(exc: BaseException) -> bool:
    """Throttling, 5xx answers and connection trouble. Resending after a lost answer may make
    a duplicate, which at-least-once allows; anything else will fail the same way again."""
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return exc.response.get("Error", {}).get("Code") in RETRYABLE_CODES or status >= 500
    return isinstance(exc, BotoConnectionError | HTTPClientError)


def error_text(exc: BaseException) -> str:
    """``Code: message`` of a ClientError, else the exception's repr."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', '?')}: {error.get('Message', '')}"
    return repr(exc)


async def send_with_retries(
    pending: Sequence[tuple[Record, E]],
    send: Callable[[list[E]], list[EntryFailure]],
    *,
    max_attempts: int,
    backoff: Backoff,
) -> None:
    """Send ``pending`` entries with the blocking ``send`` (in a worker thread); resend only the
    entries it reports as retryable failures, in order, after a backoff, and the whole request
    when it fails with a retryable error; at most ``max_attempts`` requests. Raises
    DeliveryFailed with every record not accepted (in batch order) and why."""
    from botocore.exceptions import BotoCoreError, ClientError

    todo = [(position, record, entry) for position, (record, entry) in enumerate(pending)]
    rejected: list[tuple[int, Record]] = []
    reasons: dict[str, None] = {}  # ordered, without repeats
    attempt = 0
    while todo:
        attempt += 1
        entries = [entry for _, _, entry in todo]
        try:
            # abandon_on_cancel: the fence deadline cancels a delivery at once; the request
            # in flight may still land (the epoch in every record is for that).
            failures = await trio.to_thread.run_sync(send, entries, abandon_on_cancel=True)
        except (ClientError, BotoCoreError) as exc:
            reason = error_text(exc)
            if not is_retryable(exc):
                rejected.extend((position, record) for position, record, _ in todo)
                reasons[reason] = None
                break
            retry = todo
        else:
            retry = []
            for failure in failures:
                position, record, entry = todo[failure.index]
                if failure.retry:
                    retry.append((position, record, entry))
                else:
                    rejected.append((position, record))
                    reasons[failure.reason] = None
            reason = next((failure.reason for failure in failures if failure.retry), "")
            retry.sort(key=lambda item: item[0])  # send order = batch order
        todo = retry
        if todo and attempt >= max_attempts:
            rejected.extend((position, record) for position, record, _ in todo)
            reasons[f"gave up after {attempt} attempts, last: {reason}"] = None
            break
        if todo:
            await trio.sleep(backoff.next_delay())
    if rejected:
        rejected.sort(key=lambda item: item[0])
        raise DeliveryFailed([record for _, record in rejected], "; ".join(reasons))


async def deliver_entries(
    batch: Sequence[Record],
    entries: Sequence[tuple[Record, E, int]],
    rejected: Sequence[tuple[Record, str]],
    send: Callable[[list[E]], list[EntryFailure]],
    *,
    max_records: int,
    max_bytes: int,
    max_attempts: int,
    backoff: Callable[[], Backoff],
) -> None:
    """Send ``entries`` (record, API entry, bytes) in requests within the limits, each with
    send_with_retries; ``rejected`` records (with why) could not be sent at all. After a
    request fails, later ones are not tried (the same trouble would hit them). Raises one
    DeliveryFailed naming every record not accepted, in batch order."""
    failed = [record for record, _ in rejected]
    reasons = [reason for _, reason in rejected]
    requests: list[list[tuple[Record, E]]] = [[]]
    request_bytes = 0
    for record, entry, size in entries:
        if requests[-1] and (len(requests[-1]) >= max_records or request_bytes + size > max_bytes):
            requests.append([])
            request_bytes = 0
        requests[-1].append((record, entry))
        request_bytes += size
    for number, request in enumerate(requests):
        if not request:
            continue
        try:
            await send_with_retries(request, send, max_attempts=max_attempts, backoff=backoff())
        except DeliveryFailed as exc:
            failed.extend(exc.records)
            reasons.append(exc.reason)
            later = [record for rest in requests[number + 1 :] for record, _ in rest]
            if later:
                failed.extend(later)
                reasons.append(f"{len(later)} later record(s) not sent after that failure")
            break
    if failed:
        order = {id(record): position for position, record in enumerate(batch)}
        failed.sort(key=lambda record: order.get(id(record), 0))
        raise DeliveryFailed(failed, "; ".join(reasons))


class AwsBatchSink(abc.ABC, Generic[E]):
    """At-least-once delivery to one AWS destination, ``service``'s (Sink protocol). Subclasses
    give ``_entry`` (a record's API entry and its size, or why it cannot be sent at all) and
    ``_send`` (one blocking request). ``client``: a boto3 client to use instead of making one
    (tests); ``records_limit``, ``bytes_limit``: the API's own, which the batch limits must
    not exceed."""

    def __init__(
        self,
        service: str,
        *,
        region: str,
        endpoint_url: str,
        max_records: int,
        records_limit: int,
        max_bytes: int,
        bytes_limit: int,
        max_attempts: int,
        backoff: tuple[float, float],
        client: Any,
        rng: random.Random | None,
    ) -> None:
        if not 1 <= max_records <= records_limit:
            raise ValueError(f"max_records must be in 1..{records_limit}, got {max_records}")
        if not 1 <= max_bytes <= bytes_limit:
            raise ValueError(f"max_bytes must be in 1..{bytes_limit}, got {max_bytes}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._max_attempts = max_attempts
        self._backoff = backoff  # (initial, max) seconds
        self._rng = rng or random.Random()
        self._client = client if client is not None else make_client(service, region, endpoint_url)
        self._closed = False

    @abc.abstractmethod
    def _entry(self, record: Record) -> tuple[E, int] | str:
        """``record``'s entry and the bytes it counts against ``max_bytes``, or why it is not
        sendable (over a limit)."""

    @abc.abstractmethod
    def _send(self, entries: list[E]) -> list[EntryFailure]:
        """One request (blocking); the entries the destination did not take, and why."""

    async def deliver(self, batch: Sequence[Record]) -> None:
        """Send every record of ``batch`` (in several requests if it is over the limits)."""
        if self._closed:
            raise RuntimeError("deliver on a closed sink")
        entries: list[tuple[Record, E, int]] = []
        rejected: list[tuple[Record, str]] = []
        for record in batch:
            made = self._entry(record)
            if isinstance(made, str):
                rejected.append((record, made))
            else:
                entries.append((record, *made))
        await deliver_entries(
            batch,
            entries,
            rejected,
            self._send,
            max_records=self.max_records,
            max_bytes=self.max_bytes,
            max_attempts=self._max_attempts,
            backoff=lambda: Backoff(*self._backoff, rng=self._rng),
        )

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await trio.to_thread.run_sync(self._client.close)


@functools.cache
def _data_loader() -> botocore.loaders.Loader:
    """Parse botocore's service models once per process, not once per client."""
    import botocore.loaders

    return botocore.loaders.create_loader()


def make_client(service: str, region: str, endpoint_url: str = "") -> Any:
    """One boto3 client for one sink. botocore itself does not retry (the sinks resend only
    what failed, with their own backoff); dummy credentials for a local endpoint when none are
    configured (moto and the like check that a signature is there, not the keys)."""
    import boto3
    import botocore.session
    from botocore.config import Config

    core = botocore.session.get_session()  # a fresh session: credentials as of now
    core.register_component("data_loader", _data_loader())
    session = boto3.session.Session(region_name=region or None, botocore_session=core)
    kwargs: dict[str, Any] = {}
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
        if session.get_credentials() is None:
            kwargs.update(aws_access_key_id="local", aws_secret_access_key="local")
    config = Config(
        connect_timeout=3,
        read_timeout=10,
        retries={"mode": "standard", "max_attempts": 1},
        max_pool_connections=2,
    )
    return session.client(service, config=config, **kwargs)
