//! Reads the load signals kvroute needs out of a model server's Prometheus text exposition.
//!
//! Only the handful of engine metrics below are looked at; everything else (histograms, HELP/TYPE
//! lines, timestamps) is skipped line by line, so a 100 KB vLLM page costs one pass and no
//! allocation per sample. A page without any recognised load metric is rejected as garbage: a pod
//! whose metrics we cannot read must not look idle.
//!
//! | signal          | vLLM                                                  | SGLang                      | TRT-LLM                          |
//! |-----------------|-------------------------------------------------------|-----------------------------|----------------------------------|
//! | waiting         | `vllm:num_requests_waiting`                           | `sglang:num_queue_reqs`     | `trtllm_num_requests_waiting`    |
//! | running         | `vllm:num_requests_running`                           | `sglang:num_running_reqs`   | `trtllm_num_requests_running`    |
//! | KV use (0..1)   | `vllm:kv_cache_usage_perc` (`gpu_cache_usage_perc`)   | `sglang:token_usage`        | `trtllm_kv_cache_utilization`    |
//! | cache geometry  | `vllm:cache_config_info{block_size,num_gpu_blocks}`   | `sglang:cache_config_info{page_size,num_pages}` | — |
//! | LoRA adapters   | `vllm:lora_requests_info{running_lora_adapters,waiting_lora_adapters}` | — | — |
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
    /// Not read off the page: this gateway's own requests on the pod when the leader sent the
    /// poll, the most of `waiting` and `running` that can be ours (see [`GatewayShare`]).
    #[serde(default, skip_serializing_if = "GatewayShare::is_none")]
    pub ours: GatewayShare,
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromError {
    NoLoadMetrics,
    NotText,
}

enum Signal {
    Waiting,
    Running,
    KvUsage,
    CacheInfo,
    LoraInfo,
}

fn signal(name: &str) -> Option<Signal> {
    Some(match name {
        "vllm:num_requests_waiting" | "sglang:num_queue_reqs" | "trtllm_num_requests_waiting" => {
            Signal::Waiting
        }
        "vllm:num_requests_running" | "sglang:num_running_reqs" | "trtllm_num_requests_running" => {
            Signal::Running
        }
        "vllm:kv_cache_usage_perc"
        | "vllm:gpu_cache_usage_perc"
        | "sglang:token_usage"
        | "trtllm_kv_cache_utilization" => Signal::KvUsage,
        "vllm:cache_config_info" | "sglang:cache_config_info" => Signal::CacheInfo,
        "vllm:lora_requests_info" => Signal::LoraInfo,
        _ => return None,
    })
}

pub fn parse(text: &[u8]) -> Result<PodMetrics, PromError> {
    let text = std::str::from_utf8(text).map_err(|_| PromError::NotText)?;
    let mut m = PodMetrics::default();
    let (mut saw_waiting, mut saw_running) = (false, false);
    let mut newest_lora = f64::NEG_INFINITY;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                let Some(close) = line.rfind('}') else {
                    continue;
                };
                if close < open {
                    continue;
                }
                (
                    line.get(..open).unwrap_or(""),
                    line.get(open + 1..close).unwrap_or(""),
                    line.get(close + 1..).unwrap_or(""),
                )
            }
            None => match line.split_once(char::is_whitespace) {
                Some((n, r)) => (n, "", r),
                None => continue,
            },
        };
        let Some(sig) = signal(name.trim()) else {
            continue;
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        if !value.is_finite() || value < 0.0 {
            continue;
        }
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
            Signal::KvUsage => m.kv_usage = m.kv_usage.max(value.min(1.0)),
            Signal::CacheInfo => {
                let block = label(labels, "block_size").or_else(|| label(labels, "page_size"));
                let blocks = label(labels, "num_gpu_blocks").or_else(|| label(labels, "num_pages"));
                m.block_size = block.and_then(|v| v.parse().ok()).filter(|v| *v > 0);
                m.num_gpu_blocks = blocks.and_then(|v| v.parse().ok()).filter(|v| *v > 0);
            }
            Signal::LoraInfo if value > newest_lora => {
                newest_lora = value;
                m.adapters = ["running_lora_adapters", "waiting_lora_adapters"]
                    .iter()
                    .filter_map(|key| label(labels, key))
                    .flat_map(|list| list.split(','))
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                    .fold(Vec::new(), |mut all, a| {
                        if !all.iter().any(|x| x == a) {
                            all.push(a.to_string());
                        }
                        all
                    });
            }
            Signal::LoraInfo => {}
        }
    }
    // Finite samples can add up to infinity (found by fuzzing `prom`): the load table could not
    // carry it (JSON has no infinity) and no worker would read the table; such a page is garbage.
    if !(saw_waiting && saw_running && m.waiting.is_finite() && m.running.is_finite()) {
        return Err(PromError::NoLoadMetrics);
    }
    Ok(m)
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
    fn garbage_is_rejected_not_read_as_idle() {
        assert_eq!(
            parse(b"hello world\n{{{}}}\n"),
            Err(PromError::NoLoadMetrics)
        );
        assert_eq!(parse(b"\xff\xfe\x00"), Err(PromError::NotText));
        assert_eq!(parse(b""), Err(PromError::NoLoadMetrics));
        assert_eq!(
            parse(b"vllm:num_requests_running NaN\nvllm:num_requests_waiting -3\n"),
            Err(PromError::NoLoadMetrics)
        );
        assert_eq!(
            parse(b"vllm:num_requests_running 1e308\nvllm:num_requests_running 1e308\nvllm:num_requests_waiting 0\n"),
            Err(PromError::NoLoadMetrics),
            "samples adding up to infinity"
        );
        // Broken lines are skipped, good ones still count.
        let m = parse(b"vllm:num_requests_running{model_name=\"a\" 1\nvllm:num_requests_running 2\nvllm:num_requests_waiting} 1\nvllm:num_requests_waiting 0\n").unwrap();
        assert_eq!(m.running, 2.0);
    }
}
