"""The worker id: how this supervisor names itself in DynamoDB (lease owner, worker item).

On ECS the task id is stable for the task's life and shows up in the console, so it beats
"<hostname>-<pid>"; but an unreachable metadata endpoint must never stop the worker starting.
On Kubernetes the pod name (POD_NAME, set by the downward API in conf/kubernetes/) is what
`kubectl get pods` shows and outlives a container restart, so a supervisor restarted in the
same pod takes its own shards back at once. Not $HOSTNAME: every shell sets it, and in a pod
it is the pod name only while the spec sets no hostname; the fallback already uses it.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping

ECS_METADATA_ENV = "ECS_CONTAINER_METADATA_URI_V4"
POD_NAME_ENV = "POD_NAME"  # the downward API's metadata.name (conf/kubernetes/deployment.yaml)
FETCH_TIMEOUT = 1.0  # seconds; the endpoint is link-local, a slow answer means it is not there

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
log = logging.getLogger("shardvisor.worker_id")


def resolve_worker_id(
    configured: str,
    *,
    environ: Mapping[str, str],
    hostname: str,
    pid: int,
    fetch: Callable[[str], bytes] | None = None,
) -> str:
    """The configured id, else the ECS task id, else the Kubernetes pod name, else
    "<hostname>-<pid>"; always sanitized."""
    if configured:
        return sanitize(configured)
    metadata_uri = environ.get(ECS_METADATA_ENV, "")
    if metadata_uri:
        task_id = _ecs_task_id(metadata_uri, fetch or _http_get)
        if task_id:
            return sanitize(task_id)
    pod_name = environ.get(POD_NAME_ENV, "").strip()
    if pod_name:
        return sanitize(pod_name)
    return sanitize(f"{hostname}-{pid}")


def sanitize(worker_id: str) -> str:
    """Replace characters outside [A-Za-z0-9_.:-] with "-" (the config's worker.id alphabet)."""
    return _UNSAFE.sub("-", worker_id)


def _http_get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the error response; left open, it leaks the socket
        raise


def _ecs_task_id(metadata_uri: str, fetch: Callable[[str], bytes]) -> str | None:
    """The ECS task id, or None (with a warning) if the metadata endpoint fails us."""
    url = metadata_uri.rstrip("/") + "/task"
    try:
        return _task_id_from(fetch(url))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        log.warning(
            "cannot read the ECS task id from %s (%s); using %s, else <hostname>-<pid>",
            url,
            exc,
            POD_NAME_ENV,
        )
        return None


def _task_id_from(body: bytes) -> str:
    """The last "/" segment of the task metadata's TaskARN (.../task/<cluster>/<task id>)."""
    document = json.loads(body)
    arn = document.get("TaskARN") if isinstance(document, dict) else None
    task_id = arn.rsplit("/", 1)[-1] if isinstance(arn, str) else ""
    if not task_id:
        raise ValueError(f"no TaskARN with a task id in {body[:200]!r}")
    return task_id
