#!/usr/bin/env bash
# Runs one interop test script with the environment setup.sh made, or reports the test skipped
# (exit 77) with the reason setup.sh recorded.
#
#   run.sh STATUS VENV SCRIPT [ARGS...]
status=$(cat "$1" 2>/dev/null || echo "skip: the interop setup (interop/setup) has not run")
if [ "$status" != ok ]; then
  echo "lockstep interop: ${status}"
  exit 77
fi
exec "$2/bin/python" "${@:3}"
