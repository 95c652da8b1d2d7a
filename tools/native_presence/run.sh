#!/bin/bash
# What a native filter's mere presence costs a request, beside a Proxy-Wasm filter's: one Envoy
# (2 workers), four listeners on the same 4 zero-latency kvsim pods: plain, `native` (a do-nothing
# dynamic module, noop_module.c, built here with gcc), `presence` (kvroute with no pools: every
# callback enters V8, nothing is routed) and `kvroute` (routing, `phase_timing` on as in
# tools/phase_profile/run.sh). ROUNDS rounds of N sequential
# 16 KB chat requests to each, the order rotating; prints each one's p50 over plain's.
# Every process is stopped by PID on exit; ports are chosen free at start.
set -euo pipefail
source "$(dirname "$0")/../phase_profile/common.sh"
gcc -O2 -shared -fPIC -o "$out/libnoop.so" "$root/tools/native_presence/noop_module.c"
start_kvsim 4
free_ports
read -r native_port presence_port < <(python3 -c '
import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
python3 "$root/tools/native_presence/config.py" "$out/sim.json" "$wasm" "$kv_port" "$plain_port" \
  "$native_port" "$presence_port" "$admin_port" > "$out/envoy.yaml"
ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$out" "$envoy_bin" -c "$out/envoy.yaml" --concurrency 2 \
  --log-level warn > "$out/envoy.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$admin_port/ready" && break; sleep 0.2; done
curl -sf -o /dev/null "http://127.0.0.1:$admin_port/ready" || { cat "$out/envoy.log" >&2; exit 1; }
sleep 1 # the first polls
grep -i "dynamic module" "$out/envoy.log" | head -3 || true
python3 "$root/tools/native_presence/latency.py" plain="$plain_port" native="$native_port" \
  presence="$presence_port" kvroute="$kv_port"
