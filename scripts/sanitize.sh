#!/usr/bin/env bash
# Builds fleet with gcc's sanitizers and runs the tests under them.
#
#   scripts/sanitize.sh [asan] [tsan]        (no argument: both, asan first)
#
#   asan  ASan + UBSan + LeakSanitizer, build-asan/: the whole suite except the
#         tests labelled docker.
#   tsan  ThreadSanitizer, build-tsan/: the tests of the multi-threaded code
#         (worker and its slot pool, the exec and process handlers, the SDK,
#         the HTTP client against the test server's thread, the client
#         library against the threaded router) and the integration tests
#         whose workers run several slots.
#
# Environment:
#   JOBS          parallel compile and ctest jobs (default: nproc)
#   BUILD_PREFIX  build directories are ${BUILD_PREFIX}asan and
#                 ${BUILD_PREFIX}tsan (default: build-, in the source tree)
#   ASAN_TESTS    ctest -R regex narrowing the asan run (default: all)
#   TSAN_TESTS    ctest -R regex for the tsan run (default: the set above;
#                 "." runs every non-docker test)
#
# The integration tests start the real programs from <build>/bin, so those
# run instrumented too, with their output in log files the tests delete
# afterwards. So every sanitizer writes its reports to <build>/sanitizer-logs
# (log_path), which must be empty at the end: a mode fails if a test fails or
# any report was written, and the reports are printed. Suppressions, each
# with its reason, are in tests/sanitizers/.
#
# Prints one summary line per mode with the time taken; exits non-zero if
# any mode failed.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)

modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(asan tsan)
for m in "${modes[@]}"; do
  case "$m" in
    asan|tsan) ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "sanitize: unknown mode '$m' (asan, tsan)" >&2; exit 2 ;;
  esac
done

JOBS=${JOBS:-$(nproc)}
BUILD_PREFIX=${BUILD_PREFIX:-build-}
supp="$src/tests/sanitizers"
default_tsan_tests='^(CreditLedgerTest|ProcessHandlerTest|ProcessHandlerLoopTest|ProcessHandlerObjectsTest|SdkTest|EchoHandlerTest|SleepHandlerTest|Sha256HandlerTest|MakeHandlerTest|ExecHandlerTest|SlotPoolTest|WorkerProcessTest|HttpClientTest|DockerLauncherFakeTest|DockerEnginesTest|SwarmLauncherTest|AutoscalerLoopTest|MetricsSourceTest|ProducerTest|ControlClientTest|SubmitCliTest|CtlCliTest|DataPathTest|GarbageTest|MetricsTest|LedgerFaultTest|JournalTest|BrokerCoreJournalTest|BrokerCoreOffLoopJournalTest)\.'

bash scripts/deps.sh

# gcc's sanitizer runtimes come with g++ (libgcc-12-dev depends on libasan8,
# libubsan1, liblsan0 and libtsan2); check, so a missing one is named here
# rather than as a link error.
for lib in libasan.so libubsan.so libtsan.so; do
  if [ "$(g++ -print-file-name=$lib)" = "$lib" ]; then
    echo "sanitize: g++ has no $lib (install libgcc-12-dev)" >&2
    exit 2
  fi
done

fmt_time() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# run_mode MODE: builds and tests one mode; prints its summary line last.
run_mode() {
  local mode=$1 dir="${BUILD_PREFIX}$1" san flags regex wrap=()
  case "$mode" in
    asan)
      san=address,undefined
      flags="-O1 -g1 -fsanitize=$san -fno-omit-frame-pointer -fno-sanitize-recover=all"
      regex=${ASAN_TESTS:-}
      ;;
    tsan)
      san=thread
      flags="-O1 -g1 -fsanitize=$san -fno-omit-frame-pointer"
      regex=${TSAN_TESTS:-$default_tsan_tests}
      # gcc 12's TSan cannot map its shadow memory when the kernel randomizes
      # mmap with more bits than it expects ("unexpected memory mapping");
      # without address randomization it always can.
      if setarch "$(uname -m)" -R true 2>/dev/null; then wrap=(setarch "$(uname -m)" -R); fi
      ;;
  esac
  local logs="$src/$dir/sanitizer-logs" t0=$SECONDS t1 status=PASS why=""

  echo "== $mode: build ($dir)"
  # Not FLEET_WERROR: gcc 12 warns spuriously (-Wmaybe-uninitialized,
  # -Wstringop-overflow) under the sanitizers' instrumentation.
  # -O1 -g1 (line tables): about a third less compile time than -O2 -g, and
  # the reports still name file and line.
  if ! cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Sanitize \
        "-DCMAKE_CXX_FLAGS=$flags" \
        "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=$san" \
        "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=$san" >/dev/null ||
     ! cmake --build "$dir" -j "$JOBS"; then
    t1=$SECONDS
    summary+=("$mode: FAIL (build failed) build $(fmt_time $((t1 - t0)))")
    return 1
  fi
  t1=$SECONDS

  echo "== $mode: test"
  rm -rf "$logs"
  mkdir -p "$logs"
  local common="print_stacktrace=1"
  local ctest_args=(--output-on-failure -j "$JOBS" -LE 'docker|bench' --timeout 600)
  [ -n "$regex" ] && ctest_args+=(-R "$regex")
  local rc=0
  (
    cd "$dir"
    export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:$common:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=0:log_path=$logs/asan"
    export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="halt_on_error=1:$common:suppressions=$supp/ubsan.supp:log_path=$logs/ubsan"
    # Every race is reported, not only the first; a process that had one
    # exits 66, and the report file fails the mode either way.
    export TSAN_OPTIONS="halt_on_error=0:second_deadlock_stack=1:suppressions=$supp/tsan.supp:print_suppressions=0:log_path=$logs/tsan"
    "${wrap[@]}" ctest "${ctest_args[@]}"
  ) || rc=$?
  local t2=$SECONDS
  local reports
  reports=$(find "$logs" -type f | sort)
  if [ -n "$reports" ]; then
    echo "== $mode: sanitizer reports ($(echo "$reports" | wc -l) files in $logs)"
    local f
    for f in $reports; do
      echo "---- $f"
      head -n 80 "$f"
    done
  fi
  local nreports=0
  [ -n "$reports" ] && nreports=$(echo "$reports" | wc -l)
  if [ "$rc" -ne 0 ]; then status=FAIL; why=" (tests failed)"; fi
  if [ "$nreports" -ne 0 ]; then status=FAIL; why="$why (sanitizer reports: $nreports)"; fi
  summary+=("$mode: $status$why build $(fmt_time $((t1 - t0))), tests $(fmt_time $((t2 - t1))), total $(fmt_time $((t2 - t0)))")
  [ "$status" = PASS ]
}

summary=()
failed=0
for m in "${modes[@]}"; do
  run_mode "$m" || failed=1
done
echo
for line in "${summary[@]}"; do echo "sanitize: $line"; done
exit $failed
