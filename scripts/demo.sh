#!/usr/bin/env bash
# make demo: a local fleet on free ports of 127.0.0.1 — one broker, a few
# workers, two bursts of work from fleet-submit with a live view of queue
# depth and worker states, a retirement, and a clean stop. Leaves nothing
# running, whatever happens.
#
# Usage: scripts/demo.sh [BIN_DIR]
# Sizes: FLEET_DEMO_WORKERS (4), FLEET_DEMO_COUNT (100000), FLEET_DEMO_SLEEPS (1600)
set -euo pipefail

BIN=$(cd "${1:-build/bin}" && pwd)
WORKERS=${FLEET_DEMO_WORKERS:-4}
COUNT=${FLEET_DEMO_COUNT:-100000}
SLEEPS=${FLEET_DEMO_SLEEPS:-1600}
tmp=$(mktemp -d -t fleet-demo.XXXXXX)
pids=()
view_pid=""

cleanup() {
  [ -n "$view_pid" ] && kill "$view_pid" 2>/dev/null || true
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  local left=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=$((left + 1)); done
  rm -rf "$tmp"
  echo "demo: stopped broker and workers; $left processes left running"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '\n== %s\n' "$*"; }

say "starting fleet-broker"
"$BIN/fleet-broker" --frontend 'tcp://127.0.0.1:*' --backend 'tcp://127.0.0.1:*' \
  --control 'tcp://127.0.0.1:*' --metrics 127.0.0.1:0 --ready-file "$tmp/ready" --heartbeat-ms 250 \
  --log-level warn 2>"$tmp/broker.log" &
pids+=($!)
for _ in $(seq 200); do [ -s "$tmp/ready" ] && break; sleep 0.05; done
[ -s "$tmp/ready" ] || { echo "broker did not start:"; cat "$tmp/broker.log"; exit 1; }
frontend=$(sed -n 's/^frontend=//p' "$tmp/ready")
backend=$(sed -n 's/^backend=//p' "$tmp/ready")
control=$(sed -n 's/^control=//p' "$tmp/ready")
echo "frontend $frontend  backend $backend  control $control"

ctl() { "$BIN/fleet-ctl" --control "$control" "$@"; }

started=()  # pids of the last start_workers
start_workers() {  # handler, then extra flags
  local handler=$1; shift
  started=()
  for i in $(seq "$WORKERS"); do
    "$BIN/fleet-worker" --broker "$backend" --id "demo-$handler-$i" --handler "$handler" \
      --concurrency 4 --log-level warn "$@" 2>>"$tmp/workers.log" &
    pids+=($!)
    started+=($!)
  done
  for _ in $(seq 200); do
    [ "$(ctl workers | grep -c "demo-$handler-")" -ge "$WORKERS" ] && return 0
    sleep 0.05
  done
  echo "workers did not register:"; cat "$tmp/workers.log"; exit 1
}

# The live view: one line every half second from the broker's stats.
live_view() {
  local start=$SECONDS
  while true; do
    local s
    s=$(ctl --json stats 2>/dev/null) || { sleep 0.5; continue; }
    v() { echo "$s" | grep -o "\"$1\":[0-9.e+]*" | head -1 | cut -d: -f2 | cut -d. -f1; }
    printf '  [live %3ss] queue_depth=%-6s inflight=%-4s workers idle=%s busy=%s retiring=%s  done=%s\n' \
      "$((SECONDS - start))" "$(v queued)" "$(v inflight)" "$(v workers_idle)" \
      "$(v workers_busy)" "$(v workers_retiring)" \
      "$(( $(v completed_ok) + $(v completed_failed) ))"
    sleep 0.5
  done
}

say "starting $WORKERS sha256 workers (concurrency 4 each)"
start_workers sha256
sha_pids=("${started[@]}")
ctl workers

live_view &
view_pid=$!

say "burst 1: $COUNT sha256 batches of 100 bytes"
"$BIN/fleet-submit" --broker "$frontend" --count "$COUNT" --size 100 --inflight 4000

say "retiring one sha256 worker; the rest keep serving"
ctl retire "demo-sha256-$WORKERS" --if-idle || true

say "switching to $WORKERS sleep workers (SIGTERM drains the sha256 ones)"
for p in "${sha_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
start_workers sleep

say "burst 2: $SLEEPS batches of 20 ms sleep (queue depth rises, then drains)"
"$BIN/fleet-submit" --broker "$frontend" --count "$SLEEPS" --payload 20 --inflight "$SLEEPS"

kill "$view_pid" 2>/dev/null || true
wait "$view_pid" 2>/dev/null || true
view_pid=""

say "final state"
ctl workers
ctl stats | sed -n '/NAME/,$p' | grep -E 'NAME|submitted|completed|requeued|dead_lettered|duplicates|workers_retired'

say "stopping (workers drain and exit, then the broker)"
