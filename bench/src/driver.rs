//! The load generator: sends a workload's requests to the target, streaming, and measures each one.
//!
//! Two ways to offer load. Open loop starts requests at the workload's Poisson arrival times whatever
//! the target does, which is how overload shows up as latency rather than being hidden by a slower
//! client. Closed loop keeps a fixed number of requests in flight. Either way, a session whose turns
//! depend on each other (multi-turn, agent) sends a turn only after the previous turn's reply was
//! recorded: turns are chained per session in slot order with one-shot channels.
//!
//! Every request streams with `stream_options.include_usage`, because TTFT and inter-token latency
//! only exist for streamed responses and the usage chunk carries the token counts (including
//! `prompt_tokens_details.cached_tokens`). Anything the target does wrong — refused connection,
//! non-200, malformed chunk, error event, missing `[DONE]`, timeout — makes that request a failure
//! with a reason, never a crash of the run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::routing::ClientRouter;
use super::workload::{Api, Load, Slot, WorkloadGen, WorkloadSpec};

/// The response header in which the simulator names the pod that served the request.
pub const POD_HEADER: &str = "x-kvsim-pod";
/// kvroute's debug response header (with `debug_header: true`).
pub const DEBUG_HEADER: &str = "x-kvroute-debug";
/// kvroute's machine-readable reason on a reply it made itself (`queue_full`, `queue_timeout`, …).
pub const ERROR_HEADER: &str = "x-kvroute-error";

/// `predicted_ttft_ms=<n>` from an `x-kvroute-debug` value (`key=value; key=value; …`).
pub fn predicted_ttft_ms(debug: &str) -> Option<f64> {
    debug
        .split(';')
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| k.trim() == "predicted_ttft_ms")
        .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// How the driver sends beyond the spec: a client-side router (the reference policies), and other
/// gateway replicas in front of the same pods.
#[derive(Clone, Debug, Default)]
pub struct DriveOptions {
    pub router: Option<Arc<ClientRouter>>,
    /// Base URLs of further gateways beside the target: request N goes to gateway N mod the number
    /// of gateways, as clients behind a layer-4 balancer would spread (a session's turns land on
    /// different replicas).
    pub other_gateways: Vec<String>,
    /// The pods' caches emptied mid-run; the report then has the hit ratio around it
    /// ([`CacheReset`](super::report::CacheReset)). Done by
    /// [`run_after_warmup_with`](super::compare::run_after_warmup_with), which knows the pods;
    /// the driver itself only sends.
    pub pod_reset: Option<PodReset>,
}

/// Pods whose prefix cache is emptied during a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PodReset {
    /// Simulated seconds into the run (warm-up included).
    pub at_s: f64,
    /// A restart of each pod (`POST /sim/restart`: its `process_start_time_seconds` moves, which a
    /// router reading it can see at its next poll), not vLLM's reset_prefix_cache (`/sim/reset`).
    pub restart: bool,
    /// Only the first this many pods (all when `None`).
    pub pods: Option<usize>,
}

/// Longest wall-clock wait the driver will schedule (30 days).
const MAX_WAIT: Duration = Duration::from_secs(30 * 24 * 3600);

/// One request's measurements, in wall-clock seconds (the report converts to simulated time).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RequestRecord {
    pub index: u64,
    pub session: String,
    pub turn: u32,
    /// When the request was sent, from the start of the run.
    pub start_s: f64,
    /// Time to the first chunk with non-empty content.
    pub ttft_s: Option<f64>,
    /// Gaps between consecutive content chunks after the first.
    pub itl_s: Vec<f64>,
    /// Time to `[DONE]` (or to the failure).
    pub e2e_s: Option<f64>,
    /// Time to the response's status line and headers, whatever the status: when the client first
    /// heard back (a simulated pod answers its headers at once, so through a gateway that holds
    /// requests this is the wait there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers_s: Option<f64>,
    /// The priority class the request was sent with, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// kvroute's `x-kvroute-error` on a reply the gateway made itself (`queue_timeout`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_error: Option<String>,
    pub prompt_words: usize,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// From usage; without a usage chunk, the number of content chunks.
    pub output_tokens: u64,
    pub status: Option<u16>,
    pub pod: Option<String>,
    /// kvroute's predicted TTFT for this request, wall-clock ms (`predicted_ttft_ms` in its
    /// `x-kvroute-debug` response header), when it sent one.
    pub predicted_ttft_ms: Option<f64>,
    /// With the shadow probe: every pod's own estimate of this request's first token, simulated
    /// ms, taken just before the gateway chose (see `ClientRouter::Shadow`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub probed_ttft_ms: Vec<(String, f64)>,
    /// kvroute's whole `x-kvroute-debug` line (every pod's prediction, the queue it saw), for
    /// reading a run's decisions afterwards (`--records`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debug: Option<String>,
    /// HTTP 200, `[DONE]` seen and no error event.
    pub ok: bool,
    /// Whether the request was sent at all (a turn still waiting for its predecessor at the drain
    /// deadline was not).
    pub sent: bool,
    /// Failure class: `connect`, `timeout`, `http 503`, `body`, `no [DONE]`, `error event`,
    /// `drain timeout`, `abandoned`, …
    pub error: Option<String>,
    /// Failure detail, when there is more to say than the class.
    pub error_detail: Option<String>,
}

impl RequestRecord {
    /// The same record with times divided by `time_scale` (wall → simulated seconds).
    pub fn scaled(&self, time_scale: f64) -> Self {
        let s = |v: f64| v / time_scale;
        Self {
            start_s: s(self.start_s),
            ttft_s: self.ttft_s.map(s),
            itl_s: self.itl_s.iter().copied().map(s).collect(),
            e2e_s: self.e2e_s.map(s),
            headers_s: self.headers_s.map(s),
            ..self.clone()
        }
    }
}

/// Incremental splitter of a `text/event-stream` body into `data:` payloads. Network reads split
/// events anywhere, so bytes are buffered until a full line is available.
#[derive(Debug, Default)]
pub struct SseBuffer {
    buf: Vec<u8>,
}

impl SseBuffer {
    /// Appends `bytes` and returns the `data:` payloads of the lines completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut consumed = 0;
        while let Some(nl) = self
            .buf
            .get(consumed..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
        {
            let line = self.buf.get(consumed..consumed + nl).unwrap_or_default();
            consumed += nl + 1;
            let line = String::from_utf8_lossy(line);
            let line = line.trim_end_matches('\r');
            if let Some(data) = line.strip_prefix("data:") {
                out.push(data.trim().to_owned());
            }
        }
        self.buf.drain(..consumed);
        out
    }
}

/// What one streamed response yielded so far.
#[derive(Debug, Default)]
struct Measurement {
    status: Option<u16>,
    pod: Option<String>,
    predicted_ttft_ms: Option<f64>,
    probed_ttft_ms: Vec<(String, f64)>,
    debug: Option<String>,
    gateway_error: Option<String>,
    headers_at: Option<Duration>,
    ttft: Option<Duration>,
    last_content: Option<Duration>,
    itls: Vec<Duration>,
    end: Option<Duration>,
    text: String,
    content_chunks: u64,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    done: bool,
    error: Option<(String, Option<String>)>,
}

impl Measurement {
    fn fail(&mut self, class: &str, detail: Option<String>) {
        // The first failure is the cause; later ones are consequences.
        if self.error.is_none() {
            self.error = Some((class.to_owned(), detail));
        }
    }

    fn ok(&self) -> bool {
        self.status == Some(200) && self.done && self.error.is_none()
    }

    /// Applies one `data:` payload received `at` after the request started.
    fn on_data(&mut self, data: &str, at: Duration, api: Api) {
        if data == "[DONE]" {
            if !self.done {
                self.done = true;
                self.end = Some(at);
            }
            return;
        }
        let chunk: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => return self.fail("bad chunk", Some(e.to_string())),
        };
        if let Some(err) = chunk.get("error") {
            return self.fail("error event", Some(err.to_string()));
        }
        let field = match api {
            Api::Chat => "/delta/content",
            Api::Completions => "/text",
        };
        let choices = chunk.get("choices").and_then(Value::as_array);
        for choice in choices.into_iter().flatten() {
            let Some(content) = choice.pointer(field).and_then(Value::as_str) else {
                continue;
            };
            if content.is_empty() {
                continue;
            }
            match self.last_content {
                None => self.ttft = Some(at),
                Some(prev) => self.itls.push(at.saturating_sub(prev)),
            }
            self.last_content = Some(at);
            self.content_chunks += 1;
            self.text.push_str(content);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            let n = |p: &str| usage.pointer(p).and_then(Value::as_u64);
            self.prompt_tokens = n("/prompt_tokens").or(self.prompt_tokens);
            self.completion_tokens = n("/completion_tokens").or(self.completion_tokens);
            self.cached_tokens = n("/prompt_tokens_details/cached_tokens").or(self.cached_tokens);
        }
    }
}

/// Sends one request and reads its stream into `m`. Returns early on failure, leaving the cause in `m`.
#[allow(clippy::too_many_arguments)]
async fn execute(
    client: &reqwest::Client,
    url: &str,
    session_header: Option<(&HeaderName, HeaderValue)>,
    extra_headers: Vec<(HeaderName, HeaderValue)>,
    hold: Option<tokio::sync::OwnedMutexGuard<()>>,
    body: Vec<u8>,
    api: Api,
    start: Instant,
    m: &mut Measurement,
) {
    let mut rb = client
        .post(url)
        .header(CONTENT_TYPE, "application/json")
        .body(body);
    if let Some((name, value)) = session_header {
        rb = rb.header(name, value);
    }
    for (name, value) in extra_headers {
        rb = rb.header(name, value);
    }
    let sent = rb.send().await;
    // The request has reached its pod (or failed): a client-side router may decide the next one.
    drop(hold);
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            let class = if e.is_connect() { "connect" } else { "send" };
            return m.fail(class, Some(format!("{e:#}")));
        }
    };
    m.status = Some(resp.status().as_u16());
    m.headers_at = Some(start.elapsed());
    m.gateway_error = resp
        .headers()
        .get(ERROR_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    m.pod = resp
        .headers()
        .get(POD_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    m.debug = resp
        .headers()
        .get(DEBUG_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(p) = m.debug.as_deref().and_then(predicted_ttft_ms) {
        m.predicted_ttft_ms = Some(p);
    }
    if resp.status() != reqwest::StatusCode::OK {
        let class = format!("http {}", resp.status().as_u16());
        let detail = resp
            .text()
            .await
            .ok()
            .map(|t| t.chars().take(300).collect());
        m.end = Some(start.elapsed());
        return m.fail(&class, detail);
    }
    let mut stream = resp.bytes_stream();
    let mut sse = SseBuffer::default();
    // Read to the end even after `[DONE]`, so the connection goes back to the pool.
    while let Some(item) = stream.next().await {
        let at = start.elapsed();
        match item {
            Ok(bytes) => {
                for data in sse.push(&bytes) {
                    m.on_data(&data, at, api);
                }
            }
            Err(e) => {
                m.end.get_or_insert(at);
                return m.fail("body", Some(format!("{e:#}")));
            }
        }
    }
    if !m.done {
        m.end = Some(start.elapsed());
        m.fail("no [DONE]", None);
    }
}

/// A request between its arrival and the end of its measurement.
#[derive(Debug)]
struct Pending {
    slot: Slot,
    prompt_words: usize,
    priority: Option<i64>,
    sent_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct Ledger {
    done: Vec<RequestRecord>,
    pending: HashMap<u64, Pending>,
}

struct Shared {
    client: reqwest::Client,
    /// The target's base URL.
    target: String,
    /// The inference URL of every gateway (the target's first).
    urls: Vec<String>,
    router: Option<Arc<ClientRouter>>,
    api: Api,
    session_header: Option<HeaderName>,
    request_timeout: Duration,
    gen: Mutex<WorkloadGen>,
    sequential: bool,
    /// Per session, the receiver that fires when its latest dispatched turn has finished.
    chains: Mutex<HashMap<String, oneshot::Receiver<()>>>,
    ledger: Mutex<Ledger>,
    t0: Instant,
    /// Set at the drain deadline: a turn released by its aborted predecessor must not be sent.
    closing: AtomicBool,
}

/// A poisoned lock only means another request task panicked; its data is still the best we have.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Links a dispatched slot to its session's previous turn.
struct Admitted {
    slot: Slot,
    after: Option<oneshot::Receiver<()>>,
    /// Dropped when this turn is finished, which releases the next turn.
    finished: Option<oneshot::Sender<()>>,
}

impl Shared {
    /// The gateway request `index` goes to.
    fn url_for(&self, index: u64) -> &str {
        let n = self.urls.len().max(1) as u64;
        self.urls
            .get((index % n) as usize)
            .map_or("", String::as_str)
    }

    fn next_slot(&self) -> Option<Slot> {
        lock(&self.gen).next_slot()
    }

    fn admit(&self, slot: Slot) -> Admitted {
        let (after, finished) = if self.sequential {
            let (tx, rx) = oneshot::channel();
            (
                lock(&self.chains).insert(slot.session.clone(), rx),
                Some(tx),
            )
        } else {
            (None, None)
        };
        lock(&self.ledger).pending.insert(
            slot.index,
            Pending {
                slot: slot.clone(),
                prompt_words: 0,
                priority: None,
                sent_at: None,
            },
        );
        Admitted {
            slot,
            after,
            finished,
        }
    }

    async fn serve(self: Arc<Self>, a: Admitted) {
        if let Some(rx) = a.after {
            // An error only means the previous turn's task was dropped; its reply is then the stand-in.
            let _ = rx.await;
        }
        if self.closing.load(Ordering::SeqCst) {
            // Left pending: `cut_off` reports it as abandoned.
            return;
        }
        let slot = a.slot;
        let plan = lock(&self.gen).build_request(&slot);
        let mut start = Instant::now();
        if let Some(p) = lock(&self.ledger).pending.get_mut(&slot.index) {
            p.prompt_words = plan.prompt_words;
            p.priority = plan.priority;
            p.sent_at = Some(start);
        }
        let mut m = Measurement::default();
        match serde_json::to_vec(&plan.body) {
            Ok(mut body) => {
                let mut extra_headers: Vec<(HeaderName, HeaderValue)> = plan
                    .headers
                    .iter()
                    .filter_map(|(k, v)| {
                        Some((
                            HeaderName::from_bytes(k.as_bytes()).ok()?,
                            HeaderValue::from_str(v).ok()?,
                        ))
                    })
                    .collect();
                let mut hold = None;
                if let Some(router) = &self.router {
                    let routed = router
                        .route(
                            &self.client,
                            &self.target,
                            self.api.path(),
                            &body,
                            plan.prompt_words,
                        )
                        .await;
                    if routed.restart_clock {
                        start = Instant::now();
                        if let Some(p) = lock(&self.ledger).pending.get_mut(&slot.index) {
                            p.sent_at = Some(start);
                        }
                    }
                    extra_headers.extend(routed.headers);
                    m.predicted_ttft_ms = routed.predicted_ttft_ms;
                    m.probed_ttft_ms = routed.probed_ttft_ms;
                    hold = routed.hold;
                    if let Some(b) = routed.body {
                        body = b;
                    }
                }
                let header = self
                    .session_header
                    .as_ref()
                    .and_then(|name| HeaderValue::from_str(&slot.session).ok().map(|v| (name, v)));
                let fut = execute(
                    &self.client,
                    self.url_for(slot.index),
                    header,
                    extra_headers,
                    hold,
                    body,
                    self.api,
                    start,
                    &mut m,
                );
                if tokio::time::timeout(self.request_timeout, fut)
                    .await
                    .is_err()
                {
                    m.end = Some(start.elapsed());
                    m.error = Some(("timeout".to_owned(), None));
                }
            }
            Err(e) => m.fail("encode", Some(e.to_string())),
        }
        let ok = m.ok();
        lock(&self.gen).record_reply(&slot, ok.then_some(m.text.as_str()));
        drop(a.finished);
        let record = RequestRecord {
            index: slot.index,
            session: slot.session.clone(),
            turn: slot.turn,
            start_s: start.duration_since(self.t0).as_secs_f64(),
            ttft_s: m.ttft.map(|d| d.as_secs_f64()),
            itl_s: m.itls.iter().map(Duration::as_secs_f64).collect(),
            e2e_s: m.end.map(|d| d.as_secs_f64()),
            headers_s: m.headers_at.map(|d| d.as_secs_f64()),
            priority: plan.priority,
            gateway_error: m.gateway_error.take(),
            prompt_words: plan.prompt_words,
            prompt_tokens: m.prompt_tokens,
            cached_tokens: m.cached_tokens,
            output_tokens: m.completion_tokens.unwrap_or(m.content_chunks),
            status: m.status,
            pod: m.pod.clone(),
            predicted_ttft_ms: m.predicted_ttft_ms,
            probed_ttft_ms: std::mem::take(&mut m.probed_ttft_ms),
            debug: m.debug.take(),
            ok,
            sent: true,
            error: m.error.as_ref().map(|e| e.0.clone()),
            error_detail: m.error.and_then(|e| e.1),
        };
        let mut ledger = lock(&self.ledger);
        ledger.pending.remove(&slot.index);
        ledger.done.push(record);
    }

    /// Requests still pending when the run is cut off, as failures.
    fn cut_off(&self) -> Vec<RequestRecord> {
        let mut ledger = lock(&self.ledger);
        let now = Instant::now();
        let mut out: Vec<RequestRecord> = ledger
            .pending
            .drain()
            .map(|(_, p)| RequestRecord {
                index: p.slot.index,
                session: p.slot.session,
                turn: p.slot.turn,
                start_s: p
                    .sent_at
                    .map(|t| t.duration_since(self.t0).as_secs_f64())
                    .unwrap_or_else(|| now.duration_since(self.t0).as_secs_f64()),
                e2e_s: p.sent_at.map(|t| now.duration_since(t).as_secs_f64()),
                prompt_words: p.prompt_words,
                priority: p.priority,
                sent: p.sent_at.is_some(),
                error: Some(
                    if p.sent_at.is_some() {
                        "drain timeout"
                    } else {
                        "abandoned"
                    }
                    .to_owned(),
                ),
                ..RequestRecord::default()
            })
            .collect();
        out.sort_by_key(|r| r.index);
        out
    }
}

/// All requests of a run and how long it took.
#[derive(Debug)]
pub struct DriverOutput {
    /// Sorted by slot index.
    pub records: Vec<RequestRecord>,
    /// From the start of the run to the end of the last request (or the drain deadline).
    pub wall: Duration,
}

/// Runs `spec` against `target` (a base URL such as `http://127.0.0.1:10000`).
pub async fn drive(
    target: &str,
    spec: &WorkloadSpec,
    time_scale: f64,
) -> anyhow::Result<DriverOutput> {
    drive_with(target, spec, time_scale, &DriveOptions::default()).await
}

/// [`drive`] with a client-side router (see [`DriveOptions`]).
pub async fn drive_with(
    target: &str,
    spec: &WorkloadSpec,
    time_scale: f64,
    opts: &DriveOptions,
) -> anyhow::Result<DriverOutput> {
    anyhow::ensure!(
        time_scale.is_finite() && time_scale > 0.0,
        "time scale must be > 0"
    );
    let gen = WorkloadGen::new(spec)?;
    // Capped so that absurd specs (a year-long timeout) cannot overflow `Instant` arithmetic.
    let wall = |sim_s: f64| {
        Duration::try_from_secs_f64(sim_s * time_scale)
            .unwrap_or(Duration::ZERO)
            .min(MAX_WAIT)
    };
    let pool = match spec.load {
        Load::Closed { concurrency } => concurrency,
        Load::Open { .. } => 1024,
    };
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(pool)
        .tcp_nodelay(true)
        // The target is a local Envoy: a proxy from the environment would only distort the timings.
        .no_proxy()
        .build()?;
    let session_header = spec
        .session_header
        .as_deref()
        .map(|h| HeaderName::from_bytes(h.as_bytes()))
        .transpose()?;
    let shared = Arc::new(Shared {
        client,
        target: target.trim_end_matches('/').to_owned(),
        urls: std::iter::once(target)
            .chain(opts.other_gateways.iter().map(String::as_str))
            .map(|t| format!("{}{}", t.trim_end_matches('/'), spec.api.path()))
            .collect(),
        router: opts.router.clone(),
        api: spec.api,
        session_header,
        request_timeout: wall(spec.request_timeout_s),
        sequential: gen.is_sequential(),
        gen: Mutex::new(gen),
        chains: Mutex::new(HashMap::new()),
        ledger: Mutex::new(Ledger::default()),
        t0: Instant::now(),
        closing: AtomicBool::new(false),
    });
    let t0 = shared.t0;
    let mut tasks = JoinSet::new();
    match spec.load {
        Load::Open { .. } => {
            let t0_tokio = tokio::time::Instant::from_std(t0);
            while let Some(slot) = shared.next_slot() {
                tokio::time::sleep_until(t0_tokio + wall(slot.arrival_s)).await;
                let admitted = shared.admit(slot);
                tasks.spawn(shared.clone().serve(admitted));
                while tasks.try_join_next().is_some() {}
            }
        }
        Load::Closed { concurrency } => {
            let deadline = t0 + wall(spec.duration_s);
            for _ in 0..concurrency {
                let shared = shared.clone();
                tasks.spawn(async move {
                    while Instant::now() < deadline {
                        let Some(slot) = shared.next_slot() else {
                            break;
                        };
                        let admitted = shared.admit(slot);
                        shared.clone().serve(admitted).await;
                    }
                });
            }
            // The closed loop's "arrivals" end at the deadline; wait for it before the drain clock starts.
            let drained = async { while tasks.join_next().await.is_some() {} };
            let _ =
                tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), drained).await;
        }
    }
    let drain = async { while tasks.join_next().await.is_some() {} };
    let drained = tokio::time::timeout(wall(spec.drain_timeout_s), drain)
        .await
        .is_ok();
    if !drained {
        shared.closing.store(true, Ordering::SeqCst);
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    let end = Instant::now();
    let cut = shared.cut_off();
    let mut records = std::mem::take(&mut lock(&shared.ledger).done);
    records.extend(cut);
    records.sort_by_key(|r| r.index);
    // A run that drained early ends with its last request, not when the drain loop noticed.
    let last_end = records
        .iter()
        .filter_map(|r| r.e2e_s.map(|e| r.start_s + e))
        .fold(0.0_f64, f64::max);
    let wall_time = if drained {
        Duration::try_from_secs_f64(last_end)
            .unwrap_or_default()
            .min(end.duration_since(t0))
    } else {
        end.duration_since(t0)
    };
    Ok(DriverOutput {
        records,
        wall: wall_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicted_ttft_is_read_from_the_debug_header() {
        let line = "pod=127.0.0.1:1; reason=load; predicted_ttft_ms=412.5; score=0.3";
        assert_eq!(predicted_ttft_ms(line), Some(412.5));
        assert_eq!(predicted_ttft_ms("predicted_ttft_ms=7"), Some(7.0));
        assert_eq!(predicted_ttft_ms("pod=a; reason=prefix"), None, "absent");
        assert_eq!(predicted_ttft_ms("predicted_ttft_ms=soon"), None);
        assert_eq!(predicted_ttft_ms("predicted_ttft_ms=-1"), None);
    }
}
