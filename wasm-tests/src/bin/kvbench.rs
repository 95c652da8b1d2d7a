//! kvbench: drive a seeded OpenAI-compatible workload at a target (Envoy in front of kvsim pods) and
//! report latency, throughput, success and the pods' cache-hit ratio.
//!
//! A thin command line over `wasm_tests::bench`, so the same runs can be made by hand or from the
//! orchestration that compares load-balancing policies.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
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
    // `compare` (start pods and Envoy once per load-balancing policy, run the same spec against
    // each, print one table) belongs to the orchestration and is added here by its owner.
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
    /// Open loop: Poisson arrivals per simulated second
    #[arg(long)]
    rate: Option<f64>,
    /// Closed loop: requests kept in flight
    #[arg(long)]
    concurrency: Option<usize>,
    /// Simulated seconds during which requests are started
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Stop after this many requests
    #[arg(long)]
    requests: Option<usize>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The simulator's time scale (0.05 = 20× faster than real); figures are reported in simulated time
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Also write the report as JSON (an array of labelled reports) to this file
    #[arg(long)]
    json: Option<PathBuf>,
    /// Include per-request records in the JSON
    #[arg(long)]
    records: bool,
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// Row label in the table and JSON (default: the workload name)
    #[arg(long)]
    label: Option<String>,
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

    /// multi-tenant: number of tenants
    #[arg(long, default_value_t = MultiTenantParams::default().tenants)]
    tenants: usize,
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

impl RunArgs {
    fn spec(&self) -> anyhow::Result<WorkloadSpec> {
        let workload = match self.workload {
            WorkloadArg::MultiTenant => WorkloadKind::MultiTenant(MultiTenantParams {
                tenants: self.tenants,
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
        let load = match (self.rate, self.concurrency) {
            (Some(rate), _) => Load::Open { rate },
            (None, Some(concurrency)) => Load::Closed { concurrency },
            (None, None) => anyhow::bail!("give --rate or --concurrency"),
        };
        let mut spec = WorkloadSpec::new(workload, load);
        spec.seed = self.seed;
        spec.duration_s = self.duration;
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
            let spec = args.spec()?;
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
    }
    Ok(())
}
