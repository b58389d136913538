#!/usr/bin/env bash
# Runs docs/examples/producer.py (written from docs/protocol.md alone) against
# a live fleet-broker and fleet-worker on 127.0.0.1.
# Usage: python_producer_test.sh BIN_DIR PRODUCER_PY
set -u

bin_dir=${1:?usage: $0 BIN_DIR PRODUCER_PY}
producer=${2:?usage: $0 BIN_DIR PRODUCER_PY}
python=/usr/bin/python3  # Debian's interpreter, which has python3-zmq and python3-msgpack

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fleet-pyprod.XXXXXX")
broker_pid=
worker_pid=

cleanup() {
  for pid in $worker_pid $broker_pid; do
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in broker.log worker.log producer.out; do
    if [[ -f $tmp/$f ]]; then
      echo "---- $f"
      cat "$tmp/$f"
    fi
  done
  exit 1
}

"$bin_dir/fleet-broker" --frontend 'tcp://127.0.0.1:*' --backend 'tcp://127.0.0.1:*' \
  --control 'tcp://127.0.0.1:*' --metrics 127.0.0.1:0 --ready-file "$tmp/ready" >"$tmp/broker.log" 2>&1 &
broker_pid=$!

for ((i = 0; i < 200; i++)); do  # 200 x 0.05 s = 10 s
  [[ -f $tmp/ready ]] && break
  kill -0 "$broker_pid" 2>/dev/null || fail "fleet-broker exited before it was ready"
  sleep 0.05
done
[[ -f $tmp/ready ]] || fail "no ready file from fleet-broker after 10 s"

frontend=$(sed -n 's/^frontend=//p' "$tmp/ready")
backend=$(sed -n 's/^backend=//p' "$tmp/ready")
[[ -n $frontend && -n $backend ]] || fail "ready file lacks frontend= or backend=: $(cat "$tmp/ready")"

"$bin_dir/fleet-worker" --broker "$backend" --id py-test-worker --handler echo \
  >"$tmp/worker.log" 2>&1 &
worker_pid=$!

"$python" "$producer" --broker "$frontend" --count 50 --payload abc >"$tmp/producer.out" 2>&1
rc=$?
[[ $rc -eq 0 ]] || fail "producer.py exited with $rc"

ok_lines=$(grep -c ' ok abc$' "$tmp/producer.out")
[[ $ok_lines -eq 50 ]] || fail "expected 50 result lines with ' ok abc', got $ok_lines"
grep -qx 'ok=50 failed=0 missing=0' "$tmp/producer.out" || fail "summary line missing or wrong"

echo "PASS: 50 batches through fleet-broker and fleet-worker from producer.py"
exit 0
