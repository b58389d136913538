#!/usr/bin/env bash
# Runs the Python package's tests (python/tests) the way a user installs it:
# pip into a venv made with --system-site-packages (Debian's python3-zmq,
# python3-msgpack, python3-joblib, python3-cloudpickle and python3-pytest come
# from there; nothing is downloaded and Debian's own python is never touched).
# Usage: run_tests.sh BUILD_DIR [pytest args...]
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD_DIR [pytest args]}" && pwd)
shift
src=$(cd "$(dirname "$0")" && pwd)
venv=$build/python-venv
if [[ ! -x $venv/bin/python ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
# pip builds in the source tree; build from a copy so the checkout stays clean.
stage=$(mktemp -d "${TMPDIR:-/tmp}/fleet-py.XXXXXX")
trap 'rm -rf "$stage"' EXIT
cp -r "$src/pyproject.toml" "$src/README.md" "$src/fleet" "$stage/"
"$venv/bin/python" -m pip install -q --no-build-isolation --no-deps --no-index \
  --disable-pip-version-check --force-reinstall "$stage" >"$stage/pip.log" 2>&1 ||
  { cat "$stage/pip.log"; exit 1; }
cd "$src/tests"
set +e
# Unbuffered, and a test still running after 120 s prints every thread's
# stack: a hang that ctest's timeout cuts off still says where it was.
PYTHONUNBUFFERED=1 FLEET_BIN_DIR=$build/bin "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  -o faulthandler_timeout=120 --basetemp="$stage/t" "$@" .
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "FAIL: pytest collected no tests in python/tests" >&2
  exit 1
fi
exit $rc
