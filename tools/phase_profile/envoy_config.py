"""envoy/kvroute.yaml adapted: the pods kvsim started, free ports, phase_timing on, and a second
listener with the same routes but no kvroute filter."""
import json, re, sys

sim, wasm, kv_port, plain_port, admin_port = sys.argv[1:6]
pods = json.load(open(sim))["pods"]
y = open("envoy/kvroute.yaml").read()
y = y.replace("port_value: 9901", f"port_value: {admin_port}")
y = y.replace("address: 0.0.0.0", "address: 127.0.0.1")
y = y.replace("filename: target/wasm32-wasip1/release/kvroute.wasm", f"filename: {wasm}")
y = y.replace('"endpoints": ["10.0.0.11:8000", "10.0.0.12:8000"]',
              '"endpoints": [%s]' % ", ".join(f'"{p}"' for p in pods))
y = y.replace('"stale_after_ms": 2000', '"stale_after_ms": 2000, "phase_timing": true')
lb = "\n".join("        - endpoint: {address: {socket_address: {address: %s, port_value: %s}}}"
               % tuple(p.split(":")) for p in pods)
y = re.sub(r"(        - endpoint: \{address: \{socket_address: \{address: 10\.0\.0\.1[12], port_value: 8000\}\}\}\n)+",
           lb + "\n", y)
listener = y[y.index("  - name: inference"):y.index("  clusters:")]
plain = (listener.replace("name: inference", "name: plain")
         .replace("port_value: 8080", f"port_value: {plain_port}")
         .replace("stat_prefix: inference", "stat_prefix: plain"))
a = plain.index("          - name: envoy.filters.http.wasm")
b = plain.index("          - name: envoy.filters.http.router")
plain = plain[:a] + plain[b:]
y = y.replace(listener, listener.replace("port_value: 8080", f"port_value: {kv_port}") + plain)
# Histograms reach /stats only when Envoy flushes (5 s by default): flush every second, and run.sh
# waits for one flush after the load, so a short run is not read empty.
y = "stats_flush_interval: 1s\n" + y
assert "10.0.0.11" not in y, "envoy/kvroute.yaml changed: adapt envoy_config.py"
print(y)
