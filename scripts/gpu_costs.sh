#!/usr/bin/env bash
# The GPU cost curve behind the SIMULATION: a verification of K = 0..32 drafts on a 7B-shaped target
# and a draft step of a 0.5B-shaped model, timed on a CUDA GPU by the verifier's own engine.
#
#   scripts/gpu_costs.sh prepare   # on a machine with PyPI: the pinned llama-cpp-python sdist (trimmed)
#                                  # and the wheels it needs, into .gpu-costs/ (about 9 MB)
#   scripts/gpu_costs.sh measure   # on the GPU machine (no network needed): builds llama-cpp-python with
#                                  # CUDA for that GPU only, writes random-weight GGUFs, measures; the curve
#                                  # goes to ${OUT:-out}/gpu_costs.json, for `speculoos bench --cost-curve`
#
# The GPU machine needs Python 3.11+, numpy, jinja2, CMake, ninja, scikit-build-core and the CUDA compiler.
# Nothing in the project depends on this script.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=.gpu-costs
VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)

prepare() {
  rm -rf "$STAGE" && mkdir -p "$STAGE/unpack"
  python3 -m pip download --quiet --no-deps --no-binary :all: -d "$STAGE/unpack" "llama-cpp-python==$VERSION"
  python3 -m pip download --quiet --no-deps --only-binary :all: -d "$STAGE/wheels" gguf diskcache
  tar xzf "$STAGE/unpack/llama_cpp_python-$VERSION.tar.gz" -C "$STAGE/unpack"
  local src="$STAGE/unpack/llama_cpp_python-$VERSION" vendor="$STAGE/unpack/llama_cpp_python-$VERSION/vendor/llama.cpp"
  # What a CUDA build of the library does not read: git history, docs, test data, other backends, the web UI.
  # The vocabulary-only Qwen2 GGUF stays: the random-weight models take their tokenizer from it.
  rm -rf "$src/.git" "$vendor/docs" "$vendor/benches" "$vendor/tools/ui" "$vendor"/tools/mtmd/test-*
  find "$vendor/models" -type f ! -name ggml-vocab-qwen2.gguf -delete
  for backend in vulkan sycl opencl hexagon et metal cann openvino webgpu virtgpu zdnn musa rpc blas; do
    rm -rf "$vendor/ggml/src/ggml-$backend"
  done
  tar czf "$STAGE/llama_cpp_python-$VERSION.tar.gz" -C "$STAGE/unpack" "llama_cpp_python-$VERSION"
  rm -rf "$STAGE/unpack"
  du -sh "$STAGE"
}

measure() {
  local out=${OUT:-out} build=/tmp/gpu-costs site=/tmp/gpu-costs/site
  rm -rf "$site" && mkdir -p "$out" "$build"
  local arch
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d '.')
  local device
  device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  echo "building llama-cpp-python $VERSION with CUDA for sm_$arch ($device)"
  tar xzf "$STAGE/llama_cpp_python-$VERSION.tar.gz" -C "$build"
  # One architecture, no FlashAttention kernels (the engine runs without them), no NCCL, no llava; and,
  # as scripts/setup.sh does, no AMX kernels: they fault on virtual machines that do not enable AMX.
  local amx_off="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  CFLAGS="${CFLAGS:-} $amx_off" CXXFLAGS="${CXXFLAGS:-} $amx_off" \
  CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch -DGGML_CUDA_FA=off -DGGML_CUDA_NCCL=off -DLLAVA_BUILD=off" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    python3 -m pip install --quiet --no-index --no-deps --no-build-isolation --target "$site" \
      "$build/llama_cpp_python-$VERSION"
  python3 -m pip install --quiet --no-index --no-deps --target "$site" "$STAGE"/wheels/*.whl
  PYTHONPATH="$site:$PWD" python3 -X faulthandler -m proxy.bench.gpu_costs \
    --tokenizer "$build/llama_cpp_python-$VERSION/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf" \
    --models-dir "$build/models" --out "$out/gpu_costs.json" --device "$device" | tee "$out/gpu_costs.txt"
}

case "${1:-}" in
  prepare) prepare ;;
  measure) measure ;;
  *) echo "usage: scripts/gpu_costs.sh prepare|measure" >&2; exit 2 ;;
esac
