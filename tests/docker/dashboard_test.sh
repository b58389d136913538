#!/usr/bin/env bash
# Every query of the Grafana dashboard (docker/grafana/dashboards/fleet.json)
# returns data from a real Prometheus scraping a real fleet, without Docker:
# fleet-broker, one fleet-worker of our own (its /metrics scraped too) and
# fleet-autoscaler with the process launcher, all on 127.0.0.1; Debian's
# prometheus scraping the three every second; a burst of sleep batches that
# makes the pool grow and shrink back, and one batch that fails; then
# check_dashboard.py --prometheus until every expression has data.
#
# Usage: dashboard_test.sh BIN_DIR
# Exit: 0 passed, 1 failed, 77 skipped (no prometheus binary).
set -u

bin=$(cd "${1:?usage: $0 BIN_DIR}" && pwd) || exit 1
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
prometheus=$(command -v prometheus || true)
if [[ -z $prometheus ]]; then
  echo "SKIP: no prometheus binary (Debian package prometheus; scripts/deps.sh installs it)"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fleet-dashboard.XXXXXX")
prefix="dash-$$-"  # ids of the workers the autoscaler starts, ours alone
scaler_pid= worker_pid= broker_pid= prom_pid=
started_us=${EPOCHREALTIME/./}

log() {
  local ms=$(((${EPOCHREALTIME/./} - started_us) / 1000))
  printf '[%d.%03d s] %s\n' $((ms / 1000)) $((ms % 1000)) "$*"
}

stop() {  # pid, seconds to wait after SIGTERM before SIGKILL
  local pid=$1 tenths=$(($2 * 10)) i
  [[ -n $pid ]] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < tenths; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

cleanup() {
  local rc=$?
  # The autoscaler first: it drains and stops the workers it started.
  stop "$scaler_pid" 10
  stop "$worker_pid" 5
  stop "$broker_pid" 5
  stop "$prom_pid" 5
  local left
  left=$(pgrep -f -- "--id ${prefix}" || true)
  if [[ -n $left ]]; then
    echo "FAIL: workers left running after the autoscaler stopped: $left"
    kill -KILL $left 2>/dev/null
    rc=1
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.log; do
    [[ -s $f ]] || continue
    echo "---- $(basename "$f") (last 30 lines)"
    tail -n 30 "$f"
  done
  exit 1
}

# all_alive: every process started so far is still running.
all_alive() {
  local name pid
  for name in broker worker scaler prom; do
    pid=${name}_pid
    pid=${!pid}
    [[ -z $pid ]] || kill -0 "$pid" 2>/dev/null || fail "$name (pid $pid) exited early"
  done
}

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.1 s; fails at once
# if one of our processes dies meanwhile.
wait_for() {
  local seconds=$1 what=$2
  shift 2
  local deadline=$(($(date +%s) + seconds))
  until "$@" >/dev/null 2>&1; do
    all_alive
    (($(date +%s) < deadline)) || fail "$what not within ${seconds} s"
    sleep 0.1
  done
}

# http_ok URL: answers 200.  http_ok URL --contains TEXT: and the body has TEXT.
# http_ok PROMETHEUS_URL PROMQL MIN: the query's first value is >= MIN.
http_ok() {
  "$python" - "$@" <<'EOF'
import json, sys, urllib.parse, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
url, rest = sys.argv[1], sys.argv[2:]
if rest and rest[0] != "--contains":
    url += "/api/v1/query?" + urllib.parse.urlencode({"query": rest[0]})
with opener.open(url, timeout=2) as r:
    body = r.read()
if rest and rest[0] == "--contains":
    sys.exit(0 if rest[1].encode() in body else 1)
if rest:
    result = json.loads(body)["data"]["result"]
    sys.exit(0 if result and float(result[0]["value"][1]) >= float(rest[1]) else 1)
EOF
}

# Free ports for the HTTP endpoints (the broker's ZeroMQ sockets bind port 0).
read -r port_broker port_worker port_scaler port_prom < <("$python" -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
')

"$bin/fleet-broker" --frontend 'tcp://127.0.0.1:*' --backend 'tcp://127.0.0.1:*' \
  --control 'tcp://127.0.0.1:*' --metrics "127.0.0.1:$port_broker" --heartbeat-ms 250 \
  --ready-file "$tmp/ready" --log-level warn >"$tmp/broker.log" 2>&1 &
broker_pid=$!
wait_for 10 "fleet-broker's ready file" test -s "$tmp/ready"
val() { sed -n "s/^$1=//p" "$tmp/ready"; }
frontend=$(val frontend) backend=$(val backend) control=$(val control)
[[ -n $frontend && -n $backend && -n $control ]] || fail "ready file incomplete: $(cat "$tmp/ready")"

"$bin/fleet-worker" --broker "$backend" --id "static-$$" --handler sleep --concurrency 2 \
  --metrics "127.0.0.1:$port_worker" --log-level warn >"$tmp/worker.log" 2>&1 &
worker_pid=$!
# On the broker's /metrics before the autoscaler starts, or the autoscaler
# would launch a worker of its own to reach --min (and retire it at once).
wait_for 10 "fleet-worker on the broker's /metrics" \
  http_ok "http://127.0.0.1:$port_broker/metrics" --contains "worker=\"static-$$\""

# --min 1: the static worker is the floor, so the pool grows for the burst and
# shrinks back to it.
"$bin/fleet-autoscaler" --control "$control" \
  --metrics-source "http://127.0.0.1:$port_broker/metrics" \
  --worker-args "--broker $backend --handler sleep --log-level warn" \
  --min 1 --max 3 --idle-seconds 1 --cooldown-seconds 1 --stabilization-seconds 1 \
  --poll-ms 250 --grace-seconds 2 --id-prefix "$prefix" \
  --metrics "127.0.0.1:$port_scaler" >"$tmp/autoscaler.log" 2>&1 &
scaler_pid=$!


cat >"$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: fleet-broker
    static_configs: [{targets: ["127.0.0.1:$port_broker"]}]
  - job_name: fleet-worker
    static_configs: [{targets: ["127.0.0.1:$port_worker"]}]
  - job_name: fleet-autoscaler
    static_configs: [{targets: ["127.0.0.1:$port_scaler"]}]
EOF
"$prometheus" --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
  --web.listen-address="127.0.0.1:$port_prom" --log.level=warn >"$tmp/prometheus.log" 2>&1 &
prom_pid=$!
prom="http://127.0.0.1:$port_prom"
log "broker, worker, autoscaler and prometheus ($prom) started"

wait_for 30 "prometheus ready" http_ok "$prom/-/ready"
# Scrape every target once before any work, so the counters' zeros are stored
# and increase() sees the first launch and the first retirement.
wait_for 30 "prometheus scraping all three targets" http_ok "$prom" 'count(up == 1)' 3
all_alive
log "all targets up"

# 120 batches of 50 ms: more than the static worker's 2 slots can take, so
# the autoscaler starts workers up to --max, then retires them when idle.
"$bin/fleet-submit" --broker "$frontend" --count 120 --payload 50 --inflight 120 \
  --timeout-seconds 60 >"$tmp/submit-ok.log" 2>&1 || fail "fleet-submit (ok burst) failed"
grep -q "submitted=120 ok=120 failed=0 lost=0" "$tmp/submit-ok.log" ||
  fail "burst summary: $(tail -n 1 "$tmp/submit-ok.log")"
# The sleep handler fails a payload that is not a number of milliseconds.
"$bin/fleet-submit" --broker "$frontend" --count 1 --payload not-a-number \
  --timeout-seconds 30 >"$tmp/submit-failed.log" 2>&1 || fail "fleet-submit (failing batch) failed"
grep -q "submitted=1 ok=0 failed=1 lost=0" "$tmp/submit-failed.log" ||
  fail "failing batch summary: $(tail -n 1 "$tmp/submit-failed.log")"
log "workload done: $(tail -n 1 "$tmp/submit-ok.log"); $(tail -n 1 "$tmp/submit-failed.log")"

# The scale-down annotation needs a retirement: wait for the pool to shrink.
wait_for 30 "the autoscaler retiring a worker" grep -q "decision scale_down" "$tmp/autoscaler.log"
log "pool scaled down"

"$python" "$here/check_dashboard.py" --prometheus "$prom" --rate-interval 1m --wait 60 \
  >"$tmp/check.log" 2>&1
rc=$?
cat "$tmp/check.log"
((rc == 0)) || fail "check_dashboard.py found queries without data (exit $rc)"
log "PASS: every dashboard query returns data"
