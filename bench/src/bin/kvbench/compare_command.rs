//! `kvbench compare`: the same seeded workloads through fresh pods and Envoy (or a peer router) per
//! policy, with the summary over seeds.

use std::path::PathBuf;

use clap::{ArgGroup, Args, ValueEnum};
use kvbench::compare::{self, Policy, StackOptions};
use kvbench::compare_plots::ComparePlots;
use kvbench::peers::{PeerPolicy, PeerRouter};
use kvbench::{driver, overload, summary};

use crate::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum CompareWorkload {
    MultiTenant,
    MultiTurn,
    Agent,
    SharedAgent,
    LongUnique,
    MultiTenantStall,
    UnequalPool,
    ManyAdapters,
    TieredTenants,
    /// `make bench-pd`'s interference mix on 4 aggregated pods (not part of `all`)
    Interference,
    /// Arrivals above capacity for a while, two priority classes, one tenant bursting: flow
    /// control's benchmark (`make bench-overload`, with kvroute-flow; not part of `all`)
    Overload,
    /// Every workload above but interference, in turn
    All,
}

impl CompareWorkload {
    pub(crate) fn workloads(self) -> Vec<WorkloadArg> {
        match self {
            CompareWorkload::MultiTenant => vec![WorkloadArg::MultiTenant],
            CompareWorkload::MultiTurn => vec![WorkloadArg::MultiTurn],
            CompareWorkload::Agent => vec![WorkloadArg::Agent],
            CompareWorkload::SharedAgent => vec![WorkloadArg::SharedAgent],
            CompareWorkload::LongUnique => vec![WorkloadArg::LongUnique],
            CompareWorkload::MultiTenantStall => vec![WorkloadArg::MultiTenantStall],
            CompareWorkload::UnequalPool => vec![WorkloadArg::UnequalPool],
            CompareWorkload::ManyAdapters => vec![WorkloadArg::ManyAdapters],
            CompareWorkload::TieredTenants => vec![WorkloadArg::TieredTenants],
            CompareWorkload::Interference => vec![WorkloadArg::Interference],
            CompareWorkload::Overload => vec![WorkloadArg::Overload],
            CompareWorkload::All => vec![
                WorkloadArg::MultiTenant,
                WorkloadArg::MultiTurn,
                WorkloadArg::Agent,
                WorkloadArg::SharedAgent,
                WorkloadArg::LongUnique,
                WorkloadArg::MultiTenantStall,
                WorkloadArg::UnequalPool,
                WorkloadArg::ManyAdapters,
                WorkloadArg::TieredTenants,
            ],
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum PolicyArg {
    Kvroute,
    /// kvroute with flow control on (requests wait at the gateway while every pod is full)
    KvrouteFlow,
    /// kvroute with the previous version's module (--previous-wasm; `make previous-module`)
    KvroutePrevious,
    /// kvroute with the workload's own signal off (many-adapters: adapter loads not priced)
    KvrouteWithoutSignal,
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

pub(crate) fn peer(router: PeerRouter, cache_aware: bool) -> Policy {
    Policy::Peer(PeerPolicy::new(router, cache_aware))
}

impl From<PolicyArg> for Policy {
    fn from(p: PolicyArg) -> Self {
        match p {
            PolicyArg::Kvroute => Policy::Kvroute,
            PolicyArg::KvrouteFlow => Policy::KvrouteFlow,
            PolicyArg::KvroutePrevious => Policy::KvroutePrevious,
            PolicyArg::KvrouteWithoutSignal => Policy::KvrouteWithoutSignal,
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
pub(crate) struct CompareArgs {
    /// Policies to compare, in this order. The verdict judges kvroute against round-robin, the
    /// peer routers' cache-aware policies, kvroute-previous and perfect-knowledge-total (those not
    /// run are "not measured"), and least-request where it ran
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["kvroute", "round-robin", "least-request", "perfect-knowledge-total"])]
    pub(crate) policies: Vec<PolicyArg>,
    /// The module kvroute-previous runs [default: target/previous/<commit>/kvroute.wasm, the
    /// commit pinned in bench/previous-version, which `make previous-module` builds]
    #[arg(long, value_name = "PATH")]
    pub(crate) previous_wasm: Option<PathBuf>,
    /// How often kvroute (and kvroute-previous) polls the pods, wall-clock ms; pods are stale
    /// after ten polls missed
    #[arg(long, default_value_t = compare::BENCH_POLL_INTERVAL_MS)]
    pub(crate) poll_interval_ms: u64,
    /// A JSON object whose top-level keys are set in kvroute's configuration (every kvroute
    /// policy), after the workload's own (overload: `{"overload_guard": {"max_running": 8}}`),
    /// e.g. '{"overload_guard": {}}' to leave the seat cap unset
    #[arg(long, value_name = "JSON")]
    pub(crate) kvroute_config: Option<String>,
    /// Empty every pod's prefix cache (POST /sim/reset) this many simulated seconds into each run
    /// (warm-up included); each run's text and JSON then give the hit ratio of the requests
    /// started in every 10 s window and how long it took to come back within 0.05 of its level
    /// before the reset
    #[arg(long, value_name = "SECONDS")]
    pub(crate) reset_caches_at: Option<f64>,
    /// The cache reset is a restart of every pod (POST /sim/restart: a later
    /// process_start_time_seconds, the cache emptied), not vLLM's reset_prefix_cache
    #[arg(long, requires = "reset_caches_at")]
    pub(crate) reset_as_restart: bool,
    /// Reset (or restart) only the first N pods, not every one (one pod's crash, not the pool's)
    #[arg(long, value_name = "N", requires = "reset_caches_at")]
    pub(crate) reset_pods: Option<usize>,
    /// A policy that fails to start or run is reported and left out (its checks "not measured")
    /// instead of ending the comparison
    #[arg(long)]
    pub(crate) keep_going: bool,
    /// Simulated pods (fresh ones for every policy) [default: the workload's; with several kvsim
    /// processes, this sets the first one's]
    #[arg(long)]
    pub(crate) pods: Option<usize>,
    /// Seeds to run every workload with: --seed, --seed + 1, …; with more than one, a summary of
    /// medians and spreads and a verdict per workload follow
    #[arg(long, default_value_t = 1)]
    pub(crate) seeds: u64,
    /// Extra kvsim arguments, space-separated, e.g. "--num-gpu-blocks 2048"
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub(crate) sim_args: String,
    /// The simulator's time scale (0.05 = 20× faster than real); figures are reported in simulated time
    #[arg(long, default_value_t = 0.05)]
    pub(crate) time_scale: f64,
    /// Workloads to run, in this order (comma-separated; `all` = every one but interference)
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "multi-tenant"
    )]
    pub(crate) workload: Vec<CompareWorkload>,
    /// Simulated seconds at the start of the run that are sent but not measured (the pods start
    /// with empty caches); 0 = measure everything [default: the workload's, 30 or 60]
    #[arg(long)]
    pub(crate) warmup: Option<f64>,
    /// Gateways in front of the same pods, each an Envoy with the policy and nothing shared but the
    /// pods; request N goes to gateway N mod this (Envoy policies only). Several counts
    /// (`1,2`) run every policy once per count, on the same seeds; rows with more than one gateway
    /// are labelled `<policy> ×N`
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub(crate) replicas: Vec<usize>,
    /// With several kvroute replicas, do not let them exchange placements (`peers`): each knows
    /// only what it routed itself
    #[arg(long)]
    pub(crate) no_replica_sync: bool,
    /// A diagnostic: before each kvroute request, ask every simulated pod for its own estimate of
    /// the request's first token (as the perfect-knowledge bound does), then let kvroute choose;
    /// each kvroute run's text then says how often it chose the earliest pod and how much later
    /// its choices were (regret). The probing happens before the request's clock starts
    #[arg(long)]
    pub(crate) shadow_probe: bool,
    /// Write DIR/<workload>.json (reports) and DIR/<workload>.txt (table and ratios); with several
    /// seeds DIR/<workload>-seed<N>.{json,txt} and DIR/<workload>-summary.{json,txt}; and the
    /// pictures: DIR/<workload>-ttft-cdf.png, DIR/hit-ratio.png and, with several --replicas,
    /// DIR/<workload>-replicas.png
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) spec: SpecArgs,
}

/// One workload (or matrix cell) of a comparison, over every seed.
pub(crate) struct CaseResult {
    /// The workload's name, or the cell's.
    pub(crate) name: String,
    pub(crate) summaries: Vec<summary::PolicySummary>,
    pub(crate) verdict: summary::Verdict,
    /// Policies that failed (with --keep-going), per seed: (seed, label, why).
    pub(crate) failed: Vec<(u64, String, String)>,
}

pub(crate) async fn compare_main(args: &CompareArgs) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let results = compare_cases(args, None).await?;
    let seeds = args.seeds;
    if results.len() > 1 {
        println!();
        println!("== verdicts ({seeds} seeds each) ==");
        for r in &results {
            println!("{}", summary::verdict_line(&r.verdict));
        }
    }
    let overview: Vec<(String, Vec<summary::PolicySummary>)> = results
        .iter()
        .map(|r| (r.name.clone(), r.summaries.clone()))
        .collect();
    if let Some(dir) = &args.out {
        ComparePlots::new().overview(dir, &overview);
    }
    let policies: Vec<Policy> = args.policies.iter().map(|&p| p.into()).collect();
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

/// Runs every workload of `args` over every seed and policy, printing each run's table and each
/// workload's summary and verdict (and writing them under `--out`); returns the workloads'
/// results. `name`: what the verdict and files are called instead of the workload's name (a
/// matrix cell's).
pub(crate) async fn compare_cases(
    args: &CompareArgs,
    name: Option<&str>,
) -> anyhow::Result<Vec<CaseResult>> {
    anyhow::ensure!(
        args.time_scale.is_finite() && args.time_scale > 0.0,
        "time scale must be > 0"
    );
    anyhow::ensure!(args.seeds >= 1, "--seeds must be at least 1");
    anyhow::ensure!(
        !args.replicas.is_empty() && args.replicas.iter().all(|&n| n >= 1),
        "--replicas must be at least 1"
    );
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
        let mut plugin_extra = compare::bench_plugin_extra_polling(args.poll_interval_ms);
        compare::merge_top_level(&mut plugin_extra, &defaults.plugin_extra);
        if let Some(text) = &args.kvroute_config {
            let v: serde_json::Value =
                serde_json::from_str(text).map_err(|e| anyhow::anyhow!("--kvroute-config: {e}"))?;
            anyhow::ensure!(v.is_object(), "--kvroute-config must be a JSON object");
            compare::merge_top_level(&mut plugin_extra, &v);
        }
        let mut groups = defaults.groups;
        if let (Some(n), Some(first)) = (args.pods, groups.first_mut()) {
            first.pods = n;
        }
        anyhow::ensure!(groups.iter().all(|g| g.pods >= 1), "--pods must be >= 1");
        cases.push((w, spec, warmup, groups, plugin_extra, defaults.signal_off));
    }
    let policies: Vec<Policy> = args.policies.iter().map(|&p| p.into()).collect();
    anyhow::ensure!(!policies.is_empty(), "no policies given");
    let seeds: Vec<u64> = (0..args.seeds).map(|i| args.spec.seed + i).collect();
    if policies.contains(&Policy::KvroutePrevious) && !args.keep_going {
        // Fail before the first run rather than after the others of the first seed.
        compare::resolve_previous_wasm(args.previous_wasm.as_deref())?;
    }
    if let Some(at) = args.reset_caches_at {
        for (w, spec, ..) in &cases {
            anyhow::ensure!(
                at.is_finite() && at > 0.0 && at < spec.duration_s,
                "{}: --reset-caches-at ({at} s) must fall inside the run (0–{} s)",
                w.name(),
                spec.duration_s
            );
        }
    }
    let extra = compare::CompareOptions {
        pod_reset: args.reset_caches_at.map(|at_s| driver::PodReset {
            at_s,
            restart: args.reset_as_restart,
            pods: args.reset_pods,
        }),
        keep_going: args.keep_going,
    };
    let plots = args.out.as_ref().map(|_| ComparePlots::new());
    let mut results = Vec::new();
    for (w, spec, warmup, groups, plugin_extra, signal_off) in &cases {
        let case = name.unwrap_or(w.name());
        // A workload about one signal runs kvroute without it too, beside kvroute, in the same run.
        let mut policies = policies.clone();
        if !signal_off.is_null() && !policies.contains(&Policy::KvrouteWithoutSignal) {
            if let Some(at) = policies.iter().position(|p| *p == Policy::Kvroute) {
                policies.insert(at + 1, Policy::KvrouteWithoutSignal);
            }
        }
        let opts = StackOptions {
            groups: groups.clone(),
            sim_args: split_args(&args.sim_args),
            time_scale: args.time_scale,
            plugin_extra: plugin_extra.clone(),
            signal_off: signal_off.clone(),
            current_module_extra: compare::time_scaled_extra(w.name(), args.time_scale),
            previous_wasm: args.previous_wasm.clone(),
            replica_sync: !args.no_replica_sync,
            shadow_probe: args.shadow_probe,
            ..StackOptions::default()
        };
        let mut pool = compare::describe_groups(groups);
        if !args.sim_args.trim().is_empty() {
            pool = format!("{pool}; every pod also: {}", args.sim_args.trim());
        }
        if args.poll_interval_ms != compare::BENCH_POLL_INTERVAL_MS {
            pool = format!("{pool}; kvroute polls every {} ms", args.poll_interval_ms);
        }
        if let Some(guard) = plugin_extra.get("overload_guard") {
            pool = format!("{pool}; kvroute's overload_guard {guard}");
        }
        if let Some(extra) = &args.kvroute_config {
            pool = format!("{pool}; kvroute config {extra}");
        }
        let mut runs = Vec::new();
        let mut failed = Vec::new();
        for &seed in &seeds {
            let mut spec = spec.clone();
            spec.seed = seed;
            let mut rows = Vec::new();
            for &replicas in &args.replicas {
                let opts = StackOptions {
                    replicas,
                    ..opts.clone()
                };
                let compared =
                    compare::compare_with(&policies, &spec, &opts, *warmup, &extra).await?;
                rows.extend(compared.rows);
                failed.extend(compared.failed.into_iter().map(|(l, e)| (seed, l, e)));
            }
            println!();
            println!("pool: {pool}");
            print!("{}", compare::render_text(&rows, *warmup));
            for (s, label, why) in failed.iter().filter(|f| f.0 == seed) {
                println!("{label} FAILED on seed {s}: {why}");
            }
            if let Some(dir) = &args.out {
                let stem = if seeds.len() == 1 {
                    case.to_owned()
                } else {
                    format!("{case}-seed{seed}")
                };
                compare::write_outputs(dir, &stem, &rows, *warmup)?;
                eprintln!("wrote {0}/{1}.json and {0}/{1}.txt", dir.display(), stem);
            }
            runs.push(rows);
        }
        let summaries = summary::summarize(&runs);
        // The overload workload is judged by flow control's figures, not by routing's.
        let overload = overload::summarize(&runs);
        let verdict = if *w == WorkloadArg::Overload {
            overload::verdict(case, &runs)
        } else {
            summary::verdict(case, &runs, &summaries)
        };
        let mut text = format!(
            "pool: {pool}\n{}",
            summary::render_summary(case, &summaries, &verdict)
        );
        if !overload.is_empty() {
            text.push_str(&overload::render_summary(&overload));
        }
        for (seed, label, why) in &failed {
            text.push_str(&format!("{label} FAILED on seed {seed}: {why}\n"));
        }
        println!();
        print!("{text}");
        if let Some(dir) = &args.out {
            std::fs::create_dir_all(dir)?;
            let stem = format!("{case}-summary");
            let doc = serde_json::json!({
                "workload": w.name(),
                "name": case,
                "pool": groups,
                "sim_args": args.sim_args.trim(),
                "poll_interval_ms": args.poll_interval_ms,
                "kvroute_config": plugin_extra,
                "reset_caches_at_s": args.reset_caches_at,
                "reset_as_restart": args.reset_as_restart,
                "reset_pods": args.reset_pods,
                "seeds": seeds,
                "warmup_s": warmup,
                "policies": summaries,
                "verdict": verdict,
                "overload": overload,
                "failed": failed,
            });
            std::fs::write(
                dir.join(format!("{stem}.json")),
                serde_json::to_string_pretty(&doc)? + "\n",
            )?;
            std::fs::write(dir.join(format!("{stem}.txt")), &text)?;
            eprintln!("wrote {0}/{1}.json and {0}/{1}.txt", dir.display(), stem);
            if let Some(plots) = &plots {
                plots.workload(dir, case, &runs, &summaries);
            }
        }
        results.push(CaseResult {
            name: case.to_owned(),
            summaries,
            verdict,
            failed,
        });
    }
    Ok(results)
}
