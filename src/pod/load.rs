//! The load table the leader publishes: every known pod, its pool role, its latest metrics and when
//! they were read. (In-flight requests are not here: they change per request, see `crate::work`.)

use crate::common::Role;
use crate::pod::models::ServedModel;
use crate::pod::prom::PodMetrics;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodLoad {
    pub addr: String,
    pub role: Role,
    /// The configured pool (`pools[].name`) the pod belongs to: its `pool` label in the metrics.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pool: String,
    /// Time of the last successful metrics read; 0 = never.
    pub metrics_at_ms: u64,
    /// The last poll failed outright: refused or reset, non-200, or unparsable (see
    /// `crate::health`). A poll that timed out does not set it (see `late`).
    pub failing: bool,
    /// The last poll timed out: the pod's figures are stale, the pod is not known to be down.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub late: bool,
    /// Ejected by passive health (its requests failed) until this time; 0 = not ejected.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ejected_until_ms: u64,
    pub metrics: PodMetrics,
    /// The pod's `/v1/models` entries (aliases, LoRA adapters), as last read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub served: Vec<ServedModel>,
    /// Every name a request may use on this pod: its metrics' `model_name`, its running LoRA
    /// adapters and its `/v1/models` ids. Empty = unknown (any model).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serves: Vec<String>,
    /// Where the pod is, as Envoy reported it with the pool cluster's members (`crate::pd::topology`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<crate::pod::locality::Locality>,
    /// Restarts the leader has seen (`crate::vm::leader`): each emptied the pod's KV cache, so a
    /// worker that sees it change drops the pod's prefix entries at once.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub restarts: u32,
    /// The engine's cap on requests running at once, as its polls have shown it
    /// (`crate::pod::seats`); `None` until they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seats: Option<u32>,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl PodLoad {
    pub fn is_fresh(&self, now_ms: u64, stale_after_ms: u64) -> bool {
        !self.failing
            && self.metrics_at_ms > 0
            && now_ms.saturating_sub(self.metrics_at_ms) <= stale_after_ms
    }

    /// Prefix-index capacity in our blocks, from the engine's KV geometry when it reports one.
    pub fn capacity_blocks(
        &self,
        our_block_tokens: u32,
        default_blocks: u32,
        max_blocks: u32,
    ) -> usize {
        let reported = match (self.metrics.block_size, self.metrics.num_gpu_blocks) {
            (Some(bs), Some(n)) if our_block_tokens > 0 => {
                // Saturating: a pod may report any `num_gpu_blocks` (found by fuzzing `prom`).
                Some((u64::from(bs).saturating_mul(n) / u64::from(our_block_tokens)).max(1))
            }
            _ => None,
        };
        // Never capped by a response that reported fewer cached tokens than expected: that says
        // what the pod lost (a restart or a reset empties a cache that is as large as before),
        // and the index forgets exactly that (`crate::affinity::Affinity::on_cache_report`).
        reported
            .unwrap_or(u64::from(default_blocks))
            .min(u64::from(max_blocks)) as usize
    }
}

/// The table's format: a table another module version wrote decodes as `None` (ignored until this
/// version's leader publishes).
pub const LOAD_FORMAT: u32 = 2;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadTable {
    #[serde(default)]
    pub format: u32,
    pub version: u64,
    pub published_ms: u64,
    pub pods: Vec<PodLoad>,
}

impl LoadTable {
    pub fn encode(&self) -> Vec<u8> {
        let mut table = self.clone();
        table.format = LOAD_FORMAT;
        serde_json::to_vec(&table).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Option<LoadTable> {
        serde_json::from_slice::<LoadTable>(bytes)
            .ok()
            .filter(|t| t.format == LOAD_FORMAT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_and_capacity() {
        let mut p = PodLoad {
            addr: "a:1".into(),
            role: Role::Aggregated,
            pool: String::new(),
            metrics_at_ms: 1000,
            failing: false,
            late: false,
            ejected_until_ms: 0,
            metrics: PodMetrics::default(),
            served: Vec::new(),
            serves: Vec::new(),
            locality: None,
            restarts: 0,
            seats: None,
        };
        assert!(p.is_fresh(2000, 1000));
        assert!(!p.is_fresh(2001, 1000));
        p.failing = true;
        assert!(!p.is_fresh(1000, 1000));
        assert_eq!(p.capacity_blocks(16, 500, 10_000), 500);
        p.metrics.block_size = Some(16);
        p.metrics.num_gpu_blocks = Some(4096);
        assert_eq!(p.capacity_blocks(16, 500, 10_000), 4096);
        assert_eq!(
            p.capacity_blocks(16, 500, 1000),
            1000,
            "bounded by configuration"
        );
        let t = LoadTable {
            format: LOAD_FORMAT,
            version: 3,
            published_ms: 5,
            pods: vec![p],
        };
        assert_eq!(LoadTable::decode(&t.encode()), Some(t.clone()));
        assert_eq!(LoadTable::decode(b"junk"), None);
        // Every f64 reads back exactly (serde_json's `float_roundtrip`; found by fuzzing
        // `load_table`: the default parser read this one back an ulp off).
        let mut exact = t.clone();
        exact.pods[0].metrics.kv_usage = 0.43802143457299597;
        exact.pods[0].metrics.waiting = 1345.5798573199613;
        assert_eq!(LoadTable::decode(&exact.encode()), Some(exact));
        // A pod reporting an absurd geometry gets the configured ceiling, not an overflow.
        let mut absurd = t.pods[0].clone();
        absurd.metrics.block_size = Some(u32::MAX);
        absurd.metrics.num_gpu_blocks = Some(u64::MAX);
        assert_eq!(absurd.capacity_blocks(16, 500, 1000), 1000);
        assert_eq!(
            LoadTable::decode(br#"{"version":3,"published_ms":5,"pods":[]}"#),
            None,
            "the previous module's table (no format) is not misread"
        );
    }
}
