#!/usr/bin/env bash
# Fresh machine -> running demo: a virtualenv in .venv, the package with its demo extra (moto),
# then `shardvisor demo`
# (moto's DynamoDB server in-process, the reference feed, 3 supervisors over 6 shards).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv.sh
. scripts/venv.sh
project_venv -e ".[demo]"
exec .venv/bin/shardvisor demo "$@"
