#!/usr/bin/env bash
# Installs the Debian packages fleet needs to build, test and run its demo.
# Idempotent and quiet when nothing is missing.
set -euo pipefail
pkgs=(
  g++ cmake ninja-build make pkg-config
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev prometheus-cpp-dev
  libcli11-dev libspdlog-dev nlohmann-json3-dev libcurl4-openssl-dev libyaml-cpp-dev
  libssl-dev libgtest-dev libgmock-dev
  python3 python3-zmq python3-msgpack python3-yaml procps prometheus openssl
  python3-venv python3-pip python3-setuptools python3-joblib python3-cloudpickle python3-pytest
  python3-numpy python3-sklearn
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
