//! Reading the pods' own Prometheus counters, for the cluster's cache-hit ratio.
//!
//! The ratio a router achieves is a property of the pods, not of the responses: the pods count
//! prefix-cache queries and hits in tokens, and Σ Δhits / Σ Δqueries between a scrape before and a
//! scrape after the run is the fraction of prompt tokens the cluster did not have to prefill. The
//! parser follows the Prometheus text exposition format (comments, labels with escaped values,
//! optional timestamps, `NaN`/`±Inf`) and sums a metric over all its label sets, so it does not
//! depend on which labels a server adds.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// Tokens looked up in the prefix cache.
pub const PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries_total";
/// Tokens found in the prefix cache.
pub const PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits_total";
pub const PROMPT_TOKENS: &str = "vllm:prompt_tokens_total";
pub const GENERATION_TOKENS: &str = "vllm:generation_tokens_total";
pub const REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
pub const REQUESTS_RUNNING: &str = "vllm:num_requests_running";

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Parses Prometheus text format. Lines that are not valid samples are skipped: a scrape is
/// evidence, and one odd line should not void the rest of it.
pub fn parse_prometheus(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = line.get(..name_end)?;
    if name.is_empty() {
        return None;
    }
    let mut rest = line.get(name_end..)?.trim_start();
    let mut labels = Vec::new();
    if let Some(after_brace) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(after_brace)?;
        labels = parsed;
        rest = after.trim_start();
    }
    // Whatever follows the value is the optional timestamp, which a delta does not need.
    let value = parse_value(rest.split_whitespace().next()?)?;
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Parses `a="x",b="y"}` (the opening brace already consumed); returns the labels and the text
/// after the closing brace.
fn parse_labels(s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = rest.find('=')?;
        let key = rest.get(..eq)?.trim().to_owned();
        rest = rest.get(eq + 1..)?.trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let close = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                other => value.push(other),
            }
        };
        labels.push((key, value));
        rest = rest.get(close + 1..)?.trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        }
    }
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// Each metric's value summed over all its label sets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSnapshot {
    sums: BTreeMap<String, f64>,
}

impl MetricsSnapshot {
    pub fn parse(text: &str) -> Self {
        let mut sums = BTreeMap::new();
        for s in parse_prometheus(text) {
            *sums.entry(s.name).or_insert(0.0) += s.value;
        }
        Self { sums }
    }

    /// The summed value, or `None` if the metric is absent.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.sums.get(name).copied()
    }
}

/// Increase of a counter between two scrapes; a decrease means the pod restarted and its counter
/// began again from zero, so the increase is the new value (Prometheus' `increase()` does the same).
pub fn counter_delta(before: f64, after: f64) -> f64 {
    if after >= before {
        after - before
    } else {
        after
    }
}

/// What one pod did during a run, from its counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PodDelta {
    /// `ip:port` as given.
    pub pod: String,
    /// Why the pod is left out of the cluster figures, if it is.
    pub error: Option<String>,
    pub prefix_cache_queries: f64,
    pub prefix_cache_hits: f64,
    pub prompt_tokens: f64,
    pub generation_tokens: f64,
    /// Gauges at the end of the run.
    pub requests_waiting: Option<f64>,
    pub requests_running: Option<f64>,
}

impl PodDelta {
    /// Deltas between two snapshots of one pod; a counter missing from either scrape counts as 0.
    pub fn between(pod: &str, before: &MetricsSnapshot, after: &MetricsSnapshot) -> Self {
        let d = |name: &str| {
            counter_delta(
                before.get(name).unwrap_or(0.0),
                after.get(name).unwrap_or(0.0),
            )
        };
        Self {
            pod: pod.to_owned(),
            error: None,
            prefix_cache_queries: d(PREFIX_CACHE_QUERIES),
            prefix_cache_hits: d(PREFIX_CACHE_HITS),
            prompt_tokens: d(PROMPT_TOKENS),
            generation_tokens: d(GENERATION_TOKENS),
            requests_waiting: after.get(REQUESTS_WAITING),
            requests_running: after.get(REQUESTS_RUNNING),
        }
    }

    /// A pod whose scrape failed.
    pub fn failed(pod: &str, error: String) -> Self {
        Self {
            pod: pod.to_owned(),
            error: Some(error),
            ..Self::default()
        }
    }

    /// This pod's own hit ratio.
    pub fn hit_ratio(&self) -> Option<f64> {
        (self.prefix_cache_queries > 0.0)
            .then(|| self.prefix_cache_hits / self.prefix_cache_queries)
    }
}

/// Σ Δhits / Σ Δqueries over the pods that were scraped both times; `None` if nothing was queried.
pub fn cluster_hit_ratio(pods: &[PodDelta]) -> Option<f64> {
    let ok = pods.iter().filter(|p| p.error.is_none());
    let (hits, queries) = ok.fold((0.0, 0.0), |(h, q), p| {
        (h + p.prefix_cache_hits, q + p.prefix_cache_queries)
    });
    (queries > 0.0).then(|| hits / queries)
}

/// `http://ip:port/metrics` for `ip:port`; a value that already has a scheme is used as the base.
pub fn metrics_url(pod: &str) -> String {
    let base = pod.trim_end_matches('/');
    let base = if base.contains("://") {
        base.to_owned()
    } else {
        format!("http://{base}")
    };
    if base.ends_with("/metrics") {
        base
    } else {
        format!("{base}/metrics")
    }
}

/// Fetches and parses one pod's metrics.
pub async fn scrape(
    client: &reqwest::Client,
    pod: &str,
    timeout: Duration,
) -> anyhow::Result<MetricsSnapshot> {
    let resp = client
        .get(metrics_url(pod))
        .timeout(timeout)
        .send()
        .await?
        .error_for_status()?;
    Ok(MetricsSnapshot::parse(&resp.text().await?))
}

/// Scrapes every pod concurrently; a pod that fails is an `Err` in its place, not a failed run.
pub async fn scrape_all(
    client: &reqwest::Client,
    pods: &[String],
    timeout: Duration,
) -> Vec<anyhow::Result<MetricsSnapshot>> {
    futures::future::join_all(pods.iter().map(|p| scrape(client, p, timeout))).await
}

/// Per-pod deltas from the scrapes before and after a run.
pub fn deltas(
    pods: &[String],
    before: Vec<anyhow::Result<MetricsSnapshot>>,
    after: Vec<anyhow::Result<MetricsSnapshot>>,
) -> Vec<PodDelta> {
    pods.iter()
        .zip(before.into_iter().zip(after))
        .map(|(pod, scrapes)| match scrapes {
            (Ok(b), Ok(a)) => PodDelta::between(pod, &b, &a),
            (Err(e), _) => PodDelta::failed(pod, format!("scrape before run: {e:#}")),
            (_, Err(e)) => PodDelta::failed(pod, format!("scrape after run: {e:#}")),
        })
        .collect()
}
