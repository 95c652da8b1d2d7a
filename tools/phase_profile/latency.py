"""N pairs (default 1,000, after 200 warm-up) of 16 KB chat requests, alternating between the
kvroute and the plain listener over one connection each; prints both listeners' p50 / p90 / p99
and what kvroute adds at each (µs)."""
import http.client, os, sys

from chat16k import body as chat_body, timed_post

kv, plain = int(sys.argv[1]), int(sys.argv[2])
n, warm = int(os.environ.get("N", "1000")), 200
body = chat_body()
conns = {p: http.client.HTTPConnection("127.0.0.1", p) for p in (kv, plain)}
times = {p: [] for p in conns}
for i in range(n + warm):
    for port, c in conns.items():
        us = timed_post(c, body, f"port {port}")
        if i >= warm:
            times[port].append(us)


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


cells = []
for p in (0.5, 0.9, 0.99):
    k, q = pct(times[kv], p), pct(times[plain], p)
    cells.append(f"p{int(p * 100)} {k:.0f}/{q:.0f} (+{k - q:.0f})")
print("kvroute/plain " + "  ".join(cells))
