//! Envoy's side of the metrics: each series of `crate::metrics` defined once per VM (the
//! gateway-wide ones at start, a labelled one when first recorded), then recorded by id.

use crate::metrics::{self, Counter, Gauge, Histogram, Labels, SeriesMap};
use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

/// Labelled series one VM defines at most. Their labels are bounded by configuration (pools,
/// their members, the models the pods serve); this only caps what a runaway pod list could cost.
const MAX_SERIES: usize = 8192;

#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Series → metric id.
    ids: SeriesMap<u32>,
}

impl Stats {
    /// Defines every gateway-wide metric once per VM; a metric the host refuses is skipped, never
    /// fatal.
    pub fn define() -> Stats {
        let mut stats = Stats::default();
        let unlabelled = Counter::ALL
            .iter()
            .filter(|c| c.labels().is_empty())
            .map(|c| (MetricType::Counter, c.name()))
            .chain(
                Gauge::ALL
                    .iter()
                    .filter(|g| g.labels().is_empty())
                    .map(|g| (MetricType::Gauge, g.name())),
            )
            .chain(
                Histogram::ALL
                    .iter()
                    .filter(|h| h.labels().is_empty())
                    .map(|h| (MetricType::Histogram, h.name())),
            );
        for (kind, name) in unlabelled {
            stats.id(kind, name, &[]);
        }
        stats
    }

    fn id(&mut self, kind: MetricType, name: &'static str, labels: &Labels<'_>) -> Option<u32> {
        if let Some(id) = self.ids.get(name, labels) {
            return Some(*id);
        }
        if self.ids.len() >= MAX_SERIES {
            return None;
        }
        let id = hostcalls::define_metric(kind, &metrics::series_name(name, labels)).ok()?;
        self.ids.insert(name, labels, id);
        Some(id)
    }

    pub fn add(&mut self, c: Counter, labels: &Labels<'_>, n: u64) {
        if let Some(id) = self.id(MetricType::Counter, c.name(), labels) {
            let _ = hostcalls::increment_metric(id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub fn set(&mut self, g: Gauge, labels: &Labels<'_>, value: u64) {
        if let Some(id) = self.id(MetricType::Gauge, g.name(), labels) {
            let _ = hostcalls::record_metric(id, value);
        }
    }

    pub fn record(&mut self, h: Histogram, labels: &Labels<'_>, value: u64) {
        if let Some(id) = self.id(MetricType::Histogram, h.name(), labels) {
            let _ = hostcalls::record_metric(id, value);
        }
    }
}
