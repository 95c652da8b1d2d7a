//! Envoy's side of the metrics: each name of `crate::metrics` defined once per VM, recorded by id.

use crate::metrics::{Counter, Gauge, Histogram};
use crate::scheduler::cost::Coefficients;
use hashbrown::HashMap;
use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

/// One pod's learned cost as gauges named after the pod: `kvroute.pod.<ip>_<port>.*`, the
/// address's dots and colons made underscores so that Envoy's stat tags leave it whole.
#[derive(Debug, Clone, Copy)]
struct PodCostIds {
    overhead_us: Option<u32>,
    ns_per_token: Option<u32>,
    fit_samples: Option<u32>,
}

#[derive(Debug, Default, Clone)]
pub struct Stats {
    ids: HashMap<&'static str, u32>,
    pods: HashMap<String, PodCostIds>,
}

impl Stats {
    /// Defines every metric once per VM; a metric the host refuses is skipped, never fatal.
    pub fn define() -> Stats {
        let names = Counter::ALL
            .iter()
            .map(|c| (MetricType::Counter, c.name()))
            .chain(Gauge::ALL.iter().map(|g| (MetricType::Gauge, g.name())))
            .chain(
                Histogram::ALL
                    .iter()
                    .map(|h| (MetricType::Histogram, h.name())),
            );
        Stats {
            ids: names
                .filter_map(|(kind, name)| Some((name, hostcalls::define_metric(kind, name).ok()?)))
                .collect(),
            pods: HashMap::new(),
        }
    }

    pub fn add(&self, c: Counter, n: u64) {
        if let Some(id) = self.ids.get(c.name()) {
            let _ = hostcalls::increment_metric(*id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub fn set(&self, g: Gauge, value: u64) {
        if let Some(id) = self.ids.get(g.name()) {
            let _ = hostcalls::record_metric(*id, value);
        }
    }

    pub fn record(&self, h: Histogram, value: u64) {
        if let Some(id) = self.ids.get(h.name()) {
            let _ = hostcalls::record_metric(*id, value);
        }
    }

    /// Publishes a pod's learned cost (the leader, on its tick; bounded by the pool size).
    pub fn set_pod_cost(&mut self, addr: &str, cost: &Coefficients, samples: f64) {
        let ids = match self.pods.get(addr) {
            Some(ids) => *ids,
            None => {
                let base: String = addr
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .collect();
                let gauge = |what: &str| {
                    let name = format!("kvroute.pod.{base}.{what}");
                    hostcalls::define_metric(MetricType::Gauge, &name).ok()
                };
                let ids = PodCostIds {
                    overhead_us: gauge("overhead_us"),
                    ns_per_token: gauge("prefill_ns_per_token"),
                    fit_samples: gauge("fit_samples"),
                };
                self.pods.insert(addr.to_string(), ids);
                ids
            }
        };
        for (id, value) in [
            (ids.overhead_us, cost.overhead_ms * 1e3),
            (ids.ns_per_token, cost.us_per_token * 1e3),
            (ids.fit_samples, samples),
        ] {
            if let Some(id) = id {
                let _ = hostcalls::record_metric(id, value.max(0.0) as u64);
            }
        }
    }
}
