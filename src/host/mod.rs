//! The only module that imports proxy_wasm: Envoy's callbacks in, header writes and shared-data
//! updates out. Decisions are made by the pure core (`crate::router`, `crate::leader`); this layer
//! moves bytes and never panics (every host call's error is handled, not unwrapped).

mod filter;
mod root;
mod shared;
mod stats;

use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(root::Root::new()) });
}}

/// The status (0 when the host gives none) and body of a `dispatch_http_call` answer; a connection
/// failure or timeout arrives as 503/504 from the host.
fn call_response(body_size: usize) -> (u32, Vec<u8>) {
    use proxy_wasm::hostcalls;
    use proxy_wasm::types::{BufferType, MapType};
    let status = hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(0);
    let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
        .ok()
        .flatten()
        .unwrap_or_default();
    (status, body)
}

/// Microseconds since the epoch from the host clock (first-byte timing); 0 if the host cannot tell.
fn now_us() -> u64 {
    proxy_wasm::hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_micros() as u64)
}

/// Milliseconds since the epoch from the host clock; 0 if the host cannot tell.
fn now_ms() -> u64 {
    proxy_wasm::hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}
