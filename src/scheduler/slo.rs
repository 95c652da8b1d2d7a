//! SLO-aware placement: a request may carry a time-to-first-token objective and a per-output-token
//! objective (`x-slo-ttft-ms`, `x-slo-tpot-ms`: the header names of llm-d's SLO-aware scheduler).
//!
//! Among the pods predicted to meet both, the one holding most of the prompt goes first (ties by
//! prediction): a cache hit that still meets the objective saves the pool a prefill that a faster,
//! colder pod would compute, which keeps capacity for the requests behind. When no pod is predicted
//! to meet them, the request goes to the fastest pod and the miss is counted; a request of negative
//! priority is shed instead (429), as under saturation. The TTFT is the scheduler's prediction
//! (`super::predict`); the per-token time is the pod's recently observed inter-token latency (the
//! gateway times the chunks of the streams it carries; unknown = assumed to meet it).

use crate::common::{ConfigError, HeaderName};
use serde::Deserialize;

/// `slo` in the configuration's wire form.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct SloConfig {
    /// Request header carrying the TTFT objective in milliseconds; empty turns it off.
    pub ttft_header: String,
    /// Request header carrying the per-output-token objective in milliseconds; empty turns it off.
    pub tpot_header: String,
}

impl Default for SloConfig {
    fn default() -> Self {
        SloConfig {
            ttft_header: "x-slo-ttft-ms".to_string(),
            tpot_header: "x-slo-tpot-ms".to_string(),
        }
    }
}

/// The objective headers routing reads; `None` turns that objective off.
#[derive(Debug, Clone, PartialEq)]
pub struct SloHeaders {
    pub ttft_header: Option<HeaderName>,
    pub tpot_header: Option<HeaderName>,
}

impl SloConfig {
    pub fn compile(&self) -> Result<SloHeaders, ConfigError> {
        Ok(SloHeaders {
            ttft_header: HeaderName::optional("slo.ttft_header", &self.ttft_header)?,
            tpot_header: HeaderName::optional("slo.tpot_header", &self.tpot_header)?,
        })
    }
}

/// The objectives one request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
}

impl Slo {
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some()
    }

    /// What is left of the objectives `waited_ms` after the request arrived: the first-token
    /// objective is the client's, from its request's headers, so a request held at the gateway
    /// (flow control) or slow to upload its body is planned against what remains of it (none left:
    /// no pod meets it).
    pub fn after(self, waited_ms: f64) -> Slo {
        Slo {
            ttft_ms: self.ttft_ms.map(|slo| (slo - waited_ms.max(0.0)).max(0.0)),
            ..self
        }
    }

    /// Whether a pod predicted at `ttft_ms`, observed at `itl_ms` per token, meets both.
    pub fn met_by(&self, ttft_ms: f64, itl_ms: Option<f64>) -> bool {
        let ttft_ok = self.ttft_ms.is_none_or(|slo| ttft_ms <= slo);
        let tpot_ok = match (self.tpot_ms, itl_ms) {
            (Some(slo), Some(itl)) => itl <= slo,
            _ => true,
        };
        ttft_ok && tpot_ok
    }
}

/// Parses an objective header: a positive number of milliseconds.
pub fn parse_objective(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(ms) if ms.is_finite() && ms > 0.0 => Ok(ms),
        _ => Err(format!(
            "must be a positive number of milliseconds, got `{value}`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objectives_parse_and_judge() {
        assert_eq!(parse_objective(" 250 "), Ok(250.0));
        assert!(parse_objective("0").is_err());
        assert!(parse_objective("-5").is_err());
        assert!(parse_objective("NaN").is_err());
        assert!(parse_objective("fast").is_err());
        let slo = Slo {
            ttft_ms: Some(100.0),
            tpot_ms: Some(20.0),
        };
        assert!(slo.met_by(99.0, Some(19.0)));
        assert!(
            slo.met_by(99.0, None),
            "an unknown ITL is not held against a pod"
        );
        assert!(!slo.met_by(101.0, Some(1.0)));
        assert!(!slo.met_by(1.0, Some(25.0)));
        assert!(!Slo::default().is_set());
    }
}
