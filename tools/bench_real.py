#!/usr/bin/env python3
"""`make bench-real`: kvroute against round-robin and the peer routers on REAL llama.cpp pods.

For every policy and seed this starts fresh `llama-server` pods (SmolLM2-135M, one slot, one
thread, 2,048 tokens of context, `--metrics`, loopback, free ports chosen at run time), starts the
router in front of them, waits until it reports every pod, warms nothing, and sends the same seeded
workload as streamed `/v1/chat/completions` (`stream_options.include_usage`):

* multi-tenant: T tenants, each with its own ~500-token system prompt of distinct words, asking
  10-30-word questions (max_tokens 8) at Poisson arrivals of a fixed rate; the first seconds are
  unmeasured.
* multi-turn: a few conversations, each resending its whole history every turn (the history grows by
  a question and the model's own reply per turn), a closed loop with seeded think times; a finished
  conversation is replaced by a fresh one.

Per request: TTFT (time to the first non-empty content chunk), `usage.prompt_tokens` and
`usage.prompt_tokens_details.cached_tokens` of the final chunk, the status and, where known, the pod.
Per pod: the deltas of its own `llamacpp:prompt_tokens_total` (tokens it computed) and
`llamacpp:prompt_tokens_cached_total` (tokens it took from its cache) and of its busy seconds.

Policies: kvroute (Envoy with the kvroute plugin as `kvbench up --endpoints ...` configures it,
with two plugin settings a user of CPU llama.cpp pods needs, see below; `kvroute-defaults` is
`kvbench up` unchanged), round-robin (a plain client-side rotation straight to the pods: `kvbench
up` has no round-robin mode), and the peer routers of `make peers` with their cache_aware policy
(vllm-router, sglang-router; smg on request), each dropped with a note when it does not start
against llama-server.

Scaling for CPU. A calibration on one throw-away pod measures the prefill rate, the time of a
request whose system prompt is cached and of one whose is not, and the size of a saved prompt
state; the multi-tenant rate is sized for --utilisation of the pool under round-robin. Each pod's
host prompt cache (llama-server's --cache-ram, which keeps prompts beyond the slot's) is sized to
keep --cache-prompts tenants' prompts besides its slot's (4 of 6 by default): the pool has room for
every tenant with a third to spare, one pod does not, the regime of the simulator's multi-tenant
shape (there 4 pods each hold about 40% of 48 tenants' prompts, room for 1.7 times them all; with
3 of 6, no room to spare, one uneven placement thrashes a pod). llama-server's default (8192 MiB)
would keep every prompt of the run on every pod (`--cache-ram 8192`).

kvroute's two settings. llama-server sends a queued request's response headers only when its
slot takes the request, so kvroute's per-attempt first-byte timeout (health.first_byte_timeout_ms,
5 s by default, retried twice onto other pods) also times the queue, which on one-thread CPU pods
is often longer: it is raised (--first-byte-timeout-ms). llama.cpp reports no KV-cache geometry,
so kvroute is told each pod's cache size (default_pod_capacity_blocks, from --cache-ram;
--kvroute-capacity off leaves kvroute's 16384-block default). `kvbench up` has no option for plugin
settings: it is started to write its Envoy configuration, that file is copied with these settings
merged into the plugin's, and Envoy is run on the copy.

Python 3.11 standard library only. Every process is started in its own process group and stopped
by PID (SIGTERM to its group, then SIGKILL), also on failure and Ctrl-C.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LLAMA_BIN = REPO / ".tools/llama/bin/llama-server"
LLAMA_MODEL = REPO / ".tools/llama/SmolLM2-135M-Instruct.Q4_1.gguf"
KVBENCH = REPO / "target/release/kvbench"
WASM = REPO / "target/wasm32-wasip1/release/kvroute.wasm"
PEERS_DIR = REPO / ".tools/peers"
MODEL = "SmolLM2-135M-Instruct"
CTX = 2048

# The peers as bench/src/peers.rs starts them: console script, arguments before the
# common ones, log level.
PEERS = {
    "vllm-router": ("vllm-router", [], "warning"),
    "sglang-router": ("sglang-router", ["launch"], "warn"),
    "smg": ("smg", ["launch", "--load-monitor-interval", "1"], "warn"),
}
ALL_POLICIES = ["kvroute", "kvroute-defaults", "round-robin", *PEERS]

# Common English words (no filler that would tokenise oddly): prompts and questions are drawn from
# them, so a prompt's tokens are about its words.
WORDS = """
able account across action active actual address admit adult advice affect agency agent agree ahead
allow almost alone along already always amount animal answer anyone appear apply approach area argue
around arrive article artist assume attack attention author avoid award aware balance ball bank base
beat beautiful become before begin behind believe benefit best better between beyond bill black blood
blue board body book born both break bring brother budget build building business call camera campaign
cancer capital card care career carry case catch cause cell center central century certain chair
challenge chance change charge check child choice choose church citizen city civil claim class clear
close coach cold collection college color come common community company compare computer concern
condition conference consider contain continue control cost could country county couple course court
cover create crime cultural culture cup current customer dark data daughter dead deal debate decade
decide decision deep defense degree describe design despite detail determine develop difference
different difficult dinner direction director discover discuss disease doctor door down draw dream
drive drop drug during early east easy economic economy edge education effect effort eight either
election else employee energy enjoy enough enter entire environment especially establish evening event
ever every evidence exactly example executive exist expect experience expert explain face fact factor
fail fall family far fast father fear federal feel feeling field fight figure fill film final finally
financial find fine finger finish fire firm first fish five floor focus follow food foot force foreign
forget form former forward four free friend front full fund future game garden general generation girl
give glass goal good government great green ground group grow growth guess gun guy hair half hand hang
happen happy hard have head health hear heart heat heavy help here herself high himself history hold
home hope hospital hotel hour house however huge human hundred husband idea identify image imagine
impact important improve include income increase indeed indicate individual industry information
inside instead institution interest interview into investment issue item itself join just keep kind
kitchen know land language large last late later laugh lawyer lead leader learn least leave left legal
less letter level life light like likely line list listen little live local long look lose loss love
machine magazine main maintain major majority make manage management manager many market marriage
material matter maybe measure media medical meet meeting member memory mention message method middle
might military million mind minute miss mission model modern moment money month more morning most
mother mouth move movement movie much music must myself name nation national natural nature near nearly
necessary need network never news newspaper next nice night none north note nothing notice number
occur offer office officer official often once only onto open operation opportunity option order
organization other others outside over owner page pain painting paper parent part participant
particular partner party pass past patient pattern peace people perform perhaps period person personal
phone physical pick picture piece place plan plant play player point police policy political poor
popular population position positive possible power practice prepare present president pressure
pretty prevent price private probably problem process produce product production professional
professor program project property protect prove provide public pull purpose push quality question
quickly quite race radio raise range rate rather reach read ready real reality realize really reason
receive recent recently recognize record reduce reflect region relate remain remember remove report
represent require research resource respond response rest result return reveal rich right rise risk
road rock role room rule safe same save scene school science scientist score season seat second section
security seek seem sell send senior sense series serious serve service seven several shake share shoot
short shot shoulder show side sign significant similar simple simply since sing single sister site
situation size skill skin small smile social society soldier some somebody someone something sometimes
song soon sort sound source south southern space speak special specific speech spend sport spring
staff stage stand standard star start state statement station stay step still stock stop store story
strategy street strong structure student study stuff style subject success successful such suddenly
suffer suggest summer support sure surface system table take talk task teach teacher team technology
television tell tend term test thank themselves theory thing think third those though thought thousand
threat three through throughout throw thus today together tonight total tough toward town trade
traditional training travel treat treatment tree trial trip trouble true truth turn type under
understand unit until upon usually value various very victim view violence visit voice vote wait walk
wall want watch water weapon wear week weight well west western whatever wheel whether which while
white whole whose wide wife will wind window wish within without woman wonder word work worker world
worry would write writer wrong yard yeah year young yourself
""".split()

COMPANIES = [
    ("Harbour Freight Lines", "container shipping"),
    ("Orchard Valley Farms", "fruit growing"),
    ("Copper Ridge Mining", "mineral extraction"),
    ("Lantern Street Books", "bookselling"),
    ("Silver Meadow Clinic", "family medicine"),
    ("Thunder Bay Rail", "freight railways"),
    ("Marble Arch Hotels", "hospitality"),
    ("Velvet Canvas Studio", "interior design"),
    ("Northwind Airways", "regional flights"),
    ("Granite Peak Insurance", "home insurance"),
    ("Blue Heron Bank", "retail banking"),
    ("Riverstone Schools", "primary education"),
]


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def sentence(rng: random.Random, lo: int, hi: int) -> str:
    s = words(rng, rng.randint(lo, hi))
    return s[0].upper() + s[1:] + "."


def tenant_system_prompt(seed: int, tenant: int, n_words: int) -> str:
    """A tenant's own system prompt: its company, then numbered rules of random common words."""
    rng = random.Random(f"tenant-system/{seed}/{tenant}")
    name, domain = COMPANIES[tenant % len(COMPANIES)]
    if tenant >= len(COMPANIES):
        name = f"{name} {tenant // len(COMPANIES) + 1}"
    parts = [f"You are the support assistant of {name}, a company in {domain}. Follow these rules."]
    count, i = 0, 1
    while count < n_words:
        s = sentence(rng, 8, 16)
        parts.append(f"Rule {i}: {s}")
        count += len(s.split()) + 2
        i += 1
    return " ".join(parts)


def conversation_system_prompt(seed: int, conv: int, n_words: int) -> str:
    rng = random.Random(f"conv-system/{seed}/{conv}")
    parts = [f"You are a helpful assistant in conversation {conv}. Context for this user."]
    count = 0
    while count < n_words:
        s = sentence(rng, 8, 16)
        parts.append(s)
        count += len(s.split())
    return " ".join(parts)


def question(rng: random.Random, lo: int, hi: int) -> str:
    return words(rng, rng.randint(lo, hi)).capitalize() + "?"


# ----------------------------------------------------------------------------------------------
# Processes


class Procs:
    """Every process this script starts, each in its own process group, stopped by PID."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen] = []
        self.lock = threading.Lock()

    def start(self, argv: list[str], log: Path) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "wb")
        try:
            p = subprocess.Popen(
                [str(a) for a in argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=REPO,
            )
        finally:
            out.close()
        p.log_path = log  # type: ignore[attr-defined]
        with self.lock:
            self.live.append(p)
        return p

    def stop(self, p: subprocess.Popen, grace: float = 5.0) -> None:
        """SIGTERM to the process (kvbench then stops its Envoy and removes its scratch directory),
        then SIGKILL to whatever of its process group is left."""
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)  # the group: Envoy under kvbench
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.5 if sig == signal.SIGTERM else 0)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        # A kvbench killed before it could clean up leaves Envoy's scratch directory behind.
        for d in Path(tempfile.gettempdir()).glob(f"kvroute-envoy-{p.pid}-*"):
            shutil.rmtree(d, ignore_errors=True)
        with self.lock:
            if p in self.live:
                self.live.remove(p)

    def stop_all(self) -> None:
        for p in list(reversed(self.live)):
            self.stop(p, grace=3.0)


PROCS = Procs()
_handed_out: set[int] = set()


def free_port() -> int:
    """A port free on 127.0.0.1 now (the OS's choice), never one handed out before in this run."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free port")


def log_tail(p: subprocess.Popen, n: int = 20) -> str:
    try:
        lines = Path(p.log_path).read_text(errors="replace").splitlines()  # type: ignore[attr-defined]
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def http_get(url: str, timeout: float = 3.0) -> tuple[int, str]:
    req = urllib.request.Request(url)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (OSError, http.client.HTTPException):
        return 0, ""


def http_post_json(url: str, body: dict, timeout: float = 30.0) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_until(what: str, check, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited (rc {proc.returncode}); log:\n{log_tail(proc)}")
        if check():
            return
        if time.monotonic() > deadline:
            tail = f"; log:\n{log_tail(proc)}" if proc is not None else ""
            raise RuntimeError(f"{what}: not ready within {timeout:.0f} s{tail}")
        time.sleep(0.1)


@dataclass
class Pod:
    addr: str
    proc: subprocess.Popen

    @property
    def host_port(self) -> tuple[str, int]:
        h, p = self.addr.rsplit(":", 1)
        return h, int(p)

    def metrics(self) -> dict[str, float]:
        status, text = http_get(f"http://{self.addr}/metrics", timeout=5)
        out: dict[str, float] = {}
        if status != 200:
            return out
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.split(" ", 1)
            try:
                out[name] = float(value)
            except ValueError:
                pass
        return out


def start_pods(n: int, cache_ram: int, logdir: Path, extra: list[str] | None = None) -> list[Pod]:
    pods = []
    for i in range(n):
        port = free_port()
        argv = [
            LLAMA_BIN, "-m", LLAMA_MODEL, "--alias", MODEL, "--host", "127.0.0.1", "--port", port,
            "-c", CTX, "-np", "1", "-t", "1", "--metrics", "--cache-ram", cache_ram, *(extra or []),
        ]
        pods.append(Pod(f"127.0.0.1:{port}", PROCS.start(argv, logdir / f"pod-{i}.log")))
    for pod in pods:
        wait_until(
            f"llama-server {pod.addr} /health",
            lambda pod=pod: http_get(f"http://{pod.addr}/health")[0] == 200,
            60,
            pod.proc,
        )
    return pods


# ----------------------------------------------------------------------------------------------
# Routers


class Router:
    """Where requests go, and how to tell which pod served one."""

    label = ""
    how = ""

    def target(self) -> tuple[str, int, str | None]:
        """(host, port, pod if this router knows it before sending)."""
        raise NotImplementedError

    def pod_of(self, headers: dict[str, str]) -> str | None:
        return None

    def stop(self) -> None:
        pass


class RoundRobin(Router):
    label = "round-robin"
    how = "client-side rotation straight to the pods (no proxy; `kvbench up` has no round-robin mode)"

    def __init__(self, pods: list[Pod]) -> None:
        self.pods = pods
        self.n = 0
        self.lock = threading.Lock()

    def target(self):
        with self.lock:
            pod = self.pods[self.n % len(self.pods)]
            self.n += 1
        h, p = pod.host_port
        return h, p, pod.addr


def kvroute_stats_ready(admin: int, n: int) -> bool:
    """kvroute reports `n` pods healthy and none stale: `wasmcustom.kvroute.pods_healthy`, or per
    pool `wasmcustom.kvroute.pool=.=default;.;role=.=aggregated;.;pods_healthy`."""
    status, text = http_get(f"http://127.0.0.1:{admin}/stats", timeout=2)
    if status != 200:
        return False
    healthy = stale = 0
    seen = False
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if not k.startswith("wasmcustom.kvroute."):
            continue
        if k.endswith("pods_healthy"):
            healthy += int(v.strip() or 0)
            seen = True
        elif k.endswith("pods_stale"):
            stale += int(v.strip() or 0)
    return seen and healthy == n and stale == 0


def patch_plugin_config(node, settings: dict) -> bool:
    """Merges `settings` into the kvroute plugin configuration (a JSON string) inside an Envoy
    bootstrap; nested objects are merged one level deep."""
    found = False
    if isinstance(node, dict):
        if node.get("root_id") == "kvroute" and isinstance(node.get("configuration"), dict):
            conf = json.loads(node["configuration"]["value"])
            for k, v in settings.items():
                if isinstance(v, dict) and isinstance(conf.get(k), dict):
                    conf[k] = {**conf[k], **v}
                else:
                    conf[k] = v
            node["configuration"]["value"] = json.dumps(conf)
            found = True
        for v in node.values():
            found = patch_plugin_config(v, settings) or found
    elif isinstance(node, list):
        for v in node:
            found = patch_plugin_config(v, settings) or found
    return found


class Kvroute(Router):
    """Envoy with the kvroute plugin as `kvbench up --endpoints …` configures it (2 workers,
    override-host pool, retries onto fallbacks, the plugin polling every 200 ms, debug header on).

    With `first_byte_timeout_ms` set, `kvbench up` (which has no option for plugin settings) is
    started only to write its Envoy configuration: that file is copied, the one plugin setting
    `health.first_byte_timeout_ms` changed, kvbench stopped, and Envoy started on the copy with the
    arguments kvbench gives it."""

    def __init__(self, pods: list[Pod], logdir: Path, first_byte_timeout_ms: int | None,
                 settings: dict | None = None) -> None:
        self.port, self.admin = free_port(), free_port()
        n = len(pods)
        argv = [
            KVBENCH, "up", "--endpoints", ",".join(p.addr for p in pods),
            "--port", self.port, "--admin-port", self.admin,
        ]
        up = PROCS.start(argv, logdir / "kvbench-up.log")
        if first_byte_timeout_ms is None:
            self.label = "kvroute-defaults"
            self.how = ("`kvbench up --endpoints …` unchanged: Envoy (2 workers) + kvroute, its "
                        "default health.first_byte_timeout_ms 5000 (× retries 2)")
            self.proc = up
            wait_until("kvroute (kvbench up) with every pod healthy",
                       lambda: kvroute_stats_ready(self.admin, n), 60, up)
            time.sleep(0.3)  # every worker VM adopts the leader's pod table (25 ms ticks)
            return
        self.label = "kvroute"
        self.how = (f"`kvbench up --endpoints …`'s Envoy configuration (2 workers + kvroute, debug "
                    f"header) with health.first_byte_timeout_ms {first_byte_timeout_ms} instead of "
                    "5000: llama-server sends a queued request's headers only when its slot takes it")
        try:
            def written() -> bool:
                return any(Path(tempfile.gettempdir()).glob(f"kvroute-envoy-{up.pid}-*/envoy.json")) \
                    and http_get(f"http://127.0.0.1:{self.admin}/ready", timeout=1)[0] == 200
            wait_until("kvbench up's Envoy", written, 60, up)
            src = next(Path(tempfile.gettempdir()).glob(f"kvroute-envoy-{up.pid}-*/envoy.json"))
            config = json.loads(src.read_text())
        finally:
            PROCS.stop(up)
        settings = {"health": {"first_byte_timeout_ms": first_byte_timeout_ms}, **(settings or {})}
        if settings.keys() - {"health"}:
            self.how += "; plugin settings " + json.dumps(settings)
        if not patch_plugin_config(config, settings):
            raise RuntimeError("no kvroute plugin configuration in kvbench up's Envoy configuration")
        logdir.mkdir(parents=True, exist_ok=True)
        cfg = logdir / "envoy.json"
        cfg.write_text(json.dumps(config, indent=1))
        envoy = next((REPO / ".tools/venv/lib").glob("python3*/site-packages/envoy/_bin/envoy"), None)
        if envoy is None:
            raise RuntimeError("Envoy is missing from .tools/venv: run `make tools`")
        # The listener and admin ports of kvbench's Envoy, free again once it has exited.
        wait_until("kvbench up's Envoy gone", lambda: not port_open(self.port), 15)
        self.proc = PROCS.start([
            envoy, "-c", cfg, "--use-dynamic-base-id", "--concurrency", "2",
            "--admin-address-path", logdir / "envoy-admin-address", "-l", "info",
            "--disable-hot-restart", "--drain-time-s", "1", "--drain-strategy", "immediate",
        ], logdir / "envoy.log")
        wait_until("Envoy + kvroute with every pod healthy",
                   lambda: kvroute_stats_ready(self.admin, n), 60, self.proc)
        time.sleep(0.3)  # every worker VM adopts the leader's pod table (25 ms ticks)

    def target(self):
        return "127.0.0.1", self.port, None

    def pod_of(self, headers):
        debug = headers.get("x-kvroute-debug", "")
        for kv in debug.split(";"):
            k, _, v = kv.strip().partition("=")
            if k == "pod":
                return v
        return None

    def stop(self):
        # kvroute's own view (per-pod speed fits, routing reasons, evictions) for the logs.
        status, text = http_get(f"http://127.0.0.1:{self.admin}/stats", timeout=3)
        if status == 200:
            (Path(self.proc.log_path).parent / "envoy-stats.txt").write_text(  # type: ignore[attr-defined]
                "\n".join(l for l in text.splitlines() if "kvroute" in l) + "\n")
        PROCS.stop(self.proc)


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Peer(Router):
    def __init__(self, name: str, pods: list[Pod], logdir: Path) -> None:
        script, pre, level = PEERS[name]
        bin_ = PEERS_DIR / name / "bin" / script
        if not bin_.exists():
            raise PeerUnavailable(f"{bin_} is missing (`make peers` installs it)")
        self.label = name
        self.how = f"{name} --policy cache_aware (router defaults otherwise), in front of the pods"
        self.port, metrics = free_port(), free_port()
        argv = [
            bin_, *pre, "--host", "127.0.0.1", "--port", self.port,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", metrics,
            "--policy", "cache_aware", "--log-level", level,
            "--worker-urls", *[f"http://{p.addr}" for p in pods],
        ]
        self.proc = PROCS.start(argv, logdir / f"{name}.log")
        n = len(pods)

        def ready() -> bool:
            status, text = http_get(f"http://127.0.0.1:{self.port}/workers", timeout=2)
            if status != 200:
                return False
            try:
                ws = json.loads(text).get("workers") or []
            except ValueError:
                return False
            return sum(1 for w in ws if w.get("is_healthy") is True) == n

        try:
            wait_until(f"{name} with every worker healthy", ready, 60, self.proc)
        except RuntimeError as e:
            PROCS.stop(self.proc)
            raise PeerUnavailable(str(e)) from e

    def target(self):
        return "127.0.0.1", self.port, None

    def stop(self):
        PROCS.stop(self.proc)


class PeerUnavailable(Exception):
    pass


def start_router(policy: str, pods: list[Pod], logdir: Path, args) -> Router:
    if policy == "round-robin":
        return RoundRobin(pods)
    if policy == "kvroute":
        return Kvroute(pods, logdir, args.first_byte_timeout_ms,
                       {**args.kvroute_auto_settings, **dict(args.kvroute_set)})
    if policy == "kvroute-defaults":
        return Kvroute(pods, logdir, None)
    return Peer(policy, pods, logdir)


# ----------------------------------------------------------------------------------------------
# One streamed chat request


def chat(
    router: Router, messages: list[dict], max_tokens: int, timeout: float
) -> dict:
    host, port, pod = router.target()
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    rec: dict = {"status": 0, "ttft": None, "e2e": None, "prompt_tokens": None,
                 "cached_tokens": None, "pod": pod, "reply": "", "error": None, "prompt_ms": None}
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"content-type": "application/json"})
        resp = conn.getresponse()
        rec["status"] = resp.status
        headers = {k.lower(): v for k, v in resp.getheaders()}
        rec["pod"] = rec["pod"] or router.pod_of(headers)
        if "x-kvroute-debug" in headers:
            rec["kvroute_debug"] = headers["x-kvroute-debug"]
        if resp.status != 200:
            rec["error"] = resp.read(300).decode(errors="replace")
            return rec
        reply, done = [], False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            if "error" in chunk:
                rec["error"] = json.dumps(chunk["error"])[:300]
                continue
            for ch in chunk.get("choices") or []:
                c = (ch.get("delta") or {}).get("content")
                if c:
                    if rec["ttft"] is None:
                        rec["ttft"] = time.monotonic() - t0
                    reply.append(c)
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                rec["prompt_tokens"] = usage.get("prompt_tokens")
                rec["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            timings = chunk.get("timings")
            if isinstance(timings, dict):
                rec["prompt_ms"] = timings.get("prompt_ms")
        rec["reply"] = "".join(reply)
        if not done and rec["error"] is None:
            rec["error"] = "stream ended without [DONE]"
    except (OSError, http.client.HTTPException) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        rec["e2e"] = time.monotonic() - t0
        conn.close()
    return rec


def ok(r: dict) -> bool:
    return r["status"] == 200 and r["error"] is None and r["ttft"] is not None


# ----------------------------------------------------------------------------------------------
# Workloads


@dataclass
class Shape:
    name: str
    duration: float
    warmup: float
    params: dict = field(default_factory=dict)


def snapshot(pods: list[Pod]) -> list[dict[str, float]]:
    return [p.metrics() for p in pods]


class Run:
    """Records of one (shape, policy, seed) run, the pods' counters at its marks, and progress."""

    def __init__(self, shape: Shape, policy: str, seed: int, pods: list[Pod]) -> None:
        self.shape, self.policy, self.seed, self.pods = shape, policy, seed, pods
        self.records: list[dict] = []
        self.lock = threading.Lock()
        self.sent = 0
        self.t0 = 0.0
        self.marks: dict[str, list[dict[str, float]]] = {}
        self.mark_times: dict[str, float] = {}

    def add(self, rec: dict) -> None:
        with self.lock:
            self.records.append(rec)

    def mark(self, name: str) -> None:
        self.mark_times[name] = time.monotonic() - self.t0
        self.marks[name] = snapshot(self.pods)

    def progress(self, now: float, closed: bool = False) -> str:
        with self.lock:
            done = len(self.records)
            good = sum(1 for r in self.records if ok(r))
        return (f"    t={now:5.1f}s  sent {self.sent:4d}  done {done:4d} ({good} ok)  "
                f"in flight {self.sent - done}")


def drive_multi_tenant(run: Run, router: Router, args, prompts: list[str], rate: float) -> None:
    shape, seed = run.shape, run.seed
    rng = random.Random(f"arrivals/{seed}")
    qrng = random.Random(f"questions/{seed}")
    # The first arrivals introduce every tenant once, in a seeded order, inside the unmeasured
    # start: a pool's first sight of a tenant is a miss under every policy, and the measured window
    # is then the steady state rather than whichever tenants the draw happened to bring late.
    first = list(range(len(prompts)))
    random.Random(f"first-tenants/{seed}").shuffle(first)
    schedule = []
    t = rng.expovariate(rate)
    while t < shape.duration:
        tenant = first.pop(0) if first else rng.randrange(len(prompts))
        schedule.append((t, tenant, question(qrng, 10, 30)))
        t += rng.expovariate(rate)
    late = [i for i, (at, _, _) in enumerate(schedule[:len(prompts)]) if at >= shape.warmup]
    if late:
        print(f"    note: {len(late)} tenant(s) first arrive after the unmeasured start", flush=True)

    threads = []
    run.t0 = time.monotonic()
    run.mark("start")
    next_progress = 10.0
    marked = False

    def one(i: int, at: float, tenant: int, q: str) -> None:
        rec = chat(router, [{"role": "system", "content": prompts[tenant]},
                            {"role": "user", "content": q}], args.max_tokens, args.request_timeout)
        rec.update(i=i, sent_at=at, session=f"tenant-{tenant}", turn=None,
                   measured=at >= shape.warmup)
        rec.pop("reply", None)
        run.add(rec)

    for i, (at, tenant, q) in enumerate(schedule):
        while True:
            now = time.monotonic() - run.t0
            if not marked and now >= shape.warmup:
                run.mark("measured")
                marked = True
            if now >= next_progress:
                print(run.progress(now), flush=True)
                next_progress += 10.0
            if now >= at:
                break
            time.sleep(min(0.05, at - now))
        th = threading.Thread(target=one, args=(i, at, tenant, q), daemon=True)
        th.start()
        threads.append(th)
        run.sent += 1
    while time.monotonic() - run.t0 < shape.duration:
        time.sleep(0.05)
    if not marked:
        run.mark("measured")
    drain(run, threads, args.drain_timeout)


def drive_multi_turn(run: Run, router: Router, args) -> None:
    shape, seed, p = run.shape, run.seed, run.shape.params
    run.t0 = time.monotonic()
    run.mark("start")
    stop_at = shape.duration
    counter = {"conv": 0}
    clock = threading.Lock()

    def new_conv() -> int:
        with clock:
            c = counter["conv"]
            counter["conv"] += 1
        return c

    def user_msg(conv: int, turn: int) -> str:
        r = random.Random(f"user/{seed}/{conv}/{turn}")
        return sentence(r, p["user_words"][0], p["user_words"][1]) + " " + question(r, 8, 14)

    def stand_in_reply(conv: int, turn: int) -> str:
        return sentence(random.Random(f"reply/{seed}/{conv}/{turn}"), 6, 10)

    def slot_loop(slot: int) -> None:
        think = random.Random(f"think/{seed}/{slot}")
        conv = new_conv()
        # Staggered start: slot k begins part-way through its first conversation, with seeded
        # stand-ins as the earlier replies, so conversations end (and fresh ones start cold) one at a
        # time instead of all together.
        turn = (slot * p["turns"]) // p["conversations"]
        history = [{"role": "system", "content": conversation_system_prompt(seed, conv, p["system_words"])}]
        for t in range(turn):
            history += [{"role": "user", "content": user_msg(conv, t)},
                        {"role": "assistant", "content": stand_in_reply(conv, t)}]
        time.sleep(think.uniform(0, p["think_s"]))
        while time.monotonic() - run.t0 < stop_at:
            msgs = history + [{"role": "user", "content": user_msg(conv, turn)}]
            at = time.monotonic() - run.t0
            with run.lock:
                run.sent += 1
                i = run.sent
            rec = chat(router, msgs, args.max_tokens, args.request_timeout)
            reply = rec.pop("reply", "") or stand_in_reply(conv, turn)
            rec.update(i=i, sent_at=at, session=f"conv-{conv}", turn=turn, measured=at >= shape.warmup)
            run.add(rec)
            history = msgs + [{"role": "assistant", "content": reply}]
            turn += 1
            if turn >= p["turns"]:
                conv = new_conv()
                turn = 0
                history = [{"role": "system",
                            "content": conversation_system_prompt(seed, conv, p["system_words"])}]
            time.sleep(think.expovariate(1.0 / p["think_s"]))

    threads = [threading.Thread(target=slot_loop, args=(s,), daemon=True)
               for s in range(p["conversations"])]
    for th in threads:
        th.start()
    next_progress, marked = 10.0, False
    while time.monotonic() - run.t0 < shape.duration:
        now = time.monotonic() - run.t0
        if not marked and now >= shape.warmup:
            run.mark("measured")
            marked = True
        if now >= next_progress:
            print(run.progress(now), flush=True)
            next_progress += 10.0
        time.sleep(0.05)
    if not marked:
        run.mark("measured")
    drain(run, threads, args.drain_timeout)


def drain(run: Run, threads: list[threading.Thread], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    late = [th for th in threads if th.is_alive()]
    run.mark("end")
    run.late = len(late)  # type: ignore[attr-defined]
    if late:
        print(f"    {len(late)} request(s) still in flight {timeout:.0f} s after the end: "
              "counted as failed", flush=True)


# ----------------------------------------------------------------------------------------------
# Statistics


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    f = math.floor(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def counter_delta(a: list[dict], b: list[dict], name: str) -> list[float]:
    return [bb.get(name, 0.0) - aa.get(name, 0.0) for aa, bb in zip(a, b)]


def run_stats(run: Run) -> dict:
    with run.lock:
        records = list(run.records)
    measured = [r for r in records if r["measured"]]
    late = getattr(run, "late", 0)
    # Requests still in flight after the drain never got a record: failed, and measured if sent late
    # enough (every one of them was sent after the warm-up when the warm-up is short against the
    # drain; counted as measured).
    n_measured = len(measured) + late
    good = [r for r in measured if ok(r)]
    ttfts = [r["ttft"] for r in good]
    usage = [r for r in good if r["prompt_tokens"] is not None and r["cached_tokens"] is not None]
    prompt = sum(r["prompt_tokens"] for r in usage)
    cached = sum(r["cached_tokens"] for r in usage)
    all_usage = [r for r in records if ok(r) and r["prompt_tokens"] is not None
                 and r["cached_tokens"] is not None]

    m0, m1, s0 = run.marks.get("measured"), run.marks.get("end"), run.marks.get("start")
    pods = []
    pod_hit = None
    whole = None
    busy = []
    if m0 and m1:
        comp = counter_delta(m0, m1, "llamacpp:prompt_tokens_total")
        hit = counter_delta(m0, m1, "llamacpp:prompt_tokens_cached_total")
        secs = [a + b for a, b in zip(counter_delta(m0, m1, "llamacpp:prompt_seconds_total"),
                                      counter_delta(m0, m1, "llamacpp:tokens_predicted_seconds_total"))]
        wall = run.mark_times["end"] - run.mark_times["measured"]
        busy = [s / wall if wall > 0 else None for s in secs]
        total = sum(comp) + sum(hit)
        pod_hit = sum(hit) / total if total else None
        for pod, c, h, b in zip(run.pods, comp, hit, busy):
            pods.append({"pod": pod.addr, "computed_tokens": c, "cached_tokens": h,
                         "busy": b})
    if s0 and m1:
        comp = sum(counter_delta(s0, m1, "llamacpp:prompt_tokens_total"))
        hit = sum(counter_delta(s0, m1, "llamacpp:prompt_tokens_cached_total"))
        whole = {
            "pods_prompt_tokens": comp + hit,
            "pods_cached_tokens": hit,
            "responses_prompt_tokens": sum(r["prompt_tokens"] for r in all_usage),
            "responses_cached_tokens": sum(r["cached_tokens"] for r in all_usage),
        }
    served = {}
    for r in good:
        if r.get("pod"):
            served[r["pod"]] = served.get(r["pod"], 0) + 1
    return {
        "requests": n_measured,
        "ok": len(good),
        "ok_ratio": len(good) / n_measured if n_measured else None,
        "p50_ttft": pct(ttfts, 0.5),
        "p90_ttft": pct(ttfts, 0.9),
        "p99_ttft": pct(ttfts, 0.99),
        "mean_ttft": statistics.fmean(ttfts) if ttfts else None,
        "hit_ratio_responses": cached / prompt if prompt else None,
        "hit_ratio_pods_window": pod_hit,
        "hit_ratio_responses_whole": (whole["responses_cached_tokens"] / whole["responses_prompt_tokens"]
                                      if whole and whole["responses_prompt_tokens"] else None),
        "hit_ratio_pods_whole": (whole["pods_cached_tokens"] / whole["pods_prompt_tokens"]
                                 if whole and whole["pods_prompt_tokens"] else None),
        "pods": pods,
        "pool_busy": statistics.fmean(busy) if busy and None not in busy else None,
        "served_by_pod": served,
        "whole_run": whole,
        "errors": sorted({r["error"] for r in measured if r["error"]})[:5],
    }


def agg(values: list[float | None]) -> tuple[float, float, float] | None:
    vs = [v for v in values if v is not None]
    if not vs:
        return None
    return statistics.median(vs), min(vs), max(vs)


def fmt_agg(a, unit: str = "s", scale: float = 1.0, digits: int = 2) -> str:
    if a is None:
        return "-"
    med, lo, hi = (x * scale for x in a)
    f = f"{{:.{digits}f}}"
    if len({f.format(med), f.format(lo), f.format(hi)}) == 1:
        return f.format(med) + unit
    return f"{f.format(med)}{unit} [{f.format(lo)}–{f.format(hi)}]"


def lru_hit_ratio(tenants: int, held: int, draws: int = 20000) -> float:
    """Share of a pod's requests that find their tenant among the `held` most recently used
    (llama-server: the slot's prompt and the saved prompts of --cache-ram, oldest dropped first)
    when every request picks one of `tenants` uniformly, as under round-robin."""
    rng = random.Random("lru")
    recent: list[int] = []
    hits = 0
    for _ in range(draws):
        t = rng.randrange(tenants)
        if t in recent:
            hits += 1
            recent.remove(t)
        recent.append(t)
        del recent[:-held]
    return hits / draws


# ----------------------------------------------------------------------------------------------
# Calibration


def calibrate(args, logdir: Path, prompts: list[str]) -> dict:
    """One fresh pod (thrown away after): tokens per system prompt, the prefill rate of one thread,
    the time of a request that finds its system prompt cached and of one that does not, and the
    size of a saved prompt state (for --cache-ram)."""
    pods = start_pods(1, 8192, logdir, extra=["-lv", "4"])
    pod = pods[0]
    try:
        tokens = [len(http_post_json(f"http://{pod.addr}/tokenize", {"content": s})["tokens"])
                  for s in prompts]
        router = RoundRobin(pods)
        rng = random.Random("calibration")
        cold, hot = [], []
        for s in prompts[:2]:
            for kind in ("cold", "hot", "hot"):
                r = chat(router, [{"role": "system", "content": s},
                                  {"role": "user", "content": question(rng, 10, 30)}],
                         args.max_tokens, 120)
                if not ok(r):
                    raise RuntimeError(f"calibration request failed: {r}")
                (cold if kind == "cold" else hot).append(r)
        log = Path(pod.proc.log_path).read_text(errors="replace")  # type: ignore[attr-defined]
        states = [(int(n), float(mib)) for n, mib in re.findall(
            r"saving prompt with length (\d+), total state size = ([\d.]+) MiB", log)]
        mib_per_token = (statistics.fmean(m / n for n, m in states) if states
                         else 45.0 / 2048)  # SmolLM2-135M: 30 layers × 2 × 192 f16 values
        rates = [r["prompt_tokens"] - r["cached_tokens"] for r in cold]
        prefill_tps = statistics.fmean(
            (r["prompt_tokens"] - r["cached_tokens"]) / (r["prompt_ms"] / 1000.0)
            for r in cold if r["prompt_ms"])
    finally:
        for p in pods:
            PROCS.stop(p.proc)
    return {
        "system_prompt_tokens": tokens,
        "prefill_tokens_per_s": prefill_tps,
        "cold_prompt_tokens": rates,
        "cold_ttft_s": statistics.fmean(r["ttft"] for r in cold),
        "cold_e2e_s": statistics.fmean(r["e2e"] for r in cold),
        "hot_ttft_s": statistics.fmean(r["ttft"] for r in hot),
        "hot_e2e_s": statistics.fmean(r["e2e"] for r in hot),
        "hot_cached_tokens": [r["cached_tokens"] for r in hot],
        "mib_per_token": mib_per_token,
        "mean_request_tokens": statistics.fmean(r["prompt_tokens"] + args.max_tokens for r in cold + hot),
    }


# ----------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=2, help="llama-server pods per run (default 2)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds 1..N, each policy per seed (default 2)")
    ap.add_argument("--seed-list", default=None, help="these seeds instead (comma-separated)")
    ap.add_argument("--policies", default="kvroute,round-robin,vllm-router,sglang-router",
                    help=f"comma-separated, of {','.join(ALL_POLICIES)}")
    ap.add_argument("--shapes", default="multi-tenant,multi-turn")
    ap.add_argument("--out", default=str(REPO / "bench-out/real"))
    ap.add_argument("--tenants", type=int, default=6)
    ap.add_argument("--system-words", type=int, default=420,
                    help="words per tenant system prompt (about 500 tokens)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--rate", type=float, default=None,
                    help="multi-tenant arrivals per second (default: sized from the calibration "
                         "for --utilisation under round-robin)")
    ap.add_argument("--utilisation", type=float, default=0.65,
                    help="target pool utilisation under round-robin when sizing --rate (default 0.65)")
    ap.add_argument("--mt-duration", type=float, default=60.0, help="multi-tenant seconds (default 60)")
    ap.add_argument("--mt-warmup", type=float, default=15.0, help="unmeasured multi-tenant start (15)")
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--conv-system-words", type=int, default=300)
    ap.add_argument("--think", type=float, default=4.0, help="mean think time between turns, s")
    ap.add_argument("--turn-duration", type=float, default=35.0, help="multi-turn seconds (default 35)")
    ap.add_argument("--turn-warmup", type=float, default=10.0, help="unmeasured multi-turn start (10)")
    ap.add_argument("--cache-prompts", type=int, default=3,
                    help="size each pod's host prompt cache (--cache-ram) so that it keeps this many "
                         "tenants' prompts besides the one in its slot (default 3: 4 of 6 tenants "
                         "per pod, room for 8 in a pool of 2)")
    ap.add_argument("--cache-ram", type=int, default=None,
                    help="llama-server --cache-ram in MiB, overriding --cache-prompts "
                         "(8192 is llama-server's own default)")
    ap.add_argument("--first-byte-timeout-ms", type=int, default=60000,
                    help="kvroute's health.first_byte_timeout_ms for the `kvroute` policy (default "
                         "60000; kvbench up's 5000 is the `kvroute-defaults` policy)")
    ap.add_argument("--kvroute-capacity", choices=["auto", "off"], default="auto",
                    help="auto (default): tell the `kvroute` policy each pod's prompt-cache size "
                         "(default_pod_capacity_blocks, for engines that do not report "
                         "num_gpu_blocks, as llama.cpp does not) from --cache-ram; off: kvroute's "
                         "default (16384 blocks, about 260k tokens)")
    ap.add_argument("--kvroute-set", action="append", default=[], metavar="KEY=JSON",
                    type=lambda kv: (kv.split("=", 1)[0], json.loads(kv.split("=", 1)[1])),
                    help="another kvroute plugin setting for the `kvroute` policy (repeatable), "
                         "e.g. default_pod_capacity_blocks=140")
    ap.add_argument("--request-timeout", type=float, default=180.0)
    ap.add_argument("--drain-timeout", type=float, default=40.0)
    args = ap.parse_args()

    seeds = ([int(x) for x in args.seed_list.split(",")] if args.seed_list
             else list(range(1, args.seeds + 1)))
    args.seeds = len(seeds)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in ALL_POLICIES:
            ap.error(f"unknown policy {p!r} (known: {', '.join(ALL_POLICIES)})")
    shapes_wanted = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in shapes_wanted:
        if s not in ("multi-tenant", "multi-turn"):
            ap.error(f"unknown shape {s!r}")
    for path, fix in [(LLAMA_BIN, "make llama"), (LLAMA_MODEL, "make llama"),
                      (KVBENCH, "make build-tools"), (WASM, "make build")]:
        if not path.exists():
            print(f"bench-real: {path} is missing: run `{fix}`", file=sys.stderr)
            return 2

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    # Ctrl-C raises KeyboardInterrupt even where the shell started this with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)

    out = Path(args.out)
    logroot = out / "logs"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    report: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        report.append(line)

    try:
        print("calibrating on one fresh pod (thrown away after)…", flush=True)
        cal_prompts = [tenant_system_prompt(0, t, args.system_words) for t in range(args.tenants)]
        cal = calibrate(args, logroot / "calibration", cal_prompts)
        state_mib = cal["mib_per_token"] * cal["mean_request_tokens"]
        cache_ram = args.cache_ram if args.cache_ram is not None else max(
            1, math.ceil((args.cache_prompts + 1.5) * state_mib))
        # llama-server saves the slot's prompt into the cache (dropping the oldest entries to make
        # room) before it looks there for the new request's prompt: with room for k states, a pod
        # keeps its slot's prompt and k - 1 saved ones that a request can still find.
        room = int(cache_ram // state_mib)
        held = max(1, min(args.tenants, room))
        # The rate is sized for the scaled cache (--cache-prompts) even under a given --cache-ram,
        # so that both see the same load.
        h_rr = lru_hit_ratio(args.tenants, max(1, min(args.tenants, args.cache_prompts + 1)))
        s_rr = h_rr * cal["hot_e2e_s"] + (1 - h_rr) * cal["cold_e2e_s"]
        rate = args.rate if args.rate is not None else args.utilisation * args.pods / s_rr

        # What a pod keeps, in kvroute's blocks (block.mode chars: 16 tokens × 4 chars = 64 chars of
        # prompt text): --cache-ram's tokens (its slot's prompt stands in for the state a save
        # drops before a load).
        cache_tokens = cache_ram / cal["mib_per_token"]
        chars_per_token = statistics.fmean(
            len(p) / t for p, t in zip(cal_prompts, cal["system_prompt_tokens"]))
        capacity_blocks = math.ceil(cache_tokens * chars_per_token / 64)
        args.kvroute_auto_settings = (
            {"default_pod_capacity_blocks": capacity_blocks} if args.kvroute_capacity == "auto" else {})

        say("bench-real: kvroute against round-robin and peer routers on real llama.cpp pods")
        say(f"pods: {args.pods} × llama-server (llama.cpp, SmolLM2-135M-Instruct Q4_1, CPU), each "
            f"-np 1 -t 1 -c {CTX} --metrics --cache-ram {cache_ram}, fresh for every run, loopback")
        say(f"calibration (one pod, one thread): prefill {cal['prefill_tokens_per_s']:.0f} tokens/s; "
            f"a {statistics.fmean(cal['cold_prompt_tokens']):.0f}-token prompt uncached: TTFT "
            f"{cal['cold_ttft_s']:.2f} s (request {cal['cold_e2e_s']:.2f} s), its system prompt "
            f"cached: TTFT {cal['hot_ttft_s']:.2f} s (request {cal['hot_e2e_s']:.2f} s)")
        say(f"system prompts: {min(cal['system_prompt_tokens'])}–{max(cal['system_prompt_tokens'])} "
            f"tokens; a saved prompt state {state_mib:.1f} MiB "
            f"({cal['mib_per_token'] * 1024:.1f} KiB/token)")
        if args.cache_ram is None:
            say(f"prompt cache: --cache-ram {cache_ram} MiB has room for {room} saved prompt states; "
                "llama-server saves the slot's prompt before it looks for the next one, so a pod "
                f"keeps {held} of the {args.tenants} tenants' system prompts (its slot's and "
                f"{held - 1} saved): the pool has room for {held * args.pods} tenants' prompts, one "
                "pod does not hold all (the multi-tenant regime). "
                "llama-server's default --cache-ram 8192 would keep every prompt of the run on every "
                "pod (--cache-ram 8192 to run that)")
        else:
            say(f"prompt cache: --cache-ram {cache_ram} MiB (given): room for {room} saved prompt "
                f"states of {state_mib:.1f} MiB")
        if args.kvroute_capacity == "auto":
            say(f"kvroute is told each pod's cache: default_pod_capacity_blocks {capacity_blocks} "
                f"(--cache-ram's {cache_tokens:.0f} tokens × {chars_per_token:.1f} chars/token ÷ 64 "
                "chars/block), as a user would for llama.cpp, which reports no num_gpu_blocks")
        say(f"multi-tenant: {args.tenants} tenants × {args.system_words}-word system prompts, "
            f"10–30-word questions, max_tokens {args.max_tokens}, Poisson {rate:.2f} req/s for "
            f"{args.mt_duration:.0f} s (the first {args.tenants} arrivals bring every tenant once, in a "
            f"seeded order; then uniform picks), first {args.mt_warmup:.0f} s unmeasured"
            + ("" if args.rate is not None else
               f" (sized for {args.utilisation:.0%} pool utilisation under round-robin, "
               f"expecting {h_rr:.0%} of its requests to hit)"))
        say(f"multi-turn: {args.conversations} conversations at once × {args.turns} turns "
            f"({args.conv_system_words}-word system prompt each, 15–30-word message + question per "
            f"turn, the model's reply kept in the history, max_tokens {args.max_tokens}), closed loop "
            f"with exponential think times (mean {args.think:.1f} s), staggered; "
            f"{args.turn_duration:.0f} s, first {args.turn_warmup:.0f} s unmeasured")
        say("TTFT: to the first non-empty content chunk. hit: cached/prompt tokens of the measured "
            "requests (usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens); whole run: the "
            "same over every request, and from the pods' own llamacpp:prompt_tokens_cached_total / "
            "(prompt_tokens_total + prompt_tokens_cached_total) deltas. pool busy: the pods' "
            "prompt_seconds_total + tokens_predicted_seconds_total over the measured window's wall time")
        say(f"seeds: {', '.join(map(str, seeds))}; policies: {', '.join(policies)}; machine: {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f} at the start (other work on the machine slows "
            "the pods)")
        est = args.seeds * len(policies) * sum(
            (args.mt_duration if s == "multi-tenant" else args.turn_duration) + 12
            for s in shapes_wanted)
        print(f"(about {est / 60:.0f} min from here)", flush=True)

        shapes = []
        for s in shapes_wanted:
            if s == "multi-tenant":
                shapes.append(Shape("multi-tenant", args.mt_duration, args.mt_warmup))
            else:
                shapes.append(Shape("multi-turn", args.turn_duration, args.turn_warmup, {
                    "conversations": args.conversations, "turns": args.turns,
                    "system_words": args.conv_system_words, "user_words": (15, 30),
                    "think_s": args.think}))

        results: dict[str, dict[str, list[dict]]] = {}
        hows: dict[str, str] = {}
        dropped: dict[str, str] = {}
        runs_json = []
        for shape in shapes:
            results[shape.name] = {}
            for seed in seeds:
                prompts = [tenant_system_prompt(seed, t, args.system_words) for t in range(args.tenants)]
                for policy in policies:
                    if policy in dropped:
                        continue
                    tag = f"{shape.name}-{policy}-s{seed}"
                    print(f"\n[{(time.monotonic() - started) / 60:4.1f} min] {shape.name}, {policy}, "
                          f"seed {seed}: starting {args.pods} fresh pods…", flush=True)
                    pods = start_pods(args.pods, cache_ram, logroot / tag)
                    router = None
                    try:
                        try:
                            router = start_router(policy, pods, logroot / tag, args)
                        except PeerUnavailable as e:
                            dropped[policy] = str(e).splitlines()[0]
                            print(f"  DROPPED {policy}: {e}", flush=True)
                            continue
                        hows[policy] = router.how
                        run = Run(shape, policy, seed, pods)
                        print(f"  {policy} ready in front of {', '.join(p.addr for p in pods)}; "
                              "sending the workload", flush=True)
                        if shape.name == "multi-tenant":
                            drive_multi_tenant(run, router, args, prompts, rate)
                        else:
                            drive_multi_turn(run, router, args)
                    finally:
                        if router is not None:
                            router.stop()
                        for p in pods:
                            PROCS.stop(p.proc)
                    st = run_stats(run)
                    results[shape.name].setdefault(policy, []).append(st)
                    busy = st["pool_busy"]
                    print(f"  done: {st['ok']}/{st['requests']} ok, p50 "
                          f"{st['p50_ttft'] or float('nan'):.2f} s, p90 "
                          f"{st['p90_ttft'] or float('nan'):.2f} s, hit "
                          f"{(st['hit_ratio_responses'] or 0):.1%} (responses) / "
                          f"{(st['hit_ratio_pods_window'] or 0):.1%} (pods), pool busy "
                          f"{(busy or 0):.0%}, load average {os.getloadavg()[0]:.1f} "
                          f"on {os.cpu_count()} CPUs", flush=True)
                    w = st["whole_run"]
                    if w and w["pods_cached_tokens"] != w["responses_cached_tokens"]:
                        print(f"  note: over the whole run the pods counted {w['pods_cached_tokens']:.0f} "
                              f"cached tokens, the responses {w['responses_cached_tokens']}", flush=True)
                    runs_json.append({"shape": shape.name, "policy": policy, "seed": seed,
                                      "loadavg_end": os.getloadavg(),
                                      "stats": st, "records": run.records,
                                      "marks_s": run.mark_times})

        # ------------------------------------------------------------------ the table
        say()
        say(f"Median [min–max] over {args.seeds} seed(s); TTFT of the measured, successful requests.")
        for shape in shapes:
            rows = results.get(shape.name, {})
            say()
            say(f"{shape.name}")
            hdr = (f"  {'policy':<16} {'p50 TTFT':<20} {'p90 TTFT':<20} {'hit (responses)':<20} "
                   f"{'whole run: resp. / pods':<24} {'ok':<16} {'requests':<12} {'pool busy':<14}")
            say(hdr)
            for policy in policies:
                sts = rows.get(policy)
                if not sts:
                    say(f"  {policy:<16} dropped: {dropped.get(policy, 'no result')}")
                    continue
                wr = agg([s["hit_ratio_responses_whole"] for s in sts])
                wp = agg([s["hit_ratio_pods_whole"] for s in sts])
                whole = (f"{wr[0]:.1%} / {wp[0]:.1%}" if wr and wp else "-")
                say(f"  {policy:<16} "
                    f"{fmt_agg(agg([s['p50_ttft'] for s in sts])):<20} "
                    f"{fmt_agg(agg([s['p90_ttft'] for s in sts])):<20} "
                    f"{fmt_agg(agg([s['hit_ratio_responses'] for s in sts]), '%', 100, 1):<20} "
                    f"{whole:<24} "
                    f"{fmt_agg(agg([s['ok_ratio'] for s in sts]), '%', 100, 1):<16} "
                    f"{fmt_agg(agg([s['requests'] for s in sts]), '', 1, 0):<12} "
                    f"{fmt_agg(agg([s['pool_busy'] for s in sts]), '%', 100, 0):<14}")
            kv, rr = rows.get("kvroute"), rows.get("round-robin")
            if kv and rr:
                a, b = agg([s["p90_ttft"] for s in kv]), agg([s["p90_ttft"] for s in rr])
                if a and b and b[0] > 0:
                    per_seed = [k["p90_ttft"] / r["p90_ttft"] for k, r in zip(kv, rr)
                                if k["p90_ttft"] and r["p90_ttft"]]
                    x = a[0] / b[0]
                    line = (f"  p90 TTFT kvroute / round-robin = {x:.2f}"
                            f" (per seed {', '.join(f'{v:.2f}' for v in per_seed)})")
                    if shape.name == "multi-tenant":
                        line += f" (target ≤ 0.5): {'met' if x <= 0.5 else 'NOT met'}"
                    say(line)
        say()
        say("How each policy ran:")
        for policy in policies:
            if policy in hows:
                say(f"  {policy:<15} {hows[policy]}")
            elif policy in dropped:
                say(f"  {policy:<15} dropped: {dropped[policy]}")
        say(f"Wall time {(time.monotonic() - started) / 60:.1f} min. Logs: {logroot}")

        (out / "bench-real.txt").write_text("\n".join(report) + "\n")
        (out / "bench-real.json").write_text(json.dumps({
            "config": {k: v for k, v in vars(args).items()},
            "cache_ram_mib": cache_ram,
            "multi_tenant_rate": rate,
            "calibration": cal,
            "policies_how": hows,
            "dropped": dropped,
            "summary": results,
            "runs": runs_json,
        }, indent=1, default=str))
        print(f"\nwrote {out / 'bench-real.txt'} and {out / 'bench-real.json'}", flush=True)
        return 0
    except KeyboardInterrupt as e:
        print(f"\nbench-real: interrupted ({str(e) or 'Ctrl-C'}): stopping every process it started",
              file=sys.stderr, flush=True)
        return 130
    except (RuntimeError, OSError) as e:
        print(f"\nbench-real: FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        PROCS.stop_all()


if __name__ == "__main__":
    sys.exit(main())
