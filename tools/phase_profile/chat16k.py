"""What the latency scripts send and how they time it: a 16 KB chat request (max_tokens 1, not
streamed) and one POST of it over a kept-alive connection, in µs."""
import json, sys, time

SYSTEM = ("You are a careful assistant. " * 600)[:16384]


def body(prefix=""):
    """The request; `prefix` makes its system prompt new (a fresh prompt)."""
    return json.dumps({"model": "sim-model", "max_tokens": 1, "messages": [
        {"role": "system", "content": prefix + SYSTEM}, {"role": "user", "content": "hi"}]})


def timed_post(conn, payload, name):
    """Sends `payload` on `conn` and reads the answer whole: µs taken; exits unless 200."""
    t = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", payload, {"content-type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        sys.exit(f"{name}: status {resp.status}")
    return (time.perf_counter() - t) * 1e6
