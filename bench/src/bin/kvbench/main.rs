//! kvbench: drive a seeded OpenAI-compatible workload at a target (Envoy in front of kvsim pods) and
//! report latency, throughput, success and the pods' cache-hit ratio.
//!
//! A thin command line over `kvbench`: `run` drives one workload at a running target;
//! `compare` starts fresh pods and Envoy per load-balancing policy and runs the same seeded workload
//! through each; `matrix` runs `compare` over a matrix of workloads with every policy of the verdict; `compare-pd` runs aggregated pods against prefill/decode pools on the same number of
//! simulated GPUs (interference and agent scenarios); `overhead` measures kvroute's own cost per request
//! and memory (Envoy with the filter against the same Envoy without it); `demo` shows three requests
//! through kvroute and through round-robin; `up` runs Envoy with kvroute in the foreground in front of
//! given endpoints or simulated pods. One file per command's options and driver (`run_command`,
//! `compare_command`, `compare_pd_command`, `overhead_command`; `local_commands` for `demo`, `up`
//! and `soak`; `config_command` for `config check` and `config schema`); this one dispatches.

mod compare_command;
mod compare_pd_command;
mod config_command;
mod local_commands;
mod matrix_command;
mod overhead_command;
mod run_command;

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use kvbench::compare::{self};
use kvbench::demo::{self, DemoOptions, UpOptions};
use kvbench::table::{Align, Table};
use kvbench::{render_json, render_table, run};

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
    /// `compare` over a matrix of workloads ("cells": `--list` shows them), every policy of the
    /// verdict (kvroute, the previous version's module, round-robin, least-request, the peer
    /// routers, the bound) over several seeds: one overview table of p90 TTFT, hit ratio,
    /// prediction error and each cell's verdict.
    Matrix(Box<MatrixArgs>),
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
    /// errors by cause, p99 drift and Envoy RSS over time (soak.csv, soak.png); fails if any
    /// request was lost.
    Soak(SoakArgs),
    /// Check kvroute configurations with the plugin's own parser before deploying them
    /// (`config check FILE...`), or print their JSON Schema (`config schema`).
    Config(ConfigArgs),
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
            let prewarm = kvbench::workload::WorkloadGen::new(&spec)?.prewarm_bodies();
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
        Command::Config(args) => config_main(&args)?,
        Command::Matrix(args) => matrix_main(&args).await?,
        Command::ComparePd(args) => compare_pd_main(&args).await?,
        Command::Overhead(args) => overhead_main(&args).await?,
        Command::Soak(args) => {
            let opts = kvbench::soak::SoakOptions {
                seconds: args.seconds,
                rate: args.rate,
                pods: args.pods,
                phase_s: args.phase_seconds,
                window_s: args.window_seconds,
                time_scale: args.time_scale,
                out: args.out.clone(),
            };
            let report = kvbench::soak::soak(&opts).await?;
            let mut table = Table::new(&[
                "start_s",
                "fault",
                "requests",
                "errors",
                "p50_ms",
                "p99_ms",
                "envoy_rss_mib",
            ])
            .aligns(&[Align::Right, Align::Left]);
            for w in &report.windows {
                table.row([
                    w.start_s.to_string(),
                    w.fault.clone(),
                    w.requests.to_string(),
                    w.errors.to_string(),
                    format!("{:.0}", w.p50_ms),
                    format!("{:.0}", w.p99_ms),
                    format!("{:.1}", w.envoy_rss_mib),
                ]);
            }
            print!("{}", table.text());
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
                config: args.config.clone(),
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

pub(crate) use compare_command::*;
pub(crate) use compare_pd_command::*;
pub(crate) use config_command::*;
pub(crate) use local_commands::*;
pub(crate) use matrix_command::*;
pub(crate) use overhead_command::*;
pub(crate) use run_command::*;
