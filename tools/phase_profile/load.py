"""N pairs of 16 KB chat requests, alternating between the kvroute and the plain listener."""
import http.client, json, os, statistics, sys, time

kv, plain = int(sys.argv[1]), int(sys.argv[2])
n, warm = int(os.environ.get("N", "1500")), 200
fresh = os.environ.get("FRESH") == "1"
system = ("You are a careful assistant. " * 600)[:16384]
conns = {p: http.client.HTTPConnection("127.0.0.1", p) for p in (kv, plain)}
times = {p: [] for p in conns}
for i in range(n + warm):
    body = json.dumps({"model": "sim-model", "max_tokens": 1, "messages": [
        {"role": "system", "content": (f"{i} " if fresh else "") + system},
        {"role": "user", "content": "hi"}]})
    for port, c in conns.items():
        t = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        r = c.getresponse()
        r.read()
        if r.status != 200:
            sys.exit(f"port {port}: status {r.status}")
        if i >= warm:
            times[port].append((time.perf_counter() - t) * 1e6)
k, p = statistics.median(times[kv]), statistics.median(times[plain])
print(f"{n} pairs, {'fresh' if fresh else 'repeat'} 16 KB prompts: p50 {k:.0f} µs through kvroute, "
      f"{p:.0f} µs plain, added {k - p:.0f} µs")
