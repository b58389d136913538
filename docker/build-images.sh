#!/usr/bin/env bash
# Builds fleet's container images, from scratch or from Docker's layer cache:
#   ${FLEET_IMAGE:-fleet:latest}                             docker/Dockerfile
#   ${FLEET_PYTHON_IMAGE:-fleet-python:latest}               docker/Dockerfile.python (on top of the first)
#   ${FLEET_PROMETHEUS_LOCAL_IMAGE:-fleet-prometheus:local}  docker/prometheus
# after docker/base-image.sh has made sure debian:bookworm-slim exists.
# Idempotent; when nothing changed every step comes from the cache and the run
# takes a few seconds. Tests call it before they start containers.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: docker/build-images.sh [--fleet] [--python] [--prometheus] [--pull|--no-pull] [-v] [-h]

Builds the fleet image, its Python variant and the local Prometheus image
(all three by default).

  --fleet        build only ${FLEET_IMAGE:-fleet:latest}
  --python       build ${FLEET_PYTHON_IMAGE:-fleet-python:latest} (and the fleet image
                 it starts from)
  --prometheus   build only ${FLEET_PROMETHEUS_LOCAL_IMAGE:-fleet-prometheus:local}
  --pull         try a registry for debian:bookworm-slim before building it
                 with debootstrap (FLEET_BASE_PULL=1)
  --no-pull      never try a registry (the default)
  --background LOG  start the build detached, output to LOG, and return
                   (make test does this before it compiles)
  -v, --verbose  show the docker build output as it happens
  -h, --help     this text

Quiet by default: one line per image. When a build fails, the end of its log
is printed and the whole log is kept.
EOF
}

log() { echo "build-images: $*" >&2; }
die() { log "error: $*"; exit 1; }

want_fleet=0
want_python=0
want_prometheus=0
verbose=0
background_log=""
base_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --fleet) want_fleet=1 ;;
    --python) want_fleet=1; want_python=1 ;;
    --prometheus) want_prometheus=1 ;;
    --no-pull) base_args+=(--no-pull) ;;
    --pull) base_args+=(--pull) ;;
    --background)
      [ $# -ge 2 ] || die "--background needs a log file"
      background_log=$2; shift ;;
    -v|--verbose) verbose=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
  shift
done
if [ "$want_fleet" = 0 ] && [ "$want_prometheus" = 0 ]; then
  want_fleet=1
  want_python=1
  want_prometheus=1
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

if [ -n "$background_log" ]; then
  # `make test` starts the build here while it compiles the programs, so the
  # downloads overlap the compile; the tests' own run then waits on the lock
  # below and finds everything cached. No engine: nothing to start.
  docker version >/dev/null 2>&1 || exit 0
  mkdir -p "$(dirname "$background_log")"
  args=()
  [ "$want_fleet" = 1 ] && args+=(--fleet)
  [ "$want_python" = 1 ] && args+=(--python)
  [ "$want_prometheus" = 1 ] && args+=(--prometheus)
  nohup bash "$ROOT/docker/build-images.sh" "${args[@]}" "${base_args[@]+"${base_args[@]}"}" \
    >"$background_log" 2>&1 </dev/null &
  log "building the images in the background (log: $background_log)"
  exit 0
fi

# One build at a time on this engine (the tags are shared): a second run
# waits for the first, then finds the layers cached.
exec 9>"${TMPDIR:-/tmp}/fleet-build-images.lock"
if ! flock -n 9; then
  log "another build of the images is running; waiting for it"
  flock 9
fi
FLEET_IMAGE=${FLEET_IMAGE:-fleet:latest}
PYTHON_IMAGE=${FLEET_PYTHON_IMAGE:-fleet-python:latest}
PROMETHEUS_IMAGE=${FLEET_PROMETHEUS_LOCAL_IMAGE:-fleet-prometheus:local}

image_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }

# build TAG ARGS...: one docker build, its log kept only when it fails.
build() {
  local tag=$1 started before after logfile rc=0
  shift
  before=$(image_id "$tag")
  logfile=$(mktemp -t fleet-image-build.XXXXXX.log)
  started=$(date +%s)
  if [ "$verbose" = 1 ]; then
    docker build --network host -t "$tag" "$@" 2>&1 | tee "$logfile" || rc=$?
  else
    docker build --network host -t "$tag" "$@" >"$logfile" 2>&1 || rc=$?
  fi
  if [ "$rc" -ne 0 ]; then
    log "building $tag failed (exit $rc); last lines of the log:"
    tail -n 40 "$logfile" >&2
    log "full log: $logfile"
    exit 1
  fi
  rm -f "$logfile"
  after=$(image_id "$tag")
  log "$tag $([ "$before" = "$after" ] && echo unchanged || echo built) in $(( $(date +%s) - started ))s" \
      "($(echo "$after" | cut -c8-19), $(docker image inspect -f '{{.Size}}' "$tag" |
          awk '{ printf "%.0f MB", $1 / 1e6 }'))"
}

started=$(date +%s)
bash "$ROOT/docker/base-image.sh" "${base_args[@]+"${base_args[@]}"}"

if [ "$want_fleet" = 1 ]; then
  revision=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  build "$FLEET_IMAGE" -f docker/Dockerfile --build-arg "FLEET_REVISION=$revision" .
fi
if [ "$want_python" = 1 ]; then
  build "$PYTHON_IMAGE" -f docker/Dockerfile.python --build-arg "FLEET_IMAGE=$FLEET_IMAGE" \
    --build-arg "FLEET_REVISION=$revision" .
fi
if [ "$want_prometheus" = 1 ]; then
  build "$PROMETHEUS_IMAGE" docker/prometheus
fi
log "done in $(( $(date +%s) - started ))s"
