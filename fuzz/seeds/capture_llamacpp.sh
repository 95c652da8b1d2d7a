#!/usr/bin/env bash
# Captures a real llama.cpp `llama-server --metrics` page, idle and busy, into samples/ (the prom
# seed corpus, and the fixtures of src/vm/prom.rs's tests): llama.cpp is not simulated by kvsim,
# so its page comes from the real server and the small model `make llama` installs.
# Usage (from the repository root, after `make llama`): fuzz/seeds/capture_llamacpp.sh
# LLAMA_DIR: another install with the same layout (bin/llama-server, SmolLM2-135M-Instruct.Q4_1.gguf).
# The server started here is stopped by its PID on exit, also on failure.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../.. && pwd)
LLAMA_DIR=${LLAMA_DIR:-$ROOT/.tools/llama}
OUT=samples
mkdir -p "$OUT"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# One slot: of three requests sent at once, one runs and two are deferred (llama.cpp's waiting).
"$LLAMA_DIR/bin/llama-server" -m "$LLAMA_DIR/SmolLM2-135M-Instruct.Q4_1.gguf" --alias SmolLM2-135M-Instruct \
  --host 127.0.0.1 --port "$PORT" -c 2048 -np 1 -t 1 --metrics >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT/metrics" >"$OUT/llamacpp-metrics-idle.txt"

LONG=$(python3 -c 'print("You are a careful assistant. " * 80)')
BODY=$(python3 -c 'import json,sys; print(json.dumps({"model":"SmolLM2-135M-Instruct","messages":[{"role":"system","content":sys.argv[1]},{"role":"user","content":"Summarise the above."}],"max_tokens":64}))' "$LONG")
# One request first, so the busy page's counters and throughput gauges are not all 0.
curl -s -H 'content-type: application/json' "http://127.0.0.1:$PORT/v1/chat/completions" -d "$BODY" >/dev/null
CLIENTS=()
for _ in 1 2 3; do
  curl -s -H 'content-type: application/json' "http://127.0.0.1:$PORT/v1/chat/completions" -d "$BODY" >/dev/null &
  CLIENTS+=($!)
done
# Until the page shows one request running and two deferred (or 10 s).
for _ in $(seq 100); do
  sleep 0.1
  PAGE=$(curl -sf "http://127.0.0.1:$PORT/metrics")
  if grep -q '^llamacpp:requests_processing 1$' <<<"$PAGE" && grep -q '^llamacpp:requests_deferred 2$' <<<"$PAGE"; then
    printf '%s\n' "$PAGE" >"$OUT/llamacpp-metrics-busy.txt"
    break
  fi
done
for pid in "${CLIENTS[@]}"; do wait "$pid" || true; done
test -s "$OUT/llamacpp-metrics-busy.txt" || { echo "the page never showed two deferred requests" >&2; exit 1; }
echo "wrote $OUT/llamacpp-metrics-idle.txt and $OUT/llamacpp-metrics-busy.txt"
