# Sourced by run.sh, cpu_split.sh and polling.sh: the repository root as the working directory,
# a scratch folder ($out), the Envoy binary and the plugin, every started process stopped by PID
# on exit (add each to `pids`), and two helpers.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
out=$(mktemp -d)
envoy_bin=$(find .tools/venv -name envoy -type f -perm -u+x | head -1)
wasm=$(realpath "${KVROUTE_WASM:-target/wasm32-wasip1/release/kvroute.wasm}")
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$out"' EXIT

# start_kvsim PODS: that many zero-latency pods, their addresses in $out/sim.json.
start_kvsim() {
  target/release/kvsim --pods "$1" --time-scale 0.0001 > "$out/sim.json" 2> "$out/sim.err" &
  pids+=($!)
  for _ in $(seq 300); do grep -q pods "$out/sim.json" 2>/dev/null && break; sleep 0.1; done
  grep -q pods "$out/sim.json" || { echo "kvsim did not start: $(cat "$out/sim.err")" >&2; exit 1; }
}

# free_ports: sets kv_port, plain_port and admin_port to ports free on loopback now.
free_ports() {
  read -r kv_port plain_port admin_port < <(python3 -c '
import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
}
