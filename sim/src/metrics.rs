//! Prometheus text exposition (format 0.0.4) with the names real engines use.
//!
//! A router learns load only from what engines publish, so the simulator publishes the same
//! metric names, types, labels and bucket bounds as vLLM v1 (`vllm:*`, labelled with `model_name`
//! and `engine` like vLLM's `prometheus_client` output) or SGLang (`sglang:*`). Durations are recorded
//! in simulated seconds, so a run at `--time-scale 0.05` publishes the latencies a real GPU would show.

use std::fmt::Write as _;

use super::config::{EngineKind, SimConfig};

/// vLLM v1 bucket bounds (vllm/v1/metrics/loggers.py).
const VLLM_TTFT: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const VLLM_ITL: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const VLLM_E2E: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// SGLang bucket bounds (sglang/srt/metrics/collector.py).
const SGLANG_TTFT: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0,
];
const SGLANG_ITL: &[f64] = &[
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
];
const SGLANG_E2E: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0, 600.0, 1200.0, 1800.0, 2400.0,
];

#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last slot is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Sum of the observed values.
    #[cfg(test)]
    pub fn sum(&self) -> f64 {
        self.sum
    }

    pub fn observe(&mut self, value: f64) {
        let slot = self.bounds.iter().take_while(|b| value > **b).count();
        if let Some(c) = self.counts.get_mut(slot) {
            *c += 1;
        }
        self.sum += value;
        self.count += 1;
    }
}

/// The latency histograms of one pod, with the bounds of the engine it imitates.
#[derive(Debug, Clone)]
pub struct Latencies {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
}

impl Latencies {
    pub fn new(engine: EngineKind) -> Self {
        match engine {
            EngineKind::Vllm => Self {
                ttft: Histogram::new(VLLM_TTFT),
                itl: Histogram::new(VLLM_ITL),
                e2e: Histogram::new(VLLM_E2E),
            },
            EngineKind::Sglang => Self {
                ttft: Histogram::new(SGLANG_TTFT),
                itl: Histogram::new(SGLANG_ITL),
                e2e: Histogram::new(SGLANG_E2E),
            },
        }
    }
}

/// Monotonic counters kept by the engine.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Prompt tokens looked up in the prefix cache (every admitted request's whole prompt).
    pub prefix_queries: u64,
    /// Prompt tokens found in the local prefix cache.
    pub prefix_hits: u64,
    /// Prompt tokens whose KV arrived from a prefill pod instead of being computed.
    pub transferred_tokens: u64,
    /// Prompt tokens of requests whose prefill finished.
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub success: u64,
    pub aborted: u64,
    /// Running requests preempted for KV space (vLLM's `vllm:num_preemptions`).
    pub preemptions: u64,
    /// LoRA adapters loaded into a GPU slot.
    pub adapter_loads: u64,
    /// Prompt tokens looked up in the host tier (vLLM's connector lookup: the prompt less its GPU
    /// prefix hit), at first admission, while the pod has a tier.
    pub external_queries: u64,
    /// Of those, tokens found there and loaded instead of computed.
    pub external_hits: u64,
    /// KV bytes loaded from host memory into the GPU (`transfer_type="CPU_to_GPU"`).
    pub offload_loaded_bytes: u64,
    /// KV bytes written through from the GPU to host memory (`transfer_type="GPU_to_CPU"`).
    pub offload_stored_bytes: u64,
}

/// Everything `/metrics` shows, copied out of the engine under its lock.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub running: usize,
    pub waiting: usize,
    /// LoRA adapters of the running and the waiting requests (`vllm:lora_requests_info`).
    pub running_adapters: std::collections::BTreeSet<String>,
    pub waiting_adapters: std::collections::BTreeSet<String>,
    pub used_blocks: usize,
    pub counters: Counters,
    pub latencies: Latencies,
}

impl Snapshot {
    pub fn kv_usage(&self, cfg: &SimConfig) -> f64 {
        (self.used_blocks as f64 / cfg.num_gpu_blocks.max(1) as f64).min(1.0)
    }
}

/// Formats a sample value the way Python's `prometheus_client` does (`5.0`, `0.25`, `+Inf`).
fn num(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// Label values must escape backslash, quote and newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Writer {
    out: String,
    labels: String,
}

impl Writer {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, extra: &str, value: f64) {
        let sep = if extra.is_empty() { "" } else { "," };
        let _ = writeln!(
            self.out,
            "{name}{{{}{sep}{extra}}} {}",
            self.labels,
            num(value)
        );
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, "gauge", help);
        self.sample(name, "", value);
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.header(name, "counter", help);
        self.sample(name, "", value as f64);
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.header(name, "histogram", help);
        let mut cumulative = 0;
        for (i, c) in h.counts.iter().enumerate() {
            cumulative += c;
            let le = h.bounds.get(i).copied().unwrap_or(f64::INFINITY);
            self.sample(
                &format!("{name}_bucket"),
                &format!("le=\"{}\"", num(le)),
                cumulative as f64,
            );
        }
        self.sample(&format!("{name}_count"), "", h.count as f64);
        self.sample(&format!("{name}_sum"), "", h.sum);
    }
}

/// Renders `/metrics`. Every sample carries `model_name` (the first served model, as vLLM labels
/// its engine with the first `--served-model-name`).
pub fn render(cfg: &SimConfig, snap: &Snapshot) -> String {
    let model = escape(
        cfg.models
            .first()
            .map(String::as_str)
            .unwrap_or("sim-model"),
    );
    let c = &snap.counters;
    let l = &snap.latencies;
    match cfg.engine {
        EngineKind::Vllm => {
            let mut w = Writer {
                out: String::new(),
                labels: format!("model_name=\"{model}\",engine=\"0\""),
            };
            w.gauge(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                snap.running as f64,
            );
            w.gauge(
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                snap.waiting as f64,
            );
            w.gauge(
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                snap.kv_usage(cfg),
            );
            w.header(
                "vllm:cache_config_info",
                "gauge",
                "Information of the LLMEngine CacheConfig",
            );
            w.sample(
                "vllm:cache_config_info",
                &format!(
                    "block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",\
                     num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",prefix_caching_hash_algo=\"xxh3\"",
                    cfg.block_size, cfg.num_gpu_blocks
                ),
                1.0,
            );
            w.counter(
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
                c.prefix_queries,
            );
            w.counter(
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
                c.prefix_hits,
            );
            if cfg.host_tier() {
                // vLLM's connector counters (`vllm/v1/metrics/loggers.py`) and the offloading
                // connector's byte counter (`kv_connector/v1/offloading/metrics.py`, a
                // `prometheus_client` Counter `vllm:kv_offload_total_bytes`: its samples carry
                // `_total`).
                w.counter(
                    "vllm:external_prefix_cache_queries_total",
                    "External prefix cache queries from KV connector cross-instance cache \
                     sharing, in terms of number of queried tokens.",
                    c.external_queries,
                );
                w.counter(
                    "vllm:external_prefix_cache_hits_total",
                    "External prefix cache hits from KV connector cross-instance cache sharing, \
                     in terms of number of cached tokens.",
                    c.external_hits,
                );
                w.header(
                    "vllm:kv_offload_total_bytes_total",
                    "counter",
                    "Number of bytes offloaded by KV connector",
                );
                w.sample(
                    "vllm:kv_offload_total_bytes_total",
                    "transfer_type=\"CPU_to_GPU\"",
                    c.offload_loaded_bytes as f64,
                );
                w.sample(
                    "vllm:kv_offload_total_bytes_total",
                    "transfer_type=\"GPU_to_CPU\"",
                    c.offload_stored_bytes as f64,
                );
            }
            w.counter(
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                c.prompt_tokens,
            );
            w.counter(
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                c.generation_tokens,
            );
            w.counter(
                "vllm:num_preemptions_total",
                "Cumulative number of preemption from the engine.",
                c.preemptions,
            );
            w.header(
                "vllm:request_success_total",
                "counter",
                "Count of successfully processed requests.",
            );
            w.sample(
                "vllm:request_success_total",
                "finished_reason=\"stop\"",
                0.0,
            );
            w.sample(
                "vllm:request_success_total",
                "finished_reason=\"length\"",
                c.success as f64,
            );
            w.sample(
                "vllm:request_success_total",
                "finished_reason=\"abort\"",
                c.aborted as f64,
            );
            w.histogram(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &l.ttft,
            );
            w.histogram(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                &l.itl,
            );
            w.histogram(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                &l.e2e,
            );
            w.out
        }
        EngineKind::Sglang => {
            let mut w = Writer {
                out: String::new(),
                labels: format!("model_name=\"{model}\""),
            };
            let capacity_tokens = cfg.num_gpu_blocks * cfg.block_size;
            let used_tokens = (snap.used_blocks * cfg.block_size).min(capacity_tokens);
            w.gauge(
                "sglang:num_running_reqs",
                "The number of running requests.",
                snap.running as f64,
            );
            w.gauge(
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                snap.waiting as f64,
            );
            w.gauge("sglang:token_usage", "The token usage.", snap.kv_usage(cfg));
            w.gauge(
                "sglang:num_used_tokens",
                "The number of used tokens.",
                used_tokens as f64,
            );
            w.gauge(
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                capacity_tokens as f64,
            );
            let hit_rate = if c.prefix_queries == 0 {
                0.0
            } else {
                c.prefix_hits as f64 / c.prefix_queries as f64
            };
            w.gauge(
                "sglang:cache_hit_rate",
                "The prefix cache hit rate.",
                hit_rate,
            );
            w.header(
                "sglang:cache_config_info",
                "gauge",
                "Information of the KV cache configuration.",
            );
            w.sample(
                "sglang:cache_config_info",
                &format!(
                    "num_pages=\"{}\",page_size=\"{}\"",
                    cfg.num_gpu_blocks, cfg.block_size
                ),
                1.0,
            );
            w.counter(
                "sglang:prompt_tokens_total",
                "Number of prefill tokens processed.",
                c.prompt_tokens,
            );
            w.counter(
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                c.generation_tokens,
            );
            w.counter(
                "sglang:cached_tokens_total",
                "Number of cached prompt tokens.",
                c.prefix_hits,
            );
            w.counter(
                "sglang:num_requests_total",
                "Number of requests processed.",
                c.success,
            );
            w.histogram(
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &l.ttft,
            );
            w.histogram(
                "sglang:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                &l.itl,
            );
            w.histogram(
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                &l.e2e,
            );
            w.out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_look_like_prometheus_client() {
        assert_eq!(num(5.0), "5.0");
        assert_eq!(num(0.25), "0.25");
        assert_eq!(num(f64::INFINITY), "+Inf");
    }

    #[test]
    fn histogram_buckets_are_cumulative_in_output() {
        let mut h = Histogram::new(VLLM_ITL);
        h.observe(0.01);
        h.observe(3.0);
        let mut w = Writer {
            out: String::new(),
            labels: "model_name=\"m\"".into(),
        };
        w.histogram("x", "help", &h);
        assert!(w.out.contains("x_bucket{model_name=\"m\",le=\"0.01\"} 1.0"));
        assert!(w.out.contains("x_bucket{model_name=\"m\",le=\"5.0\"} 2.0"));
        assert!(w.out.contains("x_bucket{model_name=\"m\",le=\"+Inf\"} 2.0"));
        assert!(w.out.contains("x_count{model_name=\"m\"} 2.0"));
    }
}
