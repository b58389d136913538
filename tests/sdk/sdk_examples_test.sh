#!/usr/bin/env bash
# The C++ SDK as a user gets it: `cmake --install` of this build into a fresh
# prefix, examples/ configured and built out of tree against it with
# find_package(fleet), and the two example programs run against the
# installed fleet-broker: results, a failed batch, a drain on SIGTERM and a
# retire.
# Usage: sdk_examples_test.sh SOURCE_DIR BUILD_DIR
set -u

src=${1:?usage: $0 SOURCE_DIR BUILD_DIR}
build=${2:?usage: $0 SOURCE_DIR BUILD_DIR}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fleet-sdk.XXXXXX")
pids=()

cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in install.log configure.log build.log broker.log worker.log worker2.log producer.out; do
    if [[ -f $tmp/$f ]]; then
      echo "---- $f"
      tail -n 40 "$tmp/$f"
    fi
  done
  exit 1
}

# Waits up to 20 s for worker PID to exit after WHAT; fails unless with 0.
expect_exit_zero() {
  local pid=$1 what=$2 rc
  for ((i = 0; i < 400; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -0 "$pid" 2>/dev/null && fail "word-count-worker still running 20 s after $what"
  wait "$pid"
  rc=$?
  [[ $rc -eq 0 ]] || fail "word-count-worker exited $rc after $what, expected 0"
}

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || fail "cmake --install failed"

# The SDK's headers, and no internal one.
headers=$(cd "$prefix/include" && find . -type f | sort | tr '\n' ' ')
[[ $headers == "./fleet/client.h ./fleet/errors.h ./fleet/worker.h " ]] || fail "installed headers: $headers"
[[ -f $prefix/lib/cmake/fleet/fleetConfig.cmake ]] || fail "no fleetConfig.cmake installed"

# A sanitizer build (scripts/sanitize.sh) installs instrumented libraries:
# a program linking them is compiled and linked with the same flags.
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
cmake -S "$src/examples" -B "$tmp/ex" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  "-DCMAKE_CXX_FLAGS=$(cache_value CMAKE_CXX_FLAGS)" \
  "-DCMAKE_EXE_LINKER_FLAGS=$(cache_value CMAKE_EXE_LINKER_FLAGS)" \
  >"$tmp/configure.log" 2>&1 || fail "configuring examples/ against the package failed"
cmake --build "$tmp/ex" >"$tmp/build.log" 2>&1 || fail "building examples/ failed"

"$prefix/bin/fleet-broker" --frontend 'tcp://127.0.0.1:*' --backend 'tcp://127.0.0.1:*' \
  --control 'tcp://127.0.0.1:*' --heartbeat-ms 250 --ready-file "$tmp/ready" \
  >"$tmp/broker.log" 2>&1 &
pids+=($!)
for ((i = 0; i < 200; i++)); do
  [[ -f $tmp/ready ]] && break
  sleep 0.05
done
[[ -f $tmp/ready ]] || fail "no ready file from fleet-broker"
frontend=$(sed -n 's/^frontend=//p' "$tmp/ready")
backend=$(sed -n 's/^backend=//p' "$tmp/ready")
control=$(sed -n 's/^control=//p' "$tmp/ready")

"$tmp/ex/word-count-worker" "$backend" >"$tmp/worker.log" 2>&1 &
worker=$!
pids+=($worker)

timeout 60 "$tmp/ex/word-count-producer" "$frontend" "one two three" "" "  a  b " \
  >"$tmp/producer.out" 2>&1
rc=$?
[[ $rc -eq 1 ]] || fail "word-count-producer exited $rc, expected 1 (one batch fails)"
grep -q ' ok 3 words$' "$tmp/producer.out" || fail "no '3 words' result"
grep -q ' ok 2 words$' "$tmp/producer.out" || fail "no '2 words' result"
grep -q ' failed nothing to count$' "$tmp/producer.out" || fail "no failed result with the function's error"
[[ $(wc -l <"$tmp/producer.out") -eq 3 ]] || fail "expected 3 result lines"

# SIGTERM: the worker drains and exits 0.
kill -TERM "$worker"
expect_exit_zero "$worker" "SIGTERM"
grep -q 'drained, exiting' "$tmp/worker.log" || fail "the worker did not return from Run"

# fleet-ctl retire: the same.
"$tmp/ex/word-count-worker" "$backend" >"$tmp/worker2.log" 2>&1 &
worker=$!
pids+=($worker)
id="$(hostname)-$worker"
for ((i = 0; i < 200; i++)); do
  "$prefix/bin/fleet-ctl" --control "$control" workers 2>/dev/null | grep -q -- "$id" && break
  sleep 0.05
done
"$prefix/bin/fleet-ctl" --control "$control" retire "$id" >/dev/null || fail "fleet-ctl retire $id failed"
expect_exit_zero "$worker" "its retire"
echo "ok: examples built against the installed SDK and ran"
