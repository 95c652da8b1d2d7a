//! Seeded workloads for kvbench: what is sent, to which session, and when.
//!
//! A benchmark comparing load-balancing policies is only fair if every policy sees the same traffic,
//! so everything here is a pure function of the seed: the vocabulary, the arrival times, which
//! tenant/conversation/agent session each request belongs to, and every word of every prompt. The one
//! input that is not seeded is the server's own reply, which multi-turn and agent sessions must resend
//! (that is what makes their prefixes grow); a failed reply is replaced by a seeded stand-in of the
//! requested length, so a failure changes the text but never the shape of the workload.
//!
//! Text is made of pseudo-words from a seeded vocabulary, separated by single spaces. The simulator
//! counts roughly one token per word, so word counts below double as token counts.
//!
//! The generator ([`WorkloadGen`]) hands out [`Slot`]s (an arrival offset, a session and a turn) in a
//! seeded order, and builds a slot's request body only when it is about to be sent
//! ([`WorkloadGen::build_request`]), because a turn's body depends on the previous turn's reply
//! ([`WorkloadGen::record_reply`]).
//!
//! One file per family, each implementing `Family` beside its parameters: `tenants` (multi-tenant
//! and multi-tenant-stall), `sessions` (multi-turn and agent: sessions that resend their replies),
//! `interference` (interference and long-unique), `shared_agent`, `unique` (unequal-pool),
//! `overload` (arrivals above capacity for a while, two priority classes, one tenant bursting:
//! its requests carry a priority and a flow id, sent as headers, see [`RequestTags`]).

mod adapters;
mod interference;
mod overload;
mod sessions;
mod shared_agent;
mod tenants;
mod unique;

pub use adapters::ManyAdapterParams;
pub use interference::InterferenceParams;
pub use overload::{OverloadParams, HIGH_PRIORITY, LOW_PRIORITY};
pub use sessions::{AgentParams, MultiTurnParams};
pub use shared_agent::SharedAgentParams;
pub use tenants::MultiTenantParams;
pub use unique::UniqueParams;

use anyhow::{bail, ensure};
use rand::distributions::Distribution;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::Exp;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// How requests are offered to the target.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Load {
    /// Open loop: Poisson arrivals at `rate` requests per simulated second, whatever the target does.
    Open { rate: f64 },
    /// Closed loop: `concurrency` clients, each sending its next request when the previous one ends.
    Closed { concurrency: usize },
}

/// Which OpenAI endpoint the requests use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `POST /v1/chat/completions` with `messages`.
    Chat,
    /// `POST /v1/completions` with the messages flattened into one `prompt` string.
    Completions,
}

impl Api {
    /// The request path on the target.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
        }
    }
}

/// The workload family and its parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum WorkloadKind {
    MultiTenant(MultiTenantParams),
    MultiTurn(MultiTurnParams),
    Agent(AgentParams),
    Interference(InterferenceParams),
    /// Every pod holds the shared prefix; each call adds its own long context.
    SharedAgent(SharedAgentParams),
    /// Unique long prompts among streaming decodes (the interference generator, other defaults).
    LongUnique(InterferenceParams),
    /// Multi-tenant traffic meant for an engine where prefills stall decodes (`multi-tenant`'s
    /// generator, other defaults).
    MultiTenantStall(MultiTenantParams),
    /// Unique prompts for a pool of unequal pods (one half as fast).
    UnequalPool(UniqueParams),
    /// Tenants whose arrivals surge above the pool's capacity for a while, one of them bursting,
    /// in two priority classes (flow control's benchmark; not in `make bench`'s `all`).
    Overload(OverloadParams),
    /// Requests for many LoRA adapters, a few hot, on pods with two adapter slots each.
    ManyAdapters(ManyAdapterParams),
    /// Multi-tenant traffic for pods with a host-memory KV tier (`multi-tenant`'s generator,
    /// other defaults).
    TieredTenants(MultiTenantParams),
}

impl WorkloadKind {
    /// Every CLI name, in `make bench` order (interference is `make bench-pd`'s, overload
    /// `make bench-overload`'s).
    pub const NAMES: [&'static str; 11] = [
        "multi-tenant",
        "multi-turn",
        "agent",
        "shared-agent",
        "long-unique",
        "multi-tenant-stall",
        "unequal-pool",
        "many-adapters",
        "tiered-tenants",
        "interference",
        "overload",
    ];

    /// The CLI name: `multi-tenant`, `multi-turn`, `agent`, `interference`, `shared-agent`,
    /// `long-unique`, `multi-tenant-stall`, `unequal-pool` or `overload`.
    pub fn name(&self) -> &'static str {
        match self {
            WorkloadKind::MultiTenant(_) => "multi-tenant",
            WorkloadKind::MultiTurn(_) => "multi-turn",
            WorkloadKind::Agent(_) => "agent",
            WorkloadKind::Interference(_) => "interference",
            WorkloadKind::SharedAgent(_) => "shared-agent",
            WorkloadKind::LongUnique(_) => "long-unique",
            WorkloadKind::MultiTenantStall(_) => "multi-tenant-stall",
            WorkloadKind::UnequalPool(_) => "unequal-pool",
            WorkloadKind::Overload(_) => "overload",
            WorkloadKind::ManyAdapters(_) => "many-adapters",
            WorkloadKind::TieredTenants(_) => "tiered-tenants",
        }
    }

    /// The named workload with default parameters.
    pub fn from_name(name: &str) -> anyhow::Result<Self> {
        Ok(match name {
            "multi-tenant" => WorkloadKind::MultiTenant(MultiTenantParams::default()),
            "multi-turn" => WorkloadKind::MultiTurn(MultiTurnParams::default()),
            "agent" => WorkloadKind::Agent(AgentParams::default()),
            "interference" => WorkloadKind::Interference(InterferenceParams::default()),
            "shared-agent" => WorkloadKind::SharedAgent(SharedAgentParams::default()),
            "long-unique" => WorkloadKind::LongUnique(InterferenceParams::long_unique()),
            "multi-tenant-stall" => WorkloadKind::MultiTenantStall(MultiTenantParams::stall()),
            "unequal-pool" => WorkloadKind::UnequalPool(UniqueParams::default()),
            "overload" => WorkloadKind::Overload(OverloadParams::default()),
            "many-adapters" => WorkloadKind::ManyAdapters(ManyAdapterParams::default()),
            "tiered-tenants" => WorkloadKind::TieredTenants(MultiTenantParams::tiered()),
            other => bail!("unknown workload {other:?} ({})", Self::NAMES.join(", ")),
        })
    }
}

/// Everything that defines one benchmark run except the target. Durations and rates are in
/// *simulated* seconds: the driver multiplies durations by the run's time scale (and divides rates
/// by it) to get wall-clock values, so one spec describes the same experiment at any time scale.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    pub workload: WorkloadKind,
    /// Seed of everything generated.
    pub seed: u64,
    pub load: Load,
    /// Seconds during which requests are started (open loop: arrivals; closed loop: new requests).
    pub duration_s: f64,
    /// Stop after this many requests even if the duration has not elapsed.
    pub max_requests: Option<usize>,
    /// `model` field of every request.
    pub model: String,
    pub api: Api,
    /// Send `ignore_eos: true` so the server generates exactly `max_tokens` (vLLM's benchmarks do the
    /// same, to keep output lengths part of the workload rather than of the model).
    pub ignore_eos: bool,
    /// If set, every request carries this header with its session key (for session-affinity routing).
    pub session_header: Option<String>,
    /// A request still unfinished after this long fails with `timeout`.
    pub request_timeout_s: f64,
    /// After the last start, wait this long for in-flight requests, then fail them with `drain timeout`.
    pub drain_timeout_s: f64,
    /// Keep per-request records in the report (for plots).
    pub keep_records: bool,
}

impl WorkloadSpec {
    /// A spec with the defaults: seed 1, 60 s, model `sim-model`, chat API, `ignore_eos`, 600 s
    /// request and drain timeouts, no record keeping.
    pub fn new(workload: WorkloadKind, load: Load) -> Self {
        Self {
            workload,
            seed: 1,
            load,
            duration_s: 60.0,
            max_requests: None,
            model: "sim-model".to_owned(),
            api: Api::Chat,
            ignore_eos: true,
            session_header: None,
            request_timeout_s: 600.0,
            drain_timeout_s: 600.0,
            keep_records: false,
        }
    }

    /// Rejects specs that would loop forever, divide by zero or draw from an empty range.
    pub fn validate(&self) -> anyhow::Result<()> {
        match self.load {
            Load::Open { rate } => ensure!(rate.is_finite() && rate > 0.0, "rate must be > 0"),
            Load::Closed { concurrency } => ensure!(concurrency >= 1, "concurrency must be >= 1"),
        }
        ensure!(
            self.duration_s.is_finite() && self.duration_s >= 0.0,
            "duration must be >= 0"
        );
        ensure!(
            self.request_timeout_s.is_finite() && self.request_timeout_s > 0.0,
            "request timeout must be > 0"
        );
        ensure!(
            self.drain_timeout_s.is_finite() && self.drain_timeout_s >= 0.0,
            "drain timeout must be >= 0"
        );
        match &self.workload {
            WorkloadKind::MultiTenant(p)
            | WorkloadKind::MultiTenantStall(p)
            | WorkloadKind::TieredTenants(p) => {
                ensure!(p.tenants >= 1, "tenants must be >= 1");
                ensure!(p.zipf_s.is_finite() && p.zipf_s >= 0.0, "zipf must be >= 0");
                check_range("question words", p.question_words)?;
                check_range("max tokens", p.max_tokens)?;
            }
            WorkloadKind::MultiTurn(p) => {
                ensure!(p.conversations >= 1, "conversations must be >= 1");
                ensure!(p.turns >= 1, "turns must be >= 1");
                check_range("user words", p.user_words)?;
                check_range("max tokens", p.max_tokens)?;
            }
            WorkloadKind::Agent(p) => {
                ensure!(p.sessions >= 1, "agent sessions must be >= 1");
                ensure!(p.steps >= 1, "agent steps must be >= 1");
                check_range("tool result words", p.tool_result_words)?;
                check_range("max tokens", p.max_tokens)?;
            }
            WorkloadKind::SharedAgent(p) => {
                check_range("context words", p.context_words)?;
                check_range("max tokens", p.max_tokens)?;
            }
            WorkloadKind::UnequalPool(p) => {
                check_range("prompt words", p.prompt_words)?;
                check_range("max tokens", p.max_tokens)?;
            }
            WorkloadKind::Overload(p) => p.validate()?,
            WorkloadKind::ManyAdapters(p) => {
                ensure!(p.adapters >= 1, "adapters must be >= 1");
                ensure!(p.zipf_s.is_finite() && p.zipf_s >= 0.0, "zipf must be >= 0");
                check_range("question words", p.question_words)?;
                check_range("max tokens", p.max_tokens)?;
            }
            WorkloadKind::Interference(p) | WorkloadKind::LongUnique(p) => {
                ensure!(
                    p.long_share.is_finite() && (0.0..=1.0).contains(&p.long_share),
                    "long share must be between 0 and 1"
                );
                check_range("stream prompt words", p.stream_prompt_words)?;
                check_range("stream max tokens", p.stream_max_tokens)?;
                check_range("long prompt words", p.long_prompt_words)?;
                check_range("long max tokens", p.long_max_tokens)?;
            }
        }
        Ok(())
    }
}

fn check_range<T: PartialOrd + std::fmt::Debug>(what: &str, r: (T, T)) -> anyhow::Result<()> {
    ensure!(r.0 <= r.1, "{what}: min {:?} > max {:?}", r.0, r.1);
    Ok(())
}

/// An independent random stream for one purpose and one (session, turn), so that what a request
/// contains never depends on the order in which other requests were built.
fn rng_for(seed: u64, tag: &str, a: u64, b: u64) -> StdRng {
    let mut key = Vec::with_capacity(tag.len() + 16);
    key.extend_from_slice(tag.as_bytes());
    key.extend_from_slice(&a.to_le_bytes());
    key.extend_from_slice(&b.to_le_bytes());
    StdRng::seed_from_u64(xxhash_rust::xxh3::xxh3_64_with_seed(&key, seed))
}

/// A seeded vocabulary of pronounceable lowercase pseudo-words of 2–6 letters, without
/// punctuation: kvsim counts a word as one token but cuts longer words into 6-byte pieces and makes
/// every punctuation mark a token, so these words keep "words = tokens" true.
#[derive(Clone, Debug)]
pub struct Vocab {
    words: Vec<String>,
}

impl Vocab {
    /// Words per vocabulary: large enough that two random texts share no long run of words.
    pub const SIZE: usize = 4096;
    /// Longest word, in bytes (kvsim's longest single-token piece).
    pub const MAX_WORD_BYTES: usize = 6;

    pub fn new(seed: u64) -> Self {
        const ONSETS: &[&str] = &[
            "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
            "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "sh", "st", "th", "tr",
        ];
        const VOWELS: &[&str] = &["a", "e", "i", "o", "u", "ai", "ea", "ou"];
        let mut rng = rng_for(seed, "vocab", 0, 0);
        let mut words = Vec::with_capacity(Self::SIZE);
        while words.len() < Self::SIZE {
            let syllables = rng.gen_range(1..=3);
            let mut w = String::new();
            for _ in 0..syllables {
                w.push_str(ONSETS.choose(&mut rng).copied().unwrap_or("b"));
                w.push_str(VOWELS.choose(&mut rng).copied().unwrap_or("a"));
            }
            if rng.gen_bool(0.3) {
                w.push('n');
            }
            if w.len() <= Self::MAX_WORD_BYTES {
                words.push(w);
            }
        }
        Self { words }
    }

    /// `n` words drawn from `rng`, space-separated.
    pub fn text(&self, rng: &mut StdRng, n: usize) -> String {
        let mut out = String::with_capacity(n * 7);
        for i in 0..n {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(self.words.choose(rng).map(String::as_str).unwrap_or("la"));
        }
        out
    }
}

/// Whitespace-separated words in `s`: the workload's stand-in for a token count.
pub fn word_count(s: &str) -> usize {
    s.split_whitespace().count()
}

/// One request-to-be: when it arrives, which session it belongs to and which turn of it it is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Slot {
    /// Position in the generated sequence, from 0.
    pub index: u64,
    /// Open loop: arrival offset from the start in simulated seconds. Closed loop: 0.
    pub arrival_s: f64,
    /// `tenant-N`, `conv-N`, `agent-N`, `stream-N`, `long-N`, `call-N` or `req-N`.
    pub session: String,
    pub session_id: u64,
    /// Turn (step) within the session, from 0; for tenants, the tenant's request count so far.
    pub turn: u32,
}

/// A chat message.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

impl Message {
    fn new(role: &'static str, content: String) -> Self {
        Self { role, content }
    }
}

/// What a request says about itself beyond its body: its priority class and its flow (who it is
/// fair to), sent as [`PRIORITY_HEADER`] and [`FAIRNESS_HEADER`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestTags {
    pub priority: Option<i64>,
    pub flow: Option<String>,
}

/// kvroute's priority header (`shedding.priority_header`'s default; higher first, negative
/// sheddable), which flow control orders its bands by.
pub const PRIORITY_HEADER: &str = "x-kvroute-priority";
/// The flow id header flow control is fair between (`flow_control.fairness_header`'s default, as
/// in the Gateway API Inference Extension).
pub const FAIRNESS_HEADER: &str = "x-gateway-inference-fairness-id";

impl RequestTags {
    /// The request headers these tags are sent as.
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(p) = self.priority {
            out.push((PRIORITY_HEADER.to_owned(), p.to_string()));
        }
        if let Some(f) = &self.flow {
            out.push((FAIRNESS_HEADER.to_owned(), f.clone()));
        }
        out
    }
}

/// A request ready to send.
#[derive(Clone, Debug)]
pub struct PlannedRequest {
    /// The conversation as sent (before flattening for the completions API).
    pub messages: Vec<Message>,
    pub max_tokens: u32,
    /// The JSON body, always streaming with `include_usage`.
    pub body: Value,
    /// Words in all message contents (≈ prompt tokens, without template overhead).
    pub prompt_words: usize,
    /// Its priority class, if the workload gives it one (also in `headers`).
    pub priority: Option<i64>,
    /// Request headers beyond the body's (priority, flow id): `(name, value)`.
    pub headers: Vec<(String, String)>,
}

/// The completions-API rendering of a conversation: append-only, so a conversation's prompts still
/// share their prefix from turn to turn.
fn flatten(messages: &[Message]) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str(m.role);
        out.push_str(": ");
        out.push_str(&m.content);
        out.push_str("\n\n");
    }
    out.push_str("assistant:");
    out
}

/// One workload family's generator: its sessions, what each request says, and what it keeps of
/// the replies. [`WorkloadGen`] owns what every family shares: the arrivals, the slots' numbering
/// and the request bodies. A new family is one file implementing this.
trait Family: std::fmt::Debug + Send {
    /// The session (name and id) and turn of slot `index`.
    fn next_session(&mut self, index: u64) -> (String, u64, u32);
    /// The same for a slot arriving `arrival_s` into the run (a family whose mix changes over
    /// time overrides it).
    fn next_session_at(&mut self, index: u64, _arrival_s: f64) -> (String, u64, u32) {
        self.next_session(index)
    }
    /// The priority and flow of `slot`'s request (none by default).
    fn tags(&self, _seed: u64, _slot: &Slot) -> RequestTags {
        RequestTags::default()
    }
    /// The open-loop arrival rate at `t` simulated seconds, as a multiple of the spec's rate, at
    /// most [`max_intensity`](Self::max_intensity) (arrivals are thinned to it).
    fn intensity(&self, _t: f64) -> f64 {
        1.0
    }
    fn max_intensity(&self) -> f64 {
        1.0
    }
    /// The messages of `slot`'s request, and its `max_tokens`.
    fn messages(&mut self, seed: u64, vocab: &Vocab, slot: &Slot) -> (Vec<Message>, u32);
    /// Whether a session's turns must run one after another (each resends the previous reply).
    fn is_sequential(&self) -> bool {
        false
    }
    /// What the server returned for `slot` (`None`: the request failed).
    fn record_reply(&mut self, _slot: &Slot, _reply: Option<&str>) {}
    /// Messages every pod must hold before the run (see [`WorkloadGen::prewarm_bodies`]).
    fn prewarm(&self) -> Option<Vec<Message>> {
        None
    }
    /// The `model` of `slot`'s request, where the family names one (an adapter); else the spec's.
    fn model(&self, _slot: &Slot) -> Option<String> {
        None
    }
}

/// The stateful generator of one run's requests. See the module documentation.
#[derive(Debug)]
pub struct WorkloadGen {
    seed: u64,
    model: String,
    api: Api,
    ignore_eos: bool,
    duration_s: f64,
    max_requests: Option<usize>,
    vocab: Vocab,
    arrivals: Option<(Exp<f64>, StdRng)>,
    /// Thinning of a time-varying rate ([`Family::intensity`]): its own stream, drawn from only
    /// where the rate is below its peak, so constant-rate workloads draw exactly as before.
    thinning: Box<StdRng>,
    clock_s: f64,
    next_index: u64,
    exhausted: bool,
    family: Box<dyn Family>,
}

impl WorkloadGen {
    pub fn new(spec: &WorkloadSpec) -> anyhow::Result<Self> {
        spec.validate()?;
        let seed = spec.seed;
        let vocab = Vocab::new(seed);
        let family: Box<dyn Family> = match &spec.workload {
            WorkloadKind::MultiTenant(p)
            | WorkloadKind::MultiTenantStall(p)
            | WorkloadKind::TieredTenants(p) => Box::new(tenants::Tenants::new(seed, &vocab, p)),
            WorkloadKind::MultiTurn(p) => Box::new(sessions::Conversations::new(seed, p)),
            WorkloadKind::Agent(p) => Box::new(sessions::Agents::new(seed, &vocab, p)),
            WorkloadKind::Interference(p) | WorkloadKind::LongUnique(p) => {
                Box::new(interference::Interference::new(seed, p))
            }
            WorkloadKind::SharedAgent(p) => {
                Box::new(shared_agent::SharedAgent::new(seed, &vocab, p))
            }
            WorkloadKind::UnequalPool(p) => Box::new(unique::Unique { p: p.clone() }),
            WorkloadKind::Overload(p) => Box::new(overload::Overload::new(seed, &vocab, p)),
            WorkloadKind::ManyAdapters(p) => Box::new(adapters::ManyAdapters::new(seed, &vocab, p)),
        };
        // Candidates come at the peak rate; `next_slot` thins them to the family's intensity.
        let peak = family.max_intensity();
        let arrivals = match spec.load {
            Load::Open { rate } => Some((Exp::new(rate * peak)?, rng_for(seed, "arrivals", 0, 0))),
            Load::Closed { .. } => None,
        };
        Ok(Self {
            seed,
            model: spec.model.clone(),
            api: spec.api,
            ignore_eos: spec.ignore_eos,
            duration_s: spec.duration_s,
            max_requests: spec.max_requests,
            vocab,
            arrivals,
            thinning: Box::new(rng_for(seed, "arrival-thinning", 0, 0)),
            clock_s: 0.0,
            next_index: 0,
            exhausted: false,
            family,
        })
    }

    /// Whether a session's turns must run one after another (each resends the previous reply).
    pub fn is_sequential(&self) -> bool {
        self.family.is_sequential()
    }

    /// The next slot, or `None` once the open-loop duration or `max_requests` is reached. The
    /// closed-loop duration is the driver's business (it depends on how fast the target answers).
    pub fn next_slot(&mut self) -> Option<Slot> {
        if self.exhausted {
            return None;
        }
        if let Some(max) = self.max_requests {
            if self.next_index >= max as u64 {
                self.exhausted = true;
                return None;
            }
        }
        let peak = self.family.max_intensity();
        let arrival_s = match &mut self.arrivals {
            Some((exp, rng)) => loop {
                self.clock_s += exp.sample(rng);
                if self.clock_s > self.duration_s {
                    self.exhausted = true;
                    return None;
                }
                // Thinning (Lewis and Shedler): candidates at the peak rate, each kept with
                // probability intensity / peak.
                let keep = self.family.intensity(self.clock_s) / peak;
                if keep >= 1.0 || self.thinning.gen::<f64>() < keep {
                    break self.clock_s;
                }
            },
            None => 0.0,
        };
        let index = self.next_index;
        self.next_index += 1;
        let (session, session_id, turn) = self.family.next_session_at(index, arrival_s);
        Some(Slot {
            index,
            arrival_s,
            session,
            session_id,
            turn,
        })
    }

    /// The request for `slot`. For sequential workloads call it only after the session's previous
    /// turn was recorded with [`record_reply`](Self::record_reply); an unrecorded turn is filled with
    /// its stand-in.
    pub fn build_request(&mut self, slot: &Slot) -> PlannedRequest {
        let (messages, max_tokens) = self.family.messages(self.seed, &self.vocab, slot);
        let prompt_words = messages.iter().map(|m| word_count(&m.content)).sum();
        let mut body = self.body(&messages, max_tokens);
        if let (Some(model), Value::Object(map)) = (self.family.model(slot), &mut body) {
            map.insert("model".into(), json!(model));
        }
        let tags = self.family.tags(self.seed, slot);
        PlannedRequest {
            messages,
            max_tokens,
            body,
            prompt_words,
            priority: tags.priority,
            headers: tags.headers(),
        }
    }

    /// Records what the server returned for `slot` (`None` if the request failed, in which case the
    /// seeded stand-in is resent instead). Forgets a session after its last turn.
    pub fn record_reply(&mut self, slot: &Slot, reply: Option<&str>) {
        self.family.record_reply(slot, reply);
    }

    /// Requests to send to *every* pod directly (not through the router) before the run, so that
    /// what the workload says every pod holds is held: for `shared-agent`, the shared prefix as a
    /// system message (one output token, not streamed). Empty for the other workloads. A pure
    /// function of the spec.
    pub fn prewarm_bodies(&self) -> Vec<Value> {
        let Some(messages) = self.family.prewarm() else {
            return Vec::new();
        };
        let mut body = self.body(&messages, 1);
        if let Value::Object(map) = &mut body {
            map.insert("stream".into(), json!(false));
            map.remove("stream_options");
        }
        vec![body]
    }

    fn body(&self, messages: &[Message], max_tokens: u32) -> Value {
        let mut body = serde_json::Map::new();
        body.insert("model".into(), json!(self.model));
        match self.api {
            Api::Chat => body.insert("messages".into(), json!(messages)),
            Api::Completions => body.insert("prompt".into(), json!(flatten(messages))),
        };
        body.insert("max_tokens".into(), json!(max_tokens));
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
        if self.ignore_eos {
            body.insert("ignore_eos".into(), json!(true));
        }
        Value::Object(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, load: Load, seed: u64) -> WorkloadSpec {
        let mut s = WorkloadSpec::new(WorkloadKind::from_name(name).expect("known"), load);
        s.seed = seed;
        s.duration_s = 30.0;
        s.max_requests = Some(40);
        s
    }

    /// Every request of a run: slot and body.
    fn generate(spec: &WorkloadSpec) -> Vec<(Slot, PlannedRequest)> {
        let mut gen = WorkloadGen::new(spec).expect("valid");
        let mut out = Vec::new();
        while let Some(slot) = gen.next_slot() {
            let plan = gen.build_request(&slot);
            gen.record_reply(&slot, None);
            out.push((slot, plan));
        }
        out
    }

    const NEW: [&str; 6] = [
        "shared-agent",
        "long-unique",
        "multi-tenant-stall",
        "unequal-pool",
        "overload",
        "many-adapters",
    ];

    #[test]
    fn many_adapters_names_one_adapter_per_request_the_first_the_hottest() {
        let s = spec("many-adapters", Load::Open { rate: 4.0 }, 5);
        let reqs = generate(&s);
        let p = ManyAdapterParams::default();
        let mut counts = vec![0usize; p.adapters];
        for (slot, plan) in &reqs {
            let model = plan.body["model"].as_str().expect("model");
            assert_eq!(model, ManyAdapterParams::name(slot.session_id as usize));
            counts[slot.session_id as usize] += 1;
        }
        assert_eq!(counts.iter().sum::<usize>(), reqs.len());
        let most = counts.iter().max().copied().unwrap_or(0);
        assert_eq!(
            counts[0], most,
            "Zipf 1: adapter-0 is the hottest: {counts:?}"
        );
        assert!(counts.iter().filter(|&&c| c > 0).count() >= 6, "{counts:?}");
        assert_eq!(p.lora_modules()[3], "adapter-3=/adapters/3");
    }

    #[test]
    fn every_name_round_trips() {
        for name in WorkloadKind::NAMES {
            assert_eq!(WorkloadKind::from_name(name).expect("known").name(), name);
        }
        assert!(WorkloadKind::from_name("nope").is_err());
    }

    #[test]
    fn new_workloads_are_pure_functions_of_the_seed() {
        for name in NEW {
            let load = Load::Open { rate: 2.0 };
            let a = generate(&spec(name, load, 7));
            let b = generate(&spec(name, load, 7));
            let c = generate(&spec(name, load, 8));
            assert!(!a.is_empty(), "{name}");
            let bodies = |v: &[(Slot, PlannedRequest)]| -> Vec<Value> {
                v.iter().map(|(_, p)| p.body.clone()).collect()
            };
            let slots = |v: &[(Slot, PlannedRequest)]| -> Vec<Slot> {
                v.iter().map(|(s, _)| s.clone()).collect()
            };
            assert_eq!(slots(&a), slots(&b), "{name}");
            assert_eq!(bodies(&a), bodies(&b), "{name}");
            assert_ne!(bodies(&a), bodies(&c), "{name}: another seed, other text");
            let w = WorkloadGen::new(&spec(name, load, 7)).expect("valid");
            let w2 = WorkloadGen::new(&spec(name, load, 7)).expect("valid");
            assert_eq!(w.prewarm_bodies(), w2.prewarm_bodies(), "{name}");
        }
    }

    #[test]
    fn shared_agent_calls_share_the_prewarmed_prefix_and_bring_their_own_context() {
        let s = spec("shared-agent", Load::Closed { concurrency: 24 }, 3);
        let reqs = generate(&s);
        let p = SharedAgentParams::default();
        let gen = WorkloadGen::new(&s).expect("valid");
        let warm = gen.prewarm_bodies();
        assert_eq!(warm.len(), 1);
        assert_eq!(warm[0]["stream"], false);
        assert_eq!(warm[0]["max_tokens"], 1);
        let prefix = warm[0]["messages"][0]["content"].as_str().expect("text");
        assert_eq!(word_count(prefix), p.prefix_words);
        let mut contexts = std::collections::HashSet::new();
        for (slot, plan) in &reqs {
            assert_eq!(slot.session, format!("call-{}", slot.index));
            assert_eq!(plan.messages.len(), 2);
            assert_eq!(plan.messages[0].role, "system");
            assert_eq!(
                plan.messages[0].content, prefix,
                "every call starts with the prefix"
            );
            let n = word_count(&plan.messages[1].content);
            assert!((p.context_words.0..=p.context_words.1).contains(&n), "{n}");
            assert!((p.max_tokens.0..=p.max_tokens.1).contains(&plan.max_tokens));
            assert!(contexts.insert(plan.messages[1].content.clone()), "unique");
        }
        assert!(!gen.is_sequential());
    }

    #[test]
    fn long_unique_mixes_rare_8000_word_prompts_into_streams() {
        let mut s = spec("long-unique", Load::Open { rate: 2.6 }, 1);
        s.max_requests = Some(400);
        s.duration_s = 1000.0;
        let reqs = generate(&s);
        let p = InterferenceParams::long_unique();
        let long: Vec<_> = reqs
            .iter()
            .filter(|(s, _)| InterferenceParams::is_long_session(&s.session))
            .collect();
        let share = long.len() as f64 / reqs.len() as f64;
        assert!((0.03..0.15).contains(&share), "{share}");
        for (_, plan) in &long {
            assert_eq!(plan.prompt_words, 8000);
            assert!((p.long_max_tokens.0..=p.long_max_tokens.1).contains(&plan.max_tokens));
        }
        for (slot, plan) in &reqs {
            if InterferenceParams::is_stream_session(&slot.session) {
                assert!((50..=150).contains(&plan.prompt_words));
                assert!((400..=800).contains(&plan.max_tokens));
            }
        }
        assert_eq!(s.workload.name(), "long-unique");
    }

    #[test]
    fn multi_tenant_stall_has_12_long_system_prompts_and_short_questions() {
        let mut s = spec("multi-tenant-stall", Load::Open { rate: 4.0 }, 2);
        s.max_requests = Some(200);
        s.duration_s = 1000.0;
        let reqs = generate(&s);
        let mut systems = std::collections::HashMap::new();
        for (slot, plan) in &reqs {
            assert_eq!(word_count(&plan.messages[0].content), 6000);
            let q = word_count(&plan.messages[1].content);
            assert!((20..=60).contains(&q), "{q}");
            let prev = systems.insert(slot.session.clone(), plan.messages[0].content.clone());
            if let Some(prev) = prev {
                assert_eq!(prev, plan.messages[0].content, "a tenant keeps its prompt");
            }
        }
        assert_eq!(systems.len(), 12);
        assert!(WorkloadGen::new(&s)
            .expect("valid")
            .prewarm_bodies()
            .is_empty());
    }

    #[test]
    fn unequal_pool_prompts_are_unique_and_in_range() {
        let reqs = generate(&spec("unequal-pool", Load::Open { rate: 2.0 }, 5));
        let mut seen = std::collections::HashSet::new();
        for (slot, plan) in &reqs {
            assert_eq!(slot.session, format!("req-{}", slot.index));
            assert!((2000..=4000).contains(&plan.prompt_words));
            assert!((64..=256).contains(&plan.max_tokens));
            assert!(seen.insert(plan.messages[0].content.clone()));
        }
    }

    #[test]
    fn overload_surges_bursts_one_tenant_and_tags_priorities_and_flows() {
        let mut s = spec("overload", Load::Open { rate: 3.0 }, 4);
        s.max_requests = None;
        s.duration_s = 160.0;
        let p = OverloadParams::default();
        let reqs = generate(&s);
        let in_window = |a: f64, b: f64| {
            let v: Vec<&(Slot, PlannedRequest)> = reqs
                .iter()
                .filter(|(slot, _)| slot.arrival_s >= a && slot.arrival_s < b)
                .collect();
            v
        };
        // Outside the surge: about 3/s; in the burst, 3 × 2.5 × (5 + 5) / 6 = 12.5/s.
        let before = in_window(0.0, p.surge_start_s).len() as f64 / p.surge_start_s;
        let burst = in_window(p.burst_start_s, p.burst_end_s);
        let burst_rate = burst.len() as f64 / (p.burst_end_s - p.burst_start_s);
        assert!((2.2..3.8).contains(&before), "{before}");
        assert!((10.5..14.5).contains(&burst_rate), "{burst_rate}");
        assert!((p.intensity(60.0) - 2.5 * 10.0 / 6.0).abs() < 1e-12);
        assert!(p.intensity(60.0) <= p.max_intensity());
        // Tenant 0 sends half the burst (5 of 10 shares).
        let zero = burst
            .iter()
            .filter(|(s, _)| s.session == "tenant-0")
            .count() as f64;
        let share = zero / burst.len() as f64;
        assert!((0.4..0.6).contains(&share), "{share}");
        let expected = p.expected_requests(0, 3.0, 160.0);
        // Tenant 0: ×1 for 100 s, ×2.5 for 20 s, ×12.5 for 40 s, at 3/s ÷ 6 tenants.
        let want = 3.0 * (100.0 + 2.5 * 20.0 + 12.5 * 40.0) / 6.0;
        assert!((expected - want).abs() < 1e-9, "{expected}");
        let high = reqs
            .iter()
            .filter(|(_, r)| r.priority == Some(HIGH_PRIORITY))
            .count() as f64;
        let high_share = high / reqs.len() as f64;
        assert!((0.15..0.25).contains(&high_share), "{high_share}");
        for (slot, plan) in &reqs {
            let priority = plan
                .priority
                .expect("every request has a class")
                .to_string();
            assert_eq!(
                plan.headers,
                vec![
                    (PRIORITY_HEADER.to_owned(), priority),
                    (FAIRNESS_HEADER.to_owned(), slot.session.clone()),
                ]
            );
            assert_eq!(word_count(&plan.messages[0].content), p.system_words);
        }
        // Workloads without tags send no extra headers.
        let plain = generate(&spec("unequal-pool", Load::Open { rate: 2.0 }, 5));
        assert!(plain
            .iter()
            .all(|(_, r)| r.headers.is_empty() && r.priority.is_none()));
        let bad = WorkloadKind::Overload(OverloadParams {
            burst_tenant: 6,
            ..OverloadParams::default()
        });
        assert!(WorkloadSpec::new(bad, Load::Open { rate: 1.0 })
            .validate()
            .is_err());
    }

    #[test]
    fn new_workloads_reject_empty_ranges() {
        let bad = WorkloadKind::SharedAgent(SharedAgentParams {
            context_words: (10, 5),
            ..SharedAgentParams::default()
        });
        assert!(WorkloadSpec::new(bad, Load::Closed { concurrency: 1 })
            .validate()
            .is_err());
        let bad = WorkloadKind::UnequalPool(UniqueParams {
            max_tokens: (9, 1),
            ..UniqueParams::default()
        });
        assert!(WorkloadSpec::new(bad, Load::Open { rate: 1.0 })
            .validate()
            .is_err());
    }
}
