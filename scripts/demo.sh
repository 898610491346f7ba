#!/usr/bin/env bash
# Fresh machine -> running demo: a virtualenv in .venv, the package with its demo extra (moto),
# then `shardvisor demo`
# (moto's DynamoDB server in-process, the reference feed, 3 supervisors over 6 shards).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[demo]"
exec .venv/bin/shardvisor demo "$@"
