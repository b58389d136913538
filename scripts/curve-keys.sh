#!/usr/bin/env bash
# Makes the CURVE keys of the docker-compose deployment (docker-compose.curve.yml)
# with `fleet-ctl keygen`, by default from the fleet image in a throwaway
# container with no network. See the README, "Turning security on".
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/curve-keys.sh [--host-ctl FLEET_CTL] DIR

Writes into DIR (created with mode 0700 when missing):

  broker.key   broker.pub     the broker's pair: it serves CURVE with it; its
                              public half is what every client needs
  worker.key   worker.pub     every worker container (the autoscaler mounts
                              worker.key and broker.pub into each one)
  producer.key producer.pub   the producer profile's example producer
  control.key  control.pub    the autoscaler, on the control endpoint
  producers.allow             public keys let in on the frontend (producers)
  workers.allow               ... on the backend (workers)
  control.allow               ... on the control endpoint: control.pub, and
                              broker.pub for the broker container's own
                              healthcheck and `docker-compose exec broker
                              fleet-ctl ...`

Never overwrites: if any of these files exists it stops before writing.

Owners (a .key is mode 0600, so only its owner reads it, and each is read
by the user its container runs as):
  broker.key worker.key producer.key  FLEET_KEY_OWNER (10001:10001, the
                                      image's user `fleet`)
  control.key                         the autoscaler's user: FLEET_DOCKER_USER
                                      (0:0 as in docker-compose.yml)
  *.pub, *.allow (0644)               you, so you can edit the allowlists

  --host-ctl FLEET_CTL  run this fleet-ctl (e.g. build/bin/fleet-ctl) instead
                        of the one in ${FLEET_IMAGE:-fleet:latest}; needs
                        root (for the owners) and a rootful Docker engine
  -h, --help            this text
EOF
}

die() { echo "curve-keys: error: $*" >&2; exit 1; }

host_ctl=""
while [ $# -gt 0 ]; do
  case "$1" in
    --host-ctl) [ $# -ge 2 ] || die "--host-ctl needs a path"; host_ctl=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option: $1" ;;
    *) break ;;
  esac
  shift
done
[ $# -eq 1 ] || { usage >&2; exit 2; }

image=${FLEET_IMAGE:-fleet:latest}
key_owner=${FLEET_KEY_OWNER:-10001:10001}
control_owner=${FLEET_DOCKER_USER:-0:0}
operator="$(id -u):$(id -g)"
for o in "$key_owner" "$control_owner"; do
  [[ "$o" =~ ^[0-9]+(:[0-9]+)?$ ]] || die "owner '$o' is not UID or UID:GID (numbers)"
done

files=(broker.key broker.pub worker.key worker.pub producer.key producer.pub
       control.key control.pub producers.allow workers.allow control.allow)

mkdir -p -m 0700 "$1"
dir=$(cd "$1" && pwd -P)
existing=()
for f in "${files[@]}"; do
  if [ -e "$dir/$f" ] || [ -L "$dir/$f" ]; then existing+=("$f"); fi
done
[ ${#existing[@]} -eq 0 ] ||
  die "refusing to overwrite ${existing[*]} in $dir (keys are never replaced here: remove them, or pick another directory)"

# Runs in DIR with fleet-ctl on PATH, as root (of the container or the host).
# keygen itself refuses to overwrite (O_EXCL) and noclobber covers the
# allowlists, so a race with another run cannot replace a key either.
inner='set -eu
umask 077
for n in broker worker producer control; do fleet-ctl keygen "$n" >/dev/null; done
set -C
{ echo "# The broker lets these public keys in on its frontend (producers), one per"
  echo "# line. Add one: cat NAME.pub >> producers.allow, then send the broker SIGHUP"
  echo "# (docker-compose kill -s HUP broker) to reload the allowlists."
  echo "# producer: the compose producer profile"; grep "^public" producer.pub; } > producers.allow
{ echo "# The broker lets these public keys in on its backend (workers)."
  echo "# worker: every worker container the autoscaler starts"; grep "^public" worker.pub
} > workers.allow
{ echo "# The broker lets these public keys in on its control endpoint."
  echo "# control: the autoscaler"; grep "^public" control.pub
  echo "# broker: fleet-ctl in the broker container (healthcheck, docker-compose exec)"
  grep "^public" broker.pub; } > control.allow
chmod 0600 broker.key worker.key producer.key control.key
chmod 0644 broker.pub worker.pub producer.pub control.pub producers.allow workers.allow control.allow
chown "$KEY_OWNER" broker.key worker.key producer.key
chown "$CONTROL_OWNER" control.key
chown "$OPERATOR" broker.pub worker.pub producer.pub control.pub producers.allow workers.allow control.allow'

if [ -n "$host_ctl" ]; then
  [ -x "$host_ctl" ] || die "--host-ctl $host_ctl: not an executable"
  [ "$(id -u)" = 0 ] || die "--host-ctl needs root to give the keys their owners; without root, use the image (the default)"
  bin=$(cd "$(dirname "$host_ctl")" && pwd -P)
  ( cd "$dir" && PATH="$bin:$PATH" KEY_OWNER=$key_owner CONTROL_OWNER=$control_owner \
      OPERATOR=$operator sh -c "$inner" )
else
  command -v docker >/dev/null || die "docker not found (or use --host-ctl build/bin/fleet-ctl as root)"
  docker image inspect "$image" >/dev/null 2>&1 ||
    die "image $image not found: build it with docker/build-images.sh (or use --host-ctl build/bin/fleet-ctl as root)"
  # Rootless Docker: the container's root is you on the host.
  if docker info --format '{{.SecurityOptions}}' 2>/dev/null | grep -q rootless; then
    operator=0:0
  fi
  docker run --rm --network none --user 0:0 --read-only --no-healthcheck \
    --cap-drop ALL --cap-add CHOWN --cap-add DAC_OVERRIDE --cap-add FOWNER \
    --security-opt no-new-privileges --entrypoint /bin/sh --workdir /keys \
    -e KEY_OWNER="$key_owner" -e CONTROL_OWNER="$control_owner" -e OPERATOR="$operator" \
    -v "$dir:/keys" "$image" -c "$inner"
fi

echo "curve-keys: wrote the deployment's keys to $dir:"
(cd "$dir" && ls -ln "${files[@]}" | sed 's/^/  /')
cat <<EOF
Turn CURVE on:
  export FLEET_CURVE_DIR=$dir
  docker-compose -f docker-compose.yml -f docker-compose.curve.yml up -d
EOF
