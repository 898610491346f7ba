"""The thin side of CloudWatch EMF: read the Prometheus registry, write documents as lines.

``core.emf`` decides what the documents say; this module only samples the registry the
/metrics endpoint exposes (so both show the same figures) and writes one JSON object per line
to the log stream, where the awslogs driver, the CloudWatch agent or Fluent Bit pick them up.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry

from supervisor.adapters.logs import redact
from supervisor.core.emf import Samples


def registry_samples(registry: CollectorRegistry) -> Samples:
    """Counter totals and gauge values, keyed by (sample name, sorted labels); histogram
    buckets and ``_created`` stamps are left out (EMF carries durations as events)."""
    samples = {}
    for family in registry.collect():
        if family.type not in ("counter", "gauge"):
            continue
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_total"):
                continue
            samples[sample.name, tuple(sorted(sample.labels.items()))] = float(sample.value)
    return samples


def write_documents(documents: Iterable[dict[str, Any]], fd: int | None = None) -> int:
    """Each document as one line in one ``write`` (a line of a few hundred bytes is not torn
    by the children writing to the same stream), secrets masked as in every log line; to
    stderr's descriptor unless ``fd`` says otherwise. Returns how many were written."""
    target = sys.stderr.fileno() if fd is None else fd
    count = 0
    for document in documents:
        data = (redact(json.dumps(document, separators=(",", ":"))) + "\n").encode()
        while data:
            data = data[os.write(target, data) :]
        count += 1
    return count


__all__ = ["registry_samples", "write_documents"]
