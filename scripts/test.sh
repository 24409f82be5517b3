#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest, e.g. `-m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ "$#" -eq 0 ]; then
  set -- -m "not slow and not vllm"
fi
exec .venv/bin/python -m pytest -p no:cacheprovider -q "$@"
