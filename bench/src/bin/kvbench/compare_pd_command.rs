//! `kvbench compare-pd`: aggregated pods against prefill/decode pools on the same simulated GPUs.

use std::path::PathBuf;

use anyhow::Context;
use clap::{ArgGroup, Args, ValueEnum};
use kvbench::compare::{self};
use kvbench::compare_pd::{self, PdMode, PdStackOptions, Scenario};
use kvbench::{AgentParams, InterferenceParams, Load, WorkloadKind};

use crate::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PdScenarioArg {
    /// Long-prompt arrivals among many streaming decodes: P99 ITL of the streams
    Interference,
    /// The 45:1 agent workload at a load that saturates the aggregated pods: TTFT and throughput
    Agent,
    /// Both in turn
    All,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum PdModeArg {
    Sidecar,
    Inline,
}

/// `A/P+D`: A aggregated pods against P prefill + D decode pods.
pub(crate) fn parse_gpus(s: &str) -> Result<(usize, usize, usize), String> {
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
pub(crate) struct ComparePdArgs {
    #[arg(long, value_enum, default_value = "all")]
    pub(crate) scenario: PdScenarioArg,
    /// P/D modes to run (one P/D row each)
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["sidecar", "inline"])]
    pub(crate) modes: Vec<PdModeArg>,
    /// The simulator's time scale (0.05 = 20× faster than real); figures are reported in simulated time
    #[arg(long, default_value_t = 0.05)]
    pub(crate) time_scale: f64,
    /// kvsim arguments for every pod of every topology, space-separated
    #[arg(long, default_value = compare_pd::DEFAULT_SIM_ARGS, allow_hyphen_values = true)]
    pub(crate) sim_args: String,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Include per-request records in the JSON
    #[arg(long)]
    pub(crate) records: bool,
    /// kvroute configuration fields (JSON object) merged into the benchmark's, for every topology,
    /// e.g. '{"debug_header": true}'
    #[arg(long, value_name = "JSON")]
    pub(crate) plugin_extra: Option<String>,
    /// Write DIR/pd-<scenario>.json and DIR/pd-<scenario>.txt
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,

    /// interference: aggregated pods / prefill + decode pods
    #[arg(long, default_value = "4/2+2", value_parser = parse_gpus)]
    pub(crate) interference_gpus: (usize, usize, usize),
    /// interference: Poisson arrivals per simulated second (streams and long prompts together)
    #[arg(long, default_value_t = compare_pd::INTERFERENCE_RATE)]
    pub(crate) interference_rate: f64,
    /// interference: share of the arrivals that are long prompts
    #[arg(long, default_value_t = InterferenceParams::default().long_share)]
    pub(crate) long_share: f64,
    /// interference: words of a long prompt, MIN-MAX
    #[arg(long, default_value = "6000-10000", value_parser = parse_range)]
    pub(crate) long_prompt_words: (usize, usize),
    /// interference: output tokens of a stream, MIN-MAX
    #[arg(long, default_value = "400-800", value_parser = parse_range)]
    pub(crate) stream_tokens: (usize, usize),
    /// interference: simulated seconds of arrivals
    #[arg(long, default_value_t = compare_pd::INTERFERENCE_DURATION)]
    pub(crate) interference_duration: f64,
    /// interference: simulated seconds sent but not measured (the streams ramp up)
    #[arg(long, default_value_t = compare_pd::INTERFERENCE_WARMUP)]
    pub(crate) interference_warmup: f64,

    /// agent: aggregated pods / prefill + decode pods
    #[arg(long, default_value = "3/2+1", value_parser = parse_gpus)]
    pub(crate) agent_gpus: (usize, usize, usize),
    /// agent: open loop, Poisson arrivals per simulated second
    #[arg(long)]
    pub(crate) agent_rate: Option<f64>,
    /// agent: closed loop, requests kept in flight [default: 24, closed loop]
    #[arg(long)]
    pub(crate) agent_concurrency: Option<usize>,
    /// agent: sessions in progress at once
    #[arg(long, default_value_t = compare_pd::AGENT_SESSIONS)]
    pub(crate) agent_sessions: usize,
    /// agent: simulated seconds during which requests are started
    #[arg(long, default_value_t = compare_pd::AGENT_DURATION)]
    pub(crate) agent_duration: f64,
    /// agent: simulated seconds sent but not measured (cold caches)
    #[arg(long, default_value_t = compare_pd::AGENT_WARMUP)]
    pub(crate) agent_warmup: f64,
    /// Leave out the round-robin P/D baselines (a plain Envoy; the client round-robins prefill and
    /// decode pods, splitting every request, or only prompts over 512 words)
    #[arg(long)]
    pub(crate) no_baselines: bool,
    /// Leave out the elastic P/D rows (as many `both` pods as the split has, one pool)
    #[arg(long)]
    pub(crate) no_elastic: bool,
    /// agent: leave out the control row (the aggregated pods with kvroute's prefix scorer weighted
    /// 6 against 1 per load scorer)
    #[arg(long)]
    pub(crate) no_control: bool,
}

/// `MIN-MAX` (or a single number).
pub(crate) fn parse_range(s: &str) -> Result<(usize, usize), String> {
    let err = || format!("{s:?} is not MIN-MAX");
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let a: usize = a.trim().parse().map_err(|_| err())?;
    let b: usize = b.trim().parse().map_err(|_| err())?;
    if a > b {
        return Err(err());
    }
    Ok((a, b))
}

pub(crate) fn pd_scenarios(args: &ComparePdArgs) -> anyhow::Result<Vec<Scenario>> {
    let modes: Vec<PdMode> = args
        .modes
        .iter()
        .map(|m| match m {
            PdModeArg::Sidecar => PdMode::Sidecar,
            PdModeArg::Inline => PdMode::Inline,
        })
        .collect();
    anyhow::ensure!(!modes.is_empty(), "no P/D modes given");
    let setups =
        |(a, p, d): (usize, usize, usize)| compare_pd::setups(a, p, d, &modes, !args.no_elastic);
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

pub(crate) async fn compare_pd_main(args: &ComparePdArgs) -> anyhow::Result<()> {
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
