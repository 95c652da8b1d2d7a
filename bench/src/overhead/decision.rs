//! kvroute's own account of its body phase: the `kvroute.decision_microseconds` histogram, which
//! the filter records around reading the buffered body out of Envoy, parsing it, cutting it into
//! blocks and choosing a pod (wall time inside the VM). Read from Envoy's `/stats` as detailed
//! buckets; the difference of two readings covers exactly the requests in between, so each cell
//! of the sweep gets its own figure, and the client-side added latency can be split into this
//! phase and everything else (the Envoy/V8 crossings of the other callbacks, body buffering).
//!
//! Envoy merges histograms into `/stats` only when it flushes stats, so the harness runs these
//! Envoys with a half-second flush interval and [`read_after_flush`] waits out one and a half (the
//! merge is posted to the workers and finishes a little after the flush starts).

use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;

use harness::Envoy;

pub(super) const HISTOGRAM: &str = "wasmcustom.kvroute.decision_microseconds";

/// How often both Envoys flush stats (and so merge histograms): `stats_flush_interval`.
pub(super) const FLUSH_INTERVAL: Duration = Duration::from_millis(500);

/// One histogram's buckets so far: (lower bound, width, count), as Envoy reports them.
#[derive(Clone, Debug, Default)]
pub(super) struct Buckets(Vec<(f64, f64, u64)>);

/// What a stretch of requests spent in kvroute's body phase, µs.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct DecisionSummary {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// The histogram's buckets once everything recorded before the call has been flushed.
pub(super) async fn read_after_flush(envoy: &Envoy) -> Result<Buckets> {
    tokio::time::sleep(FLUSH_INTERVAL * 3 / 2 + Duration::from_millis(200)).await;
    let url = format!(
        "http://{}/stats?format=json&histogram_buckets=detailed&filter=decision_microseconds",
        envoy.admin
    );
    let v: Value = reqwest::get(&url)
        .await
        .context("reading the decision histogram")?
        .json()
        .await
        .context("the decision histogram's JSON")?;
    Ok(Buckets::from_stats(&v))
}

impl Buckets {
    fn from_stats(v: &Value) -> Buckets {
        let details = v
            .get("stats")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| s.pointer("/histograms/details")?.as_array())
            .flatten();
        let mut out = Vec::new();
        for d in details {
            if d.get("name").and_then(Value::as_str) != Some(HISTOGRAM) {
                continue;
            }
            for b in d
                .get("totals")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let num = |k: &str| b.get(k).and_then(Value::as_f64);
                if let (Some(lo), Some(w), Some(n)) =
                    (num("lower_bound"), num("width"), num("count"))
                {
                    out.push((lo, w, n as u64));
                }
            }
        }
        Buckets(out)
    }

    /// The buckets of what was recorded after `earlier`.
    pub(super) fn since(&self, earlier: &Buckets) -> Buckets {
        let before = |lo: f64| earlier.0.iter().find(|b| b.0 == lo).map_or(0, |b| b.2);
        Buckets(
            self.0
                .iter()
                .map(|&(lo, w, n)| (lo, w, n.saturating_sub(before(lo))))
                .filter(|b| b.2 > 0)
                .collect(),
        )
    }

    /// Count, mean and quantiles (linear within a bucket); `None` when nothing was recorded.
    pub(super) fn summary(&self) -> Option<DecisionSummary> {
        let mut buckets = self.0.clone();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let count: u64 = buckets.iter().map(|b| b.2).sum();
        if count == 0 {
            return None;
        }
        let mean = buckets
            .iter()
            .map(|&(lo, w, n)| (lo + w / 2.0) * n as f64)
            .sum::<f64>()
            / count as f64;
        let quantile = |q: f64| {
            let rank = q * count as f64;
            let mut seen = 0.0;
            for &(lo, w, n) in &buckets {
                let n = n as f64;
                if seen + n >= rank {
                    return lo + w * ((rank - seen) / n).clamp(0.0, 1.0);
                }
                seen += n;
            }
            buckets.last().map_or(0.0, |&(lo, w, _)| lo + w)
        };
        Some(DecisionSummary {
            count,
            mean,
            p50: quantile(0.5),
            p90: quantile(0.9),
            p99: quantile(0.99),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stats(totals: &[(f64, f64, u64)]) -> Value {
        let totals: Vec<Value> = totals
            .iter()
            .map(|&(lo, w, n)| json!({"lower_bound": lo, "width": w, "count": n}))
            .collect();
        json!({"stats": [{"histograms": {"details": [
            {"name": "other", "totals": [{"lower_bound": 1, "width": 1, "count": 99}]},
            {"name": HISTOGRAM, "totals": totals, "intervals": []}]}}]})
    }

    #[test]
    fn the_difference_of_two_readings_covers_only_the_requests_between() {
        let before = Buckets::from_stats(&stats(&[(10.0, 1.0, 5)]));
        let after = Buckets::from_stats(&stats(&[(10.0, 1.0, 5), (20.0, 1.0, 3), (30.0, 1.0, 1)]));
        let s = after.since(&before).summary().expect("recorded");
        assert_eq!(s.count, 4);
        assert!((20.0..21.0).contains(&s.p50), "{s:?}");
        assert!((30.0..=31.0).contains(&s.p99), "{s:?}");
        assert!(before.since(&before).summary().is_none());
    }
}
