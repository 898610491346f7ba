# shardvisor container image: one supervisor per container (ECS/Fargate task, Kubernetes pod...).
#   docker build -t shardvisor .
#   docker run --rm -v "$PWD/my.toml:/etc/shardvisor/shardvisor.toml:ro" shardvisor
# conf/ecs-task-definition.json runs it on Fargate; docs/deploy.md explains both.

ARG PYTHON_IMAGE=python:3.12-slim

# --- build: the project's wheel, installed with its dependencies into /opt/venv ---------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY supervisor ./supervisor
COPY shard_worker ./shard_worker
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install /wheels/shardvisor-*.whl

# --- runtime: the same base (same interpreter path), the venv, no compiler, no pip cache ------
FROM ${PYTHON_IMAGE}
# tini: a tiny init that forwards SIGTERM to the supervisor and reaps orphaned processes.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 shardvisor \
 && useradd --system --uid 10001 --gid shardvisor --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin shardvisor
COPY --from=build /opt/venv /opt/venv
# The default config: the example (it points at a local test feed). Replace it with yours: a
# derived image (COPY my.toml /etc/shardvisor/shardvisor.toml) or a read-only bind mount.
COPY conf/shardvisor.example.toml /etc/shardvisor/shardvisor.toml
# The working directory holds the sink files (default path out/{shard}/{stream}.{epoch}.jsonl).
# Owned by the service user; VOLUME lets ECS copy it (with its ownership) into the task's
# bind mount, so it stays writable under readonlyRootFilesystem.
RUN install -d -o shardvisor -g shardvisor -m 0750 /var/lib/shardvisor

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONFAULTHANDLER=1 \
    TINI_SUBREAPER=1
WORKDIR /var/lib/shardvisor
VOLUME ["/var/lib/shardvisor"]
USER 10001:10001

# SIGTERM drains: every child flushes and reports its final checkpoint, the leases are released
# (peers take the shards at their next reconcile) and the supervisor exits 0 within
# [supervisor] shutdown_timeout (20 s): give `docker stop` more (-t 25), ECS stopTimeout 25.
STOPSIGNAL SIGTERM
# GET /healthz on the [http] listen address (default 127.0.0.1:9400); any error or non-2xx
# status exits 1 = unhealthy.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9400/healthz', timeout=3)"]

ENTRYPOINT ["tini", "--", "shardvisor"]
CMD ["run", "-c", "/etc/shardvisor/shardvisor.toml"]
