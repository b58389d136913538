#!/usr/bin/env bash
# Makes sure a local image tagged debian:bookworm-slim exists, the base of
# both stages of docker/Dockerfile and of docker/prometheus/Dockerfile.
#
# 1. If the engine already has the tag: nothing to do.
# 2. Else, only when asked (--pull), try `docker pull` (bounded by a timeout).
#    Off by default: machines with a registry never need this script (docker
#    build pulls the base itself), and ours must not talk to one.
# 3. Else build a minimal Debian 12 root file system with debootstrap from the
#    same Debian mirror the host's apt uses, trim it, and `docker import` it
#    under that tag. Needs root (or sudo) and network access to the mirror.
#
# The imported image is not Docker's official one: it carries the label
# org.fleet.base=debootstrap so `docker image inspect` tells them apart.
set -euo pipefail

TAG="debian:bookworm-slim"
SUITE="bookworm"
DEFAULT_MIRROR="http://deb.debian.org/debian"
PULL_TIMEOUT=${FLEET_BASE_PULL_TIMEOUT:-30}   # seconds
PULL=${FLEET_BASE_PULL:-0}                    # 1 tries the registry first
MIRROR=${FLEET_DEBIAN_MIRROR:-}               # empty: the host's apt mirror
SECURITY_MIRROR=${FLEET_DEBIAN_SECURITY_MIRROR:-}

usage() {
  cat <<EOF
Usage: docker/base-image.sh [--pull|--no-pull] [--mirror URL] [--security-mirror URL]

Ensures the local image ${TAG} exists: keeps it if present, else (with
--pull) tries 'docker pull' (timeout ${PULL_TIMEOUT}s), else builds it with
debootstrap --variant=minbase from the host's Debian mirror and
'docker import's it.

  --pull                 try the registry first (env FLEET_BASE_PULL=1)
  --no-pull              never try the registry (the default)
  --mirror URL           Debian mirror (env FLEET_DEBIAN_MIRROR; default:
                         the host's apt sources, else ${DEFAULT_MIRROR})
  --security-mirror URL  mirror of bookworm-security (env
                         FLEET_DEBIAN_SECURITY_MIRROR; default: the host's, if
                         it uses one)
  -h, --help             this text

Env FLEET_BASE_PULL_TIMEOUT: seconds allowed for 'docker pull' (30).
EOF
}

log() { echo "base-image: $*" >&2; }
die() { log "error: $*"; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --no-pull) PULL=0 ;;
    --pull) PULL=1 ;;
    --mirror) [ $# -ge 2 ] || die "--mirror needs a URL"; MIRROR=$2; shift ;;
    --mirror=*) MIRROR=${1#*=} ;;
    --security-mirror) [ $# -ge 2 ] || die "--security-mirror needs a URL"; SECURITY_MIRROR=$2; shift ;;
    --security-mirror=*) SECURITY_MIRROR=${1#*=} ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
  shift
done

command -v docker >/dev/null || die "docker CLI not found"
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
  die "cannot reach the Docker engine (is it running, may this user use it?)"

if docker image inspect "$TAG" >/dev/null 2>&1; then
  log "$TAG present ($(docker image inspect -f '{{.Id}}' "$TAG" | cut -c8-19)), nothing to do"
  exit 0
fi

if [ "$PULL" != 0 ]; then
  log "$TAG missing; trying docker pull (${PULL_TIMEOUT}s at most)"
  if timeout "$PULL_TIMEOUT" docker pull -q "$TAG" >/dev/null 2>&1; then
    log "pulled $TAG"
    exit 0
  fi
  log "docker pull failed; building $TAG with debootstrap instead"
else
  log "$TAG missing; building it with debootstrap (pull disabled)"
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "debootstrap needs root; run as root or install sudo"
  SUDO="sudo"
fi

# --- Which mirror: the host's apt sources, one-line and deb822 formats. ------
# Prints "<uri> <suite>" for every enabled deb source of the host.
host_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    # deb [options] uri suite components...
    sed -E -n 's/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+)[[:space:]]+([^[:space:]]+).*/\2 \3/p' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    # One stanza per paragraph; emit every URI x suite pair of enabled
    # stanzas whose Types include "deb".
    awk '
      function flush(   i, j, nu, ns, u, s) {
        if (types ~ /(^|[[:space:]])deb([[:space:]]|$)/ && enabled != "no") {
          nu = split(uris, u, /[[:space:]]+/); ns = split(suites, s, /[[:space:]]+/)
          for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
            if (u[i] != "" && s[j] != "") print u[i], s[j]
        }
        types = ""; uris = ""; suites = ""; enabled = ""; key = ""
      }
      /^[[:space:]]*#/ { next }
      /^[[:space:]]*$/ { flush(); next }
      /^[A-Za-z-]+:/ {
        key = tolower($0); sub(/:.*/, "", key)
        val = $0; sub(/^[^:]*:[[:space:]]*/, "", val)
        if (key == "types") types = val
        else if (key == "uris") uris = val
        else if (key == "suites") suites = val
        else if (key == "enabled") enabled = tolower(val)
        next
      }
      /^[[:space:]]/ {  # continuation of the previous field
        if (key == "uris") uris = uris " " $0
        else if (key == "suites") suites = suites " " $0
        next
      }
      END { flush() }
    ' "$f"
  done
}

# Only plain http(s) mirrors are usable from a fresh chroot (no apt-transport
# plugins, no file: or cdrom: sources).
usable() { case "$1" in http://*|https://*) return 0 ;; *) return 1 ;; esac; }

sources=$(host_sources 2>/dev/null || true)
if [ -z "$MIRROR" ]; then
  MIRROR=$(awk -v s="$SUITE" '$2 == s && $1 ~ /^https?:\/\// { print $1; exit }' <<<"$sources")
  [ -n "$MIRROR" ] || MIRROR=$DEFAULT_MIRROR
fi
if [ -z "$SECURITY_MIRROR" ]; then
  SECURITY_MIRROR=$(awk -v s="$SUITE-security" '$2 == s && $1 ~ /^https?:\/\// { print $1; exit }' <<<"$sources")
fi
MIRROR=${MIRROR%/}
SECURITY_MIRROR=${SECURITY_MIRROR%/}
usable "$MIRROR" || die "mirror must be an http(s) URL: $MIRROR"
[ -z "$SECURITY_MIRROR" ] || usable "$SECURITY_MIRROR" ||
  die "security mirror must be an http(s) URL: $SECURITY_MIRROR"
log "mirror $MIRROR${SECURITY_MIRROR:+, security $SECURITY_MIRROR}"

if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends debootstrap >/dev/null
fi

# --- Build the root file system in a scratch directory. ----------------------
# /var/tmp rather than /tmp: a rootfs needs exec and device nodes, which a
# tmpfs /tmp mounted nodev/noexec would refuse.
root=$(mktemp -d /var/tmp/fleet-rootfs.XXXXXX)
logfile="$root.log"
cleanup() {
  local rc=$?
  set +e
  # debootstrap mounts /proc and /sys inside the target and can leave them
  # mounted when it fails; unmount before deleting, and never cross into
  # another file system while deleting.
  awk -v r="$root/" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r m; do $SUDO umount -l "$m"; done
  $SUDO rm -rf --one-file-system "$root"
  if [ "$rc" -ne 0 ] && [ -s "$logfile" ]; then
    log "failed; last lines of the log:"
    tail -n 30 "$logfile" >&2
  fi
  rm -f "$logfile"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

started=$(date +%s)
log "debootstrap --variant=minbase $SUITE (a few minutes)"
$SUDO debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$logfile" 2>&1 ||
  die "debootstrap failed"

# apt inside the image: the same mirror, plus updates and security.
{
  echo "deb $MIRROR $SUITE main"
  echo "deb $MIRROR $SUITE-updates main"
  [ -z "$SECURITY_MIRROR" ] || echo "deb $SECURITY_MIRROR $SUITE-security main"
} | $SUDO tee "$root/etc/apt/sources.list" >/dev/null

# Keep later apt-get installs in derived images small, as the slim images do:
# no docs (copyright files stay), man pages or translations; no .deb cache.
$SUDO tee "$root/etc/dpkg/dpkg.cfg.d/fleet-slim" >/dev/null <<'EOF'
# Set by fleet's docker/base-image.sh: no documentation in containers.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
$SUDO tee "$root/etc/apt/apt.conf.d/fleet-slim" >/dev/null <<'EOF'
// Set by fleet's docker/base-image.sh.
APT::Keep-Downloaded-Packages "false";
Acquire::Languages "none";
EOF
# Packages installed during an image build must not try to start services.
printf '#!/bin/sh\n# Set by fleet docker/base-image.sh: no services start in image builds.\nexit 101\n' |
  $SUDO tee "$root/usr/sbin/policy-rc.d" >/dev/null
$SUDO chmod 755 "$root/usr/sbin/policy-rc.d"

# Security and point-release updates: debootstrap only reads the release.
log "applying updates from $SUITE-updates${SECURITY_MIRROR:+ and $SUITE-security}"
$SUDO chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
  sh -c 'apt-get update -qq && apt-get -y -qq -o Dpkg::Options::=--force-confold upgrade && apt-get clean' \
  >>"$logfile" 2>&1 || die "apt-get upgrade inside the new root failed"

# Trim what a container never reads.
$SUDO find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
$SUDO find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
$SUDO find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
$SUDO rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/lintian \
  "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old "$root"/var/log/apt/* \
  "$root"/var/log/dpkg.log "$root"/var/log/alternatives.log "$root"/var/log/bootstrap.log \
  "$root"/debootstrap
$SUDO find "$root/tmp" "$root/var/tmp" -mindepth 1 -delete
# Docker supplies these at run time; do not bake in the host's.
: | $SUDO tee "$root/etc/resolv.conf" "$root/etc/machine-id" >/dev/null
echo localhost | $SUDO tee "$root/etc/hostname" >/dev/null

log "importing as $TAG"
$SUDO tar -C "$root" --numeric-owner -c . |
  docker import \
    --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'LABEL org.fleet.base=debootstrap' \
    --change "LABEL org.fleet.base.mirror=$MIRROR" \
    --message "debootstrap --variant=minbase $SUITE $MIRROR (fleet docker/base-image.sh)" \
    - "$TAG" >/dev/null || die "docker import failed"

log "built $TAG in $(( $(date +%s) - started ))s, $(docker image inspect -f '{{.Size}}' "$TAG" |
  awk '{ printf "%.0f MB", $1 / 1e6 }')"
