#!/usr/bin/env bash
# The main job: set up, start the verifier with the Qwen 1.5B target, and serve the proxy
# (Qwen 0.5B draft) on http://127.0.0.1:8080/v1 until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SPECULOOS_RUN_SETUP:-1}" != 0 ]; then  # 0: already set up (the test that runs this script)
  SPECULOOS_SETUP_BROWSER=0 scripts/setup.sh  # the browser is for the tests only
fi

VERIFIER_PORT=${VERIFIER_PORT:-8001}
PROXY_PORT=${PROXY_PORT:-8080}
ROUTES=${ROUTES:-routes.yaml}  # its upstream is the verifier started here
LOG_DIR=${LOG_DIR:-out}
# The verifier and the draft model share this machine's cores: the proxy makes them take turns, each computing
# with every core while the other waits. VERIFIER_THREADS and DRAFT_THREADS set their threads (default: every core).
CORES=$(.venv/bin/python -c 'from proxy.engine.threads import usable_cores; print(usable_cores())')
VERIFIER_THREADS=${VERIFIER_THREADS:-$CORES}
DRAFT_THREADS=${DRAFT_THREADS:-$CORES}
echo "threads:  verifier $VERIFIER_THREADS, draft $DRAFT_THREADS (taking turns), of $CORES cores"
mkdir -p "$LOG_DIR"
.venv/bin/speculoos verifier --model qwen2.5-coder-1.5b --port "$VERIFIER_PORT" --threads "$VERIFIER_THREADS" \
  > "$LOG_DIR/verifier.log" 2>&1 &
VERIFIER_PID=$!
trap 'kill $VERIFIER_PID 2>/dev/null || true' EXIT

for _ in $(seq 1 120); do
  if curl -fsS "http://127.0.0.1:$VERIFIER_PORT/health" > /dev/null 2>&1; then break; fi
  kill -0 $VERIFIER_PID 2>/dev/null || { echo "verifier failed to start:"; cat "$LOG_DIR/verifier.log"; exit 1; }
  sleep 1
done
echo "verifier: Qwen2.5-Coder-1.5B on http://127.0.0.1:$VERIFIER_PORT (log: $LOG_DIR/verifier.log)"
cat <<MSG
proxy:    http://127.0.0.1:$PROXY_PORT/v1   ($ROUTES; Ctrl-C stops both)
live:     off; with server.live: true in $ROUTES, http://127.0.0.1:$PROXY_PORT/speculoos/live (each key its own requests)
try:      curl -s http://127.0.0.1:$PROXY_PORT/v1/chat/completions -H 'Content-Type: application/json' -d '{"model": "qwen", "temperature": 0, "max_tokens": 160, "messages": [{"role": "user", "content": "Rename n to number in this code and return only the code:\\n\\ndef is_prime(n):\\n    if n < 2:\\n        return False\\n    for i in range(2, int(n ** 0.5) + 1):\\n        if n % i == 0:\\n            return False\\n    return True\\n"}]}' | python3 -m json.tool
          (the answer's "speculoos" object says what the drafts did and how fast that was against plain decoding)
MSG
.venv/bin/speculoos serve --routes "$ROUTES" --port "$PROXY_PORT" --draft-threads "$DRAFT_THREADS"
