#!/usr/bin/env bash
# Set up (if needed) and run the test suite: with no arguments the default tier (the unit tier on up to four cores,
# then the end-to-end tier, whose servers want the cores to themselves); extra arguments go to pytest instead,
# e.g. `-m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The plugins are named rather than found: pytest rewrites the asserts of every module of a found plugin's package
# (all of hypothesis), without a cache where bytecode is not written, in every process that collects.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
PYTEST=(.venv/bin/python -m pytest -p no:cacheprovider -p pytest_asyncio.plugin -p xdist.plugin -p _hypothesis_pytestplugin -q)
if [ "$#" -eq 0 ]; then
  "${PYTEST[@]}" tests/unit -m "not slow and not vllm" --numprocesses auto --maxprocesses 4
  exec "${PYTEST[@]}" tests/e2e -m "not slow and not vllm"
fi
exec "${PYTEST[@]}" "$@"
