"""What the supervisor tells operators beyond /metrics: the fleet page and CloudWatch EMF.

The daemon owns one ``Reporter``: it feeds it hand-off and failover events as they happen,
serves its two routes (``/`` the page, ``/fleet`` the JSON, rebuilt from memory at most once
per ``FLEET_MAX_AGE``: never a table read per view), and with ``[cloudwatch] emf = true`` runs
its ``emf_loop``: every ``cloudwatch.interval`` the documents of ``core.emf`` on stderr.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import trio

from supervisor.adapters import emf as emf_adapter
from supervisor.adapters import fleet_page
from supervisor.adapters.http_endpoint import Response
from supervisor.adapters.metrics import Metrics
from supervisor.config.model import Config
from supervisor.core import emf, fleet_view
from supervisor.core.items import Snapshot

log = logging.getLogger("shardvisor.reporting")

FLEET_MAX_AGE = 1.0  # seconds a /fleet document is served before it is rebuilt


class Reporter:
    """The fleet page's routes and events, and the EMF writer, of one supervisor."""

    def __init__(
        self,
        config: Config,
        worker_id: str,
        metrics: Metrics,
        *,
        now: Callable[[], float],
        wall: Callable[[], float],
        snapshot: Callable[[], Snapshot | None],
        local: Callable[[], Mapping[str, Any]],
        runners: Callable[[], Mapping[str, Any]],
        read_ago: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self.config, self.worker_id, self.metrics = config, worker_id, metrics
        self._read_ago = read_ago
        self.now, self.wall = now, wall
        self._snapshot, self._local, self._runners = snapshot, local, runners
        self.events = fleet_view.FleetEvents()
        self._rates = fleet_view.StreamRates()
        self._cache = fleet_view.FleetCache(FLEET_MAX_AGE)
        self._emf_previous: emf.Samples = {}  # the registry at the last EMF documents
        self._emf_seen = 0  # events already in EMF documents

    def routes(self) -> dict[str, Callable[[], Response]]:
        return {"/": self.page, "/fleet": self.fleet}

    def page(self) -> Response:
        return Response(200, fleet_page.PAGE, fleet_page.CONTENT_TYPE)

    def fleet(self) -> Response:
        now = self.now()
        body = self._cache.fresh(now)
        if body is None:
            body = self._cache.store((json.dumps(self._document(now)) + "\n").encode(), now)
        return Response(200, body)

    def _document(self, now: float) -> dict[str, Any]:
        snapshot = self._snapshot() or Snapshot((), ())
        owned = {
            sid: r for sid, r in self._runners().items() if r.state.holds_lease and not r.is_standby
        }
        samples = emf_adapter.registry_samples(self.metrics.registry)
        totals = {
            (labels["shard"], labels["stream"], labels["outcome"]): value
            for (name, pairs), value in samples.items()
            if name == "shardvisor_stream_messages_total"
            for labels in (dict(pairs),)
            if labels["shard"] in owned
        }
        return fleet_view.fleet_document(
            snapshot,
            self.config,
            local=self._local(),
            lag={sid: r.checkpoint_metrics(now)["lag"] for sid, r in owned.items()},
            checkpoints={sid: r.checkpoint for sid, r in owned.items()},
            events=self.events.recent(),
            rates=self._rates.update(totals, now),
            wall=self.wall(),
            read_ago=self._read_ago() if self._read_ago is not None else None,
        )

    async def emf_loop(self) -> None:
        """Every ``cloudwatch.interval``: the interval's documents, one line each, on stderr;
        and once more when cancelled (the supervisor stops): the last, shorter interval's."""
        try:
            while True:
                await trio.sleep(self.config.cloudwatch.interval)
                self.write_emf()
        finally:
            self.write_emf()  # synchronous: safe in a cancelled scope

    def write_emf(self) -> int:
        """One interval's documents; a stderr that refuses them (a closed pipe) is logged and
        costs that interval's metrics, not the supervisor."""
        try:
            return self._write_emf()
        except OSError as exc:
            log.warning("EMF documents not written: %s", exc)
            return 0

    def _write_emf(self) -> int:
        current = emf_adapter.registry_samples(self.metrics.registry)
        documents = emf.emf_documents(
            current,
            self._emf_previous,
            self.events.since(self._emf_seen),
            worker=self.worker_id,
            namespace=self.config.cloudwatch.namespace,
            timestamp_ms=int(self.wall() * 1000),
        )
        self._emf_previous, self._emf_seen = current, self.events.total
        return emf_adapter.write_documents(documents)


__all__ = ["FLEET_MAX_AGE", "Reporter"]
