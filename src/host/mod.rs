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

/// Milliseconds since the epoch from the host clock; 0 if the host cannot tell.
fn now_ms() -> u64 {
    proxy_wasm::hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}
