#!/usr/bin/env bash
# Fresh machine -> whole test suite: Python test dependencies in .venv, dynalite from npm (pinned in
# package-lock.json), ruff, mypy, then pytest. The DynamoDB-compatible servers (moto's server, dynalite)
# are started by the tests themselves on 127.0.0.1 and stopped when they end.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv.sh
. scripts/venv.sh
project_venv -e ".[test]"
if [ ! -x node_modules/.bin/dynalite ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy supervisor shard_worker
# Two pytest-xdist workers (the machine we aim at has two cores; `scripts/test.sh -n 0 ...` runs
# in one process). pytest exits 5 when it collected no test: that fails this script too, on purpose.
exec .venv/bin/python -m pytest -n 2 --dist worksteal "$@"
