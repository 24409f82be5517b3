#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama.cpp our engine runs: the source vendored in the
# llama-cpp-python sdist that pyproject.toml pins, so `speculoos bench peers` compares servers that
# share one llama.cpp commit. For benchmarks only: nothing else in the project needs it.
# Idempotent: the binary is cached in ~/.cache/speculoos/llama-server/<version>/bin/ and a second
# run only checks it (seconds). Prints the binary's path on its last line.
# CMAKE_BUILD_PARALLEL_LEVEL sets the compile jobs (default: every core); about 6 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml | head -n 1)
[ -n "$VERSION" ] || { echo "setup_llama_server: no llama-cpp-python==X pin in pyproject.toml" >&2; exit 1; }
# The models' cache convention (proxy/models/registry.py): $XDG_CACHE_HOME when absolute, else ~/.cache.
case "${XDG_CACHE_HOME:-}" in /*) CACHE=$XDG_CACHE_HOME ;; *) CACHE=$HOME/.cache ;; esac
DIR=${SPECULOOS_LLAMA_SERVER_DIR:-$CACHE/speculoos/llama-server/$VERSION}
BINARY=$DIR/bin/llama-server
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

if [ -x "$BINARY" ] && "$BINARY" --version > /dev/null 2>&1; then
  echo "$BINARY"
  exit 0
fi
for tool in cmake c++; do
  command -v "$tool" > /dev/null 2>&1 || {
    echo "setup_llama_server: $tool is needed to build llama-server" >&2; exit 1; }
done

mkdir -p "$DIR"
exec 9> "$DIR/.lock"
flock 9  # two runs at once: the second waits, then finds the binary
if [ -x "$BINARY" ] && "$BINARY" --version > /dev/null 2>&1; then
  echo "$BINARY"
  exit 0
fi

# An interrupted run left its work here: the source is kept and the build goes on where it stopped.
WORK=$DIR/work
SOURCE=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
if [ ! -f "$WORK/.extracted" ]; then
  rm -rf "$WORK"
  mkdir -p "$WORK"
  echo "setup_llama_server: fetching the llama-cpp-python $VERSION sdist (pip caches it)" >&2
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$WORK" >&2
  tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
  touch "$WORK/.extracted"
fi
[ -f "$SOURCE/tools/server/server.cpp" ] || {
  echo "setup_llama_server: no llama-server source in $SOURCE" >&2; exit 1; }

# As scripts/setup.sh builds our engine: -march=native, but no AMX kernels on x86 (they die of a
# general protection fault on virtual machines that advertise AMX without enabling it).
if [ "$(uname -m)" = x86_64 ]; then
  AMX_OFF="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  export CFLAGS="${CFLAGS:-} $AMX_OFF" CXXFLAGS="${CXXFLAGS:-} $AMX_OFF"
fi
GENERATOR=()
if command -v ninja > /dev/null 2>&1; then GENERATOR=(-G Ninja); fi
# Static libraries: one self-contained binary to cache. No web UI (it would download or need npm),
# no HTTPS, no tests, examples or other tools.
cmake -S "$SOURCE" -B "$WORK/build" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  > "$WORK/configure.log" 2>&1 || { tail -n 40 "$WORK/configure.log" >&2; exit 1; }
echo "setup_llama_server: compiling llama-server (log: $WORK/build.log)" >&2
cmake --build "$WORK/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  > "$WORK/build.log" 2>&1 || { tail -n 40 "$WORK/build.log" >&2; exit 1; }

mkdir -p "$DIR/bin"
cp "$WORK/build/bin/llama-server" "$BINARY.partial"
mv "$BINARY.partial" "$BINARY"  # atomic: a binary in place is always complete
rm -rf "$WORK"
echo "$BINARY"
