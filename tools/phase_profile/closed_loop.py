"""One closed-loop client for cpu_split.sh: the same 16 KB chat request over one connection for
SECS seconds; writes how many were answered to FILE (when given)."""
import http.client, json, sys, time

port, secs = int(sys.argv[1]), float(sys.argv[2])
system = ("You are a careful assistant. " * 600)[:16384]
body = json.dumps({"model": "sim-model", "max_tokens": 1, "messages": [
    {"role": "system", "content": system}, {"role": "user", "content": "hi"}]})
conn = http.client.HTTPConnection("127.0.0.1", port)
end, answered = time.monotonic() + secs, 0
while time.monotonic() < end:
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        sys.exit(f"port {port}: status {r.status}")
    answered += 1
if len(sys.argv) > 3:
    open(sys.argv[3], "w").write(f"{answered}\n")
