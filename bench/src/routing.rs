//! Routing decided by the benchmark client instead of the gateway: the reference policies kvroute is
//! measured against. The client still sends every request through a plain Envoy (no plugin) whose
//! pool uses the `override_host` load-balancing policy, naming the pod in
//! `x-gateway-destination-endpoint`, so the reference pays the same proxy hop as kvroute.
//!
//! * [`ClientRouter::Oracle`] (`perfect-knowledge`): for each request, ask every simulated pod
//!   (`POST /sim/probe`, in parallel) for its true cache contents, queue and its own estimate of
//!   this request's time to first token from its real cost model, and pick the earliest first token.
//!   The probes' time is not counted in the request's latency (the bound routes for free); a probe
//!   failure sends that request round-robin. Decisions are taken one at a time: the next request's
//!   probes wait until the previous request has reached its pod (its response headers are back), so
//!   every probe sees every earlier decision. Without that, the requests of a closed loop that end
//!   in the same engine step (a batch finishes together) all saw the same pool and all went to the
//!   same pod. With [`OracleObjective::TotalWait`] it minimises instead the request's own first
//!   token plus the delay it adds to the requests already on the pod that have no first token yet
//!   (`added_wait_ms`: a prefill that joins their step lengthens it): greedy on the sum, which under
//!   saturation is the stronger reference.
//! * [`ClientRouter::Shadow`] (`kvbench compare --shadow-probe`): a diagnostic, not a policy. It
//!   probes every pod like the oracle, then leaves the choice to the gateway (kvroute), so the
//!   report can say how often the gateway chose the pod the pods themselves said was earliest, and
//!   how much later the one it chose was ([`crate::report::ShadowRegret`]). Decisions are
//!   not serialised: the gateway decides as it does without the probe.
//! * [`ClientRouter::PdRoundRobin`]: the prefill/decode baseline. Round-robin over the prefill pods
//!   and, independently, over the decode pods; a request that is split (every request with
//!   [`PdSplit::Always`], prompts longer than a threshold with [`PdSplit::Selective`]) is first sent
//!   to the prefill pod with `max_tokens: 1`, `stream: false` and `kv_transfer_params.do_remote_decode`
//!   (vLLM's NixlConnector contract), then to the decode pod with the `kv_transfer_params` the prefill
//!   pod answered. The prefill call is part of the request's latency. A failed prefill falls back to
//!   decode-only.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use serde::Serialize;
use serde_json::Value;

/// The header `override_host` reads.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// When the round-robin P/D baseline splits a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PdSplit {
    /// Every request: prefill pod, then decode pod.
    Always,
    /// Only prompts of more than `threshold_tokens` words (≈ the simulator's tokens); the others go
    /// to the decode pod alone.
    Selective { threshold_tokens: usize },
}

impl PdSplit {
    /// The selective baseline's threshold: the fixed 512 uncached tokens kvroute split at before its
    /// split was decided by cost.
    pub const SELECTIVE_THRESHOLD: usize = 512;

    pub fn label(self) -> String {
        match self {
            PdSplit::Always => "always".to_owned(),
            PdSplit::Selective { threshold_tokens } => format!("selective >{threshold_tokens}"),
        }
    }
}

/// What the perfect-knowledge router minimises per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OracleObjective {
    /// The request's own time to first token (`estimated_ttft_ms`).
    OwnTtft,
    /// Its own TTFT plus the wait it adds to the requests queued on the pod (`added_wait_ms`).
    TotalWait,
}

/// What the router decided for one request.
#[derive(Debug, Default)]
pub struct Routed {
    /// Headers to add to the request sent to Envoy.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// A body to send instead of the planned one.
    pub body: Option<Vec<u8>>,
    /// Restart the request's clock after routing (the routing time is not the request's latency).
    pub restart_clock: bool,
    /// The router's own TTFT prediction for the request, wall-clock ms (the oracle: the chosen
    /// pod's estimate), reported like kvroute's when the response carries none.
    pub predicted_ttft_ms: Option<f64>,
    /// Held until the request has reached its pod (the driver drops it when the response headers
    /// arrive): the oracle's next decision waits for it.
    pub hold: Option<tokio::sync::OwnedMutexGuard<()>>,
    /// The shadow probe's answers: every pod's own estimate of this request's first token
    /// (simulated ms), the pods that answered.
    pub probed_ttft_ms: Vec<(String, f64)>,
}

/// Counters of one router over a run.
#[derive(Debug, Default)]
pub struct RouterCounters {
    pub routed: AtomicU64,
    /// Oracle: requests sent round-robin because a probe failed.
    pub probe_fallbacks: AtomicU64,
    /// P/D: requests prefilled on a prefill pod, then decoded.
    pub split: AtomicU64,
    /// P/D: requests sent to a decode pod alone (short prompts).
    pub decode_only: AtomicU64,
    /// P/D: prefill calls that failed (the request then went to the decode pod alone).
    pub prefill_failures: AtomicU64,
}

impl RouterCounters {
    /// The counters by name (`routed`, `probe_fallbacks`, `split`, `decode_only`, `prefill_failures`).
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("routed", g(&self.routed)),
            ("probe_fallbacks", g(&self.probe_fallbacks)),
            ("split", g(&self.split)),
            ("decode_only", g(&self.decode_only)),
            ("prefill_failures", g(&self.prefill_failures)),
        ]
    }
}

/// A client-side routing policy (see the module documentation).
#[derive(Debug)]
pub enum ClientRouter {
    Oracle {
        /// `ip:port` of every pod in Envoy's pool.
        pods: Vec<String>,
        /// The simulator's time scale (the pods' estimates are simulated time).
        time_scale: f64,
        objective: OracleObjective,
        next: AtomicUsize,
        /// Wall-clock limit of one probe.
        probe_timeout: Duration,
        /// One decision at a time (see the module documentation).
        turn: std::sync::Arc<tokio::sync::Mutex<()>>,
        counters: RouterCounters,
    },
    Shadow {
        pods: Vec<String>,
        probe_timeout: Duration,
        counters: RouterCounters,
    },
    PdRoundRobin {
        prefill: Vec<String>,
        decode: Vec<String>,
        split: PdSplit,
        next_prefill: AtomicUsize,
        next_decode: AtomicUsize,
        /// Wall-clock limit of one prefill call.
        prefill_timeout: Duration,
        counters: RouterCounters,
    },
}

fn header(name: &'static str, value: &str) -> Option<(HeaderName, HeaderValue)> {
    Some((
        HeaderName::from_static(name),
        HeaderValue::from_str(value).ok()?,
    ))
}

fn pick<'a>(pods: &'a [String], next: &AtomicUsize) -> Option<&'a String> {
    if pods.is_empty() {
        return None;
    }
    pods.get(next.fetch_add(1, Ordering::Relaxed) % pods.len())
}

/// The pod with the earliest estimated first token among the probe answers (`None` = a failed
/// probe); ties go to the earliest in the rotation starting at `start`. `None` if any probe failed.
pub fn earliest(answers: &[Option<f64>], start: usize) -> Option<usize> {
    if answers.is_empty() || answers.iter().any(Option::is_none) {
        return None;
    }
    let n = answers.len();
    let mut best: Option<(usize, f64)> = None;
    for k in 0..n {
        let i = (start + k) % n;
        let Some(Some(t)) = answers.get(i) else {
            continue;
        };
        if !t.is_finite() {
            return None;
        }
        if best.is_none_or(|(_, b)| *t < b) {
            best = Some((i, *t));
        }
    }
    best.map(|(i, _)| i)
}

impl ClientRouter {
    /// The perfect-knowledge router over `pods`.
    pub fn oracle(pods: Vec<String>, time_scale: f64, objective: OracleObjective) -> Self {
        ClientRouter::Oracle {
            pods,
            time_scale,
            objective,
            next: AtomicUsize::new(0),
            probe_timeout: Duration::from_secs(5),
            turn: std::sync::Arc::new(tokio::sync::Mutex::new(())),
            counters: RouterCounters::default(),
        }
    }

    /// The shadow probe over `pods` (see the module documentation).
    pub fn shadow(pods: Vec<String>) -> Self {
        ClientRouter::Shadow {
            pods,
            probe_timeout: Duration::from_secs(5),
            counters: RouterCounters::default(),
        }
    }

    /// The round-robin P/D baseline; `prefill_timeout` is wall-clock.
    pub fn pd_round_robin(
        prefill: Vec<String>,
        decode: Vec<String>,
        split: PdSplit,
        prefill_timeout: Duration,
    ) -> Self {
        ClientRouter::PdRoundRobin {
            prefill,
            decode,
            split,
            next_prefill: AtomicUsize::new(0),
            next_decode: AtomicUsize::new(0),
            prefill_timeout,
            counters: RouterCounters::default(),
        }
    }

    pub fn counters(&self) -> &RouterCounters {
        match self {
            ClientRouter::Oracle { counters, .. }
            | ClientRouter::Shadow { counters, .. }
            | ClientRouter::PdRoundRobin { counters, .. } => counters,
        }
    }

    /// Decides where one request goes. `target` is Envoy's base URL, `path` the request's API path,
    /// `body` its JSON, `prompt_words` its size in words.
    pub async fn route(
        &self,
        client: &reqwest::Client,
        target: &str,
        path: &str,
        body: &[u8],
        prompt_words: usize,
    ) -> Routed {
        match self {
            ClientRouter::Oracle {
                pods,
                time_scale,
                objective,
                next,
                probe_timeout,
                turn,
                counters,
            } => {
                counters.routed.fetch_add(1, Ordering::Relaxed);
                let hold = turn.clone().lock_owned().await;
                let start = next.fetch_add(1, Ordering::Relaxed);
                let probes = pods
                    .iter()
                    .map(|pod| probe(client, pod, body, *probe_timeout));
                let answers = futures::future::join_all(probes).await;
                let scores: Vec<Option<f64>> = answers
                    .iter()
                    .map(|a| {
                        a.map(|(ttft, added)| match objective {
                            OracleObjective::OwnTtft => ttft,
                            OracleObjective::TotalWait => ttft + added,
                        })
                    })
                    .collect();
                let (pod, estimate) = match earliest(&scores, start % pods.len().max(1)) {
                    Some(i) => (pods.get(i), answers.get(i).copied().flatten().map(|a| a.0)),
                    None => {
                        counters.probe_fallbacks.fetch_add(1, Ordering::Relaxed);
                        (pods.get(start % pods.len().max(1)), None)
                    }
                };
                Routed {
                    headers: pod
                        .and_then(|p| header(DESTINATION_HEADER, p))
                        .into_iter()
                        .collect(),
                    body: None,
                    restart_clock: true,
                    predicted_ttft_ms: estimate.map(|ms| ms * time_scale),
                    hold: Some(hold),
                    ..Routed::default()
                }
            }
            ClientRouter::Shadow {
                pods,
                probe_timeout,
                counters,
            } => {
                counters.routed.fetch_add(1, Ordering::Relaxed);
                let probes = pods
                    .iter()
                    .map(|pod| probe(client, pod, body, *probe_timeout));
                let answers = futures::future::join_all(probes).await;
                // Only a whole probe names the earliest pod: with one answer missing, none is kept.
                let probed_ttft_ms: Option<Vec<(String, f64)>> = pods
                    .iter()
                    .zip(answers)
                    .map(|(pod, a)| Some((pod.clone(), a?.0)))
                    .collect();
                if probed_ttft_ms.is_none() {
                    counters.probe_fallbacks.fetch_add(1, Ordering::Relaxed);
                }
                Routed {
                    restart_clock: true,
                    probed_ttft_ms: probed_ttft_ms.unwrap_or_default(),
                    ..Routed::default()
                }
            }
            ClientRouter::PdRoundRobin {
                prefill,
                decode,
                split,
                next_prefill,
                next_decode,
                prefill_timeout,
                counters,
            } => {
                counters.routed.fetch_add(1, Ordering::Relaxed);
                let decode_pod = pick(decode, next_decode);
                let headers: Vec<_> = decode_pod
                    .and_then(|p| header(DESTINATION_HEADER, p))
                    .into_iter()
                    .collect();
                let wants_split = match split {
                    PdSplit::Always => true,
                    PdSplit::Selective { threshold_tokens } => prompt_words > *threshold_tokens,
                };
                let prefill_pod = if wants_split {
                    pick(prefill, next_prefill)
                } else {
                    None
                };
                let Some(prefill_pod) = prefill_pod else {
                    counters.decode_only.fetch_add(1, Ordering::Relaxed);
                    return Routed {
                        headers,
                        ..Routed::default()
                    };
                };
                let url = format!("{}{path}", target.trim_end_matches('/'));
                match prefill_then_decode_body(client, &url, prefill_pod, body, *prefill_timeout)
                    .await
                {
                    Ok(decode_body) => {
                        counters.split.fetch_add(1, Ordering::Relaxed);
                        Routed {
                            headers,
                            body: Some(decode_body),
                            ..Routed::default()
                        }
                    }
                    Err(_) => {
                        counters.prefill_failures.fetch_add(1, Ordering::Relaxed);
                        Routed {
                            headers,
                            ..Routed::default()
                        }
                    }
                }
            }
        }
    }
}

/// One probe's estimated TTFT and the wait it adds to others (simulated ms), `None` on any failure.
async fn probe(
    client: &reqwest::Client,
    pod: &str,
    body: &[u8],
    timeout: Duration,
) -> Option<(f64, f64)> {
    let resp = client
        .post(format!("http://{pod}/sim/probe"))
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_vec())
        .timeout(timeout)
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let v: Value = resp.json().await.ok()?;
    let ttft = v.get("estimated_ttft_ms").and_then(Value::as_f64)?;
    let added = v
        .get("added_wait_ms")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    Some((ttft, added))
}

/// The body of the prefill leg: the request cut to one token, not streamed, marked for a remote
/// decode (as vLLM's NixlConnector proxy and llm-d's sidecar send it).
pub fn prefill_body(body: &Value) -> Value {
    match body {
        Value::Object(map) => Value::Object(kvsim::remote_decode_prefill(map)),
        other => other.clone(),
    }
}

/// Prefills on `prefill_pod` through Envoy (`url`) and returns the decode leg's body: the original
/// with the `kv_transfer_params` the prefill pod answered.
async fn prefill_then_decode_body(
    client: &reqwest::Client,
    url: &str,
    prefill_pod: &str,
    body: &[u8],
    timeout: Duration,
) -> anyhow::Result<Vec<u8>> {
    let original: Value = serde_json::from_slice(body)?;
    let resp = client
        .post(url)
        .header(CONTENT_TYPE, "application/json")
        .header(DESTINATION_HEADER, prefill_pod)
        .body(serde_json::to_vec(&prefill_body(&original))?)
        .timeout(timeout)
        .send()
        .await?;
    anyhow::ensure!(
        resp.status().is_success(),
        "prefill answered {}",
        resp.status()
    );
    let answer: Value = resp.json().await?;
    let kv = answer
        .get("kv_transfer_params")
        .filter(|v| v.is_object())
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("the prefill pod returned no kv_transfer_params"))?;
    let mut decode = original;
    if let Value::Object(map) = &mut decode {
        map.insert("kv_transfer_params".into(), kv);
    }
    Ok(serde_json::to_vec(&decode)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn earliest_picks_the_soonest_first_token_and_rotates_ties() {
        assert_eq!(earliest(&[Some(5.0), Some(2.0), Some(9.0)], 0), Some(1));
        assert_eq!(earliest(&[Some(1.0), Some(1.0), Some(1.0)], 2), Some(2));
        assert_eq!(earliest(&[Some(1.0), Some(1.0), Some(3.0)], 2), Some(0));
        assert_eq!(earliest(&[Some(1.0), None], 0), None, "a failed probe");
        assert_eq!(earliest(&[], 0), None);
    }

    #[test]
    fn the_prefill_leg_is_one_token_not_streamed_and_asks_for_a_remote_decode() {
        let body = json!({"model": "m", "messages": [], "max_tokens": 200, "stream": true,
                          "stream_options": {"include_usage": true}});
        let p = prefill_body(&body);
        assert_eq!(p["max_tokens"], 1);
        assert_eq!(p["stream"], false);
        assert!(p.get("stream_options").is_none());
        assert_eq!(p["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(p["kv_transfer_params"]["do_remote_prefill"], false);
        assert!(p["kv_transfer_params"]["remote_block_ids"].is_null());
        assert_eq!(p["messages"], body["messages"]);
    }
}
