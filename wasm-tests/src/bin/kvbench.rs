//! kvbench: drive a seeded OpenAI-compatible workload at a target (Envoy in front of kvsim pods) and
//! report latency, throughput, success and the pods' cache-hit ratio.
//!
//! A thin command line over `wasm_tests::bench`: `run` drives one workload at a running target;
//! `compare` starts fresh pods and Envoy per load-balancing policy and runs the same seeded workload
//! through each; `compare-pd` runs aggregated pods against prefill/decode pools on the same number of
//! simulated GPUs (interference and agent scenarios); `overhead` measures kvroute's own cost per request
//! and memory (Envoy with the filter against the same Envoy without it); `demo` shows three requests
//! through kvroute and through round-robin; `up` runs Envoy with kvroute in the foreground in front of
//! given endpoints or simulated pods.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use wasm_tests::bench::compare::{self, Policy, StackOptions};
use wasm_tests::bench::compare_pd::{self, PdMode, PdStackOptions, Scenario};
use wasm_tests::bench::demo::{self, DemoOptions, UpOptions};
use wasm_tests::bench::overhead::{self, OverheadOptions, PromptKind};
use wasm_tests::bench::peers::{PeerPolicy, PeerRouter};
use wasm_tests::bench::summary;
use wasm_tests::bench::{
    render_json, render_table, run, AgentParams, Api, InterferenceParams, Load, MultiTenantParams,
    MultiTurnParams, SharedAgentParams, UniqueParams, WorkloadKind, WorkloadSpec,
};

#[derive(Parser, Debug)]
#[command(name = "kvbench", version, about = "Benchmark driver for kvroute")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one workload against a running target and print the report.
    Run(Box<RunArgs>),
    /// Start fresh simulated pods and Envoy per policy, run the same seeded workload through each,
    /// print one table and kvroute's ratios against round-robin.
    Compare(Box<CompareArgs>),
    /// Aggregated pods against prefill/decode pools on the same number of simulated GPUs, kvroute
    /// routing both, the same seeded workloads: the interference and agent scenarios.
    ComparePd(Box<ComparePdArgs>),
    /// kvroute's cost per request and its memory: Envoy with kvroute against the same Envoy
    /// without it, on the same instantly answering pods, requests interleaved (wall-clock figures).
    Overhead(Box<OverheadArgs>),
    /// Three chat requests through kvroute, then through round-robin: watch the prefix cache.
    Demo(DemoArgs),
    /// Run Envoy with kvroute in the foreground (until Ctrl-C) in front of endpoints or simulated pods.
    Up(UpArgs),
    /// Envoy + kvroute + simulated pods at a steady rate with faults on a schedule: requests,
    /// errors by cause, p99 drift and Envoy RSS over time (soak.csv, soak.svg); fails if any
    /// request was lost.
    Soak(SoakArgs),
}

#[derive(Args, Debug)]
struct SoakArgs {
    /// How long to run
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Requests per second (open loop, streamed)
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Simulated pods
    #[arg(long, default_value_t = 4)]
    pods: usize,
    /// Seconds per schedule phase (each fault, each healthy spell)
    #[arg(long, default_value_t = 10)]
    phase_seconds: u64,
    /// Seconds per reported window
    #[arg(long, default_value_t = 10)]
    window_seconds: u64,
    #[arg(long, default_value_t = 0.05)]
    time_scale: f64,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum WorkloadArg {
    MultiTenant,
    MultiTurn,
    Agent,
    /// Streaming decodes with long uncached prompts among them (the `compare-pd` defaults)
    Interference,
    /// A 4,000-word prefix every pod holds + a unique ~5,000-word context per call
    SharedAgent,
    /// Unique 8,000-word prompts among ~32 streaming decodes
    LongUnique,
    /// 12 tenants × 6,000-word system prompts on an engine whose prefills stall decodes
    MultiTenantStall,
    /// Unique prompts on a pool with one pod half as fast
    UnequalPool,
}

impl WorkloadArg {
    fn name(self) -> &'static str {
        match self {
            WorkloadArg::MultiTenant => "multi-tenant",
            WorkloadArg::MultiTurn => "multi-turn",
            WorkloadArg::Agent => "agent",
            WorkloadArg::Interference => "interference",
            WorkloadArg::SharedAgent => "shared-agent",
            WorkloadArg::LongUnique => "long-unique",
            WorkloadArg::MultiTenantStall => "multi-tenant-stall",
            WorkloadArg::UnequalPool => "unequal-pool",
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ApiArg {
    Chat,
    Completions,
}

/// Durations and rates are in simulated seconds (wall = simulated × time scale).
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("load").required(true).args(["rate", "concurrency"])))]
struct RunArgs {
    /// Base URL of the target, e.g. http://127.0.0.1:10000
    #[arg(long)]
    target: String,
    /// Pods whose /metrics are scraped for the cache-hit ratio (and, for shared-agent, which get
    /// the shared prefix first): ip:port,ip:port
    #[arg(long, value_delimiter = ',')]
    pods: Vec<String>,
    #[arg(long, value_enum)]
    workload: WorkloadArg,
    /// The simulator's time scale (0.05 = 20× faster than real); figures are reported in simulated time
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Also write the report as JSON (an array of labelled reports) to this file
    #[arg(long)]
    json: Option<PathBuf>,
    /// Row label in the table and JSON (default: the workload name)
    #[arg(long)]
    label: Option<String>,
    #[command(flatten)]
    spec: SpecArgs,
}

/// The workload and load flags shared by `run` and `compare`.
#[derive(Args, Debug)]
struct SpecArgs {
    /// Open loop: Poisson arrivals per simulated second
    #[arg(long)]
    rate: Option<f64>,
    /// Closed loop: requests kept in flight
    #[arg(long)]
    concurrency: Option<usize>,
    /// Simulated seconds during which requests are started [default: 60; compare: 300]
    #[arg(long)]
    duration: Option<f64>,
    /// Stop after this many requests
    #[arg(long)]
    requests: Option<usize>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Include per-request records in the JSON
    #[arg(long)]
    records: bool,
    #[arg(long, default_value = "sim-model")]
    model: String,
    #[arg(long, value_enum, default_value = "chat")]
    api: ApiArg,
    /// Send each request's session key in this header (session-affinity routing)
    #[arg(long)]
    session_header: Option<String>,
    /// Do not send ignore_eos (let the server decide output lengths)
    #[arg(long)]
    no_ignore_eos: bool,
    /// Per-request timeout, simulated seconds
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
    /// How long to wait for in-flight requests after the last start, simulated seconds
    #[arg(long, default_value_t = 600.0)]
    drain_timeout: f64,

    /// multi-tenant: number of tenants [default: 8; compare: 48; multi-tenant-stall: 12]
    #[arg(long)]
    tenants: Option<usize>,
    /// multi-tenant: words per tenant system prompt [default: 3000; multi-tenant-stall: 6000]
    #[arg(long)]
    tenant_system_words: Option<usize>,
    /// multi-tenant: Zipf exponent of tenant popularity (0 = uniform)
    #[arg(long, default_value_t = MultiTenantParams::default().zipf_s)]
    zipf: f64,
    /// multi-turn: conversations in progress at once
    #[arg(long, default_value_t = MultiTurnParams::default().conversations)]
    conversations: usize,
    /// multi-turn: turns per conversation
    #[arg(long, default_value_t = MultiTurnParams::default().turns)]
    turns: u32,
    /// multi-turn: words per conversation system prompt
    #[arg(long, default_value_t = MultiTurnParams::default().system_words)]
    conversation_system_words: usize,
    /// multi-turn, agent: start every first session at turn 0 instead of staggering them
    #[arg(long)]
    no_stagger: bool,
    /// agent: sessions in progress at once
    #[arg(long, default_value_t = AgentParams::default().sessions)]
    agent_sessions: usize,
    /// agent: steps per session
    #[arg(long, default_value_t = AgentParams::default().steps)]
    agent_steps: u32,
    /// agent: words of the preamble shared by all sessions
    #[arg(long, default_value_t = AgentParams::default().preamble_words)]
    agent_preamble_words: usize,
    /// agent: words of each session's initial context
    #[arg(long, default_value_t = AgentParams::default().context_words)]
    agent_context_words: usize,
}

/// What a flag left out means: `run` and `compare` differ.
#[derive(Clone, Copy, Debug)]
struct SpecDefaults {
    /// The load without `--rate`/`--concurrency` (`None`: one of them is required).
    load: Option<Load>,
    duration_s: f64,
    tenants: usize,
}

impl SpecDefaults {
    /// `run`: the library's defaults, and the load must be given.
    fn run() -> Self {
        Self {
            load: None,
            duration_s: 60.0,
            tenants: MultiTenantParams::default().tenants,
        }
    }

    /// `compare` (what `make bench` runs). Multi-tenant: 48 tenants × 3,000 words = 144,000 prompt
    /// tokens, more than twice one simulated pod's KV cache (4,096 blocks × 16 = 65,536 tokens) but
    /// about 36,000 per pod when each tenant stays on one pod: the case cache-aware routing exists
    /// for (with 8 tenants every pod caches every prompt and round-robin loses little after its first
    /// requests). At 4 requests/s round-robin recomputes ~58% of the prompt tokens and queues (p90
    /// TTFT ≈ 13 s) while kvroute serves ~96% from cache; multi-turn and agent rates are chosen the
    /// same way. 300 s of which the first 60 s (the cold start) are not measured: under 20 s of wall
    /// time per policy at time scale 0.05. The other workloads: see `compare::bench_defaults`.
    fn compare(workload: WorkloadArg) -> anyhow::Result<Self> {
        let d = compare::bench_defaults(workload.name())?;
        Ok(Self {
            load: Some(d.load),
            duration_s: d.duration_s,
            tenants: match workload {
                WorkloadArg::MultiTenantStall => MultiTenantParams::stall().tenants,
                _ => 48,
            },
        })
    }
}

impl SpecArgs {
    /// The spec for `workload`, flags left out taking `defaults`.
    fn spec(&self, workload: WorkloadArg, defaults: SpecDefaults) -> anyhow::Result<WorkloadSpec> {
        let workload = match workload {
            WorkloadArg::MultiTenant => WorkloadKind::MultiTenant(MultiTenantParams {
                tenants: self.tenants.unwrap_or(defaults.tenants),
                system_words: self
                    .tenant_system_words
                    .unwrap_or(MultiTenantParams::default().system_words),
                zipf_s: self.zipf,
                ..MultiTenantParams::default()
            }),
            WorkloadArg::MultiTenantStall => {
                let base = MultiTenantParams::stall();
                WorkloadKind::MultiTenantStall(MultiTenantParams {
                    tenants: self.tenants.unwrap_or(base.tenants),
                    system_words: self.tenant_system_words.unwrap_or(base.system_words),
                    zipf_s: self.zipf,
                    ..base
                })
            }
            WorkloadArg::SharedAgent => WorkloadKind::SharedAgent(SharedAgentParams::default()),
            WorkloadArg::LongUnique => WorkloadKind::LongUnique(InterferenceParams::long_unique()),
            WorkloadArg::UnequalPool => WorkloadKind::UnequalPool(UniqueParams::default()),
            WorkloadArg::MultiTurn => WorkloadKind::MultiTurn(MultiTurnParams {
                conversations: self.conversations,
                turns: self.turns,
                system_words: self.conversation_system_words,
                stagger: !self.no_stagger,
                ..MultiTurnParams::default()
            }),
            WorkloadArg::Interference => WorkloadKind::Interference(InterferenceParams::default()),
            WorkloadArg::Agent => WorkloadKind::Agent(AgentParams {
                sessions: self.agent_sessions,
                steps: self.agent_steps,
                preamble_words: self.agent_preamble_words,
                context_words: self.agent_context_words,
                stagger: !self.no_stagger,
                ..AgentParams::default()
            }),
        };
        let load = match (self.rate, self.concurrency, defaults.load) {
            (Some(rate), _, _) => Load::Open { rate },
            (None, Some(concurrency), _) => Load::Closed { concurrency },
            (None, None, Some(load)) => load,
            (None, None, None) => anyhow::bail!("give --rate or --concurrency"),
        };
        let mut spec = WorkloadSpec::new(workload, load);
        spec.seed = self.seed;
        spec.duration_s = self.duration.unwrap_or(defaults.duration_s);
        spec.max_requests = self.requests;
        spec.model = self.model.clone();
        spec.api = match self.api {
            ApiArg::Chat => Api::Chat,
            ApiArg::Completions => Api::Completions,
        };
        spec.ignore_eos = !self.no_ignore_eos;
        spec.session_header = self.session_header.clone();
        spec.request_timeout_s = self.timeout;
        spec.drain_timeout_s = self.drain_timeout;
        spec.keep_records = self.records;
        spec.validate()?;
        Ok(spec)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum CompareWorkload {
    MultiTenant,
    MultiTurn,
    Agent,
    SharedAgent,
    LongUnique,
    MultiTenantStall,
    UnequalPool,
    /// `make bench-pd`'s interference mix on 4 aggregated pods (not part of `all`)
    Interference,
    /// Every workload above but interference, in turn
    All,
}

impl CompareWorkload {
    fn workloads(self) -> Vec<WorkloadArg> {
        match self {
            CompareWorkload::MultiTenant => vec![WorkloadArg::MultiTenant],
            CompareWorkload::MultiTurn => vec![WorkloadArg::MultiTurn],
            CompareWorkload::Agent => vec![WorkloadArg::Agent],
            CompareWorkload::SharedAgent => vec![WorkloadArg::SharedAgent],
            CompareWorkload::LongUnique => vec![WorkloadArg::LongUnique],
            CompareWorkload::MultiTenantStall => vec![WorkloadArg::MultiTenantStall],
            CompareWorkload::UnequalPool => vec![WorkloadArg::UnequalPool],
            CompareWorkload::Interference => vec![WorkloadArg::Interference],
            CompareWorkload::All => vec![
                WorkloadArg::MultiTenant,
                WorkloadArg::MultiTurn,
                WorkloadArg::Agent,
                WorkloadArg::SharedAgent,
                WorkloadArg::LongUnique,
                WorkloadArg::MultiTenantStall,
                WorkloadArg::UnequalPool,
            ],
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PolicyArg {
    Kvroute,
    RoundRobin,
    LeastRequest,
    /// The client probes every simulated pod and sends each request to the earliest first token
    PerfectKnowledge,
    /// The same, minimising the request's first token plus the wait it adds to those queued there
    PerfectKnowledgeTotal,
    /// SGLang's router (PyPI sglang-router, `make peers`) with --policy cache_aware, no Envoy
    SglangRouter,
    /// SGLang's router with --policy round_robin
    SglangRouterRr,
    /// The Shepherd Model Gateway (PyPI smg) with --policy cache_aware
    Smg,
    /// The Shepherd Model Gateway with --policy round_robin
    SmgRr,
    /// vLLM's router (PyPI vllm-router) with --policy cache_aware
    VllmRouter,
    /// vLLM's router with --policy round_robin
    VllmRouterRr,
}

fn peer(router: PeerRouter, cache_aware: bool) -> Policy {
    Policy::Peer(PeerPolicy::new(router, cache_aware))
}

impl From<PolicyArg> for Policy {
    fn from(p: PolicyArg) -> Self {
        match p {
            PolicyArg::Kvroute => Policy::Kvroute,
            PolicyArg::RoundRobin => Policy::RoundRobin,
            PolicyArg::LeastRequest => Policy::LeastRequest,
            PolicyArg::PerfectKnowledge => Policy::Oracle,
            PolicyArg::PerfectKnowledgeTotal => Policy::OracleTotal,
            PolicyArg::SglangRouter => peer(PeerRouter::SglangRouter, true),
            PolicyArg::SglangRouterRr => peer(PeerRouter::SglangRouter, false),
            PolicyArg::Smg => peer(PeerRouter::Smg, true),
            PolicyArg::SmgRr => peer(PeerRouter::Smg, false),
            PolicyArg::VllmRouter => peer(PeerRouter::VllmRouter, true),
            PolicyArg::VllmRouterRr => peer(PeerRouter::VllmRouter, false),
        }
    }
}

/// Durations and rates are in simulated seconds (wall = simulated × time scale). Without `--rate` or
/// `--concurrency`, each workload runs at its default load on its default pods (see
/// `compare::bench_defaults`): multi-tenant 4/s, multi-turn 5/s, agent 1/s, shared-agent 24 clients
/// on 3 pods, long-unique 2.6/s, multi-tenant-stall 4/s, unequal-pool 2/s on 3 + 1 half-speed pods.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("load").args(["rate", "concurrency"])))]
struct CompareArgs {
    /// Policies to compare, in this order
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["kvroute", "round-robin", "least-request", "perfect-knowledge"])]
    policies: Vec<PolicyArg>,
    /// Simulated pods (fresh ones for every policy) [default: the workload's; with several kvsim
    /// processes, this sets the first one's]
    #[arg(long)]
    pods: Option<usize>,
    /// Seeds to run every workload with: --seed, --seed + 1, …; with more than one, a summary of
    /// medians and spreads and a verdict per workload follow
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Extra kvsim arguments, space-separated, e.g. "--num-gpu-blocks 2048"
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    sim_args: String,
    /// The simulator's time scale (0.05 = 20× faster than real); figures are reported in simulated time
    #[arg(long, default_value_t = 0.05)]
    time_scale: f64,
    /// Workloads to run, in this order (comma-separated; `all` = every one but interference)
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "multi-tenant"
    )]
    workload: Vec<CompareWorkload>,
    /// Simulated seconds at the start of the run that are sent but not measured (the pods start
    /// with empty caches); 0 = measure everything [default: the workload's, 30 or 60]
    #[arg(long)]
    warmup: Option<f64>,
    /// Write DIR/<workload>.json (reports) and DIR/<workload>.txt (table and ratios); with several
    /// seeds DIR/<workload>-seed<N>.{json,txt} and DIR/<workload>-summary.{json,txt}
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    #[command(flatten)]
    spec: SpecArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PdScenarioArg {
    /// Long-prompt arrivals among many streaming decodes: P99 ITL of the streams
    Interference,
    /// The 45:1 agent workload at a load that saturates the aggregated pods: TTFT and throughput
    Agent,
    /// Both in turn
    All,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PdModeArg {
    Sidecar,
    Inline,
}

/// `A/P+D`: A aggregated pods against P prefill + D decode pods.
fn parse_gpus(s: &str) -> Result<(usize, usize, usize), String> {
    let err = || format!("{s:?} is not A/P+D (e.g. 4/2+2)");
    let (a, pd) = s.split_once('/').ok_or_else(err)?;
    let (p, d) = pd.split_once('+').ok_or_else(err)?;
    let n = |x: &str| x.trim().parse::<usize>().map_err(|_| err());
    let (a, p, d) = (n(a)?, n(p)?, n(d)?);
    if a == 0 || p == 0 || d == 0 {
        return Err(format!("{s:?}: every pool needs at least one pod"));
    }
    Ok((a, p, d))
}

/// Durations and rates are in simulated seconds (wall = simulated × time scale). The defaults are the
/// settings `make bench-pd` reports; see `compare_pd` for why.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("agent_load").args(["agent_rate", "agent_concurrency"])))]
struct ComparePdArgs {
    #[arg(long, value_enum, default_value = "all")]
    scenario: PdScenarioArg,
    /// P/D modes to run (one P/D row each)
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["sidecar", "inline"])]
    modes: Vec<PdModeArg>,
    /// The simulator's time scale (0.05 = 20× faster than real); figures are reported in simulated time
    #[arg(long, default_value_t = 0.05)]
    time_scale: f64,
    /// kvsim arguments for every pod of every topology, space-separated
    #[arg(long, default_value = compare_pd::DEFAULT_SIM_ARGS, allow_hyphen_values = true)]
    sim_args: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Include per-request records in the JSON
    #[arg(long)]
    records: bool,
    /// kvroute configuration fields (JSON object) merged into the benchmark's, for every topology,
    /// e.g. '{"debug_header": true}'
    #[arg(long, value_name = "JSON")]
    plugin_extra: Option<String>,
    /// Write DIR/pd-<scenario>.json and DIR/pd-<scenario>.txt
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,

    /// interference: aggregated pods / prefill + decode pods
    #[arg(long, default_value = "4/2+2", value_parser = parse_gpus)]
    interference_gpus: (usize, usize, usize),
    /// interference: Poisson arrivals per simulated second (streams and long prompts together)
    #[arg(long, default_value_t = compare_pd::INTERFERENCE_RATE)]
    interference_rate: f64,
    /// interference: share of the arrivals that are long prompts
    #[arg(long, default_value_t = InterferenceParams::default().long_share)]
    long_share: f64,
    /// interference: words of a long prompt, MIN-MAX
    #[arg(long, default_value = "6000-10000", value_parser = parse_range)]
    long_prompt_words: (usize, usize),
    /// interference: output tokens of a stream, MIN-MAX
    #[arg(long, default_value = "400-800", value_parser = parse_range)]
    stream_tokens: (usize, usize),
    /// interference: simulated seconds of arrivals
    #[arg(long, default_value_t = compare_pd::INTERFERENCE_DURATION)]
    interference_duration: f64,
    /// interference: simulated seconds sent but not measured (the streams ramp up)
    #[arg(long, default_value_t = compare_pd::INTERFERENCE_WARMUP)]
    interference_warmup: f64,

    /// agent: aggregated pods / prefill + decode pods
    #[arg(long, default_value = "3/2+1", value_parser = parse_gpus)]
    agent_gpus: (usize, usize, usize),
    /// agent: open loop, Poisson arrivals per simulated second
    #[arg(long)]
    agent_rate: Option<f64>,
    /// agent: closed loop, requests kept in flight [default: 24, closed loop]
    #[arg(long)]
    agent_concurrency: Option<usize>,
    /// agent: sessions in progress at once
    #[arg(long, default_value_t = compare_pd::AGENT_SESSIONS)]
    agent_sessions: usize,
    /// agent: simulated seconds during which requests are started
    #[arg(long, default_value_t = compare_pd::AGENT_DURATION)]
    agent_duration: f64,
    /// agent: simulated seconds sent but not measured (cold caches)
    #[arg(long, default_value_t = compare_pd::AGENT_WARMUP)]
    agent_warmup: f64,
    /// Leave out the round-robin P/D baselines (a plain Envoy; the client round-robins prefill and
    /// decode pods, splitting every request, or only prompts over 512 words)
    #[arg(long)]
    no_baselines: bool,
    /// agent: leave out the control row (the aggregated pods with kvroute's prefix scorer weighted
    /// 6 against 1 per load scorer)
    #[arg(long)]
    no_control: bool,
}

/// `MIN-MAX` (or a single number).
fn parse_range(s: &str) -> Result<(usize, usize), String> {
    let err = || format!("{s:?} is not MIN-MAX");
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let a: usize = a.trim().parse().map_err(|_| err())?;
    let b: usize = b.trim().parse().map_err(|_| err())?;
    if a > b {
        return Err(err());
    }
    Ok((a, b))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PromptKindArg {
    /// The same 16 KB system prompt with a short varying question: kvroute finds a prefix hit
    Repeat,
    /// A new prompt on every request: kvroute's prefix index grows to its bounds
    Fresh,
}

/// Figures are wall-clock microseconds, not simulated time. Defaults are what `make bench-overhead`
/// reports.
#[derive(Args, Debug)]
struct OverheadArgs {
    /// Simulated pods (one kvsim process), shared by both Envoys
    #[arg(long, default_value_t = OverheadOptions::default().pods)]
    pods: usize,
    /// Envoy workers, the same in both Envoys
    #[arg(long, default_value_t = OverheadOptions::default().workers)]
    workers: usize,
    /// Measured request pairs (one to each Envoy) per prompt kind
    #[arg(long, default_value_t = OverheadOptions::default().requests)]
    requests: usize,
    /// Pairs sent before each kind's measured ones, not measured
    #[arg(long, default_value_t = OverheadOptions::default().warmup)]
    warmup: usize,
    /// Prompt kinds, measured in this order
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["repeat", "fresh"])]
    kinds: Vec<PromptKindArg>,
    /// Bytes of prompt text per request (system prompt + question)
    #[arg(long, default_value_t = OverheadOptions::default().prompt_bytes)]
    prompt_bytes: usize,
    /// The simulator's time scale (the default pods have no latency at all anyway)
    #[arg(long, default_value_t = OverheadOptions::default().time_scale)]
    time_scale: f64,
    /// kvsim arguments, space-separated (default: every latency parameter 0, the pods answer at once)
    #[arg(long, default_value = overhead::DEFAULT_SIM_ARGS, allow_hyphen_values = true)]
    sim_args: String,
    /// Bootstrap resamples for the 95% interval of the difference of medians
    #[arg(long, default_value_t = OverheadOptions::default().bootstrap)]
    bootstrap: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Requests per Envoy in the closed-loop throughput phase (0 = skip it)
    #[arg(long, default_value_t = OverheadOptions::default().throughput_requests)]
    throughput_requests: usize,
    /// Requests in flight in the throughput phase
    #[arg(long, default_value_t = OverheadOptions::default().concurrency)]
    concurrency: usize,
    /// kvroute configuration fields (JSON object) merged into its defaults, e.g. '{"block": {"mode": "tiktoken"}}'
    #[arg(long, value_name = "JSON")]
    plugin_extra: Option<String>,
    /// Include every latency sample in the JSON
    #[arg(long)]
    records: bool,
    /// Seconds without requests over which both Envoys' background CPU is measured (0 = skip)
    #[arg(long, default_value_t = OverheadOptions::default().idle_s)]
    idle: f64,
    /// Write DIR/overhead.json and DIR/overhead.txt
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// The simulator's time scale: 1 = real speed (about 3 s for a 7,500-token prefill)
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Simulated pods
    #[arg(long, default_value_t = 4)]
    pods: usize,
    /// Extra kvsim arguments, space-separated
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    sim_args: String,
    /// Tokens generated per request
    #[arg(long, default_value_t = 24)]
    max_tokens: u32,
}

#[derive(Args, Debug)]
struct UpArgs {
    /// OpenAI-compatible servers to route to, ip:port,ip:port (default: start simulated pods)
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Port of the inference listener (on 127.0.0.1)
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Port of Envoy's admin interface (default: chosen by the OS)
    #[arg(long, default_value_t = 0)]
    admin_port: u16,
    /// Simulated pods, without --endpoints
    #[arg(long, default_value_t = 4)]
    pods: usize,
    /// The simulator's time scale, without --endpoints (1 = real speed)
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Extra kvsim arguments, space-separated, without --endpoints
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    sim_args: String,
    /// Prefill servers (vLLM with a KV connector), ip:port,…; needs --decode-endpoints
    #[arg(long, value_delimiter = ',')]
    prefill_endpoints: Vec<String>,
    /// Decode servers, ip:port,…: with them kvroute disaggregates long prompts
    #[arg(long, value_delimiter = ',')]
    decode_endpoints: Vec<String>,
    /// How a disaggregated request is carried out: sidecar (x-prefiller-host-port) or inline
    #[arg(long, default_value = "sidecar")]
    pd_mode: String,
    /// Set by `make up`: errors name its variables (PORT=, DECODE=, …) instead of these flags
    #[arg(long, hide = true)]
    via_make: bool,
}

fn split_args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // SIGTERM or Ctrl-C ends a command by dropping it, so every pod, Envoy and peer router it
    // started is killed by PID on the way out rather than left running; `up` shuts down cleanly
    // on its own (and exits 0).
    let result = if matches!(cli.command, Command::Up(_)) {
        real_main(cli).await
    } else {
        tokio::select! {
            r = real_main(cli) => r,
            signal = interrupted() => Err(anyhow::anyhow!("stopped by {signal}")),
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvbench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn real_main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => {
            let spec = args.spec.spec(args.workload, SpecDefaults::run())?;
            let label = args
                .label
                .clone()
                .unwrap_or_else(|| spec.workload.name().to_owned());
            // What the workload says every pod holds (shared-agent's prefix), on the pods given.
            let prewarm = wasm_tests::bench::workload::WorkloadGen::new(&spec)?.prewarm_bodies();
            compare::prewarm_pods(&args.pods, spec.api, &prewarm).await?;
            let report = run(&args.target, &args.pods, &spec, args.time_scale).await?;
            let rows = [(label, report)];
            print!("{}", render_table(&rows));
            if let Some(path) = &args.json {
                let text = serde_json::to_string_pretty(&render_json(&rows))?;
                std::fs::write(path, text + "\n")
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
        Command::Compare(args) => compare_main(&args).await?,
        Command::ComparePd(args) => compare_pd_main(&args).await?,
        Command::Overhead(args) => overhead_main(&args).await?,
        Command::Soak(args) => {
            let opts = wasm_tests::bench::soak::SoakOptions {
                seconds: args.seconds,
                rate: args.rate,
                pods: args.pods,
                phase_s: args.phase_seconds,
                window_s: args.window_seconds,
                time_scale: args.time_scale,
                out: args.out.clone(),
            };
            let report = wasm_tests::bench::soak::soak(&opts).await?;
            println!("start_s  fault              requests  errors  p50_ms  p99_ms  envoy_rss_mib");
            for w in &report.windows {
                println!(
                    "{:>7}  {:<17}  {:>8}  {:>6}  {:>6.0}  {:>6.0}  {:>13.1}",
                    w.start_s, w.fault, w.requests, w.errors, w.p50_ms, w.p99_ms, w.envoy_rss_mib
                );
            }
            println!("{}", report.summary());
            anyhow::ensure!(report.lost() == 0, "{} requests lost", report.lost());
        }
        Command::Demo(args) => {
            let opts = DemoOptions {
                pods: args.pods,
                time_scale: args.time_scale,
                sim_args: split_args(&args.sim_args),
                max_tokens: args.max_tokens,
            };
            demo::demo(&opts).await?;
        }
        Command::Up(args) => {
            let opts = UpOptions {
                endpoints: args.endpoints.clone(),
                pods: args.pods,
                port: args.port,
                admin_port: args.admin_port,
                time_scale: args.time_scale,
                sim_args: split_args(&args.sim_args),
                prefill_endpoints: args.prefill_endpoints.clone(),
                decode_endpoints: args.decode_endpoints.clone(),
                pd_mode: args.pd_mode.clone(),
                via_make: args.via_make,
            };
            demo::up(&opts).await?;
        }
    }
    Ok(())
}

/// Resolves on the first SIGTERM or SIGINT, naming it.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

async fn compare_main(args: &CompareArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.time_scale.is_finite() && args.time_scale > 0.0,
        "time scale must be > 0"
    );
    anyhow::ensure!(args.seeds >= 1, "--seeds must be at least 1");
    // Validate every spec before starting anything.
    let mut cases = Vec::new();
    let mut workloads: Vec<WorkloadArg> = Vec::new();
    for w in args.workload.iter().flat_map(|w| w.workloads()) {
        if !workloads.contains(&w) {
            workloads.push(w);
        }
    }
    for w in workloads {
        let spec = args.spec.spec(w, SpecDefaults::compare(w)?)?;
        let defaults = compare::bench_defaults(w.name())?;
        let warmup = args.warmup.unwrap_or(defaults.warmup_s);
        anyhow::ensure!(
            warmup.is_finite() && warmup >= 0.0 && warmup < spec.duration_s,
            "{}: the warm-up ({warmup} s) must be >= 0 and shorter than the duration ({} s)",
            w.name(),
            spec.duration_s
        );
        let mut groups = defaults.groups;
        if let (Some(n), Some(first)) = (args.pods, groups.first_mut()) {
            first.pods = n;
        }
        anyhow::ensure!(groups.iter().all(|g| g.pods >= 1), "--pods must be >= 1");
        cases.push((w, spec, warmup, groups));
    }
    let policies: Vec<Policy> = args.policies.iter().map(|&p| p.into()).collect();
    anyhow::ensure!(!policies.is_empty(), "no policies given");
    let seeds: Vec<u64> = (0..args.seeds).map(|i| args.spec.seed + i).collect();
    let t0 = std::time::Instant::now();
    let mut verdicts = Vec::new();
    let mut overview = Vec::new();
    for (w, spec, warmup, groups) in &cases {
        let opts = StackOptions {
            groups: groups.clone(),
            sim_args: split_args(&args.sim_args),
            time_scale: args.time_scale,
            ..StackOptions::default()
        };
        let pool = compare::describe_groups(groups);
        let mut runs = Vec::new();
        for &seed in &seeds {
            let mut spec = spec.clone();
            spec.seed = seed;
            let rows = compare::compare(&policies, &spec, &opts, *warmup).await?;
            println!();
            if args.sim_args.trim().is_empty() {
                println!("pool: {pool}");
            } else {
                println!("pool: {pool}; every pod also: {}", args.sim_args.trim());
            }
            print!("{}", compare::render_text(&rows, *warmup));
            if let Some(dir) = &args.out {
                let stem = if seeds.len() == 1 {
                    w.name().to_owned()
                } else {
                    format!("{}-seed{seed}", w.name())
                };
                compare::write_outputs(dir, &stem, &rows, *warmup)?;
                eprintln!("wrote {0}/{1}.json and {0}/{1}.txt", dir.display(), stem);
            }
            runs.push(rows);
        }
        let summaries = summary::summarize(&runs);
        let verdict = summary::verdict(w.name(), &runs, &summaries);
        let text = format!(
            "pool: {pool}\n{}",
            summary::render_summary(w.name(), &summaries, &verdict)
        );
        println!();
        print!("{text}");
        if let Some(dir) = &args.out {
            std::fs::create_dir_all(dir)?;
            let stem = format!("{}-summary", w.name());
            let doc = serde_json::json!({
                "workload": w.name(),
                "pool": groups,
                "seeds": seeds,
                "warmup_s": warmup,
                "policies": summaries,
                "verdict": verdict,
            });
            std::fs::write(
                dir.join(format!("{stem}.json")),
                serde_json::to_string_pretty(&doc)? + "\n",
            )?;
            std::fs::write(dir.join(format!("{stem}.txt")), &text)?;
            eprintln!("wrote {0}/{1}.json and {0}/{1}.txt", dir.display(), stem);
        }
        verdicts.push(verdict);
        overview.push((w.name().to_owned(), summaries));
    }
    if verdicts.len() > 1 {
        println!();
        println!("== verdicts ({} seeds each) ==", seeds.len());
        for v in &verdicts {
            println!("{}", summary::verdict_line(v));
        }
    }
    // Every workload and policy in one table (what `make bench-peers` reports).
    if overview.len() > 1 || policies.iter().any(|p| matches!(p, Policy::Peer(_))) {
        let text = summary::render_overview(&overview);
        println!();
        print!("{text}");
        if let Some(dir) = &args.out {
            std::fs::create_dir_all(dir)?;
            std::fs::write(dir.join("overview.txt"), &text)?;
            eprintln!("wrote {}/overview.txt", dir.display());
        }
    }
    eprintln!("compare: {:.0} s wall in all", t0.elapsed().as_secs_f64());
    Ok(())
}

fn pd_scenarios(args: &ComparePdArgs) -> anyhow::Result<Vec<Scenario>> {
    let modes: Vec<PdMode> = args
        .modes
        .iter()
        .map(|m| match m {
            PdModeArg::Sidecar => PdMode::Sidecar,
            PdModeArg::Inline => PdMode::Inline,
        })
        .collect();
    anyhow::ensure!(!modes.is_empty(), "no P/D modes given");
    let setups = |(a, p, d): (usize, usize, usize)| compare_pd::setups(a, p, d, &modes);
    let mut out = Vec::new();
    if matches!(
        args.scenario,
        PdScenarioArg::Interference | PdScenarioArg::All
    ) {
        let tokens = |(a, b): (usize, usize)| -> anyhow::Result<(u32, u32)> {
            Ok((u32::try_from(a)?, u32::try_from(b)?))
        };
        let workload = WorkloadKind::Interference(InterferenceParams {
            long_share: args.long_share,
            long_prompt_words: args.long_prompt_words,
            stream_max_tokens: tokens(args.stream_tokens)?,
            ..InterferenceParams::default()
        });
        out.push(Scenario {
            name: "interference".to_owned(),
            spec: compare_pd::scenario_spec(
                workload,
                Load::Open {
                    rate: args.interference_rate,
                },
                args.interference_duration,
                args.seed,
            ),
            warmup_s: args.interference_warmup,
            setups: {
                let mut rows = setups(args.interference_gpus);
                if !args.no_baselines {
                    let (_, p, d) = args.interference_gpus;
                    rows.extend(compare_pd::round_robin_baselines(p, d));
                }
                rows
            },
        });
    }
    if matches!(args.scenario, PdScenarioArg::Agent | PdScenarioArg::All) {
        let workload = WorkloadKind::Agent(AgentParams {
            sessions: args.agent_sessions,
            ..AgentParams::default()
        });
        let load = match (args.agent_rate, args.agent_concurrency) {
            (Some(rate), _) => Load::Open { rate },
            (None, Some(concurrency)) => Load::Closed { concurrency },
            (None, None) => compare_pd::AGENT_LOAD,
        };
        out.push(Scenario {
            name: "agent".to_owned(),
            spec: compare_pd::scenario_spec(workload, load, args.agent_duration, args.seed),
            warmup_s: args.agent_warmup,
            setups: {
                let mut rows = setups(args.agent_gpus);
                if !args.no_baselines {
                    let (a, p, d) = args.agent_gpus;
                    rows.push(compare_pd::Setup::plain(
                        compare_pd::Topology::AggregatedRoundRobin { pods: a },
                    ));
                    rows.extend(compare_pd::round_robin_baselines(p, d));
                }
                if !args.no_control {
                    rows.push(compare_pd::wide_tie_band_control(args.agent_gpus.0));
                }
                rows
            },
        });
    }
    for s in &mut out {
        s.spec.keep_records = args.records;
        s.spec.validate()?;
        anyhow::ensure!(
            s.warmup_s.is_finite() && s.warmup_s >= 0.0 && s.warmup_s < s.spec.duration_s,
            "{}: the warm-up ({} s) must be >= 0 and shorter than the duration ({} s)",
            s.name,
            s.warmup_s,
            s.spec.duration_s
        );
    }
    Ok(out)
}

async fn compare_pd_main(args: &ComparePdArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.time_scale.is_finite() && args.time_scale > 0.0,
        "time scale must be > 0"
    );
    // Validate every scenario before starting anything.
    let scenarios = pd_scenarios(args)?;
    let sim_args = split_args(&args.sim_args);
    let mut plugin_extra = compare::bench_plugin_extra();
    if let Some(text) = &args.plugin_extra {
        let extra: serde_json::Value =
            serde_json::from_str(text).context("--plugin-extra is not JSON")?;
        let (Some(base), serde_json::Value::Object(extra)) = (plugin_extra.as_object_mut(), extra)
        else {
            anyhow::bail!("--plugin-extra must be a JSON object");
        };
        base.extend(extra);
    }
    let opts = PdStackOptions {
        sim_args,
        time_scale: args.time_scale,
        plugin_extra,
        ..PdStackOptions::default()
    };
    let t0 = std::time::Instant::now();
    for scenario in &scenarios {
        let rows = compare_pd::run_scenario(scenario, &opts).await?;
        let text = compare_pd::render_scenario(scenario, &opts, &rows);
        println!();
        print!("{text}");
        if let Some(dir) = &args.out {
            compare_pd::write_scenario(dir, scenario, &opts, &rows)?;
            eprintln!(
                "wrote {0}/pd-{1}.json and {0}/pd-{1}.txt",
                dir.display(),
                scenario.name
            );
        }
    }
    eprintln!(
        "compare-pd: {:.0} s wall in all",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn overhead_main(args: &OverheadArgs) -> anyhow::Result<()> {
    let plugin_extra = match &args.plugin_extra {
        Some(text) => serde_json::from_str(text).context("--plugin-extra is not JSON")?,
        None => serde_json::json!({}),
    };
    let opts = OverheadOptions {
        pods: args.pods,
        workers: args.workers,
        time_scale: args.time_scale,
        sim_args: split_args(&args.sim_args),
        kinds: args
            .kinds
            .iter()
            .map(|k| match k {
                PromptKindArg::Repeat => PromptKind::Repeat,
                PromptKindArg::Fresh => PromptKind::Fresh,
            })
            .collect(),
        requests: args.requests,
        warmup: args.warmup,
        prompt_bytes: args.prompt_bytes,
        bootstrap: args.bootstrap,
        seed: args.seed,
        throughput_requests: args.throughput_requests,
        concurrency: args.concurrency,
        plugin_extra,
        keep_samples: args.records,
        idle_s: args.idle,
    };
    opts.validate()?;
    let report = overhead::run(&opts).await?;
    println!();
    print!("{}", overhead::render_text(&report));
    if let Some(dir) = &args.out {
        overhead::write_outputs(dir, &report)?;
        eprintln!(
            "wrote {0}/overhead.json and {0}/overhead.txt",
            dir.display()
        );
    }
    Ok(())
}
