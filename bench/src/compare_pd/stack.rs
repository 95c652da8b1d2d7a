//! One row's stack: fresh simulated pods for a topology (one `kvsim` process per role) and a fresh
//! Envoy in front of them, with kvroute configured for both pools where the row uses it, started
//! and waited on until kvroute sees every pod healthy. Dropping the stack stops Envoy, then the
//! pods, so no row inherits another's warm caches.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::topology::Topology;
use crate::compare::{
    bench_plugin_extra, check_envoy_installed, wait_kvroute_healthy, StackOptions,
};
use harness::{self, plugin_config, Envoy, EnvoyOptions, Lb, Sim};

/// How the stacks of a comparison are started.
#[derive(Clone, Debug)]
pub struct PdStackOptions {
    /// `kvsim` arguments given to every pod of every topology (`--time-scale` and `--role` are added).
    pub sim_args: Vec<String>,
    pub time_scale: f64,
    /// Merged into the plugin configuration (after the pools and `pd`).
    pub plugin_extra: Value,
    /// Envoy worker threads.
    pub workers: usize,
    pub ready_timeout: Duration,
}

impl Default for PdStackOptions {
    fn default() -> Self {
        Self {
            sim_args: Vec::new(),
            time_scale: 1.0,
            plugin_extra: bench_plugin_extra(),
            workers: 2,
            ready_timeout: Duration::from_secs(30),
        }
    }
}

/// Envoy with kvroute in front of one topology's simulated pods. Dropping it kills Envoy, then the
/// simulators.
pub struct PdStack {
    pub envoy: Envoy,
    pub sims: Vec<Sim>,
    /// The pods in Envoy's pool cluster (aggregated or decode pods).
    pub pool: Vec<String>,
    /// The prefill pods (empty when aggregated).
    pub prefill: Vec<String>,
    pub topology: Topology,
}

impl PdStack {
    /// Starts fresh pods for `topology` and Envoy with kvroute (`opts.plugin_extra`, then
    /// `row_extra`, merged into its configuration), and waits until kvroute sees every pod (both
    /// pools) healthy.
    pub async fn start(
        topology: Topology,
        opts: &PdStackOptions,
        row_extra: &Value,
    ) -> Result<PdStack> {
        check_envoy_installed()?;
        let scale = opts.time_scale.to_string();
        let sim = |n: usize, role: &str| -> Result<Sim> {
            let mut args: Vec<&str> = vec!["--time-scale", &scale, "--role", role];
            args.extend(opts.sim_args.iter().map(String::as_str));
            Sim::start(n, &args).with_context(|| format!("starting {n} {role} pods (kvsim)"))
        };
        if let Topology::RoundRobinPd {
            prefill, decode, ..
        } = topology
        {
            anyhow::ensure!(
                prefill >= 1 && decode >= 1,
                "need at least one prefill and one decode pod"
            );
            let p = sim(prefill, "prefill")?;
            let d = sim(decode, "decode")?;
            // Both pools in Envoy's cluster: override_host only picks hosts the cluster has.
            let hosts: Vec<String> = p.pods.iter().chain(&d.pods).cloned().collect();
            let mut eo = EnvoyOptions::new(&hosts, Lb::OverrideHost, None);
            eo.concurrency = opts.workers;
            let envoy = Envoy::start(&eo)
                .await
                .with_context(|| format!("starting Envoy for {}", topology.label()))?;
            let (pool, pre) = (d.pods.clone(), p.pods.clone());
            return Ok(PdStack {
                envoy,
                sims: vec![p, d],
                pool,
                prefill: pre,
                topology,
            });
        }
        if let Topology::AggregatedRoundRobin { pods } = topology {
            anyhow::ensure!(pods >= 1, "need at least one pod");
            let s = sim(pods, "aggregated")?;
            let mut eo = EnvoyOptions::new(&s.pods, Lb::RoundRobin, None);
            eo.concurrency = opts.workers;
            let envoy = Envoy::start(&eo)
                .await
                .with_context(|| format!("starting Envoy for {}", topology.label()))?;
            let pool = s.pods.clone();
            return Ok(PdStack {
                envoy,
                sims: vec![s],
                pool,
                prefill: Vec::new(),
                topology,
            });
        }
        harness::wasm_path()?;
        let (sims, pool, prefill, mut extra) = match topology {
            Topology::Aggregated { pods } => {
                anyhow::ensure!(pods >= 1, "need at least one pod");
                let s = sim(pods, "aggregated")?;
                let pool = s.pods.clone();
                (vec![s], pool, Vec::new(), serde_json::Map::new())
            }
            Topology::Disaggregated {
                prefill,
                decode,
                mode,
            } => {
                anyhow::ensure!(
                    prefill >= 1 && decode >= 1,
                    "need at least one prefill and one decode pod"
                );
                let p = sim(prefill, "prefill")?;
                let d = sim(decode, "decode")?;
                let mut extra = serde_json::Map::new();
                extra.insert(
                    "pools".to_owned(),
                    json!([
                        {"name": "prefill", "role": "prefill", "endpoints": p.pods},
                        {"name": "decode", "role": "decode", "endpoints": d.pods}
                    ]),
                );
                extra.insert("pd".to_owned(), json!({"mode": mode.as_str()}));
                let (pool, pre) = (d.pods.clone(), p.pods.clone());
                (vec![p, d], pool, pre, extra)
            }
            Topology::Elastic { pods, mode } => {
                anyhow::ensure!(pods >= 2, "an elastic pool needs at least two pods");
                let s = sim(pods, "both")?;
                let mut extra = serde_json::Map::new();
                extra.insert(
                    "pools".to_owned(),
                    json!([{"name": "elastic", "role": "both", "endpoints": s.pods}]),
                );
                extra.insert("pd".to_owned(), json!({"mode": mode.as_str()}));
                let pool = s.pods.clone();
                (vec![s], pool, Vec::new(), extra)
            }
            Topology::RoundRobinPd { .. } | Topology::AggregatedRoundRobin { .. } => {
                bail!("handled above")
            }
        };
        for more in [&opts.plugin_extra, row_extra] {
            let Value::Object(more) = more.clone() else {
                continue;
            };
            for (k, v) in more {
                // Objects (`pd`, `weights`) are merged field by field; `pd` only matters with P/D.
                match (extra.get_mut(&k), v) {
                    (Some(Value::Object(base)), Value::Object(v)) => base.extend(v),
                    (_, v) if k == "pd" && topology.is_aggregated() => drop(v),
                    (_, v) => {
                        extra.insert(k, v);
                    }
                }
            }
        }
        let config = plugin_config(&pool, Value::Object(extra));
        let mut eo = EnvoyOptions::new(&pool, Lb::OverrideHost, Some(config));
        eo.concurrency = opts.workers;
        let envoy = Envoy::start(&eo)
            .await
            .with_context(|| format!("starting Envoy for {}", topology.label()))?;
        let stack = PdStack {
            envoy,
            sims,
            pool,
            prefill,
            topology,
        };
        let ready = StackOptions {
            ready_timeout: opts.ready_timeout,
            require_healthy: true,
            ..StackOptions::default()
        };
        wait_kvroute_healthy(&stack.envoy, topology.gpus() as u64, &ready).await?;
        Ok(stack)
    }

    /// Every pod: the prefill pods, then the pool's.
    pub fn all_pods(&self) -> Vec<String> {
        self.prefill.iter().chain(&self.pool).cloned().collect()
    }

    pub fn url(&self) -> String {
        self.envoy.url("")
    }
}
