//! kvroute: KV-cache-aware routing for LLM model servers, as a Proxy-Wasm plugin.
//!
//! Everything but `host` is the core: no proxy-wasm import, tested natively with `cargo test`. It
//! reaches the proxy only through the host port (`port::Host`); `host` implements the port with
//! proxy-wasm and binds Envoy's callbacks to the core.
//!
//! * `flow` — one request's path, from headers to outcome and back (parsing, usage reports)
//! * `health` — which pods may take requests: poll freshness, passive ejection
//! * `scheduler` — filters, TTFT predictor (with the learned per-pod cost), picker
//! * `adapters` — LoRA adapters: which pods hold which, what loading one costs
//! * `pd` — prefill/decode: the split decision and its inline execution
//! * `prefix` — block hashing, the prefix index, tiktoken mode
//! * `router` — one VM's routing state (index, work, fits) and the plan
//! * `vm` — one VM's state machine: election, polling, publishing, following
//! * `state` — what VMs share and its encodings
//! * `stored_responses` — which pod stored a Responses API answer, for the requests that name it
//! * `config`, `metrics`, `headers`, `port` — configuration, stat names, owned headers, the port
//! * `headermap` — header bytes from the host, read without trusting them (values that are not UTF-8)

pub mod adapters;
pub mod admission;
pub mod affinity;
pub mod common;
pub mod config;
pub mod cost;
pub mod flow;
pub mod headermap;
pub mod headers;
pub mod health;
pub mod metrics;
pub mod pd;
pub mod peers;
pub mod pod;
pub mod port;
pub mod protocol;
pub mod router;
pub mod scheduler;
pub mod state;
pub mod stored_responses;
pub mod vm;
pub mod work;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(target_arch = "wasm32")]
mod host;
