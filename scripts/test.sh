#!/usr/bin/env bash
# Set up (if needed) and run the test suite: with no arguments the default tier (the unit tier on up to four cores,
# then the end-to-end tier, whose servers want the cores to themselves); extra arguments go to pytest instead,
# e.g. `-m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
PYTEST=(.venv/bin/python -m pytest -p no:cacheprovider -q)
if [ "$#" -eq 0 ]; then
  "${PYTEST[@]}" tests/unit -m "not slow and not vllm" --numprocesses auto --maxprocesses 4
  exec "${PYTEST[@]}" tests/e2e -m "not slow and not vllm"
fi
exec "${PYTEST[@]}" "$@"
