#!/usr/bin/env bash
# One command for every row of docs/benchmarks.md: set-up included (the project's .venv, dynalite
# from npm, the peers in virtualenvs of their own under out/bench/), everything on 127.0.0.1
# against moto's DynamoDB server and dynalite, about 23 minutes on 2 cores.
#
#   scripts/bench.sh           full run: waits for the machine to be idle (no other benchmark or
#                              pytest running, up to BENCH_WAIT_IDLE seconds, default 1200), then
#                              measures and publishes docs/benchmarks.md
#   scripts/bench.sh --quick   smoke run (about 90 s): every part once, side by side; writes
#                              out/bench/benchmarks.md only (tests/e2e/test_bench_smoke.py runs it)
#   scripts/bench.sh --no-publish   a full run that writes out/bench/benchmarks.md only
#
# The programs are the package scripts/benchmarks/, run as modules (python -m benchmarks.<name>);
# each writes out/bench/<part>.json, and benchmarks.report renders them all.
# Exit 69 when a peer cannot be installed (no package index reachable).
set -euo pipefail
cd "$(dirname "$0")/.."
# The benchmarks are not installed (the product's packages must not ship them): Python finds the
# package through PYTHONPATH, absolute because the processes they start (shard workers loading
# a benchmark's handler, the peers' programs) run in other directories and inherit it.
export PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"

QUICK=0
PUBLISH=--publish
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    --no-publish) PUBLISH="" ;;
    -h | --help)
      sed -n '2,15p' "$0"
      exit 0
      ;;
    *)
      echo "usage: scripts/bench.sh [--quick | --no-publish]" >&2
      exit 64
      ;;
  esac
done

PYTHON=${PYTHON:-python3}
OUT=out/bench
START=$(date +%s)
log() { printf '[bench %4ss] %s\n' "$(($(date +%s) - START))" "$*"; }

# --- set-up -------------------------------------------------------------------------------------
mkdir -p "$OUT"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c 'import supervisor.drivers.daemon, shard_worker, trio_websocket, moto, pytest' \
  >/dev/null 2>&1; then
  log "installing the project into .venv"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test]"
fi
if [ ! -x node_modules/.bin/dynalite ]; then
  log "installing dynalite (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error
fi

# peer_venv DIR REQUIREMENT...: a virtualenv of the peer's own (supervisord's import name is
# `supervisor`, like ours), made once and kept while its requirements stay the same.
peer_venv() {
  local dir=$1
  shift
  local want="$*"
  if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.bench-requirements" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  log "installing $want into $dir"
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  if ! "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; then
    echo "bench: cannot install $want (is the package index reachable?)" >&2
    rm -rf "$dir"
    exit 69
  fi
  echo "$want" >"$dir/.bench-requirements"
}
peer_venv "$OUT/venv-dynamodb-lock" "python-dynamodb-lock==0.9.1"
peer_venv "$OUT/venv-supervisord" "supervisor==4.3.0" "websockets==17.4"

# --- wait for an idle machine (full run only) ---------------------------------------------------
if [ "$QUICK" = 0 ]; then
  waited=0
  limit=${BENCH_WAIT_IDLE:-1200}
  while others=$(pgrep -af "benchmarks\.|pytest" |
    grep -v -e "^$$ " -e pgrep || true) && [ -n "$others" ]; do
    if [ "$waited" -ge "$limit" ]; then
      log "still busy after ${limit}s; measuring anyway (the report notes a busy machine):"
      echo "$others" | cut -c1-160 >&2
      break
    fi
    if [ $((waited % 60)) = 0 ]; then
      log "waiting for other benchmarks/tests to end:"
      echo "$others" | cut -c1-160
    fi
    sleep 5
    waited=$((waited + 5))
  done
  START=$(date +%s)
fi

rm -f "$OUT"/*.json "$OUT"/benchmarks.md
PY=.venv/bin/python
BG_PIDS=()
cleanup() {
  local pid
  for pid in "${BG_PIDS[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true # it stops its supervisors and servers itself
    fi
  done
  for pid in "${BG_PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
# background NAME COMMAND...: run a part beside the foreground ones, its output in OUT/NAME.log.
background() {
  local name=$1
  shift
  "$@" >"$OUT/$name.log" 2>&1 &
  BG_PIDS+=("$!")
  BG_NAMES+=("$name")
}
BG_NAMES=()
# join: wait for every background part; fail (with its log) if one failed.
join() {
  local i failed=0
  for i in "${!BG_PIDS[@]}"; do
    if ! wait "${BG_PIDS[$i]}"; then
      echo "bench: ${BG_NAMES[$i]} failed:" >&2
      tail -40 "$OUT/${BG_NAMES[$i]}.log" >&2
      failed=1
    fi
  done
  BG_PIDS=()
  BG_NAMES=()
  return "$failed"
}

if [ "$QUICK" = 1 ]; then
  # Smoke run: every part once, cut to a trial or two; the timer-bound parts in the background.
  log "quick: fleet + peers, requests, live-only feed, fleet growth in the background (logs in $OUT/)"
  background fleet "$PY" -m benchmarks.fleet --quick
  background requests "$PY" -m benchmarks.dynamodb_requests --quick
  background live "$PY" -m benchmarks.live --quick
  background growth "$PY" -m benchmarks.fleet_growth --quick
  log "quick: restart"
  "$PY" -m benchmarks.restart --quick
  log "quick: throughput"
  "$PY" -m benchmarks.throughput --quick 2>"$OUT/throughput.log"
  log "quick: memory and scale"
  "$PY" -m benchmarks.scale --quick
  join
  "$PY" -m benchmarks.report --mode quick --run-seconds "$(($(date +%s) - START))"
  log "quick run done: $OUT/benchmarks.md (docs/benchmarks.md is only written by a full run)"
else
  log "stage 1/7: failover, hand-off (rows 1, 2), python-dynamodb-lock, supervisord, memory (row 5)"
  "$PY" -m benchmarks.fleet
  cat "$OUT/memory.log"
  log "stage 2/7: DynamoDB requests on the wire (row 6)"
  "$PY" -m benchmarks.dynamodb_requests
  log "stage 3/7: child crash -> writing again (row 3)"
  "$PY" -m benchmarks.restart
  log "stage 4/7: throughput per child (row 4) beside bare trio-websocket and websockets loops"
  "$PY" -m benchmarks.throughput 2>"$OUT/throughput.log"
  log "stage 5/7: scale on one host (row 7)"
  "$PY" -m benchmarks.scale --part scale
  log "stage 6/7: live-only feed: lost per deploy and host death, writer gap, standby cost (row 8)"
  "$PY" -m benchmarks.live
  log "stage 7/7: DynamoDB work per worker at 3, 6, 12 and 24 supervisors on the wire (row 9)"
  "$PY" -m benchmarks.fleet_growth
  log "stage 7/7: the same on protocol 2 (row 9)"
  "$PY" -m benchmarks.fleet_growth --protocol 2
  "$PY" -m benchmarks.report $PUBLISH --mode full --run-seconds "$(($(date +%s) - START))"
  log "full run done: ${PUBLISH:+docs/benchmarks.md and }$OUT/benchmarks.md"
fi
