//! What `kvbench overhead` runs: the prompt kinds, the sizes of each phase, the pods' engine
//! settings and kvroute's configuration, with the checks that reject a run that could not measure
//! anything. Kept apart so that the options read as one list, with their defaults beside them.

use anyhow::{ensure, Result};
use serde::Serialize;
use serde_json::{json, Value};

use super::prompts::QUESTION_BYTES;

/// kvsim arguments that make a pod answer at once: no simulated prefill or decode time at all.
pub const DEFAULT_SIM_ARGS: &str =
    "--prefill-overhead-ms 0 --prefill-us-per-token 0 --decode-base-ms 0 --decode-us-per-seq 0";

/// What the prompts of one measured phase look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptKind {
    /// The same system prompt on every request, a different short question each time.
    Repeat,
    /// A new prompt on every request.
    Fresh,
}

impl PromptKind {
    pub fn name(self) -> &'static str {
        match self {
            PromptKind::Repeat => "repeat",
            PromptKind::Fresh => "fresh",
        }
    }
}

/// How `kvbench overhead` runs.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadOptions {
    /// Simulated pods (one kvsim process).
    pub pods: usize,
    /// Envoy worker threads, the same in both Envoys.
    pub workers: usize,
    pub time_scale: f64,
    /// kvsim arguments (`--time-scale` is added).
    pub sim_args: Vec<String>,
    /// Prompt kinds, measured in this order on the same two Envoys.
    pub kinds: Vec<PromptKind>,
    /// Measured pairs (one request to each Envoy) per prompt kind.
    pub requests: usize,
    /// Pairs sent before each kind's measured ones and left out of the figures.
    pub warmup: usize,
    /// Bytes of prompt text per request (system prompt + question).
    pub prompt_bytes: usize,
    /// Bootstrap resamples for the interval of the difference of medians.
    pub bootstrap: usize,
    pub seed: u64,
    /// Requests per arm of the closed-loop throughput phase (0 = no such phase).
    pub throughput_requests: usize,
    /// Requests in flight in the throughput phase.
    pub concurrency: usize,
    /// Fields merged into kvroute's configuration (default: none, i.e. kvroute's defaults).
    pub plugin_extra: Value,
    /// Keep every latency sample in the report (and the JSON).
    pub keep_samples: bool,
    /// Seconds without requests, after start-up, over which both Envoys' background CPU is measured
    /// (kvroute's leader polls the pods meanwhile); 0 = skip.
    pub idle_s: f64,
}

impl Default for OverheadOptions {
    fn default() -> Self {
        Self {
            pods: 4,
            workers: 2,
            time_scale: 0.0001,
            sim_args: DEFAULT_SIM_ARGS
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            kinds: vec![PromptKind::Repeat, PromptKind::Fresh],
            requests: 3000,
            warmup: 300,
            prompt_bytes: 16_384,
            bootstrap: 2000,
            seed: 1,
            throughput_requests: 2000,
            concurrency: 4,
            plugin_extra: json!({}),
            keep_samples: false,
            idle_s: 2.0,
        }
    }
}

impl OverheadOptions {
    pub fn validate(&self) -> Result<()> {
        ensure!(self.pods >= 1, "need at least one pod");
        ensure!(self.workers >= 1, "need at least one Envoy worker");
        ensure!(
            self.time_scale.is_finite() && self.time_scale > 0.0,
            "time scale must be > 0"
        );
        ensure!(!self.kinds.is_empty(), "no prompt kinds given");
        ensure!(self.requests >= 1, "need at least one measured request");
        ensure!(
            self.prompt_bytes > QUESTION_BYTES,
            "the prompt must be longer than {QUESTION_BYTES} bytes"
        );
        ensure!(
            self.throughput_requests == 0 || self.concurrency >= 1,
            "the throughput phase needs a concurrency of at least 1"
        );
        ensure!(
            self.idle_s.is_finite() && self.idle_s >= 0.0,
            "the idle period must be >= 0 s"
        );
        ensure!(
            self.plugin_extra.is_object(),
            "the kvroute configuration extras must be a JSON object"
        );
        Ok(())
    }

    /// kvroute's configuration: the pool, chars mode, and the extras.
    pub fn plugin_config(&self, pods: &[String]) -> String {
        let mut v = json!({
            "pools": [{"name": "default", "endpoints": pods}],
            "block": {"mode": "chars"}
        });
        if let (Some(base), Value::Object(extra)) = (v.as_object_mut(), &self.plugin_extra) {
            for (k, val) in extra {
                base.insert(k.clone(), val.clone());
            }
        }
        v.to_string()
    }
}
