#!/bin/bash
# Where kvroute's cost goes inside Envoy (`make bench-phases`): one Envoy (2 workers) with two
# listeners on the same pool of zero-latency kvsim pods, one through kvroute (with `phase_timing`
# on), one without; N pairs of 16 KB chat requests (max_tokens 1, not streamed), alternating, one
# at a time over one connection each. Prints the added p50 latency and each phase's histogram.
# Every process is stopped by PID on exit. Ports are chosen free at start.
set -euo pipefail
source "$(dirname "$0")/common.sh"
start_kvsim 4
free_ports
python3 "$here/envoy_config.py" "$out/sim.json" "$wasm" "$kv_port" "$plain_port" "$admin_port" > "$out/envoy.yaml"
"$envoy_bin" -c "$out/envoy.yaml" --concurrency 2 --log-level warn > "$out/envoy.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$admin_port/ready" && break; sleep 0.2; done
sleep 1 # the first polls
python3 "$here/load.py" "$kv_port" "$plain_port"
sleep 1.5 # one stats flush (envoy_config.py sets it to 1 s), which merges the histograms
curl -s "http://127.0.0.1:$admin_port/stats?filter=wasmcustom.kvroute.(phase|decision)&histogram_buckets=none" \
  | python3 "$here/summary.py"
