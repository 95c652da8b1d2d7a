//! `kvbench run`: one seeded workload at a running target, and the workload options (`SpecArgs`)
//! that `compare` shares.

use std::path::PathBuf;

use clap::{ArgGroup, Args, ValueEnum};
use kvbench::compare::{self};
use kvbench::{
    AgentParams, Api, InterferenceParams, Load, MultiTenantParams, MultiTurnParams, OverloadParams,
    SharedAgentParams, UniqueParams, WorkloadKind, WorkloadSpec,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum WorkloadArg {
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
    /// Requests for 16 LoRA adapters (Zipf 1) on pods holding two at a time
    ManyAdapters,
    /// 24 tenants × 3,000-word system prompts on pods with a host-memory KV tier
    TieredTenants,
    /// Arrivals above the pool's capacity for a while, two priority classes, 6 tenants, one
    /// bursting (flow control's benchmark)
    Overload,
}

impl WorkloadArg {
    pub(crate) fn name(self) -> &'static str {
        match self {
            WorkloadArg::MultiTenant => "multi-tenant",
            WorkloadArg::MultiTurn => "multi-turn",
            WorkloadArg::Agent => "agent",
            WorkloadArg::Interference => "interference",
            WorkloadArg::SharedAgent => "shared-agent",
            WorkloadArg::LongUnique => "long-unique",
            WorkloadArg::MultiTenantStall => "multi-tenant-stall",
            WorkloadArg::UnequalPool => "unequal-pool",
            WorkloadArg::ManyAdapters => "many-adapters",
            WorkloadArg::TieredTenants => "tiered-tenants",
            WorkloadArg::Overload => "overload",
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum ApiArg {
    Chat,
    Completions,
}

/// Durations and rates are in simulated seconds (wall = simulated × time scale).
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("load").required(true).args(["rate", "concurrency"])))]
pub(crate) struct RunArgs {
    /// Base URL of the target, e.g. http://127.0.0.1:10000
    #[arg(long)]
    pub(crate) target: String,
    /// Pods whose /metrics are scraped for the cache-hit ratio (and, for shared-agent, which get
    /// the shared prefix first): ip:port,ip:port
    #[arg(long, value_delimiter = ',')]
    pub(crate) pods: Vec<String>,
    #[arg(long, value_enum)]
    pub(crate) workload: WorkloadArg,
    /// The simulator's time scale (0.05 = 20× faster than real); figures are reported in simulated time
    #[arg(long, default_value_t = 1.0)]
    pub(crate) time_scale: f64,
    /// Also write the report as JSON (an array of labelled reports) to this file
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Row label in the table and JSON (default: the workload name)
    #[arg(long)]
    pub(crate) label: Option<String>,
    #[command(flatten)]
    pub(crate) spec: SpecArgs,
}

/// The workload and load flags shared by `run` and `compare`.
#[derive(Args, Debug)]
pub(crate) struct SpecArgs {
    /// Open loop: Poisson arrivals per simulated second
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Closed loop: requests kept in flight
    #[arg(long)]
    pub(crate) concurrency: Option<usize>,
    /// Simulated seconds during which requests are started [default: 60; compare: 300]
    #[arg(long)]
    pub(crate) duration: Option<f64>,
    /// Stop after this many requests
    #[arg(long)]
    pub(crate) requests: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Include per-request records in the JSON
    #[arg(long)]
    pub(crate) records: bool,
    #[arg(long, default_value = "sim-model")]
    pub(crate) model: String,
    #[arg(long, value_enum, default_value = "chat")]
    pub(crate) api: ApiArg,
    /// Send each request's session key in this header (session-affinity routing)
    #[arg(long)]
    pub(crate) session_header: Option<String>,
    /// Do not send ignore_eos (let the server decide output lengths)
    #[arg(long)]
    pub(crate) no_ignore_eos: bool,
    /// Per-request timeout, simulated seconds
    #[arg(long, default_value_t = 600.0)]
    pub(crate) timeout: f64,
    /// How long to wait for in-flight requests after the last start, simulated seconds
    #[arg(long, default_value_t = 600.0)]
    pub(crate) drain_timeout: f64,

    /// multi-tenant: number of tenants [default: 8; compare: 48; multi-tenant-stall: 12]
    #[arg(long)]
    pub(crate) tenants: Option<usize>,
    /// multi-tenant: words per tenant system prompt [default: 3000; multi-tenant-stall: 6000]
    #[arg(long)]
    pub(crate) tenant_system_words: Option<usize>,
    /// multi-tenant: Zipf exponent of tenant popularity (0 = uniform)
    #[arg(long, default_value_t = MultiTenantParams::default().zipf_s)]
    pub(crate) zipf: f64,
    /// multi-turn: conversations in progress at once
    #[arg(long, default_value_t = MultiTurnParams::default().conversations)]
    pub(crate) conversations: usize,
    /// multi-turn: turns per conversation
    #[arg(long, default_value_t = MultiTurnParams::default().turns)]
    pub(crate) turns: u32,
    /// multi-turn: words per conversation system prompt
    #[arg(long, default_value_t = MultiTurnParams::default().system_words)]
    pub(crate) conversation_system_words: usize,
    /// multi-turn, agent: start every first session at turn 0 instead of staggering them
    #[arg(long)]
    pub(crate) no_stagger: bool,
    /// agent: sessions in progress at once
    #[arg(long, default_value_t = AgentParams::default().sessions)]
    pub(crate) agent_sessions: usize,
    /// agent: steps per session
    #[arg(long, default_value_t = AgentParams::default().steps)]
    pub(crate) agent_steps: u32,
    /// agent: words of the preamble shared by all sessions
    #[arg(long, default_value_t = AgentParams::default().preamble_words)]
    pub(crate) agent_preamble_words: usize,
    /// agent: words of each session's initial context
    #[arg(long, default_value_t = AgentParams::default().context_words)]
    pub(crate) agent_context_words: usize,
}

/// What a flag left out means: `run` and `compare` differ.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpecDefaults {
    /// The load without `--rate`/`--concurrency` (`None`: one of them is required).
    pub(crate) load: Option<Load>,
    pub(crate) duration_s: f64,
    pub(crate) tenants: usize,
}

impl SpecDefaults {
    /// `run`: the library's defaults, and the load must be given.
    pub(crate) fn run() -> Self {
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
    pub(crate) fn compare(workload: WorkloadArg) -> anyhow::Result<Self> {
        let d = compare::bench_defaults(workload.name())?;
        Ok(Self {
            load: Some(d.load),
            duration_s: d.duration_s,
            tenants: match workload {
                WorkloadArg::MultiTenantStall => MultiTenantParams::stall().tenants,
                WorkloadArg::TieredTenants => MultiTenantParams::tiered().tenants,
                WorkloadArg::Overload => OverloadParams::default().tenants,
                _ => 48,
            },
        })
    }
}

impl SpecArgs {
    /// The spec for `workload`, flags left out taking `defaults`.
    pub(crate) fn spec(
        &self,
        workload: WorkloadArg,
        defaults: SpecDefaults,
    ) -> anyhow::Result<WorkloadSpec> {
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
            WorkloadArg::TieredTenants => {
                let base = MultiTenantParams::tiered();
                WorkloadKind::TieredTenants(MultiTenantParams {
                    tenants: self.tenants.unwrap_or(base.tenants),
                    system_words: self.tenant_system_words.unwrap_or(base.system_words),
                    zipf_s: self.zipf,
                    ..base
                })
            }
            WorkloadArg::ManyAdapters => {
                WorkloadKind::ManyAdapters(kvbench::workload::ManyAdapterParams::default())
            }
            WorkloadArg::Overload => {
                let base = OverloadParams::default();
                WorkloadKind::Overload(OverloadParams {
                    tenants: self.tenants.unwrap_or(base.tenants),
                    system_words: self.tenant_system_words.unwrap_or(base.system_words),
                    ..base
                })
            }
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
