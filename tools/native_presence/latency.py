"""Rounds of N sequential 16 KB chat requests (max_tokens 1) to each listener in turn, one request
to each per step (the order rotating), over one connection each; per round, each listener's p50
minus the plain listener's p50 (µs). Then the median over the rounds."""
import http.client, os, statistics, sys

sys.path.insert(0, f"{sys.path[0]}/../phase_profile")
from chat16k import body as chat_body, timed_post  # noqa: E402

ports = dict(arg.split("=") for arg in sys.argv[1:])
n, warm, rounds = int(os.environ.get("N", "600")), 100, int(os.environ.get("ROUNDS", "3"))
body = chat_body()
conns = {name: http.client.HTTPConnection("127.0.0.1", int(p)) for name, p in ports.items()}
names = list(conns)
added = {name: [] for name in names}
for r in range(rounds):
    times = {name: [] for name in names}
    for i in range(n + warm):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            us = timed_post(conns[name], body, name)
            if i >= warm:
                times[name].append(us)
    base = statistics.median(times["plain"])
    line = [f"round {r + 1}: plain p50 {base:.0f}"]
    for name in names:
        if name != "plain":
            a = statistics.median(times[name]) - base
            added[name].append(a)
            line.append(f"{name} {a:+.0f}")
    print("  ".join(line), flush=True)
print("added p50 over plain, median of rounds [min … max], µs: " + "  ".join(
    f"{name} {statistics.median(v):+.0f} [{min(v):+.0f} … {max(v):+.0f}]"
    for name, v in added.items() if name != "plain"))
