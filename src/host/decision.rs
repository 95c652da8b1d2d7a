//! The routing decision handed to Envoy for its access logs and traces, and the per-request
//! debug trigger header removed before the request goes upstream.
//!
//! Wasm reaches Envoy's per-request state only through `set_property`, which Envoy stores as
//! filter state under `wasm.<name>` (a `CelState` of bytes: `%FILTER_STATE(wasm.<name>:PLAIN)%`
//! prints it as text). Proxy-wasm has no call that writes dynamic metadata, so
//! `%DYNAMIC_METADATA(...)%` cannot carry kvroute's decision.

use super::abi;
use proxy_wasm::types::MapType;

/// Stores `value` as the stream's filter state `wasm.<name>`. A refusal (a callback outside a
/// request) costs the access log one field, never the request.
pub(super) fn set_filter_state(name: &str, value: &str) {
    if !abi::set_property(&[name], value.as_bytes()) {
        log::debug!("kvroute: Envoy refused filter state wasm.{name}");
    }
}

/// Removes the client's debug trigger header (`debug_header.trigger_header`), token right or
/// wrong, so no token reaches a pod.
pub(super) fn strip_debug_trigger(name: &str) {
    abi::remove_header(MapType::HttpRequestHeaders, name);
}
