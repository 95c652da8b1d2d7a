//! What `kvbench overhead` runs: the block schemes, prompt sizes and prompt kinds of the sweep, the
//! sizes of each phase, the pods' engine settings and kvroute's configuration, with the checks that
//! reject a run that could not measure anything. Kept apart so that the options read as one list,
//! with their defaults beside them.

use anyhow::{ensure, Result};
use serde::Serialize;
use serde_json::{json, Value};

use super::prompts::QUESTION_BYTES;
use crate::peers::PeerPolicy;

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

/// kvroute's block scheme (`block.mode`): how it cuts a prompt into blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockMode {
    /// Fixed-size runs of characters: no tokenizer.
    Chars,
    /// Real tokens (`cl100k_base`): needs the full `kvroute.wasm`.
    Tiktoken,
}

impl BlockMode {
    pub fn name(self) -> &'static str {
        match self {
            BlockMode::Chars => "chars",
            BlockMode::Tiktoken => "tiktoken",
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
    /// Block schemes; each gets its own pods and pair of Envoys, in this order.
    pub modes: Vec<BlockMode>,
    /// Bytes of prompt text per request (system prompt + question), measured in this order.
    pub prompt_sizes: Vec<usize>,
    /// Prompt kinds, measured in this order for every size.
    pub kinds: Vec<PromptKind>,
    /// Most measured pairs (one request to each Envoy) per (mode, size, kind) cell.
    pub requests: usize,
    /// Most pairs sent before each cell's measured ones and left out of the figures.
    pub warmup: usize,
    /// Wall seconds after which a cell stops adding measured pairs (0 = no limit): a 256 KB prompt
    /// in tiktoken mode takes far longer than a 256-byte one, and the run must stay bounded.
    /// Warm-up stops after a quarter of it.
    pub cell_s: f64,
    /// Bootstrap resamples for the interval of the difference of medians.
    pub bootstrap: usize,
    pub seed: u64,
    /// Seconds each Envoy is loaded per throughput round (0 = no throughput phase).
    pub throughput_s: f64,
    /// Throughput rounds per prompt size; the Envoy that goes first alternates.
    pub throughput_rounds: usize,
    /// Block schemes whose sections include the throughput phase.
    pub throughput_modes: Vec<BlockMode>,
    /// Connections of the throughput phase, each sending its next request as soon as the last
    /// is answered.
    pub concurrency: usize,
    /// Fields merged into kvroute's configuration (default: none, i.e. kvroute's defaults); the
    /// fields of a `block` object are merged into the block scheme's.
    pub plugin_extra: Value,
    /// Ablation: the Envoy without kvroute buffers every request body whole too (Envoy's own
    /// `envoy.filters.http.buffer`), so the difference leaves out what buffering costs.
    pub plain_buffer: bool,
    /// Keep every latency sample in the report (and the JSON).
    pub keep_samples: bool,
    /// Seconds without requests, after start-up, over which both Envoys' background CPU is measured
    /// (kvroute's leader polls the pods meanwhile); 0 = skip.
    pub idle_s: f64,
    /// Runs of the hop phase in the first section (0 = none): each times, at every size of
    /// `hop_sizes`, the pod called directly, both Envoys and every peer router of `peers`.
    pub hop_runs: usize,
    /// Peer routers timed in the hop phase beside the Envoys, in front of the same pods (`make
    /// peers` installs them).
    pub peers: Vec<PeerPolicy>,
    /// Bytes of prompt text per request in the hop phase, in this order.
    pub hop_sizes: Vec<usize>,
    /// Measured sequential requests per hop, per run and size.
    pub hop_requests: usize,
    /// Sequential requests per hop sent before them, per run and size, not measured.
    pub hop_warmup: usize,
    /// Seconds each hop is loaded (`concurrency` connections) per run and size (0 = no loads).
    pub hop_load_s: f64,
    /// Pairs of the queue phase (0 = none): a request held by flow control behind another.
    pub held_pairs: usize,
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
            modes: vec![BlockMode::Chars, BlockMode::Tiktoken],
            prompt_sizes: vec![256, 16_384, 262_144],
            kinds: vec![PromptKind::Repeat, PromptKind::Fresh],
            requests: 2000,
            warmup: 200,
            cell_s: 12.0,
            bootstrap: 2000,
            seed: 1,
            throughput_s: 3.0,
            throughput_rounds: 5,
            throughput_modes: vec![BlockMode::Chars],
            concurrency: 16,
            plugin_extra: json!({}),
            plain_buffer: false,
            keep_samples: false,
            idle_s: 2.0,
            hop_runs: 3,
            held_pairs: 40,
            peers: Vec::new(),
            hop_sizes: vec![256, 16_384, 225_280],
            hop_requests: 500,
            hop_warmup: 50,
            hop_load_s: 2.0,
        }
    }
}

/// The largest prompt a run may ask for: below kvroute's default `max_body_bytes` (8 MiB) with
/// room for the JSON around it, and within what the simulated model accepts.
pub const MAX_PROMPT_BYTES: usize = 1 << 20;

impl OverheadOptions {
    pub fn validate(&self) -> Result<()> {
        ensure!(self.pods >= 1, "need at least one pod");
        ensure!(self.workers >= 1, "need at least one Envoy worker");
        ensure!(
            self.time_scale.is_finite() && self.time_scale > 0.0,
            "time scale must be > 0"
        );
        ensure!(!self.modes.is_empty(), "no block modes given");
        ensure!(!self.kinds.is_empty(), "no prompt kinds given");
        ensure!(!self.prompt_sizes.is_empty(), "no prompt sizes given");
        ensure!(self.requests >= 1, "need at least one measured request");
        for &size in self.prompt_sizes.iter().chain(&self.hop_sizes) {
            ensure!(
                size > QUESTION_BYTES && size <= MAX_PROMPT_BYTES,
                "prompt size {size}: must be more than {QUESTION_BYTES} bytes and at most \
                 {MAX_PROMPT_BYTES}"
            );
        }
        ensure!(
            self.cell_s.is_finite() && self.cell_s >= 0.0,
            "the cell time limit must be >= 0 s"
        );
        ensure!(
            self.throughput_s.is_finite() && self.throughput_s >= 0.0,
            "the throughput round length must be >= 0 s"
        );
        ensure!(
            self.throughput_s == 0.0 || (self.concurrency >= 1 && self.throughput_rounds >= 1),
            "the throughput phase needs a concurrency and a number of rounds of at least 1"
        );
        ensure!(
            self.idle_s.is_finite() && self.idle_s >= 0.0,
            "the idle period must be >= 0 s"
        );
        ensure!(
            self.hop_runs == 0 || (!self.hop_sizes.is_empty() && self.hop_requests >= 1),
            "the hop phase needs a prompt size and at least one request per hop"
        );
        ensure!(
            self.hop_load_s.is_finite()
                && self.hop_load_s >= 0.0
                && (self.hop_load_s == 0.0 || self.concurrency >= 1),
            "the hop phase's load must be >= 0 s, with a concurrency of at least 1"
        );
        ensure!(
            self.plugin_extra.is_object(),
            "the kvroute configuration extras must be a JSON object"
        );
        Ok(())
    }

    /// Whether the section of `mode` has a throughput phase.
    pub fn throughput_in(&self, mode: BlockMode) -> bool {
        self.throughput_s > 0.0 && self.throughput_modes.contains(&mode)
    }

    /// kvroute's configuration: the pool, the block scheme, and the extras.
    pub fn plugin_config(&self, pods: &[String], mode: BlockMode) -> String {
        let mut v = json!({
            "pools": [{"name": "default", "endpoints": pods}],
            "block": {"mode": mode.name()}
        });
        if let (Some(base), Value::Object(extra)) = (v.as_object_mut(), &self.plugin_extra) {
            for (k, val) in extra {
                match (base.get_mut(k), val) {
                    (Some(Value::Object(block)), Value::Object(fields)) if k == "block" => {
                        for (f, x) in fields {
                            block.insert(f.clone(), x.clone());
                        }
                    }
                    _ => {
                        base.insert(k.clone(), val.clone());
                    }
                }
            }
        }
        v.to_string()
    }
}

/// Whether a kvroute configuration routes at all (an empty `pools` only guards headers: the
/// ablation that measures the filter's presence without any routing work).
pub(super) fn routes(plugin_config: &str) -> bool {
    serde_json::from_str::<Value>(plugin_config)
        .ok()
        .and_then(|v| {
            v.get("pools")
                .and_then(Value::as_array)
                .map(|p| !p.is_empty())
        })
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extras_merge_into_the_block_scheme_and_replace_other_fields() {
        let opts = OverheadOptions {
            plugin_extra: json!({"block": {"tokens_per_block": 32}, "max_body_bytes": 100}),
            ..OverheadOptions::default()
        };
        let v: Value =
            serde_json::from_str(&opts.plugin_config(&["1.2.3.4:5".into()], BlockMode::Tiktoken))
                .expect("json");
        assert_eq!(v["block"]["mode"], "tiktoken");
        assert_eq!(v["block"]["tokens_per_block"], 32);
        assert_eq!(v["max_body_bytes"], 100);
        assert!(routes(&v.to_string()));
        let no_pools = OverheadOptions {
            plugin_extra: json!({"pools": []}),
            ..OverheadOptions::default()
        };
        assert!(!routes(&no_pools.plugin_config(&[], BlockMode::Chars)));
    }

    #[test]
    fn a_prompt_size_out_of_range_is_refused() {
        let opts = OverheadOptions {
            prompt_sizes: vec![256, 10],
            ..OverheadOptions::default()
        };
        assert!(opts.validate().is_err());
        assert!(OverheadOptions::default().validate().is_ok());
    }
}
