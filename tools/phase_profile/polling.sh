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
source "$(dirname "$0")/common.sh"
pods=${PODS:-512}
rounds=${ROUNDS:-2}
start_kvsim "$pods"
echo "$pods pods, $rounds rounds; µs; main CPU = Envoy's main thread, ms per second"
for round in $(seq "$rounds"); do
  for poll_ms in 200 60000; do
    free_ports
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
