//! Saturation and shedding: when every pod that could serve a request is saturated, requests of
//! negative priority are refused (429) so that the others still find room.
//!
//! A pod is saturated when its waiting queue reaches `queue_depth` or its KV cache is `kv_cache`
//! full: the thresholds of the Gateway API Inference Extension's saturation detector (5 waiting,
//! 80 % KV). The priority comes from a request header (an integer; absent = 0); only negative
//! priorities are sheddable, so clients that never send the header are never shed. Nothing is
//! queued in the proxy: a shed request gets an OpenAI-style error at once and may retry.
//!
//! The signals are the polled metrics, so shedding starts up to a poll interval after the pods
//! saturate: a burst is admitted and the requests after it are shed. That is the same lag the Gateway
//! API Inference Extension accepts; counting this gateway's in-flight requests as queued would react
//! sooner but would call a pod saturated for requests it is already running.

use super::PodView;
use crate::common::{at_least, ConfigError, HeaderName};
use serde::Deserialize;

/// `shedding` in the configuration's wire form.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct SheddingConfig {
    /// Request header carrying an integer priority; empty turns shedding off.
    pub priority_header: String,
    /// Waiting requests at which a pod counts as saturated.
    pub queue_depth: f64,
    /// KV-cache utilisation (0..1] at which a pod counts as saturated.
    pub kv_cache: f64,
}

impl Default for SheddingConfig {
    fn default() -> Self {
        SheddingConfig {
            priority_header: "x-kvroute-priority".to_string(),
            queue_depth: 5.0,
            kv_cache: 0.8,
        }
    }
}

/// Shedding as routing uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shedding {
    /// `None`: shedding is off.
    pub priority_header: Option<HeaderName>,
    pub queue_depth: f64,
    pub kv_cache: f64,
}

impl SheddingConfig {
    pub fn compile(&self) -> Result<Shedding, ConfigError> {
        at_least("shedding.queue_depth", self.queue_depth, 1.0)?;
        if !(self.kv_cache > 0.0 && self.kv_cache <= 1.0) {
            return Err(ConfigError::at("shedding.kv_cache", "must be in (0, 1]"));
        }
        Ok(Shedding {
            priority_header: HeaderName::optional(
                "shedding.priority_header",
                &self.priority_header,
            )?,
            queue_depth: self.queue_depth,
            kv_cache: self.kv_cache,
        })
    }
}

impl Shedding {
    pub fn is_saturated(&self, pod: &PodView<'_>) -> bool {
        pod.waiting >= self.queue_depth || pod.kv_usage >= self.kv_cache
    }
}

/// Parses a priority header value: an integer, optionally signed.
pub fn parse_priority(value: &str) -> Result<i32, String> {
    value.trim().parse::<i32>().map_err(|_| {
        format!("must be an integer (negative = may be shed under saturation), got `{value}`")
    })
}
