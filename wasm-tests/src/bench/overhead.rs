//! The filter-cost benchmark behind `kvbench overhead` (`make bench-overhead`): what kvroute adds to
//! a request, measured as DESIGN §7 asks, Envoy with kvroute against Envoy without it, in one run.
//!
//! One set of simulated pods answers at once (every kvsim latency parameter 0, so the engine never
//! sleeps), and two Envoys started by the harness sit in front of the same pods with the same
//! workers, the same pool cluster (`override_host`, round-robin fallback) and the same listener,
//! except that one runs the kvroute HTTP filter (chars mode, default configuration otherwise) and
//! the other does not. Both receive the same sequence of chat completions (16 KB prompt,
//! `max_tokens` 1, non-streaming), one request at a time over one persistent connection per Envoy,
//! alternating between the two Envoys and swapping which goes first on every pair, so that drift
//! and noise on the machine hit both arms alike. Two prompt kinds: `repeat` (one system prompt for the whole run plus a short varying
//! question: kvroute finds a prefix hit) and `fresh` (a new prompt per request: kvroute's index
//! grows to its bounds). The figures are client-side wall-clock latencies, not simulated time: the
//! difference of the two arms' medians is kvroute's cost per request, given with a bootstrap 95%
//! interval over the paired samples. Each Envoy's CPU time over the measured requests (every thread,
//! from `/proc`, so kvroute's leader work on another thread counts too) gives a second figure: CPU
//! per request. An optional closed-loop phase gives requests per second, and each
//! Envoy's `/stats` memory figures (plus the process's RSS) taken at the start and at the end give
//! kvroute's memory across its VMs.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::net::TcpStream;

use super::compare::{check_envoy_installed, wait_kvroute_healthy, StackOptions};
use super::driver::POD_HEADER;
use super::report::Summary;
use super::workload::Vocab;
use crate::harness::{self, Envoy, EnvoyOptions, Lb, Sim};

/// kvsim arguments that make a pod answer at once: no simulated prefill or decode time at all.
pub const DEFAULT_SIM_ARGS: &str =
    "--prefill-overhead-ms 0 --prefill-us-per-token 0 --decode-base-ms 0 --decode-us-per-seq 0";

/// Label of the arm with the filter.
pub const KVROUTE: &str = "kvroute";
/// Label of the arm without it.
pub const PLAIN: &str = "plain";

/// Bytes of the question that follows the system prompt (part of the prompt size).
const QUESTION_BYTES: usize = 96;

/// Counters of kvroute whose growth over a phase is reported.
const KVROUTE_COUNTERS: [&str; 5] = [
    "wasmcustom.kvroute.requests_routed_total",
    "wasmcustom.kvroute.requests_routed_total{reason=\"prefix_hit\"}",
    "wasmcustom.kvroute.requests_routed_total{reason=\"load\"}",
    "wasmcustom.kvroute.passthrough_total",
    "wasmcustom.kvroute.no_endpoint_total",
];

/// What the prompts of one measured phase look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptKind {
    /// The same system prompt on every request, a different short question each time.
    Repeat,
    /// A new prompt on every request.
    Fresh,
}

impl PromptKind {
    pub fn name(self) -> &'static str {
        match self {
            PromptKind::Repeat => "repeat",
            PromptKind::Fresh => "fresh",
        }
    }
}

/// How `kvbench overhead` runs.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadOptions {
    /// Simulated pods (one kvsim process).
    pub pods: usize,
    /// Envoy worker threads, the same in both Envoys.
    pub workers: usize,
    pub time_scale: f64,
    /// kvsim arguments (`--time-scale` is added).
    pub sim_args: Vec<String>,
    /// Prompt kinds, measured in this order on the same two Envoys.
    pub kinds: Vec<PromptKind>,
    /// Measured pairs (one request to each Envoy) per prompt kind.
    pub requests: usize,
    /// Pairs sent before each kind's measured ones and left out of the figures.
    pub warmup: usize,
    /// Bytes of prompt text per request (system prompt + question).
    pub prompt_bytes: usize,
    /// Bootstrap resamples for the interval of the difference of medians.
    pub bootstrap: usize,
    pub seed: u64,
    /// Requests per arm of the closed-loop throughput phase (0 = no such phase).
    pub throughput_requests: usize,
    /// Requests in flight in the throughput phase.
    pub concurrency: usize,
    /// Fields merged into kvroute's configuration (default: none, i.e. kvroute's defaults).
    pub plugin_extra: Value,
    /// Keep every latency sample in the report (and the JSON).
    pub keep_samples: bool,
    /// Seconds without requests, after start-up, over which both Envoys' background CPU is measured
    /// (kvroute's leader polls the pods meanwhile); 0 = skip.
    pub idle_s: f64,
}

impl Default for OverheadOptions {
    fn default() -> Self {
        Self {
            pods: 4,
            workers: 2,
            time_scale: 0.0001,
            sim_args: DEFAULT_SIM_ARGS
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            kinds: vec![PromptKind::Repeat, PromptKind::Fresh],
            requests: 3000,
            warmup: 300,
            prompt_bytes: 16_384,
            bootstrap: 2000,
            seed: 1,
            throughput_requests: 2000,
            concurrency: 4,
            plugin_extra: json!({}),
            keep_samples: false,
            idle_s: 2.0,
        }
    }
}

impl OverheadOptions {
    pub fn validate(&self) -> Result<()> {
        ensure!(self.pods >= 1, "need at least one pod");
        ensure!(self.workers >= 1, "need at least one Envoy worker");
        ensure!(
            self.time_scale.is_finite() && self.time_scale > 0.0,
            "time scale must be > 0"
        );
        ensure!(!self.kinds.is_empty(), "no prompt kinds given");
        ensure!(self.requests >= 1, "need at least one measured request");
        ensure!(
            self.prompt_bytes > QUESTION_BYTES,
            "the prompt must be longer than {QUESTION_BYTES} bytes"
        );
        ensure!(
            self.throughput_requests == 0 || self.concurrency >= 1,
            "the throughput phase needs a concurrency of at least 1"
        );
        ensure!(
            self.idle_s.is_finite() && self.idle_s >= 0.0,
            "the idle period must be >= 0 s"
        );
        ensure!(
            self.plugin_extra.is_object(),
            "the kvroute configuration extras must be a JSON object"
        );
        Ok(())
    }

    /// kvroute's configuration: the pool, chars mode, and the extras.
    pub fn plugin_config(&self, pods: &[String]) -> String {
        let mut v = json!({
            "pools": [{"name": "default", "endpoints": pods}],
            "block": {"mode": "chars"}
        });
        if let (Some(base), Value::Object(extra)) = (v.as_object_mut(), &self.plugin_extra) {
            for (k, val) in extra {
                base.insert(k.clone(), val.clone());
            }
        }
        v.to_string()
    }
}

/// One arm's measurements in one phase. Latencies in wall-clock microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct ArmReport {
    pub label: String,
    /// Requests sent (measured ones).
    pub requests: usize,
    /// Answered 200 with a body.
    pub ok: usize,
    /// Requests by HTTP status (0 = no response).
    pub statuses: BTreeMap<u16, usize>,
    /// Requests by the pod that answered (`x-kvsim-pod`).
    pub pods: BTreeMap<String, usize>,
    /// Over successful requests.
    pub latency_us: Summary,
    /// The Envoy process's CPU time over the measured requests divided by their number (Linux).
    pub cpu_us_per_request: Option<f64>,
    /// The same per thread (`name (tid)`), threads that used any CPU.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cpu_threads_us_per_request: BTreeMap<String, f64>,
    /// The first failures, for the report.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Every request's latency in sending order (`NaN` for a failure), when asked for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub samples_us: Vec<f64>,
}

/// One prompt kind: both arms, their difference, and what kvroute counted.
#[derive(Clone, Debug, Serialize)]
pub struct KindReport {
    pub kind: PromptKind,
    /// Mean bytes of prompt text (system + question) per request.
    pub prompt_bytes: usize,
    /// Mean bytes of the request bodies.
    pub body_bytes: usize,
    pub warmup_pairs: usize,
    /// Wall seconds of the measured pairs.
    pub wall_s: f64,
    /// Pairs in which both requests succeeded (the difference is computed over these).
    pub pairs: usize,
    pub kvroute: ArmReport,
    pub plain: ArmReport,
    /// p50(kvroute) − p50(plain), µs.
    pub diff_p50_us: Option<f64>,
    /// Bootstrap 95% interval of that difference (paired resampling), µs.
    pub diff_p50_ci95_us: Option<(f64, f64)>,
    /// mean(kvroute) − mean(plain) over the same pairs, µs.
    pub diff_mean_us: Option<f64>,
    /// Envoy CPU per request, kvroute − plain, µs.
    pub diff_cpu_us_per_request: Option<f64>,
    /// Growth of kvroute's counters over the phase (warm-up included).
    pub kvroute_counters: BTreeMap<String, u64>,
    /// `wasmcustom.kvroute.index_entries` at the end of the phase.
    pub index_entries: u64,
    /// Names of any kvroute stats the Envoy without the filter has (expected: none).
    pub plain_kvroute_stats: Vec<String>,
}

/// Closed-loop requests per second of each arm.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughputReport {
    pub kind: PromptKind,
    pub concurrency: usize,
    pub requests_per_arm: usize,
    pub kvroute_ok: usize,
    pub plain_ok: usize,
    pub kvroute_rps: f64,
    pub plain_rps: f64,
}

/// One Envoy's memory figures: `/stats` `server.memory_*` and the process's RSS, bytes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct MemoryFigures {
    pub allocated: u64,
    pub heap_size: u64,
    pub physical_size: u64,
    /// `VmRSS` of the Envoy process (Linux only).
    pub rss: Option<u64>,
}

impl MemoryFigures {
    async fn read(envoy: &Envoy) -> Result<Self> {
        let stats = envoy.stats().await.context("reading Envoy /stats")?;
        let get = |k: &str| stats.get(k).copied().unwrap_or(0);
        Ok(Self {
            allocated: get("server.memory_allocated"),
            heap_size: get("server.memory_heap_size"),
            physical_size: get("server.memory_physical_size"),
            rss: rss_bytes(envoy.proc.pid()),
        })
    }
}

/// kvroute − plain of each figure, bytes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct MemoryDiff {
    pub allocated: i64,
    pub heap_size: i64,
    pub physical_size: i64,
    pub rss: Option<i64>,
}

fn signed_diff(a: u64, b: u64) -> i64 {
    i64::try_from(a).unwrap_or(i64::MAX) - i64::try_from(b).unwrap_or(i64::MAX)
}

impl MemoryDiff {
    fn of(kv: &MemoryFigures, plain: &MemoryFigures) -> Self {
        Self {
            allocated: signed_diff(kv.allocated, plain.allocated),
            heap_size: signed_diff(kv.heap_size, plain.heap_size),
            physical_size: signed_diff(kv.physical_size, plain.physical_size),
            rss: kv.rss.zip(plain.rss).map(|(a, b)| signed_diff(a, b)),
        }
    }
}

/// Both Envoys' memory at the start (ready, before any request) and at the end of the run.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryReport {
    /// Envoy workers (each runs one kvroute VM).
    pub workers: usize,
    /// `wasm.wasm_vm_count` of the kvroute Envoy: the workers' VMs plus the main thread's.
    pub kvroute_vms: u64,
    /// The same stat in the Envoy without the filter (expected: 0).
    pub plain_vms: u64,
    pub kvroute_start: MemoryFigures,
    pub plain_start: MemoryFigures,
    pub kvroute_end: MemoryFigures,
    pub plain_end: MemoryFigures,
    pub diff_start: MemoryDiff,
    pub diff_end: MemoryDiff,
    /// `wasmcustom.kvroute.index_entries` at the end (blocks in the prefix index).
    pub index_entries: u64,
}

/// Both Envoys' CPU while no request is sent: kvroute's background work (polling, leader duties).
#[derive(Clone, Debug, Serialize)]
pub struct IdleCpu {
    pub seconds: f64,
    /// CPU milliseconds per wall second.
    pub kvroute_ms_per_s: f64,
    pub plain_ms_per_s: f64,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadReport {
    /// Always true: latencies are wall-clock microseconds, not simulated time.
    pub wall_clock: bool,
    pub envoy_version: Option<String>,
    pub options: OverheadOptions,
    pub plugin_config: String,
    pub pods: Vec<String>,
    pub kinds: Vec<KindReport>,
    pub throughput: Option<ThroughputReport>,
    pub idle_cpu: Option<IdleCpu>,
    /// Client connections each Envoy accepted over the run, per worker (`listener.*.worker_N.downstream_cx_total`).
    pub connections: BTreeMap<String, BTreeMap<String, u64>>,
    pub memory: MemoryReport,
    /// Wall seconds the whole run took.
    pub wall_s: f64,
}

/// `VmRSS` of a process, bytes.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU time of every thread of a process so far, ns, by `name (tid)` (Linux: the first field of
/// `/proc/PID/task/TID/schedstat`).
fn thread_cpu_ns(pid: u32) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let ns = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if let Some(ns) = ns {
            let tid = task.file_name().to_string_lossy().into_owned();
            out.insert(format!("{} ({tid})", name.trim()), ns);
        }
    }
    out
}

/// CPU per request between two [`thread_cpu_ns`] readings: (total, per thread), µs.
fn cpu_per_request(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    requests: usize,
) -> (Option<f64>, BTreeMap<String, f64>) {
    if after.is_empty() || requests == 0 {
        return (None, BTreeMap::new());
    }
    let per = |ns: u64| ns as f64 / 1e3 / requests as f64;
    let threads: BTreeMap<String, f64> = after
        .iter()
        .map(|(k, &ns)| (k, ns.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|(_, ns)| *ns > 0)
        .map(|(k, ns)| (k.clone(), per(ns)))
        .collect();
    (Some(threads.values().sum()), threads)
}

/// A seeded generator of prompt text made of kvsim-friendly pseudo-words.
struct Prompts {
    vocab: Vocab,
    seed: u64,
    prompt_bytes: usize,
    /// The system prompt of the `repeat` kind.
    shared_system: String,
}

/// Words from `rng` until `bytes` bytes (the last word cut if needed).
fn text_of(vocab: &Vocab, rng: &mut StdRng, bytes: usize) -> String {
    let mut out = String::with_capacity(bytes + 8);
    while out.len() < bytes {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&vocab.text(rng, 1));
    }
    // The words are ASCII, so any byte offset is a character boundary.
    out.truncate(bytes);
    out
}

impl Prompts {
    fn new(seed: u64, prompt_bytes: usize) -> Self {
        let vocab = Vocab::new(seed);
        let mut rng = Self::rng(seed, "shared", 0);
        let shared_system = text_of(&vocab, &mut rng, prompt_bytes - QUESTION_BYTES);
        Self {
            vocab,
            seed,
            prompt_bytes,
            shared_system,
        }
    }

    fn rng(seed: u64, what: &str, n: u64) -> StdRng {
        let mut key = what.as_bytes().to_vec();
        key.extend_from_slice(&n.to_le_bytes());
        StdRng::seed_from_u64(xxhash_rust::xxh3::xxh3_64_with_seed(&key, seed))
    }

    /// The request body of request `n` of `kind` (`n` counts warm-up and measured requests alike).
    fn body(&self, kind: PromptKind, n: u64) -> (Bytes, usize) {
        let mut rng = Self::rng(self.seed, kind.name(), n);
        let question = {
            let head = format!("Question {n}: ");
            let rest = QUESTION_BYTES.saturating_sub(head.len());
            head + &text_of(&self.vocab, &mut rng, rest)
        };
        let system = match kind {
            PromptKind::Repeat => self.shared_system.clone(),
            PromptKind::Fresh => text_of(&self.vocab, &mut rng, self.prompt_bytes - QUESTION_BYTES),
        };
        let prompt_bytes = system.len() + question.len();
        let body = json!({
            "model": "sim-model",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 1,
            "stream": false
        });
        (Bytes::from(body.to_string()), prompt_bytes)
    }
}

/// One request's outcome.
struct Sample {
    status: u16,
    pod: Option<String>,
    latency: Duration,
    error: Option<String>,
}

impl Sample {
    fn ok(&self) -> bool {
        self.status == 200 && self.error.is_none()
    }
}

/// Longest wait for one answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What came back on a [`Conn`].
struct Answer {
    status: u16,
    pod: Option<String>,
    body: Bytes,
}

/// One persistent HTTP/1.1 connection to an Envoy listener (hyper's connection-level client),
/// opened on first use and again after a failure. One connection per arm, not a pool, so one Envoy
/// worker takes every request of the sequential phase and the client's work is the same for both.
struct Conn {
    addr: String,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    fn new(addr: &str) -> Self {
        Self {
            addr: addr.to_owned(),
            sender: None,
        }
    }

    /// Sends one request body (from [`http_request`]) and reads the whole answer; the latency runs
    /// from before the request is written to the last byte of the body.
    async fn send(&mut self, body: &Bytes) -> Sample {
        let start = Instant::now();
        let result = tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(body.clone())).await;
        let latency = start.elapsed();
        let (status, pod, error) = match result {
            Ok(Ok(a)) if a.status != 200 => {
                let text = String::from_utf8_lossy(a.body.get(..200).unwrap_or(&a.body));
                let error = format!("http {}: {text}", a.status);
                (a.status, a.pod, Some(error))
            }
            Ok(Ok(a)) if a.body.is_empty() => (a.status, a.pod, Some("empty body".to_owned())),
            Ok(Ok(a)) => (a.status, a.pod, None),
            Ok(Err(e)) => (0, None, Some(format!("{e:#}"))),
            Err(_) => (0, None, Some("timeout".to_owned())),
        };
        if error.is_some() {
            self.sender = None;
        }
        Sample {
            status,
            pod,
            latency,
            error,
        }
    }

    async fn exchange(&mut self, body: Bytes) -> Result<Answer> {
        let sender = match &mut self.sender {
            Some(s) if !s.is_closed() => s,
            slot => {
                let tcp = TcpStream::connect(&self.addr)
                    .await
                    .with_context(|| format!("connecting to {}", self.addr))?;
                tcp.set_nodelay(true)?;
                let (sender, connection) = http1::handshake(TokioIo::new(tcp)).await?;
                tokio::spawn(connection);
                slot.insert(sender)
            }
        };
        sender.ready().await.context("connection")?;
        let request = hyper::Request::post("/v1/chat/completions")
            .header("host", "kvbench")
            .header("content-type", "application/json")
            .body(Full::new(body))?;
        let response = sender.send_request(request).await.context("request")?;
        let status = response.status().as_u16();
        let pod = response
            .headers()
            .get(POD_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response
            .into_body()
            .collect()
            .await
            .context("body")?
            .to_bytes();
        Ok(Answer { status, pod, body })
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn arm_report(label: &str, samples: &[Sample], keep: bool) -> ArmReport {
    let mut statuses = BTreeMap::new();
    let mut pods = BTreeMap::new();
    let mut errors = Vec::new();
    for s in samples {
        *statuses.entry(s.status).or_insert(0) += 1;
        if let Some(p) = &s.pod {
            *pods.entry(p.clone()).or_insert(0) += 1;
        }
        if let Some(e) = &s.error {
            if errors.len() < 5 {
                errors.push(e.clone());
            }
        }
    }
    let ok: Vec<f64> = samples
        .iter()
        .filter(|s| s.ok())
        .map(|s| us(s.latency))
        .collect();
    ArmReport {
        label: label.to_owned(),
        requests: samples.len(),
        ok: ok.len(),
        statuses,
        pods,
        latency_us: Summary::of(&ok),
        cpu_us_per_request: None,
        cpu_threads_us_per_request: BTreeMap::new(),
        errors,
        samples_us: if keep {
            samples
                .iter()
                .map(|s| if s.ok() { us(s.latency) } else { f64::NAN })
                .collect()
        } else {
            Vec::new()
        },
    }
}

/// The median of `v` (reordered), the mean of the two middle values for an even count.
fn median_in_place(v: &mut [f64]) -> Option<f64> {
    let n = v.len();
    if n == 0 {
        return None;
    }
    let mid = n / 2;
    let upper = *v.select_nth_unstable_by(mid, f64::total_cmp).1;
    if n % 2 == 1 {
        return Some(upper);
    }
    // The values before `mid` are the lower half; the lower middle is the largest of them.
    let lower = v.get(..mid)?.iter().copied().max_by(f64::total_cmp)?;
    Some((lower + upper) / 2.0)
}

/// p50(a) − p50(b) over paired samples, and its bootstrap 95% interval (pairs resampled with
/// replacement, `resamples` times, seeded).
pub fn median_difference(
    pairs: &[(f64, f64)],
    resamples: usize,
    seed: u64,
) -> (Option<f64>, Option<(f64, f64)>) {
    let mut a: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let mut b: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    let diff = median_in_place(&mut a).zip(median_in_place(&mut b));
    let Some((ma, mb)) = diff else {
        return (None, None);
    };
    if resamples == 0 || pairs.len() < 2 {
        return (Some(ma - mb), None);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let n = pairs.len();
    let mut diffs = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        a.clear();
        b.clear();
        for _ in 0..n {
            if let Some(&(x, y)) = pairs.get(rng.gen_range(0..n)) {
                a.push(x);
                b.push(y);
            }
        }
        if let (Some(x), Some(y)) = (median_in_place(&mut a), median_in_place(&mut b)) {
            diffs.push(x - y);
        }
    }
    let lo = super::percentile(&diffs, 2.5);
    let hi = super::percentile(&diffs, 97.5);
    (Some(ma - mb), lo.zip(hi))
}

/// kvroute's stats in `stats` (Envoy's labelled names → value).
fn kvroute_stats(stats: &HashMap<String, u64>) -> BTreeMap<String, u64> {
    harness::kvroute_summary(stats)
}

/// The two Envoys and the sequential phase's connection to each.
struct Arms {
    kvroute: Envoy,
    plain: Envoy,
    kvroute_conn: Conn,
    plain_conn: Conn,
}

impl Arms {
    fn listener(&self, kvroute: bool) -> &str {
        if kvroute {
            &self.kvroute.listener
        } else {
            &self.plain.listener
        }
    }
}

/// Sends `count` pairs of `kind` starting at request number `first`, one request at a time,
/// alternating the arms and swapping which goes first on every pair. Returns (kvroute, plain).
async fn run_pairs(
    arms: &mut Arms,
    prompts: &Prompts,
    kind: PromptKind,
    first: u64,
    count: usize,
) -> (Vec<Sample>, Vec<Sample>, usize, usize) {
    let mut kv = Vec::with_capacity(count);
    let mut plain = Vec::with_capacity(count);
    let (mut prompt_total, mut body_total) = (0usize, 0usize);
    for i in 0..count as u64 {
        let (body, prompt_bytes) = prompts.body(kind, first + i);
        prompt_total += prompt_bytes;
        body_total += body.len();
        let request = Bytes::copy_from_slice(&body);
        if i % 2 == 0 {
            kv.push(arms.kvroute_conn.send(&request).await);
            plain.push(arms.plain_conn.send(&request).await);
        } else {
            plain.push(arms.plain_conn.send(&request).await);
            kv.push(arms.kvroute_conn.send(&request).await);
        }
    }
    let n = count.max(1);
    (kv, plain, prompt_total / n, body_total / n)
}

/// Measures one prompt kind: warm-up pairs, then measured pairs.
async fn measure_kind(
    arms: &mut Arms,
    prompts: &Prompts,
    kind: PromptKind,
    opts: &OverheadOptions,
) -> Result<KindReport> {
    let before = kvroute_stats(&arms.kvroute.labelled_stats().await?);
    run_pairs(arms, prompts, kind, 0, opts.warmup).await;
    let (kv_pid, plain_pid) = (arms.kvroute.proc.pid(), arms.plain.proc.pid());
    let (kv_cpu0, plain_cpu0) = (thread_cpu_ns(kv_pid), thread_cpu_ns(plain_pid));
    let t0 = Instant::now();
    let (kv, plain, prompt_bytes, body_bytes) =
        run_pairs(arms, prompts, kind, opts.warmup as u64, opts.requests).await;
    let wall_s = t0.elapsed().as_secs_f64();
    let (kv_cpu1, plain_cpu1) = (thread_cpu_ns(kv_pid), thread_cpu_ns(plain_pid));
    let after = kvroute_stats(&arms.kvroute.labelled_stats().await?);
    let plain_stats = arms.plain.labelled_stats().await?;
    let paired: Vec<(f64, f64)> = kv
        .iter()
        .zip(&plain)
        .filter(|(a, b)| a.ok() && b.ok())
        .map(|(a, b)| (us(a.latency), us(b.latency)))
        .collect();
    let (diff_p50_us, diff_p50_ci95_us) =
        median_difference(&paired, opts.bootstrap, opts.seed ^ kind as u64);
    let diff_mean_us = (!paired.is_empty())
        .then(|| paired.iter().map(|(a, b)| a - b).sum::<f64>() / paired.len() as f64);
    let kvroute_counters = KVROUTE_COUNTERS
        .iter()
        .map(|&name| {
            let grew = after
                .get(name)
                .copied()
                .unwrap_or(0)
                .saturating_sub(before.get(name).copied().unwrap_or(0));
            (name.trim_start_matches("wasmcustom.").to_owned(), grew)
        })
        .collect();
    let mut kvroute = arm_report(KVROUTE, &kv, opts.keep_samples);
    (
        kvroute.cpu_us_per_request,
        kvroute.cpu_threads_us_per_request,
    ) = cpu_per_request(&kv_cpu0, &kv_cpu1, kv.len());
    let mut plain_arm = arm_report(PLAIN, &plain, opts.keep_samples);
    (
        plain_arm.cpu_us_per_request,
        plain_arm.cpu_threads_us_per_request,
    ) = cpu_per_request(&plain_cpu0, &plain_cpu1, plain.len());
    let diff_cpu_us_per_request = kvroute
        .cpu_us_per_request
        .zip(plain_arm.cpu_us_per_request)
        .map(|(a, b)| a - b);
    Ok(KindReport {
        kind,
        prompt_bytes,
        body_bytes,
        warmup_pairs: opts.warmup,
        wall_s,
        pairs: paired.len(),
        kvroute,
        plain: plain_arm,
        diff_p50_us,
        diff_p50_ci95_us,
        diff_mean_us,
        diff_cpu_us_per_request,
        kvroute_counters,
        index_entries: after
            .get("wasmcustom.kvroute.index_entries")
            .copied()
            .unwrap_or(0),
        plain_kvroute_stats: kvroute_stats(&plain_stats).into_keys().collect(),
    })
}

/// `count` requests of `kind` at `concurrency` in flight through one arm; returns (ok, seconds).
async fn closed_loop(
    arms: &Arms,
    prompts: &Arc<Vec<Bytes>>,
    kvroute: bool,
    concurrency: usize,
    count: usize,
) -> (usize, f64) {
    let addr = arms.listener(kvroute).to_owned();
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (mut conn, next, ok, prompts) =
            (Conn::new(&addr), next.clone(), ok.clone(), prompts.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let Some(body) = prompts.get(i % prompts.len().max(1)).cloned() else {
                    break;
                };
                if conn.send(&body).await.ok() {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    (ok.load(Ordering::Relaxed), start.elapsed().as_secs_f64())
}

/// The throughput phase: each arm runs its requests in two halves, kvroute–plain then plain–kvroute.
async fn throughput(arms: &Arms, prompts: &Prompts, opts: &OverheadOptions) -> ThroughputReport {
    let kind = PromptKind::Repeat;
    let bodies: Arc<Vec<Bytes>> = Arc::new(
        (0..256u64)
            .map(|i| Bytes::copy_from_slice(&prompts.body(kind, 1_000_000 + i).0))
            .collect(),
    );
    let half = opts.throughput_requests.div_ceil(2);
    let (mut kv_ok, mut kv_s, mut plain_ok, mut plain_s) = (0, 0.0, 0, 0.0);
    for order in [[true, false], [false, true]] {
        for kvroute in order {
            let (ok, s) = closed_loop(arms, &bodies, kvroute, opts.concurrency, half).await;
            if kvroute {
                kv_ok += ok;
                kv_s += s;
            } else {
                plain_ok += ok;
                plain_s += s;
            }
        }
    }
    let rate = |ok: usize, s: f64| if s > 0.0 { ok as f64 / s } else { 0.0 };
    ThroughputReport {
        kind,
        concurrency: opts.concurrency,
        requests_per_arm: 2 * half,
        kvroute_ok: kv_ok,
        plain_ok,
        kvroute_rps: rate(kv_ok, kv_s),
        plain_rps: rate(plain_ok, plain_s),
    }
}

/// Both Envoys' CPU over `seconds` without requests.
async fn idle_cpu(arms: &Arms, seconds: f64) -> IdleCpu {
    let (kv_pid, plain_pid) = (arms.kvroute.proc.pid(), arms.plain.proc.pid());
    let total = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
    let (kv0, plain0) = (
        total(&thread_cpu_ns(kv_pid)),
        total(&thread_cpu_ns(plain_pid)),
    );
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let s = t0.elapsed().as_secs_f64();
    let (kv1, plain1) = (
        total(&thread_cpu_ns(kv_pid)),
        total(&thread_cpu_ns(plain_pid)),
    );
    let ms_per_s = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e6 / s;
    IdleCpu {
        seconds: s,
        kvroute_ms_per_s: ms_per_s(kv0, kv1),
        plain_ms_per_s: ms_per_s(plain0, plain1),
    }
}

async fn envoy_version(envoy: &Envoy) -> Option<String> {
    let v: Value = reqwest::get(format!("http://{}/server_info", envoy.admin))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let full = v.get("version")?.as_str()?;
    // `<sha>/<version>/<status>/<build type>/<ssl>`
    Some(full.split('/').nth(1).unwrap_or(full).to_owned())
}

/// Runs the whole benchmark. Progress goes to stderr.
pub async fn run(opts: &OverheadOptions) -> Result<OverheadReport> {
    opts.validate()?;
    check_envoy_installed()?;
    harness::wasm_path()?;
    let t0 = Instant::now();
    let scale = opts.time_scale.to_string();
    let mut sim_args: Vec<&str> = vec!["--time-scale", &scale];
    sim_args.extend(opts.sim_args.iter().map(String::as_str));
    eprintln!(
        "overhead: starting {} pods (kvsim {}) and two Envoys ({} workers each)…",
        opts.pods,
        sim_args.join(" "),
        opts.workers
    );
    let sim = Sim::start(opts.pods, &sim_args).context("starting the simulated pods (kvsim)")?;
    let pods = sim.pods.clone();
    let plugin_config = opts.plugin_config(&pods);
    let start_envoy = |plugin: Option<String>| {
        let mut eo = EnvoyOptions::new(&pods, Lb::OverrideHost, plugin);
        eo.concurrency = opts.workers;
        eo
    };
    let kvroute = Envoy::start(&start_envoy(Some(plugin_config.clone())))
        .await
        .context("starting Envoy with kvroute")?;
    let plain = Envoy::start(&start_envoy(None))
        .await
        .context("starting Envoy without kvroute")?;
    wait_kvroute_healthy(&kvroute, pods.len() as u64, &StackOptions::default()).await?;
    let mut arms = Arms {
        kvroute_conn: Conn::new(&kvroute.listener),
        plain_conn: Conn::new(&plain.listener),
        kvroute,
        plain,
    };
    let envoy_version = envoy_version(&arms.plain).await;
    let kvroute_start = MemoryFigures::read(&arms.kvroute).await?;
    let plain_start = MemoryFigures::read(&arms.plain).await?;
    let prompts = Prompts::new(opts.seed, opts.prompt_bytes);
    let idle_cpu = if opts.idle_s > 0.0 {
        eprintln!(
            "overhead: {} s without requests (background CPU)…",
            opts.idle_s
        );
        Some(idle_cpu(&arms, opts.idle_s).await)
    } else {
        None
    };

    let mut kinds = Vec::new();
    for &kind in &opts.kinds {
        eprintln!(
            "overhead: {}: {} warm-up + {} measured pairs, one request at a time…",
            kind.name(),
            opts.warmup,
            opts.requests
        );
        let k0 = Instant::now();
        let report = measure_kind(&mut arms, &prompts, kind, opts).await?;
        eprintln!(
            "overhead: {}: done in {:.1} s",
            kind.name(),
            k0.elapsed().as_secs_f64()
        );
        kinds.push(report);
    }
    let throughput = if opts.throughput_requests > 0 {
        eprintln!(
            "overhead: throughput: {} requests per arm, {} in flight…",
            opts.throughput_requests, opts.concurrency
        );
        Some(throughput(&arms, &prompts, opts).await)
    } else {
        None
    };

    let kvroute_end = MemoryFigures::read(&arms.kvroute).await?;
    let plain_end = MemoryFigures::read(&arms.plain).await?;
    let kv_stats = arms.kvroute.stats().await?;
    let plain_stats = arms.plain.stats().await?;
    let per_worker = |stats: &HashMap<String, u64>| -> BTreeMap<String, u64> {
        stats
            .iter()
            .filter(|(k, _)| k.starts_with("listener.") && k.ends_with(".downstream_cx_total"))
            .filter_map(|(k, v)| {
                let worker = k.split('.').find(|p| p.starts_with("worker_"))?;
                Some((worker.to_owned(), *v))
            })
            .collect()
    };
    let connections = BTreeMap::from([
        (KVROUTE.to_owned(), per_worker(&kv_stats)),
        (PLAIN.to_owned(), per_worker(&plain_stats)),
    ]);
    let memory = MemoryReport {
        workers: opts.workers,
        kvroute_vms: kv_stats.get("wasm.wasm_vm_count").copied().unwrap_or(0),
        plain_vms: plain_stats.get("wasm.wasm_vm_count").copied().unwrap_or(0),
        diff_start: MemoryDiff::of(&kvroute_start, &plain_start),
        diff_end: MemoryDiff::of(&kvroute_end, &plain_end),
        kvroute_start,
        plain_start,
        kvroute_end,
        plain_end,
        index_entries: kv_stats
            .get("wasmcustom.kvroute.index_entries")
            .copied()
            .unwrap_or(0),
    };
    drop(arms);
    drop(sim);
    Ok(OverheadReport {
        wall_clock: true,
        envoy_version,
        options: opts.clone(),
        plugin_config,
        pods,
        kinds,
        throughput,
        idle_cpu,
        connections,
        memory,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

fn fmt_us(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"))
}

fn fmt_signed_us(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{x:+.1}"))
}

fn mib(v: u64) -> String {
    format!("{:.1}", v as f64 / 1_048_576.0)
}

fn mib_signed(v: i64) -> String {
    format!("{:+.1}", v as f64 / 1_048_576.0)
}

/// The text report: setup, the latency table per kind with the differences, throughput, memory.
pub fn render_text(r: &OverheadReport) -> String {
    let o = &r.options;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "kvroute filter cost: Envoy{} with kvroute against the same Envoy without it, in one run.",
        r.envoy_version
            .as_deref()
            .map(|v| format!(" {v}"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "Wall-clock microseconds (not simulated time), measured by the client on loopback; CPU = the \
         Envoy process's CPU time\nover the measured requests (all threads) per request."
    );
    let _ = writeln!(
        out,
        "Setup: {} kvsim pod(s) answering at once ({}--time-scale {}),\n\
         two Envoys with {} workers each and the same pool cluster (override_host, round-robin fallback),\n\
         one with kvroute (chars mode, defaults otherwise{}); chat completions with ~{} bytes of prompt,\n\
         max_tokens 1, non-streaming; per prompt kind {} warm-up + {} measured pairs, one request at a \
         time,\nalternating Envoys (who goes first swaps every pair), the same body to both.",
        r.pods.len(),
        o.sim_args
            .iter()
            .map(|a| format!("{a} "))
            .collect::<String>(),
        o.time_scale,
        o.workers,
        match &o.plugin_extra {
            Value::Object(m) if !m.is_empty() => format!(", plus {}", o.plugin_extra),
            _ => String::new(),
        },
        o.prompt_bytes,
        o.warmup,
        o.requests
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<7} {:<8} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "prompt", "envoy", "reqs", "ok", "mean µs", "p50", "p90", "p99", "CPU µs/req"
    );
    for k in &r.kinds {
        for arm in [&k.kvroute, &k.plain] {
            let l = &arm.latency_us;
            let _ = writeln!(
                out,
                "{:<7} {:<8} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>10}",
                k.kind.name(),
                arm.label,
                arm.requests,
                arm.ok,
                fmt_us(l.mean),
                fmt_us(l.p50),
                fmt_us(l.p90),
                fmt_us(l.p99),
                fmt_us(arm.cpu_us_per_request)
            );
        }
    }
    let _ = writeln!(out);
    for k in &r.kinds {
        let ci = k
            .diff_p50_ci95_us
            .map(|(lo, hi)| format!(" (95% CI {lo:+.1} … {hi:+.1})"))
            .unwrap_or_default();
        let c = |name: &str| k.kvroute_counters.get(name).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "{}: kvroute − plain over {} pairs: p50 {} µs{ci}, mean {} µs; Envoy CPU {} µs/request",
            k.kind.name(),
            k.pairs,
            fmt_signed_us(k.diff_p50_us),
            fmt_signed_us(k.diff_mean_us),
            fmt_signed_us(k.diff_cpu_us_per_request),
        );
        if let (Some(idle), true) = (&r.idle_cpu, k.wall_s > 0.0 && k.kvroute.requests > 0) {
            let per_s = k.kvroute.requests as f64 / k.wall_s;
            let background = (idle.kvroute_ms_per_s - idle.plain_ms_per_s) * 1e3 / per_s;
            let _ = writeln!(
                out,
                "  of that CPU, ≈ {background:.1} µs/request is background work that runs without \
                 requests too (idle rate below, at {per_s:.0} requests/s per Envoy)"
            );
        }
        let mut threads: Vec<(&String, &f64)> =
            k.kvroute.cpu_threads_us_per_request.iter().collect();
        threads.sort_by(|a, b| b.1.total_cmp(a.1));
        let busiest = threads
            .iter()
            .take(3)
            .map(|(name, v)| format!("{name} {v:.1}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "  kvroute routed {} (prefix hit {}, by load {}), index {} blocks at the end; \
             kvroute Envoy's busiest threads, CPU µs/request: {}",
            c("kvroute.requests_routed"),
            c("kvroute.routed_prefix_hit"),
            c("kvroute.routed_load"),
            k.index_entries,
            if busiest.is_empty() {
                "-".to_owned()
            } else {
                busiest
            }
        );
    }
    if let Some(t) = &r.throughput {
        let change = if t.plain_rps > 0.0 {
            format!(" ({:+.1}%)", (t.kvroute_rps / t.plain_rps - 1.0) * 100.0)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "\nThroughput, {} in flight, {} {} requests per arm (two halves, order swapped): kvroute \
             {:.0} req/s ({} ok), plain {:.0} req/s ({} ok){change}; client, kvsim and both Envoys \
             share the machine.",
            t.concurrency,
            t.requests_per_arm,
            t.kind.name(),
            t.kvroute_rps,
            t.kvroute_ok,
            t.plain_rps,
            t.plain_ok
        );
    }
    if let Some(idle) = &r.idle_cpu {
        let _ = writeln!(
            out,
            "\nWithout requests ({:.1} s): kvroute Envoy {:.2} ms CPU/s, plain {:.2} ms CPU/s (kvroute polls \
             {} pods every {} ms).",
            idle.seconds,
            idle.kvroute_ms_per_s,
            idle.plain_ms_per_s,
            r.pods.len(),
            serde_json::from_str::<Value>(&r.plugin_config)
                .ok()
                .and_then(|v| v.get("poll_interval_ms").and_then(Value::as_u64))
                .unwrap_or(200)
        );
    }
    let m = &r.memory;
    let _ = writeln!(
        out,
        "\nMemory (MiB; /stats server.memory_* and the process RSS), {} workers, kvroute Envoy \
         wasm.wasm_vm_count {} (plain {}):",
        m.workers, m.kvroute_vms, m.plain_vms
    );
    let _ = writeln!(
        out,
        "{:<14} {:>10} {:>10} {:>10} {:>8}",
        "", "allocated", "heap", "physical", "RSS"
    );
    let row = |name: &str, f: &MemoryFigures| {
        format!(
            "{:<14} {:>10} {:>10} {:>10} {:>8}\n",
            name,
            mib(f.allocated),
            mib(f.heap_size),
            mib(f.physical_size),
            f.rss.map_or_else(|| "-".to_owned(), mib)
        )
    };
    let diff_row = |name: &str, d: &MemoryDiff| {
        format!(
            "{:<14} {:>10} {:>10} {:>10} {:>8}\n",
            name,
            mib_signed(d.allocated),
            mib_signed(d.heap_size),
            mib_signed(d.physical_size),
            d.rss.map_or_else(|| "-".to_owned(), mib_signed)
        )
    };
    out.push_str(&row("kvroute start", &m.kvroute_start));
    out.push_str(&row("plain start", &m.plain_start));
    out.push_str(&diff_row("diff start", &m.diff_start));
    out.push_str(&row("kvroute end", &m.kvroute_end));
    out.push_str(&row("plain end", &m.plain_end));
    out.push_str(&diff_row("diff end", &m.diff_end));
    let vms = m.kvroute_vms.max(1);
    let _ = writeln!(
        out,
        "kvroute's memory at the end: {} MiB allocated, {} MiB RSS over {} VMs (≈ {} / {} MiB per VM); \
         prefix index {} blocks.",
        mib_signed(m.diff_end.allocated),
        m.diff_end
            .rss
            .map_or_else(|| "-".to_owned(), mib_signed),
        m.kvroute_vms,
        mib_signed(m.diff_end.allocated / vms as i64),
        m.diff_end
            .rss
            .map_or_else(|| "-".to_owned(), |v| mib_signed(v / vms as i64)),
        m.index_entries
    );
    let _ = writeln!(out, "Run took {:.1} s wall.", r.wall_s);
    out
}

/// Writes `DIR/overhead.json` (the report) and `DIR/overhead.txt` (the text of [`render_text`]).
pub fn write_outputs(dir: &Path, r: &OverheadReport) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json_path = dir.join("overhead.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(r)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let txt_path = dir.join("overhead.txt");
    std::fs::write(&txt_path, render_text(r))
        .with_context(|| format!("writing {}", txt_path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_in_place_matches_percentile() {
        for n in 1..40 {
            let v: Vec<f64> = (0..n).map(|i| ((i * 7919) % 101) as f64).collect();
            let mut w = v.clone();
            assert_eq!(median_in_place(&mut w), super::super::percentile(&v, 50.0));
        }
    }

    #[test]
    fn a_constant_shift_is_found_with_a_tight_interval() {
        let pairs: Vec<(f64, f64)> = (0..500)
            .map(|i| {
                let base = 300.0 + ((i * 37) % 50) as f64;
                (base + 20.0, base)
            })
            .collect();
        let (d, ci) = median_difference(&pairs, 500, 1);
        assert_eq!(d, Some(20.0));
        let (lo, hi) = ci.expect("interval");
        assert!(lo <= 20.0 && 20.0 <= hi, "{lo} {hi}");
    }

    #[test]
    fn prompts_have_the_asked_size_and_kinds_differ() {
        let p = Prompts::new(1, 16_384);
        let (a, n) = p.body(PromptKind::Repeat, 0);
        let (b, _) = p.body(PromptKind::Repeat, 1);
        let (c, _) = p.body(PromptKind::Fresh, 0);
        let (d, _) = p.body(PromptKind::Fresh, 1);
        assert_eq!(n, 16_384);
        let sys = |b: &Bytes| -> String {
            let v: Value = serde_json::from_slice(b).expect("json");
            v["messages"][0]["content"]
                .as_str()
                .expect("system")
                .to_owned()
        };
        assert_eq!(sys(&a), sys(&b));
        assert_ne!(sys(&c), sys(&d));
        assert_ne!(a, b);
    }
}
