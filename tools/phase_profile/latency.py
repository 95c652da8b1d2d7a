"""N pairs (default 1,000, after 200 warm-up) of 16 KB chat requests, alternating between the
kvroute and the plain listener over one connection each; prints both listeners' p50 / p90 / p99
and what kvroute adds at each (µs)."""
import http.client, json, os, sys, time

kv, plain = int(sys.argv[1]), int(sys.argv[2])
n, warm = int(os.environ.get("N", "1000")), 200
system = ("You are a careful assistant. " * 600)[:16384]
body = json.dumps({"model": "sim-model", "max_tokens": 1, "messages": [
    {"role": "system", "content": system}, {"role": "user", "content": "hi"}]})
conns = {p: http.client.HTTPConnection("127.0.0.1", p) for p in (kv, plain)}
times = {p: [] for p in conns}
for i in range(n + warm):
    for port, c in conns.items():
        t = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        if r.status != 200:
            sys.exit(f"port {port}: status {r.status}")
        if i >= warm:
            times[port].append((time.perf_counter() - t) * 1e6)


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


cells = []
for p in (0.5, 0.9, 0.99):
    k, q = pct(times[kv], p), pct(times[plain], p)
    cells.append(f"p{int(p * 100)} {k:.0f}/{q:.0f} (+{k - q:.0f})")
print("kvroute/plain " + "  ".join(cells))
