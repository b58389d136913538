#!/usr/bin/env bash
# make demo's script runs to completion with small sizes, shows the pool
# growing and shrinking, and leaves none of its processes running.
# Args: source dir, bin dir.
set -euo pipefail
src=$1
bin=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() { cat "$out"; echo "FAIL: $*"; exit 1; }
FLEET_DEMO_MAX=2 FLEET_DEMO_BURST1=60 FLEET_DEMO_BURST2=20 \
  bash "$src/scripts/demo.sh" "$bin" >"$out" 2>&1 || fail "demo exited non-zero"
grep -q "submitted=60 ok=60 failed=0 lost=0" "$out" || fail "burst 1 summary missing"
grep -q "submitted=20 ok=20 failed=0 lost=0" "$out" || fail "burst 2 summary missing"
grep -q "\[live" "$out" || fail "no live view line"
grep -q "decision scale_up" "$out" || fail "the pool never grew"
grep -q "decision scale_down" "$out" || fail "the pool never shrank"
grep -q "0 processes left running" "$out" || fail "processes left running"
echo "demo ok"
