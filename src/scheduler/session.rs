//! Session affinity: requests that carry the same session id go to the same pod while it is healthy
//! and not overloaded.
//!
//! The session's pod is chosen by rendezvous hashing of the session id over the candidate pods, not
//! remembered: every worker VM and every gateway replica computes the same pod without sharing any
//! state, and when that pod leaves only its own sessions move. A pinned pod that the overload guard
//! calls overloaded, or whose predicted time to first token is more than `max_slowdown` times the
//! best pod's, loses the pin for that request; the prediction then decides, and the session comes
//! back once the pod has caught up.

use crate::common::{at_least, ConfigError, HeaderName};
use serde::Deserialize;

/// `session` in the configuration's wire form.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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

/// Session affinity as routing uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    /// `None`: session affinity is off.
    pub header: Option<HeaderName>,
    pub max_slowdown: f64,
}

impl SessionConfig {
    pub fn compile(&self) -> Result<Session, ConfigError> {
        at_least("session.max_slowdown", self.max_slowdown, 1.0)?;
        Ok(Session {
            header: HeaderName::optional("session.header", &self.header)?,
            max_slowdown: self.max_slowdown,
        })
    }
}

/// The key the session's pod is found by: a hash of the id, so ids of any length and bytes work.
pub fn session_key(id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(id.as_bytes(), 0x5e55_1011)
}
