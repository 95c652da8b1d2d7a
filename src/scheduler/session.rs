//! Session affinity: requests that carry the same session id go to the same pod while it is healthy
//! and not overloaded.
//!
//! The session's pod is chosen by rendezvous hashing of the session id over the candidate pods, not
//! remembered: every worker VM and every gateway replica computes the same pod without sharing any
//! state, and when that pod leaves only its own sessions move. A pinned pod that the overload guard
//! calls overloaded, or whose predicted time to first token is more than `max_slowdown` times the
//! best pod's, loses the pin for that request; the prediction then decides, and the session comes
//! back once the pod has caught up.

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// Request header carrying the session id; empty turns session affinity off.
    pub header: String,
    /// The pin yields when the pinned pod's predicted TTFT exceeds the best pod's this many times.
    pub max_slowdown: f64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            header: "x-session-id".to_string(),
            max_slowdown: 4.0,
        }
    }
}

impl SessionConfig {
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !self.header.is_empty() && !is_header_name(&self.header) {
            return Err((
                "session.header",
                format!("`{}` is not a lower-case HTTP header name", self.header),
            ));
        }
        if !(self.max_slowdown.is_finite() && self.max_slowdown >= 1.0) {
            return Err(("session.max_slowdown", "must be a number ≥ 1".to_string()));
        }
        Ok(())
    }
}

/// Lower-case token characters only: Envoy stores header names lower-cased.
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(':')
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.!#$%&'*+^`|~".contains(&b)
        })
}

/// The key the session's pod is found by: a hash of the id, so ids of any length and bytes work.
pub fn session_key(id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(id.as_bytes(), 0x5e55_1011)
}
