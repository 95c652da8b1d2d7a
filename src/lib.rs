//! kvroute: KV-cache-aware routing for LLM model servers, as a Proxy-Wasm plugin.
//!
//! Everything but `host` is the pure core: plain data and functions, no proxy-wasm import, tested
//! natively with `cargo test`. `host` is the thin glue that moves bytes between Envoy and the core.

pub mod config;
pub mod cost;
pub mod discovery;
pub mod headers;
pub mod index;
pub mod leader;
pub mod metrics;
pub mod pd;
pub mod prefix;
pub mod prom;
pub mod request;
pub mod router;
pub mod scheduler;
pub mod state;
#[cfg(feature = "tiktoken")]
pub mod tokenize;

pub mod flow;
pub mod port;
pub mod usage;
pub mod vm;

#[cfg(test)]
pub mod testing;

#[cfg(target_arch = "wasm32")]
mod host;
