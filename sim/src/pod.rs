//! One simulated model-server pod: its engine, its counters, its injected faults and the llm-d
//! routing-sidecar behaviour (`x-prefiller-host-port`).
//!
//! Tests need to see what the router did to each pod (which headers arrived, whether a prefill pod
//! was really used), so the pod keeps plain counters that `/sim/stats` reports. Faults let tests make
//! a pod fail, stall, vanish or publish garbage metrics without killing processes.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use axum::http::HeaderMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::config::SimConfig;
use super::engine::{Engine, PullSource};
use super::net::RefuseSwitch;
use super::request::{InferenceRequest, KvTransferParams};

/// Header a gateway uses to pick the destination pod (counted, never acted on).
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// llm-d sidecar contract: prefill on this `host:port` first, then decode here.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";

/// Injected faults; the default is a healthy pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Faults {
    /// Share of inference requests answered with an error (0..=1).
    pub fail_ratio: f64,
    /// The status of those answers; 0 = 500.
    pub fail_status: u16,
    /// Wall-clock delay before answering any non-`/sim/` request (a slow host, not a slow GPU, so it
    /// is not scaled by the time scale).
    pub stall_ms: u64,
    /// Close the listener and cut connections that send new requests, until cleared.
    pub refuse: bool,
    /// Serve nonsense on `/metrics`.
    pub garbage_metrics: bool,
    /// Wall-clock delay before answering `/metrics` only: a busy API process whose inference
    /// endpoints still answer (vLLM serves both from one process).
    pub metrics_delay_ms: u64,
    /// Cut every streamed response after its first token (the engine process dies mid-stream): the
    /// connection is reset without the stream's end.
    pub die_mid_stream: bool,
    /// `/metrics` parses but lies: `nan`, `negative` or `absurd` (1e300) load figures.
    pub metrics_lie: String,
    /// Serve these model names instead of the configured ones (the pod was restarted with other
    /// weights): requests, `/v1/models` and the metrics' `model_name` label follow them.
    pub serve_models: Vec<String>,
}

/// What `/sim/stats` returns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimStats {
    pub pod: String,
    pub role: String,
    pub engine: String,
    pub models: Vec<String>,
    /// Inference requests received (`/v1/completions`, `/v1/chat/completions`).
    pub requests_total: u64,
    /// Inference requests answered with an error status or cut short.
    pub requests_failed: u64,
    /// `/v1/*` requests refused for want of the API key (`--api-key`).
    pub unauthorized_total: u64,
    /// Prompt tokens of requests admitted to the engine.
    pub prompt_tokens_total: u64,
    /// Of those, tokens found in this pod's own prefix cache.
    pub cached_tokens_total: u64,
    /// Prompt tokens whose KV was pulled from a prefill pod instead of computed.
    pub transferred_tokens_total: u64,
    pub generation_tokens_total: u64,
    /// Running requests preempted for KV space (`vllm:num_preemptions_total`).
    #[serde(default)]
    pub preemptions_total: u64,
    /// The engine profile and its source (`SimConfig::describe`).
    #[serde(default)]
    pub profile: String,
    /// Requests decoded here with KV prefilled elsewhere (body `kv_transfer_params` or sidecar).
    pub disaggregated_decodes: u64,
    /// Requests this pod prefilled for a remote decoder (`do_remote_decode`).
    pub prefills_for_remote_decode: u64,
    /// Requests for which this pod called the prefiller named by `x-prefiller-host-port` and used
    /// its KV.
    pub sidecar_prefills: u64,
    /// Sidecar prefill calls that failed (the request then ran a full local prefill).
    pub sidecar_prefill_failures: u64,
    /// How many inference requests arrived carrying each routing header.
    pub seen_headers: BTreeMap<String, u64>,
    /// The last `kv_transfer_params` this pod received (in a body or from a sidecar prefill).
    pub last_kv_transfer_params: Value,
    /// Request bodies that reached this pod naming `transfer_param` in their bytes (UTF-8 or
    /// UTF-16), whatever their path and whether or not they parse: what a server reading JSON
    /// more leniently than kvsim (Python's `json`) could have taken a KV handle from. kvroute's
    /// own P/D calls (`do_remote_decode`, the prefill pod's handle) count too.
    #[serde(default)]
    pub bodies_naming_kv_transfer_params: u64,
    pub running: usize,
    pub waiting: usize,
    pub kv_cache_usage: f64,
    pub cached_blocks: usize,
    /// Prompt tokens loaded from the host-memory tier instead of computed
    /// (`vllm:external_prefix_cache_hits_total`); only with a tier (`--cpu-offload-blocks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_hit_tokens_total: Option<u64>,
    /// Blocks the host-memory tier holds; only with a tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cached_blocks: Option<usize>,
    pub faults: Faults,
}

#[derive(Debug, Default)]
pub(crate) struct HttpCounters {
    pub requests_total: u64,
    pub requests_failed: u64,
    pub disaggregated_decodes: u64,
    pub prefills_for_remote_decode: u64,
    pub sidecar_prefills: u64,
    pub sidecar_prefill_failures: u64,
    pub seen_destination: u64,
    pub seen_prefiller: u64,
    /// `/v1/*` requests refused for a missing or wrong API key.
    pub unauthorized: u64,
    pub last_kv_transfer_params: Value,
    pub bodies_naming_kv_transfer_params: u64,
}

/// Pods started together, so a fault request to one pod can target a sibling (the only way to clear
/// `refuse` over HTTP, since the refusing pod itself cannot be reached).
pub(crate) type Registry = Arc<Mutex<HashMap<String, Weak<Pod>>>>;

pub(crate) struct Pod {
    pub cfg: SimConfig,
    pub addr: SocketAddr,
    /// `ip:port`, used as the `x-kvsim-pod` header and the NIXL engine id.
    pub id: String,
    pub engine: Arc<Engine>,
    faults: Mutex<Faults>,
    /// Bumped on every fault change, so a timed `refuse` only clears its own fault.
    fault_generation: AtomicU64,
    pub refuse: RefuseSwitch,
    counters: Mutex<HttpCounters>,
    rng: Mutex<StdRng>,
    client: reqwest::Client,
    siblings: Registry,
    pub created: u64,
    lora: Mutex<LoraActivity>,
    /// Responses API answers this pod stored (`super::responses::Stored`).
    pub stored: super::responses::Stored,
    /// When the pod's process started (Unix seconds), `process_start_time_seconds`; moved by a
    /// restart (`POST /sim/restart`).
    started_at: Mutex<f64>,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Bound on the label sets `vllm:lora_requests_info` keeps (prometheus_client keeps every one).
const LORA_LABEL_SETS: usize = 16;

/// The `vllm:lora_requests_info` label sets so far (running adapters, waiting adapters): a new
/// one, stamped with the time, whenever the engine's adapters have changed when the page is read
/// (vLLM sets the gauge as it logs its stats), old ones kept as the Prometheus client keeps them.
#[derive(Debug, Default)]
struct LoraActivity {
    label_sets: Vec<((String, String), f64)>,
}

impl LoraActivity {
    fn stamp(&mut self, running: String, waiting: String) {
        let running = (running, waiting);
        if self.label_sets.last().map(|(r, _)| r) == Some(&running) {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        // Strictly increasing, so the newest set is the largest even within one clock tick.
        let at = self
            .label_sets
            .last()
            .map_or(now, |(_, last)| now.max(last + 1e-3));
        self.label_sets.retain(|(r, _)| *r != running);
        self.label_sets.push((running, at));
        if self.label_sets.len() > LORA_LABEL_SETS {
            self.label_sets.remove(0);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pod {
    pub fn new(
        cfg: SimConfig,
        addr: SocketAddr,
        index: usize,
        engine: Arc<Engine>,
        refuse: RefuseSwitch,
        siblings: Registry,
    ) -> Result<Arc<Self>> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .context("building the sidecar HTTP client")?;
        let seed = cfg.seed.wrapping_add(index as u64);
        let pod = Arc::new(Self {
            cfg,
            addr,
            id: addr.to_string(),
            engine,
            faults: Mutex::new(Faults::default()),
            fault_generation: AtomicU64::new(0),
            refuse,
            counters: Mutex::new(HttpCounters::default()),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            client,
            siblings,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            lora: Mutex::new(LoraActivity::default()),
            stored: Default::default(),
            started_at: Mutex::new(unix_now()),
        });
        lock(&pod.lora).stamp(String::new(), String::new());
        lock(&pod.siblings).insert(pod.id.clone(), Arc::downgrade(&pod));
        let weak = Arc::downgrade(&pod);
        pod.engine.set_pull_hook(move |source| {
            if let Some(pod) = weak.upgrade() {
                pod.notify_pulled(source);
            }
        });
        Ok(pod)
    }

    /// Tells a prefill pod that its held KV has been read: directly if it runs in this process,
    /// else over HTTP (`POST /sim/kv-pulled`), as NIXL's decoder notifies its producer. A lost
    /// notification only means the producer frees the blocks at its timeout.
    fn notify_pulled(&self, source: PullSource) {
        if let Some(producer) = lock(&self.siblings)
            .get(&source.engine_id)
            .and_then(Weak::upgrade)
        {
            producer.engine.release_held(source.first_block);
            return;
        }
        let Some(target) = source.host_port else {
            return;
        };
        let client = self.client.clone();
        tokio::spawn(async move {
            let _ = client
                .post(format!("http://{target}/sim/kv-pulled"))
                .json(&json!({"first_block": source.first_block}))
                .timeout(Duration::from_secs(10))
                .send()
                .await;
        });
    }

    pub(crate) fn counters(&self) -> MutexGuard<'_, HttpCounters> {
        lock(&self.counters)
    }

    pub fn faults(&self) -> Faults {
        lock(&self.faults).clone()
    }

    /// The configuration as the pod serves now: the configured one, with the model names of a
    /// `serve_models` fault.
    pub fn config_now(&self) -> std::borrow::Cow<'_, SimConfig> {
        let models = lock(&self.faults).serve_models.clone();
        if models.is_empty() {
            return std::borrow::Cow::Borrowed(&self.cfg);
        }
        let mut cfg = self.cfg.clone();
        cfg.models = models;
        std::borrow::Cow::Owned(cfg)
    }

    /// Replaces the pod's faults. With `refuse_for`, `refuse` clears itself after that wall time.
    pub fn set_faults(self: &Arc<Self>, faults: Faults, refuse_for: Option<Duration>) {
        let refuse = faults.refuse;
        *lock(&self.faults) = faults;
        let generation = self.fault_generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.refuse.set(refuse);
        if let (true, Some(after)) = (refuse, refuse_for) {
            let pod = Arc::downgrade(self);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let Some(pod) = pod.upgrade() else { return };
                if pod.fault_generation.load(Ordering::SeqCst) == generation {
                    let mut f = pod.faults();
                    f.refuse = false;
                    pod.set_faults(f, None);
                }
            });
        }
    }

    /// Like `set_faults`, then waits (up to a second) until the listener has closed or reopened its
    /// port, so the caller's next connection attempt already sees the new state.
    pub async fn apply_faults(self: &Arc<Self>, faults: Faults, refuse_for: Option<Duration>) {
        let refuse = faults.refuse;
        self.set_faults(faults, refuse_for);
        self.refuse.settled(refuse, Duration::from_secs(1)).await;
    }

    /// This pod, or a sibling started by the same `spawn_pods` call, by `ip:port`.
    pub fn resolve(self: &Arc<Self>, id: Option<&str>) -> Option<Arc<Pod>> {
        match id {
            None => Some(self.clone()),
            Some(id) if id == self.id => Some(self.clone()),
            Some(id) => lock(&self.siblings).get(id).and_then(Weak::upgrade),
        }
    }

    pub fn roll_failure(&self) -> bool {
        let ratio = lock(&self.faults).fail_ratio;
        ratio > 0.0 && lock(&self.rng).gen_bool(ratio.clamp(0.0, 1.0))
    }

    pub fn random_id(&self, prefix: &str) -> String {
        let n: u128 = lock(&self.rng).gen();
        format!("{prefix}-{n:032x}")
    }

    pub fn count_arrival(&self, headers: &HeaderMap) {
        let mut c = self.counters();
        c.requests_total += 1;
        if headers.contains_key(DESTINATION_HEADER) {
            c.seen_destination += 1;
        }
        if headers.contains_key(PREFILLER_HEADER) {
            c.seen_prefiller += 1;
        }
    }

    /// A restart quicker than a poll interval: the process starts again (a later
    /// `process_start_time_seconds`, at least a second on) with nothing of the old one: the
    /// requests in flight end with an error, the caches are empty, no faults remain
    /// (`Engine::restart`). The pod's counters carry on (vLLM's would start from zero; the
    /// benchmarks read them as deltas).
    pub async fn restart(self: &Arc<Self>) {
        self.apply_faults(Faults::default(), None).await;
        self.engine.restart();
        let mut started = lock(&self.started_at);
        *started = unix_now().max(*started + 1.0);
    }

    /// The process collector's start time as Python's `prometheus_client` renders it on vLLM's
    /// page (`process_start_time_seconds 1.74262400557e+09`, vllm-project/production-stack#318).
    pub fn process_metrics(&self) -> String {
        let started = *lock(&self.started_at);
        let exp = started.abs().log10().floor().max(0.0) as i32;
        let mantissa = started / 10f64.powi(exp);
        format!(
            "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n\
             # TYPE process_start_time_seconds gauge\n\
             process_start_time_seconds {}e+{exp:02}\n",
            format!("{mantissa:.11}").trim_end_matches('0')
        )
    }

    /// `vllm:lora_requests_info` as vLLM exposes it when LoRA is enabled (empty otherwise):
    /// every label set so far, each valued with the time it was set; `snapshot` is the engine's
    /// state now (its running and waiting requests' adapters).
    pub fn lora_metrics(&self, snapshot: &super::metrics::Snapshot) -> String {
        if self.cfg.lora_modules.is_empty() || self.cfg.engine != super::config::EngineKind::Vllm {
            return String::new();
        }
        let join = |set: &std::collections::BTreeSet<String>| {
            set.iter().map(String::as_str).collect::<Vec<_>>().join(",")
        };
        let mut lora = lock(&self.lora);
        lora.stamp(
            join(&snapshot.running_adapters),
            join(&snapshot.waiting_adapters),
        );
        let mut out = String::from(
            "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n",
        );
        for ((running, waiting), at) in &lora.label_sets {
            out.push_str(&format!(
                "vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{running}\",waiting_lora_adapters=\"{waiting}\"}} {at:.3}\n",
                self.cfg.max_loras
            ));
        }
        out
    }

    pub fn count_body_naming_kv_transfer_params(&self) {
        self.counters().bodies_naming_kv_transfer_params += 1;
    }

    pub fn count_unauthorized(&self) {
        self.counters().unauthorized += 1;
    }

    pub fn count_failure(&self) {
        self.counters().requests_failed += 1;
    }

    pub fn stats(&self) -> SimStats {
        let snap = self.engine.snapshot();
        let c = self.counters();
        let seen_headers = BTreeMap::from([
            (DESTINATION_HEADER.to_string(), c.seen_destination),
            (PREFILLER_HEADER.to_string(), c.seen_prefiller),
        ]);
        SimStats {
            pod: self.id.clone(),
            role: self.cfg.role.as_str().to_string(),
            engine: self.cfg.engine.as_str().to_string(),
            models: self.cfg.models.clone(),
            requests_total: c.requests_total,
            requests_failed: c.requests_failed,
            unauthorized_total: c.unauthorized,
            prompt_tokens_total: snap.counters.prefix_queries,
            cached_tokens_total: snap.counters.prefix_hits,
            transferred_tokens_total: snap.counters.transferred_tokens,
            generation_tokens_total: snap.counters.generation_tokens,
            preemptions_total: snap.counters.preemptions,
            profile: self.cfg.describe(),
            disaggregated_decodes: c.disaggregated_decodes,
            prefills_for_remote_decode: c.prefills_for_remote_decode,
            sidecar_prefills: c.sidecar_prefills,
            sidecar_prefill_failures: c.sidecar_prefill_failures,
            seen_headers,
            last_kv_transfer_params: c.last_kv_transfer_params.clone(),
            bodies_naming_kv_transfer_params: c.bodies_naming_kv_transfer_params,
            running: snap.running,
            waiting: snap.waiting,
            kv_cache_usage: snap.kv_usage(&self.cfg),
            cached_blocks: self.engine.cached_blocks(),
            host_hit_tokens_total: self.cfg.host_tier().then_some(snap.counters.external_hits),
            host_cached_blocks: self
                .cfg
                .host_tier()
                .then(|| self.engine.host_cached_blocks()),
            faults: self.faults(),
        }
    }

    /// The sidecar's first leg: the same request, cut to one token, non-streaming and marked
    /// `do_remote_decode`, sent to the prefill pod at `target`; returns the KV handle it answers with.
    pub async fn sidecar_prefill(
        &self,
        target: &str,
        path: &str,
        req: &InferenceRequest,
        bound: Option<Duration>,
    ) -> Result<KvTransferParams> {
        let body = remote_decode_prefill(&req.body);
        // Generous: the prefill may queue behind other work on a busy prefill pod.
        let generous = Duration::from_secs_f64((600.0 * self.cfg.time_scale).max(10.0));
        let timeout = bound.map_or(generous, |b| b.min(generous));
        let resp = self
            .client
            .post(format!("http://{target}{path}"))
            .json(&body)
            .timeout(timeout)
            .send()
            .await
            .with_context(|| format!("calling prefill pod {target}"))?;
        let status = resp.status();
        if !status.is_success() {
            bail!("prefill pod {target} answered {status}");
        }
        let answer: Value = resp
            .json()
            .await
            .with_context(|| format!("reading prefill pod {target}'s answer"))?;
        let kv = answer
            .get("kv_transfer_params")
            .and_then(KvTransferParams::from_value)
            .with_context(|| format!("prefill pod {target} returned no kv_transfer_params"))?;
        if !kv.do_remote_prefill || kv.remote_block_ids.as_ref().is_none_or(Vec::is_empty) {
            bail!(
                "prefill pod {target} returned unusable kv_transfer_params {}",
                kv.raw
            );
        }
        Ok(kv)
    }
}

/// The prefill pod named by a decode request's `kv_transfer_params`, to tell when its KV is pulled.
pub fn pull_source(kv: &KvTransferParams) -> Option<PullSource> {
    let first_block = *kv.remote_block_ids.as_ref()?.first()?;
    let engine_id = kv
        .raw
        .get("remote_engine_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let host = kv.raw.get("remote_host").and_then(Value::as_str);
    let port = kv.raw.get("remote_port").and_then(Value::as_u64);
    let host_port = match (host, port) {
        (Some(h), Some(p)) => Some(format!("{h}:{p}")),
        _ => None,
    };
    let locality = kv
        .raw
        .get("kvsim_locality")
        .and_then(Value::as_str)
        .filter(|l| !l.is_empty())
        .map(str::to_string);
    Some(PullSource {
        engine_id,
        host_port,
        first_block,
        locality,
    })
}

/// The prefiller named by `x-prefiller-host-port`: `None` if absent, `Err` if unusable.
/// kvroute's bound on the sidecar's prefill call (`x-prefiller-timeout-ms`), if it sent one. llm-d's
/// routing sidecar does not read it; the simulated sidecar does, falling back to a local prefill
/// as it does on any failed prefill.
pub fn prefiller_timeout(headers: &HeaderMap) -> Option<Duration> {
    let ms: u64 = headers
        .get("x-prefiller-timeout-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

pub fn prefiller_target(headers: &HeaderMap) -> Option<Result<String, String>> {
    let raw = headers.get(PREFILLER_HEADER)?;
    let Ok(text) = raw.to_str() else {
        return Some(Err("header is not ASCII".into()));
    };
    // Only one prefiller is used; a list (as some gateways send) means "first choice first".
    let first = text.split(',').next().unwrap_or_default().trim();
    let valid = first
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    Some(if valid {
        Ok(first.to_string())
    } else {
        Err(format!("not a host:port: {text:?}"))
    })
}

/// The prefill leg of a disaggregated request, as vLLM's NixlConnector proxy and llm-d's routing
/// sidecar send it: the client's body cut to one token, not streamed, marked for a remote decode.
pub fn remote_decode_prefill(
    body: &serde_json::Map<String, serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    let mut body = body.clone();
    body.insert("max_tokens".into(), json!(1));
    if body.contains_key("max_completion_tokens") {
        body.insert("max_completion_tokens".into(), json!(1));
    }
    body.insert("stream".into(), json!(false));
    // vLLM rejects stream_options on a non-streaming request.
    body.remove("stream_options");
    body.insert(
        "kv_transfer_params".into(),
        json!({
            "do_remote_decode": true,
            "do_remote_prefill": false,
            "remote_engine_id": null,
            "remote_block_ids": null,
            "remote_host": null,
            "remote_port": null,
        }),
    );
    body
}
