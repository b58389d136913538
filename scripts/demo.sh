#!/usr/bin/env bash
# make demo: the whole local fleet without Docker on free ports of 127.0.0.1:
# fleet-broker, fleet-autoscaler with the process launcher (min 0, max 4,
# short idle threshold), two bursts of work from fleet-submit with a live
# view once a second (queue depth, pool by state, desired), the pool growing
# and shrinking back to zero, and a closing summary. Leaves nothing running,
# whatever happens.
#
# Usage: scripts/demo.sh [BIN_DIR]
# Sizes: FLEET_DEMO_MAX (4), FLEET_DEMO_BURST1 (400), FLEET_DEMO_BURST2 (200)
set -euo pipefail

BIN=$(cd "${1:-build/bin}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
MAX=${FLEET_DEMO_MAX:-4}
BURST1=${FLEET_DEMO_BURST1:-400}
BURST2=${FLEET_DEMO_BURST2:-200}
tmp=$(mktemp -d -t fleet-demo.XXXXXX)
pids=()
view_pid=""

cleanup() {
  [ -n "$view_pid" ] && kill "$view_pid" 2>/dev/null || true
  # The autoscaler drains the workers it started; the broker goes last.
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  local left
  left=$(pgrep -fc -- "[-]-id demo-$$-" || true)
  rm -rf "$tmp"
  echo "demo: stopped autoscaler, workers and broker; ${left:-0} processes left running"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '\n== %s\n' "$*"; }

wait_file() {  # file, what
  for _ in $(seq 200); do [ -s "$1" ] && return 0; sleep 0.05; done
  echo "$2 did not start:"; cat "$tmp"/*.log; exit 1
}

say "starting fleet-broker"
"$BIN/fleet-broker" --frontend 'tcp://127.0.0.1:*' --backend 'tcp://127.0.0.1:*' \
  --control 'tcp://127.0.0.1:*' --metrics 127.0.0.1:0 --ready-file "$tmp/ready" \
  --heartbeat-ms 250 --log-level warn 2>"$tmp/broker.log" &
pids+=($!)
wait_file "$tmp/ready" fleet-broker
val() { sed -n "s/^$1=//p" "$tmp/ready"; }
frontend=$(val frontend); backend=$(val backend); control=$(val control); metrics=$(val metrics)
echo "frontend $frontend  backend $backend  control $control  metrics $metrics"

say "starting fleet-autoscaler: process launcher, min 0, max $MAX, idle 2 s, cooldown 1 s, stabilization 2 s"
"$BIN/fleet-autoscaler" --control "$control" --metrics-source "$metrics" \
  --worker-args "--broker $backend --handler sleep --log-level warn" \
  --min 0 --max "$MAX" --idle-seconds 2 --cooldown-seconds 1 --stabilization-seconds 2 \
  --poll-ms 250 --grace-seconds 5 --id-prefix "demo-$$-" --metrics 127.0.0.1:0 \
  2>"$tmp/autoscaler.log" &
pids=("$!" "${pids[@]}")  # stopped first
for _ in $(seq 200); do grep -q "own metrics http" "$tmp/autoscaler.log" && break; sleep 0.05; done
scaler_metrics=$(grep -o 'own metrics http[^;]*' "$tmp/autoscaler.log" | head -1 | cut -d' ' -f3)

/usr/bin/python3 "$HERE/live_view.py" "$metrics" "$scaler_metrics" &
view_pid=$!

pool_at_zero() {
  for _ in $(seq 400); do
    [ "$("$BIN/fleet-ctl" --control "$control" workers | tail -n +2 | wc -l)" -eq 0 ] && return 0
    sleep 0.1
  done
  return 1
}

say "burst 1: $BURST1 batches of 50 ms sleep; the pool grows from 0 to $MAX"
"$BIN/fleet-submit" --broker "$frontend" --count "$BURST1" --payload 50 --inflight "$BURST1" \
  | tee "$tmp/summary1"
say "quiet: idle workers are retired through the broker, back to 0"
pool_at_zero || echo "(pool not back at zero yet)"
say "burst 2: $BURST2 batches of 20 ms sleep"
"$BIN/fleet-submit" --broker "$frontend" --count "$BURST2" --payload 20 --inflight "$BURST2" \
  | tee "$tmp/summary2"
pool_at_zero || echo "(pool not back at zero yet)"
sleep 1  # one more live line showing the empty pool

kill "$view_pid" 2>/dev/null || true
wait "$view_pid" 2>/dev/null || true
view_pid=""

say "summary"
echo "burst 1: $(cat "$tmp/summary1")"
echo "burst 2: $(cat "$tmp/summary2")"
echo "autoscaler decisions:"
grep -o 'decision [a-z_]* ([a-z_]*)' "$tmp/autoscaler.log" | sort | uniq -c | sed 's/^/  /'
"$BIN/fleet-ctl" --control "$control" stats | sed -n '/NAME/,$p' \
  | grep -E 'NAME|submitted|completed|requeued|dead_lettered|workers_retired|retire_refused'
