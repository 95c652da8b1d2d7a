#!/usr/bin/env bash
# Captures the wire samples the seed corpora start from, from real processes on loopback:
#   * /metrics pages and responses of simulated vLLM and SGLang pods (kvsim speaks their formats),
#     idle and busy, and a prefill pod's answer with its `kv_transfer_params`;
#   * the real Envoy's admin `/clusters?format=json` for static, DNS, IPv6 and health-checked
#     clusters (one member of which fails its checks).
# Usage (from the repository root, after `make build-tools tools`): fuzz/seeds/capture.sh
# Every process started here is stopped by its PID on exit, also on failure.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../.. && pwd)
KVSIM=$ROOT/target/release/kvsim
ENVOY=$(ls "$ROOT"/.tools/venv/lib/python3*/site-packages/envoy/_bin/envoy | head -n1)
OUT=samples
mkdir -p "$OUT"
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# Starts kvsim with the given flags; sets ADDR to its pod's address (not in a subshell, so that
# its PID stays in PIDS for the cleanup).
start_kvsim() {
  local log=$TMP/kvsim-$RANDOM.out
  "$KVSIM" --pods 1 --time-scale 1 "$@" >"$log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 50); do
    if grep -q '"pods"' "$log" 2>/dev/null; then break; fi
    sleep 0.1
  done
  ADDR=$(sed -n 's/.*"pods":\["\([^"]*\)".*/\1/p' "$log" | head -n1)
}

chat() { # addr body
  curl -s -H 'content-type: application/json' "http://$1/v1/chat/completions" -d "$2"
}

start_kvsim --engine vllm --model meta-llama/Llama-3.1-8B-Instruct; VLLM=$ADDR
start_kvsim --engine sglang --model Qwen/Qwen2.5-7B-Instruct; SGLANG=$ADDR
start_kvsim --engine vllm --role prefill --model meta-llama/Llama-3.1-8B-Instruct; PREFILL=$ADDR

curl -s "http://$VLLM/metrics" >"$OUT/vllm-metrics-idle.txt"
curl -s "http://$SGLANG/metrics" >"$OUT/sglang-metrics-idle.txt"
LONG=$(python3 -c 'print("You are a careful assistant. " * 400)')
BODY=$(python3 -c 'import json,sys; print(json.dumps({"model":sys.argv[1],"messages":[{"role":"system","content":sys.argv[2]},{"role":"user","content":"Summarise the above."}],"max_tokens":12,"stream":True,"stream_options":{"include_usage":True}}))' meta-llama/Llama-3.1-8B-Instruct "$LONG")
SBODY=${BODY//meta-llama\/Llama-3.1-8B-Instruct/Qwen\/Qwen2.5-7B-Instruct}
# Busy pages: requests running and waiting while the page is read (real-time pods: each of
# these prompts takes about a second to prefill).
CLIENTS=()
for _ in $(seq 40); do
  chat "$VLLM" "$BODY" >/dev/null & CLIENTS+=($!)
  chat "$SGLANG" "$SBODY" >/dev/null & CLIENTS+=($!)
done
sleep 1.5
curl -s "http://$VLLM/metrics" >"$OUT/vllm-metrics-busy.txt"
curl -s "http://$SGLANG/metrics" >"$OUT/sglang-metrics-busy.txt"
for pid in "${CLIENTS[@]}"; do kill "$pid" 2>/dev/null || true; done
wait "${CLIENTS[@]}" 2>/dev/null || true
curl -s -X POST "http://$VLLM/sim/reset" >/dev/null || true

chat "$VLLM" "$BODY" >"$OUT/vllm-chat-stream.txt"
chat "$VLLM" '{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"hi"}],"max_tokens":8}' >"$OUT/vllm-chat.json"
curl -s -H 'content-type: application/json' "http://$VLLM/v1/completions" \
  -d '{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Once upon a time","max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}' >"$OUT/vllm-completion-stream.txt"
chat "$SGLANG" '{"model":"Qwen/Qwen2.5-7B-Instruct","messages":[{"role":"user","content":"hi"}],"max_tokens":8}' >"$OUT/sglang-chat.json"
chat "$PREFILL" '{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}' >"$OUT/prefill-answer.json"
chat "$VLLM" '{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}' >"$OUT/vllm-error.json" || true

# The real Envoy's admin API.
cat >"$TMP/envoy.yaml" <<EOF
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  clusters:
  - name: pool
    type: STATIC
    connect_timeout: 0.25s
    load_assignment:
      cluster_name: pool
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: ${VLLM%:*}, port_value: ${VLLM##*:}}}}
        - endpoint: {address: {socket_address: {address: ${SGLANG%:*}, port_value: ${SGLANG##*:}}}}
  - name: outbound|8000||vllm.default.svc.cluster.local
    type: STRICT_DNS
    connect_timeout: 0.25s
    load_assignment:
      cluster_name: dns
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: localhost, port_value: 8000}}}
  - name: checked
    type: STATIC
    connect_timeout: 0.25s
    health_checks:
    - timeout: 0.2s
      interval: 0.2s
      unhealthy_threshold: 1
      healthy_threshold: 1
      http_health_check: {path: /health}
    load_assignment:
      cluster_name: checked
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: ${VLLM%:*}, port_value: ${VLLM##*:}}}}
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 1}}}
        - endpoint: {address: {socket_address: {address: "::1", port_value: 1}}}
EOF
"$ENVOY" -c "$TMP/envoy.yaml" --admin-address-path "$TMP/admin" --base-id $((RANDOM + 1000)) \
  -l warning >"$TMP/envoy.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do test -s "$TMP/admin" && break; sleep 0.1; done
sleep 1.5 # a few health-check rounds
curl -s "http://$(cat "$TMP/admin")/clusters?format=json" >"$OUT/envoy-clusters.json"
ls -l "$OUT"
