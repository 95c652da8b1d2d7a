#!/bin/bash
# Which kind of code the filter's CPU is spent in (`tools/phase_profile/cpu_split.sh`, needs
# `perf`): the Envoy of `run.sh` (2 workers, two listeners on 4 zero-latency kvsim pods, one
# through kvroute), loaded by CLIENTS closed-loop clients on one listener at a time for SECS
# seconds each, sampled by `perf record`. Envoy's binary is stripped, so the split is by code
# kind only: the plugin's compiled Wasm ("[JIT]"), Envoy's own code (V8's runtime and the host
# calls included), the kernel, libc. Prints CPU µs per request per kind for each listener, and
# the share of Envoy's code that ran under a Wasm frame (host calls the plugin made).
# Every process is stopped by PID on exit. Ports are chosen free at start.
set -euo pipefail
source "$(dirname "$0")/common.sh"
secs=${SECS:-8}
clients=${CLIENTS:-3}
command -v perf > /dev/null || { echo "cpu_split.sh needs perf (linux-perf)" >&2; exit 1; }
start_kvsim 4
free_ports
python3 "$here/envoy_config.py" "$out/sim.json" "$wasm" "$kv_port" "$plain_port" "$admin_port" \
  | sed 's/"phase_timing": true/"phase_timing": false/' > "$out/envoy.yaml"
"$envoy_bin" -c "$out/envoy.yaml" --concurrency 2 --log-level warn > "$out/envoy.log" 2>&1 &
envoy_pid=$!
pids+=($envoy_pid)
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$admin_port/ready" && break; sleep 0.2; done
sleep 1 # the first polls
for arm in kvroute plain; do
  port=$kv_port; [ "$arm" = plain ] && port=$plain_port
  python3 "$here/closed_loop.py" "$port" 2 > /dev/null # warm-up
  loaders=()
  for i in $(seq "$clients"); do
    python3 "$here/closed_loop.py" "$port" "$secs" "$out/$arm.count.$i" &
    loaders+=($!)
    pids+=($!)
  done
  perf record -q -F 1999 -g -p "$envoy_pid" -o "$out/$arm.data" -- sleep "$secs" 2> "$out/perf.err"
  for p in "${loaders[@]}"; do wait "$p"; done
  requests=$(cat "$out/$arm".count.* | python3 -c 'import sys; print(sum(int(l) for l in sys.stdin))')
  self=$(perf report -i "$out/$arm.data" --no-children --sort dso -g none -F sample,dso 2>/dev/null | grep -v '^#' | grep -v '^$')
  children=$(perf report -i "$out/$arm.data" --children --sort dso -g none 2>/dev/null | grep -v '^#' | grep -v '^$')
  python3 - "$arm" "$requests" "$secs" <<PY
import re, sys
arm, requests, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
# Samples at 1,999 Hz over the window; each client counted the requests answered in it.
us = lambda samples: samples / 1999 / requests * 1e6
kinds = {}
for line in """$self""".splitlines():
    samples, dso = line.split(None, 1)
    dso = "wasm (JIT)" if dso.startswith("[JIT]") else dso.strip()
    kinds[dso] = kinds.get(dso, 0) + int(samples)
under_jit = 0
for line in """$children""".splitlines():
    # Children% (the JIT frames and everything they called), self%, the code's kind.
    m = re.match(r"\s*([0-9.]+)%\s+([0-9.]+)%\s+\[JIT\]", line)
    if m:
        under_jit = (float(m.group(1)) - float(m.group(2))) / 100 * sum(kinds.values())
print(f"{arm}: {requests} requests in {secs:.0f} s; CPU µs per request: "
      + ", ".join(f"{k} {us(v):.1f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
      + f"; total {us(sum(kinds.values())):.1f}; Envoy code under a Wasm frame {us(max(under_jit, 0)):.1f}")
PY
done
