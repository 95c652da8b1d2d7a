//! `kvbench compare-pd` (what `make bench-pd` runs): the same number of simulated GPUs served as
//! aggregated pods or split into prefill and decode pools, kvroute routing both, the same seeded
//! workload through each, one table per scenario with the P/D-vs-aggregated ratios.
//!
//! Two scenarios, each with its published claim as the target:
//!
//! * **interference** ([`WorkloadKind::Interference`](crate::WorkloadKind::Interference)): long streaming decodes with long uncached
//!   prompts arriving among them. On an aggregated pod every prefill step delays the next token of
//!   every stream running there; with P/D the long prompts are prefilled on prefill pods and the
//!   decode pods only decode. Target: P99 inter-token latency of the streams ≥ 5× lower with P/D.
//! * **agent** ([`WorkloadKind::Agent`](crate::WorkloadKind::Agent), ≈45 input tokens per output token) at a load that saturates
//!   the aggregated pods. Target: p50 TTFT ≥ 2× lower and ≥ 30% more requests completed in the same
//!   time with P/D.
//!
//! Topology A is N aggregated pods (one `kvsim` process) in Envoy's pool cluster; topology B is a
//! `kvsim --role prefill` process and a `kvsim --role decode` process, with only the decode pods in
//! Envoy's pool cluster and both pools in kvroute's configuration (`pd.mode` sidecar or inline). Every
//! pod of both topologies runs the same engine settings, and every topology gets fresh pods and a
//! fresh Envoy, as in [`compare`](super::compare).
//!
//! The files follow a comparison. `topology` names what the simulated GPUs are (aggregated,
//! kvroute's P/D in either mode, or a round-robin baseline); `stack` starts fresh pods and an Envoy
//! for one topology; `scenario` defines the rows and workloads of `make bench-pd` with their
//! settings; `run` runs a scenario's rows one after another; `figures` reduces one run's records to
//! the per-class figures the targets are about; `verdict` judges the P/D rows against the
//! aggregated ones; `render` writes the tables and the output files.

mod figures;
mod render;
mod run;
mod scenario;
mod stack;
#[cfg(test)]
mod test_support;
mod topology;
mod verdict;

pub use figures::Figures;
pub use render::{
    describe_scenario, render_pd_table, render_scenario, render_verdicts, write_scenario,
};
pub use run::{run_scenario, PdRow};
pub use scenario::{
    round_robin_baselines, scenario_spec, setups, wide_tie_band_control, Scenario, Setup,
    AGENT_DURATION, AGENT_LOAD, AGENT_SESSIONS, AGENT_WARMUP, DEFAULT_SIM_ARGS,
    INTERFERENCE_DURATION, INTERFERENCE_RATE, INTERFERENCE_WARMUP,
};
pub use stack::{PdStack, PdStackOptions};
pub use topology::{PdMode, Topology};
pub use verdict::{verdicts, Verdict};
