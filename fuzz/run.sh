#!/usr/bin/env bash
# Builds fleet's libFuzzer targets (fuzz/CMakeLists.txt) with clang and runs
# each for a set time on a copy of its seed corpus. See --help.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ALL_TARGETS=(fuzz_protocol fuzz_prom_text fuzz_prom_api)

usage() {
  cat <<EOF
Usage: fuzz/run.sh [--merge] [--seconds N] [--build-only] [TARGET...]

Builds the fuzz targets into \$FUZZ_BUILD_DIR with clang (ASan + UBSan +
libFuzzer) and runs each TARGET (default: all of ${ALL_TARGETS[*]})
for FUZZ_SECONDS seconds, one after the other, on a copy of
fuzz/corpus/TARGET/ in a temporary directory, so the repository is not
written to. Installs clang-14 and libclang-rt-14-dev (the libFuzzer runtime)
with apt-get when no working clang is found.

Exits non-zero if any target crashes, leaks, times out, runs out of memory
or breaks an invariant; the input is kept under \$FUZZ_BUILD_DIR/artifacts/
and the command to reproduce it is printed.

Options:
  --merge       after a clean run, add the inputs that found new coverage to
                fuzz/corpus/TARGET/ (then review and commit them)
  --seconds N   same as FUZZ_SECONDS=N
  --build-only  build, run nothing
  -h, --help    this text

Environment:
  FUZZ_SECONDS    run time per target in seconds (default 60)
  FUZZ_BUILD_DIR  build directory (default build-fuzz in the repository)
  FUZZ_CXX        clang++ to use (default clang++-14, else clang++)
  FUZZ_JOBS       parallel compile jobs (default 2)
  FUZZ_MAX_LEN    largest input libFuzzer makes, bytes; longer seeds are cut
                  (default 8192; the full seeds run in fuzz_corpus_test)
  FUZZ_TIMEOUT    seconds one input may take before it counts as a hang (default 10)
  FUZZ_ARGS       extra libFuzzer flags, e.g. "-use_value_profile=1"
Memory: -rss_limit_mb=2048 -malloc_limit_mb=512 (a single allocation over
512 MB is a failure: every decoder bounds what a peer can make it allocate).
EOF
}

SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
BUILD_DIR="${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${FUZZ_JOBS:-2}"
MAX_LEN="${FUZZ_MAX_LEN:-8192}"
TIMEOUT="${FUZZ_TIMEOUT:-10}"
MERGE=0
BUILD_ONLY=0
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --merge) MERGE=1 ;;
    --build-only) BUILD_ONLY=1 ;;
    --seconds) SECONDS_PER_TARGET="${2:?--seconds needs a value}"; shift ;;
    --seconds=*) SECONDS_PER_TARGET="${1#*=}" ;;
    -*) echo "fuzz/run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      case " ${ALL_TARGETS[*]} " in
        *" $1 "*) TARGETS+=("$1") ;;
        *) echo "fuzz/run.sh: unknown target $1 (one of ${ALL_TARGETS[*]})" >&2; exit 2 ;;
      esac ;;
  esac
  shift
done
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL_TARGETS[@]}")
case "$SECONDS_PER_TARGET" in
  ''|*[!0-9]*) echo "fuzz/run.sh: FUZZ_SECONDS must be a whole number" >&2; exit 2 ;;
esac

# A clang that can link -fsanitize=fuzzer: the runtime is a separate package
# on Debian 12 (libclang-rt-14-dev ships libclang_rt.fuzzer-x86_64.a).
can_fuzz() {
  command -v "$1" >/dev/null 2>&1 || return 1
  printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' |
    "$1" -x c++ -fsanitize=fuzzer,address,undefined - -o /dev/null >/dev/null 2>&1
}

CXX="${FUZZ_CXX:-}"
if [ -z "$CXX" ]; then
  for c in clang++-14 clang++; do
    if can_fuzz "$c"; then CXX="$c"; break; fi
  done
fi
if [ -z "$CXX" ]; then
  echo "fuzz: installing clang-14 and libclang-rt-14-dev"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev >/dev/null
  CXX=clang++-14
fi
if ! can_fuzz "$CXX"; then
  echo "fuzz: $CXX cannot link -fsanitize=fuzzer,address,undefined" \
       "(is libclang-rt-14-dev installed?)" >&2
  exit 1
fi

echo "fuzz: building with $CXX into $BUILD_DIR"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S "$ROOT/fuzz" -B "$BUILD_DIR" -G Ninja -DCMAKE_CXX_COMPILER="$CXX" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
[ "$BUILD_ONLY" -eq 1 ] && exit 0

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fleet-fuzz.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
ARTIFACTS="$BUILD_DIR/artifacts"
failed=()
summary=()
for t in "${TARGETS[@]}"; do
  seeds="$ROOT/fuzz/corpus/$t"
  corpus="$WORK/$t"
  mkdir -p "$corpus" "$ARTIFACTS/$t"
  cp -r "$seeds/." "$corpus/"
  log="$WORK/$t.log"
  echo "fuzz: $t for ${SECONDS_PER_TARGET}s ($(ls "$seeds" | wc -l) seeds)"
  rc=0
  # shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
  (cd "$WORK" && "$BUILD_DIR/$t" "$corpus" \
      -max_total_time="$SECONDS_PER_TARGET" -timeout="$TIMEOUT" -max_len="$MAX_LEN" \
      -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1 \
      -artifact_prefix="$ARTIFACTS/$t/" ${FUZZ_ARGS:-}) >"$log" 2>&1 || rc=$?
  done_line="$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -1 || true)"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")"
  added="$(sed -n 's/^stat::new_units_added: *//p' "$log")"
  rss="$(sed -n 's/^stat::peak_rss_mb: *//p' "$log")"
  cov="$(sed -n 's/.* cov: \([0-9]*\) ft: \([0-9]*\) corp: \([^ ]*\).*/cov=\1 ft=\2 corp=\3/p' <<<"$done_line")"
  summary+=("$t: $cov execs=${execs:-?} exec/s=${rate:-?} new_units=${added:-?} peak_rss=${rss:-?}MB rc=$rc")
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    echo "fuzz: $t FAILED (exit $rc); end of its log:"
    grep -v -E '^#[0-9]+' "$log" | tail -40
    for a in $(sed -n "s/.*Test unit written to \(.*\)$/\1/p" "$log"); do
      echo "fuzz: input kept at $a"
      echo "fuzz: reproduce with: $BUILD_DIR/$t -rss_limit_mb=2048 -malloc_limit_mb=512 $a"
      echo "fuzz: minimise with:  $BUILD_DIR/$t -minimize_crash=1 -runs=100000 $a"
    done
  elif [ "$MERGE" -eq 1 ]; then
    before=$(ls "$seeds" | wc -l)
    "$BUILD_DIR/$t" -merge=1 -max_len="$MAX_LEN" -rss_limit_mb=2048 -malloc_limit_mb=512 \
        "$seeds" "$corpus" >"$WORK/$t.merge.log" 2>&1
    echo "fuzz: $t merged $(( $(ls "$seeds" | wc -l) - before )) new inputs into fuzz/corpus/$t/"
  fi
done

echo "fuzz: summary (${SECONDS_PER_TARGET}s per target)"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no crash, leak, timeout or broken invariant"
