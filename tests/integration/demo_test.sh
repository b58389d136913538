#!/usr/bin/env bash
# The demo runs to completion with small sizes and leaves none of its
# processes running. Args: source dir, bin dir.
set -euo pipefail
src=$1
bin=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
FLEET_DEMO_WORKERS=2 FLEET_DEMO_COUNT=2000 FLEET_DEMO_SLEEPS=40 \
  bash "$src/scripts/demo.sh" "$bin" >"$out" 2>&1 || { cat "$out"; echo "FAIL: demo exited non-zero"; exit 1; }
fail() { cat "$out"; echo "FAIL: $*"; exit 1; }
grep -q "submitted=2000 ok=2000 failed=0 lost=0" "$out" || fail "burst 1 summary missing"
grep -q "submitted=40 ok=40 failed=0 lost=0" "$out" || fail "burst 2 summary missing"
grep -q "\[live" "$out" || fail "no live view line"
grep -q "0 processes left running" "$out" || fail "processes left running"
if pgrep -f -- "--id demo-(sha256|sleep)-" >/dev/null && [ -z "${FLEET_DEMO_PARALLEL_OK:-}" ]; then
  # Only this test starts demo workers; any left is ours.
  fail "demo workers still running: $(pgrep -af -- '--id demo-')"
fi
echo "demo ok"
