//! kvbench: seeded workloads and the benchmark driver.
//!
//! The benchmark's question is how a load-balancing policy changes what users see (TTFT, ITL,
//! throughput, failures) and what the cluster spends (prefill the prefix cache did not save). So one
//! run = one seeded workload ([`workload`]) offered to one target URL — an Envoy in front of simulated
//! pods — by [`driver`], whose per-request measurements plus the pods' own prefix-cache counters
//! ([`metrics`], scraped before and after) become a [`RunReport`] ([`report`]). The orchestration
//! that starts pods and Envoy with each policy calls [`run`] once per policy with the same spec and
//! prints [`render_table`] over the labelled reports.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use kvbench::{render_table, run, Load, WorkloadKind, WorkloadSpec};
//! let mut spec = WorkloadSpec::new(WorkloadKind::from_name("multi-tenant")?, Load::Open { rate: 2.0 });
//! spec.duration_s = 120.0;
//! let pods = vec!["127.0.0.1:8001".to_owned(), "127.0.0.1:8002".to_owned()];
//! let report = run("http://127.0.0.1:10000", &pods, &spec, 0.05).await?;
//! println!("{}", render_table(&[("kvroute".to_owned(), report)]));
//! # Ok(()) }
//! ```

pub mod compare;
pub mod compare_pd;
pub mod compare_plots;
pub mod demo;
pub mod driver;
pub mod matrix;
pub mod metrics;
pub mod overhead;
pub mod overload;
pub mod peers;
pub mod plot;
pub mod report;
pub mod routing;
pub mod soak;
pub mod summary;
pub mod table;
pub mod workload;

use std::time::Duration;

pub use driver::{DriverOutput, RequestRecord};
pub use metrics::PodDelta;
pub use report::{percentile, render_json, render_table, RunReport, Summary};
pub use workload::{
    AgentParams, Api, InterferenceParams, Load, MultiTenantParams, MultiTurnParams, OverloadParams,
    SharedAgentParams, UniqueParams, WorkloadKind, WorkloadSpec,
};

/// Wall-clock budget of one metrics scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `spec` against `target` (base URL, e.g. `http://127.0.0.1:10000`) and reports.
///
/// `pod_metrics` are the pods' `ip:port` (or base URLs) whose `/metrics` are scraped before and after
/// the run for the cluster cache-hit ratio; a pod that cannot be scraped is reported, not fatal.
/// `time_scale` is the simulator's `--time-scale`: the spec's durations and rates are simulated
/// values, converted to wall clock with it, and the report converts measurements back. Errors only
/// for an invalid spec or time scale; failed requests are part of the report.
pub async fn run(
    target: &str,
    pod_metrics: &[String],
    spec: &WorkloadSpec,
    time_scale: f64,
) -> anyhow::Result<RunReport> {
    spec.validate()?;
    anyhow::ensure!(
        time_scale.is_finite() && time_scale > 0.0,
        "time scale must be > 0"
    );
    let client = reqwest::Client::builder().no_proxy().build()?;
    let before = metrics::scrape_all(&client, pod_metrics, SCRAPE_TIMEOUT).await;
    let out = driver::drive(target, spec, time_scale).await?;
    let after = metrics::scrape_all(&client, pod_metrics, SCRAPE_TIMEOUT).await;
    let pods = metrics::deltas(pod_metrics, before, after);
    Ok(RunReport::build(
        spec,
        time_scale,
        out.wall.as_secs_f64(),
        &out.records,
        pods,
    ))
}
