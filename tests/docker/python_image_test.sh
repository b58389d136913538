#!/usr/bin/env bash
# The Python worker image (docker/Dockerfile.python) started by the docker
# launcher: a broker container on a private network, fleet-autoscaler on this
# host with --launcher docker --docker-image fleet-python:latest --min 0, and a
# joblib Parallel call from this host through the "fleet" backend. Checks the
# results, that a worker container was started from zero, and that the pool
# is back at zero (no container left) afterwards.
# Usage: python_image_test.sh BIN_DIR VENV_PYTHON_DIR_OR_EMPTY
set -u
bin_dir=${1:?usage: $0 BIN_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
image=${FLEET_IMAGE:-fleet:latest}
pyimage=${FLEET_PYTHON_IMAGE:-fleet-python:latest}
tag=fleetpy$$
net=$tag-net
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fleet-pyimage.XXXXXX")
autoscaler_pid=

cleanup() {
  [[ -n $autoscaler_pid ]] && { kill "$autoscaler_pid" 2>/dev/null; wait "$autoscaler_pid" 2>/dev/null; }
  docker ps -aq --filter "label=fleet.pool=$tag" | xargs -r docker rm -f >/dev/null 2>&1
  docker rm -f "$tag-broker" >/dev/null 2>&1
  docker network rm "$net" >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.log; do echo "---- $f"; tail -n 40 "$f"; done
  docker logs "$tag-broker" 2>&1 | tail -n 20
  exit 1
}

docker image inspect "$pyimage" >/dev/null 2>&1 || fail "no image $pyimage (docker/build-images.sh --python)"
docker network create "$net" >/dev/null || fail "docker network create"
docker run -d --name "$tag-broker" --network "$net" --network-alias broker \
  -p 127.0.0.1::5555 -p 127.0.0.1::5557 -p 127.0.0.1::9750 \
  "$image" fleet-broker --retire-linger-ms 100 >/dev/null || fail "broker container"
port() { docker port "$tag-broker" "$1/tcp" | head -n 1 | sed 's/.*://'; }
front=tcp://127.0.0.1:$(port 5555)
control=tcp://127.0.0.1:$(port 5557)
metrics=http://127.0.0.1:$(port 9750)/metrics
for ((i = 0; i < 100; i++)); do
  "$bin_dir/fleet-ctl" --control "$control" --timeout-ms 500 stats >/dev/null 2>&1 && break
  sleep 0.1
done
"$bin_dir/fleet-ctl" --control "$control" stats >/dev/null || fail "the broker container does not answer"

"$bin_dir/fleet-autoscaler" --control "$control" --metrics-source "$metrics" \
  --launcher docker --docker-image "$pyimage" --docker-network "$net" --docker-pool "$tag" \
  --worker-args "--broker tcp://broker:5556 --concurrency 2 --handler process --exec 'python3 -m fleet.calls'" \
  --min 0 --max 2 --idle-seconds 1 --cooldown-seconds 0 --stabilization-seconds 0 \
  --poll-ms 200 --metrics 127.0.0.1:0 >"$tmp/autoscaler.log" 2>&1 &
autoscaler_pid=$!

PYTHONPATH=$root/python /usr/bin/python3 - "$front" "$control" >"$tmp/joblib.log" 2>&1 <<'PY' || fail "the joblib call"
import sys, joblib, fleet.joblib
from fleet import control
front, ctl = sys.argv[1], sys.argv[2]
assert control.workers(ctl) == [], "the pool should start at zero"
fleet.joblib.register()
def cube(x):          # defined here: travels by value
    return x ** 3
with joblib.parallel_backend("fleet", broker=front, control=ctl, timeout=120):
    out = joblib.Parallel(n_jobs=-1)(joblib.delayed(cube)(i) for i in range(40))
assert out == [i ** 3 for i in range(40)], out
with joblib.parallel_backend("fleet", broker=front, timeout=120):
    try:
        joblib.Parallel(n_jobs=2)(joblib.delayed(int)(s) for s in ["1", "x"])
        raise SystemExit("no exception")
    except ValueError as e:
        assert "invalid literal" in str(e) and "Traceback" in e.__cause__.tb, e
print("joblib ok")
PY
grep -q "joblib ok" "$tmp/joblib.log" || fail "no joblib ok"
grep -q "launch" "$tmp/autoscaler.log" || fail "the autoscaler launched no worker"

# Back to zero: no registered worker and no container of the pool.
for ((i = 0; i < 300; i++)); do
  n=$(docker ps -aq --filter "label=fleet.pool=$tag" | wc -l)
  out=$("$bin_dir/fleet-ctl" --control "$control" --json workers 2>/dev/null) || out=FAILED
  w=$(grep -o '"id"' <<<"$out" | wc -l)
  [[ $out == FAILED ]] && w=unknown
  [[ $n -eq 0 && $w -eq 0 ]] && break
  sleep 0.2
done
[[ $n -eq 0 && $w -eq 0 ]] || fail "the pool did not go back to zero ($n containers, $w workers)"
echo "PASS: the Python image ran a joblib call from zero workers and back to zero"
