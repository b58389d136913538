#!/usr/bin/env bash
# Builds what the Kubernetes launcher's tests run against: a real
# kube-apiserver (k8s.io/kubernetes v1.34.4, cmd/kube-apiserver) and a real
# etcd (go.etcd.io/etcd/server/v3 v3.6.16 through its embed package, in a
# 40-line program of ours, tests/kubernetes/etcd/main.go), both from the Go
# module proxy.
#
#   scripts/kube-apiserver.sh [CACHE_DIR]      (default: $FLEET_KUBE_CACHE or
#                                               ~/.cache/fleet-kube)
#
# Prints the directory holding kube-apiserver and etcd. Cached: a second
# run with the binaries present takes no time. The first run takes about
# 10 minutes on 2 cores (kube-apiserver about 8, etcd about 2) and about
# 2 GB of module cache. Needs Go (1.24 or newer) and the module proxy.
#
# The k8s.io/kubernetes module as published replaces its k8s.io/* staging
# modules with ./staging/... paths its zip does not hold; those replace
# lines are swapped for the published v0.34.4 modules, and the build runs
# with GOWORK=off.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
cache=${1:-${FLEET_KUBE_CACHE:-$HOME/.cache/fleet-kube}}
k8s_version=v1.34.4
staging_version=v0.34.4
etcd_version=v3.6.16
bin=$cache/bin
mkdir -p "$bin"
export GOWORK=off GOFLAGS=-buildvcs=false GOMODCACHE=$cache/gomod GOCACHE=$cache/gocache
export PATH=$PATH:/usr/local/go/bin
log() { echo "kube-apiserver.sh: $*" >&2; }
buildlog=$cache/build.log
fail() { log "error: $1 failed; the end of $buildlog:"; tail -n 30 "$buildlog" >&2; exit 1; }
command -v go >/dev/null || { log "error: no go (install Go 1.24+)"; exit 1; }

if [ ! -x "$bin/etcd" ]; then
  t0=$SECONDS
  log "building etcd $etcd_version (embed) ..."
  work=$cache/etcd-src
  rm -rf "$work" && mkdir -p "$work"
  cp "$src/tests/kubernetes/etcd/main.go" "$work/"
  (cd "$work" && go mod init fleet-test-etcd && go get "go.etcd.io/etcd/server/v3@$etcd_version" &&
     go mod tidy && go build -o "$bin/etcd" .) >"$buildlog" 2>&1 || fail "building etcd"
  log "etcd built in $((SECONDS - t0)) s"
fi

if [ ! -x "$bin/kube-apiserver" ]; then
  t0=$SECONDS
  log "building kube-apiserver $k8s_version (about 8 minutes on 2 cores) ..."
  (cd "$cache" && go mod download -json "k8s.io/kubernetes@$k8s_version") >"$buildlog" 2>&1 ||
    fail "downloading k8s.io/kubernetes@$k8s_version"
  work=$cache/kubernetes-src
  rm -rf "$work"
  cp -r "$GOMODCACHE/k8s.io/kubernetes@$k8s_version" "$work"
  chmod -R u+w "$work"
  # ./staging/src/k8s.io/NAME => k8s.io/NAME v0.34.4
  sed -i -E "s#=> \./staging/src/(k8s\.io/[A-Za-z0-9._-]+)\$#=> \1 $staging_version#" "$work/go.mod"
  (cd "$work" && go build -mod=mod -o "$bin/kube-apiserver" ./cmd/kube-apiserver) \
    >"$buildlog" 2>&1 || fail "building kube-apiserver"
  log "kube-apiserver built in $((SECONDS - t0)) s"
fi
echo "$bin"
