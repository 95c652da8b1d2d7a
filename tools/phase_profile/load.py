"""N pairs of 16 KB chat requests, alternating between the kvroute and the plain listener."""
import http.client, os, statistics, sys

from chat16k import body as chat_body, timed_post

kv, plain = int(sys.argv[1]), int(sys.argv[2])
n, warm = int(os.environ.get("N", "1500")), 200
fresh = os.environ.get("FRESH") == "1"
conns = {p: http.client.HTTPConnection("127.0.0.1", p) for p in (kv, plain)}
times = {p: [] for p in conns}
for i in range(n + warm):
    body = chat_body(f"{i} " if fresh else "")
    for port, c in conns.items():
        us = timed_post(c, body, f"port {port}")
        if i >= warm:
            times[port].append(us)
k, p = statistics.median(times[kv]), statistics.median(times[plain])
print(f"{n} pairs, {'fresh' if fresh else 'repeat'} 16 KB prompts: p50 {k:.0f} µs through kvroute, "
      f"{p:.0f} µs plain, added {k - p:.0f} µs")
