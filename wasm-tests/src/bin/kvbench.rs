//! kvbench: drive a seeded OpenAI-compatible workload at a target (Envoy in front of kvsim pods) and
//! report latency, throughput, success and the pods' cache-hit ratio.
//!
//! A thin command line over `wasm_tests::bench`: `run` drives one workload at a running target;
//! `compare` starts fresh pods and Envoy per load-balancing policy and runs the same seeded workload
//! through each; `demo` shows three requests through kvroute and through round-robin; `up` runs
//! Envoy with kvroute in the foreground in front of given endpoints or simulated pods.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use wasm_tests::bench::compare::{self, Policy, StackOptions};
use wasm_tests::bench::demo::{self, DemoOptions, UpOptions};
use wasm_tests::bench::{
    render_json, render_table, run, AgentParams, Api, Load, MultiTenantParams, MultiTurnParams,
    WorkloadKind, WorkloadSpec,
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
    /// Three chat requests through kvroute, then through round-robin: watch the prefix cache.
    Demo(DemoArgs),
    /// Run Envoy with kvroute in the foreground (until Ctrl-C) in front of endpoints or simulated pods.
    Up(UpArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum WorkloadArg {
    MultiTenant,
    MultiTurn,
    Agent,
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
    /// Pods whose /metrics are scraped for the cache-hit ratio: ip:port,ip:port
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

    /// multi-tenant: number of tenants [default: 8; compare: 32]
    #[arg(long)]
    tenants: Option<usize>,
    /// multi-tenant: words per tenant system prompt
    #[arg(long, default_value_t = MultiTenantParams::default().system_words)]
    tenant_system_words: usize,
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
    /// Open-loop rate without `--rate`/`--concurrency` (`None`: one of them is required).
    rate: Option<f64>,
    duration_s: f64,
    tenants: usize,
}

impl SpecDefaults {
    /// `run`: the library's defaults, and the load must be given.
    fn run() -> Self {
        Self {
            rate: None,
            duration_s: 60.0,
            tenants: MultiTenantParams::default().tenants,
        }
    }

    /// `compare` (what `make bench` runs). Multi-tenant: 32 tenants × 3,000 words = 96,000 prompt
    /// tokens, more than one simulated pod's KV cache (4,096 blocks × 16 = 65,536 tokens) but a
    /// quarter of it per pod when each tenant stays on one pod (with 8 tenants every pod caches every
    /// prompt and round-robin loses nothing after its first 32 requests). At 5 requests/s round-robin
    /// recomputes ~40% of the prompt tokens and queues (p90 TTFT 3–4 s) while kvroute serves ~96% from
    /// cache; multi-turn and agent rates are chosen the same way. 300 s of which the first 60 s
    /// (the cold start) are not measured: under 20 s of wall time per policy at time scale 0.05.
    fn compare(workload: WorkloadArg) -> Self {
        let rate = match workload {
            WorkloadArg::MultiTenant => 5.0,
            WorkloadArg::MultiTurn => 5.0,
            WorkloadArg::Agent => 1.0,
        };
        Self {
            rate: Some(rate),
            duration_s: 300.0,
            tenants: 32,
        }
    }
}

impl SpecArgs {
    /// The spec for `workload`, flags left out taking `defaults`.
    fn spec(&self, workload: WorkloadArg, defaults: SpecDefaults) -> anyhow::Result<WorkloadSpec> {
        let workload = match workload {
            WorkloadArg::MultiTenant => WorkloadKind::MultiTenant(MultiTenantParams {
                tenants: self.tenants.unwrap_or(defaults.tenants),
                system_words: self.tenant_system_words,
                zipf_s: self.zipf,
                ..MultiTenantParams::default()
            }),
            WorkloadArg::MultiTurn => WorkloadKind::MultiTurn(MultiTurnParams {
                conversations: self.conversations,
                turns: self.turns,
                system_words: self.conversation_system_words,
                stagger: !self.no_stagger,
                ..MultiTurnParams::default()
            }),
            WorkloadArg::Agent => WorkloadKind::Agent(AgentParams {
                sessions: self.agent_sessions,
                steps: self.agent_steps,
                preamble_words: self.agent_preamble_words,
                context_words: self.agent_context_words,
                stagger: !self.no_stagger,
                ..AgentParams::default()
            }),
        };
        let load = match (self.rate, self.concurrency, defaults.rate) {
            (Some(rate), _, _) => Load::Open { rate },
            (None, Some(concurrency), _) => Load::Closed { concurrency },
            (None, None, Some(rate)) => Load::Open { rate },
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
    /// The three workloads in turn
    All,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PolicyArg {
    Kvroute,
    RoundRobin,
    LeastRequest,
}

impl From<PolicyArg> for Policy {
    fn from(p: PolicyArg) -> Self {
        match p {
            PolicyArg::Kvroute => Policy::Kvroute,
            PolicyArg::RoundRobin => Policy::RoundRobin,
            PolicyArg::LeastRequest => Policy::LeastRequest,
        }
    }
}

/// Durations and rates are in simulated seconds (wall = simulated × time scale). Without `--rate` or
/// `--concurrency`, each workload runs open loop at its default rate: multi-tenant 5/s, multi-turn
/// 5/s, agent 1/s.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("load").args(["rate", "concurrency"])))]
struct CompareArgs {
    /// Policies to compare, in this order
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["kvroute", "round-robin", "least-request"])]
    policies: Vec<PolicyArg>,
    /// Simulated pods (fresh ones for every policy)
    #[arg(long, default_value_t = 4)]
    pods: usize,
    /// Extra kvsim arguments, space-separated, e.g. "--num-gpu-blocks 2048"
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    sim_args: String,
    /// The simulator's time scale (0.05 = 20× faster than real); figures are reported in simulated time
    #[arg(long, default_value_t = 0.05)]
    time_scale: f64,
    #[arg(long, value_enum, default_value = "multi-tenant")]
    workload: CompareWorkload,
    /// Simulated seconds at the start of the run that are sent but not measured (the pods start
    /// with empty caches); 0 = measure everything
    #[arg(long, default_value_t = 60.0)]
    warmup: f64,
    /// Write DIR/<workload>.json (reports) and DIR/<workload>.txt (table and ratios)
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    #[command(flatten)]
    spec: SpecArgs,
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
}

fn split_args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

#[tokio::main]
async fn main() -> ExitCode {
    match real_main(Cli::parse()).await {
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
            };
            demo::up(&opts).await?;
        }
    }
    Ok(())
}

async fn compare_main(args: &CompareArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.time_scale.is_finite() && args.time_scale > 0.0,
        "time scale must be > 0"
    );
    let workloads: Vec<WorkloadArg> = match args.workload {
        CompareWorkload::MultiTenant => vec![WorkloadArg::MultiTenant],
        CompareWorkload::MultiTurn => vec![WorkloadArg::MultiTurn],
        CompareWorkload::Agent => vec![WorkloadArg::Agent],
        CompareWorkload::All => vec![
            WorkloadArg::MultiTenant,
            WorkloadArg::MultiTurn,
            WorkloadArg::Agent,
        ],
    };
    // Validate every spec before starting anything.
    let specs = workloads
        .iter()
        .map(|&w| args.spec.spec(w, SpecDefaults::compare(w)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for spec in &specs {
        anyhow::ensure!(
            args.warmup.is_finite() && args.warmup >= 0.0 && args.warmup < spec.duration_s,
            "--warmup ({} s) must be >= 0 and shorter than --duration ({} s)",
            args.warmup,
            spec.duration_s
        );
    }
    let policies: Vec<Policy> = args.policies.iter().map(|&p| p.into()).collect();
    anyhow::ensure!(!policies.is_empty(), "no policies given");
    let opts = StackOptions {
        pods: args.pods,
        sim_args: split_args(&args.sim_args),
        time_scale: args.time_scale,
        ..StackOptions::default()
    };
    for spec in &specs {
        let rows = compare::compare(&policies, spec, &opts, args.warmup).await?;
        println!();
        print!("{}", compare::render_text(&rows, args.warmup));
        if let Some(dir) = &args.out {
            compare::write_outputs(dir, spec.workload.name(), &rows, args.warmup)?;
            eprintln!(
                "wrote {0}/{1}.json and {0}/{1}.txt",
                dir.display(),
                spec.workload.name()
            );
        }
    }
    Ok(())
}
