#!/bin/bash
# Does the leader's polling of a large pool show in request latency? (`make bench-polling`)
# One kvsim serves PODS cheap pods (default 512, every answer at once). Envoy (2 workers, the
# `run.sh` listeners: one through kvroute, one plain, on the same pool) runs ROUNDS times with
# each poll interval: 200 ms (the leader polls every pod 5 times a second) and 60 s (one poll at
# start, then none while measured). Each run sends N pairs of 16 KB chat requests, alternating
# between the listeners over one connection each, and prints the kvroute and plain p50 / p90 /
# p99, what kvroute adds at each, the requests kvroute routed, and the CPU Envoy's main thread
# (where the leader polls) spent per second. Every process is stopped by PID on exit; ports are
# chosen free at start.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
pods=${PODS:-512}
rounds=${ROUNDS:-2}
out=$(mktemp -d)
envoy_bin=$(find .tools/venv -name envoy -type f -perm -u+x | head -1)
wasm=$(realpath "${KVROUTE_WASM:-target/wasm32-wasip1/release/kvroute.wasm}")
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$out"' EXIT
target/release/kvsim --pods "$pods" --time-scale 0.0001 > "$out/sim.json" 2> "$out/sim.err" &
pids+=($!)
for _ in $(seq 300); do grep -q pods "$out/sim.json" 2>/dev/null && break; sleep 0.1; done
grep -q pods "$out/sim.json" || { echo "kvsim did not start: $(cat "$out/sim.err")" >&2; exit 1; }
echo "$pods pods, $rounds rounds; µs; main CPU = Envoy's main thread, ms per second"
for round in $(seq "$rounds"); do
  for poll_ms in 200 60000; do
    read -r kv_port plain_port admin_port < <(python3 -c '
import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
    # The shipped settings at 200 ms; at 60 s the lease and staleness stretched to match.
    lease_ms=$((poll_ms * 3 > 1500 ? poll_ms * 3 : 1500))
    stale_ms=$((poll_ms * 3 > 2000 ? poll_ms * 3 : 2000))
    python3 "$here/envoy_config.py" "$out/sim.json" "$wasm" "$kv_port" "$plain_port" "$admin_port" \
      | sed -e 's/"phase_timing": true/"phase_timing": false/' \
            -e "s/\"poll_interval_ms\": 200/\"poll_interval_ms\": $poll_ms, \"leader_lease_ms\": $lease_ms/" \
            -e "s/\"stale_after_ms\": 2000/\"stale_after_ms\": $stale_ms/" > "$out/envoy.yaml"
    "$envoy_bin" -c "$out/envoy.yaml" --concurrency 2 --log-level warn > "$out/envoy.log" 2>&1 &
    envoy_pid=$!
    pids+=($envoy_pid)
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$admin_port/ready" && break; sleep 0.2; done
    kill -0 "$envoy_pid" 2>/dev/null || { echo "Envoy exited:" >&2; tail -15 "$out/envoy.log" >&2; exit 1; }
    sleep 3 # the first polls of every pod, and the load table
    before=$(python3 "$here/main_cpu.py" "$envoy_pid")
    started=$(date +%s.%N)
    result=$(python3 "$here/latency.py" "$kv_port" "$plain_port")
    after=$(python3 "$here/main_cpu.py" "$envoy_pid")
    ended=$(date +%s.%N)
    routed=$(curl -s "http://127.0.0.1:$admin_port/stats?filter=requests_routed_total" > "$out/routed.txt"; python3 -c '
import sys
print(sum(int(l.rsplit(" ", 1)[1]) for l in open(sys.argv[1]) if l.strip()))' "$out/routed.txt")
    main=$(python3 -c "print(f'{($after - $before) / ($ended - $started):.1f}')")
    printf 'round %s  poll %5s ms  %s  routed %s  main CPU %s ms/s\n' \
      "$round" "$poll_ms" "$result" "$routed" "$main"
    kill "$envoy_pid"
    wait "$envoy_pid" 2>/dev/null || true
  done
done
