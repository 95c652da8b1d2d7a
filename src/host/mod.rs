//! The proxy binding, the only module that imports proxy_wasm: Envoy's callbacks in (`root`,
//! `filter`), the host port out (`ProxyHost` below: shared data, queues, calls, the clock, stats).
//! Nothing here decides anything: the callbacks read what a core step needs, call it, and carry
//! out what it returns. Every host call's error is handled, never unwrapped; headers, bodies,
//! properties and local replies go through `abi`, since proxy-wasm's own wrappers for them panic
//! on statuses Envoy does return and on header bytes that are not UTF-8.

mod abi;
mod decision;
mod filter;
mod held;
mod node;
mod root;
mod stats;

use crate::metrics::{Counter, Gauge, Histogram, Labels};
use crate::port::{Host, HttpCall, WriteRefused};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::RootContext;
use proxy_wasm::types::{BufferType, LogLevel, MapType};
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> { Box::new(root::Root::new(id)) });
}}

/// The host port on proxy-wasm; one per VM (it holds the VM's metric ids).
pub struct ProxyHost {
    stats: stats::Stats,
}

impl ProxyHost {
    fn new() -> ProxyHost {
        ProxyHost {
            stats: stats::Stats::define(),
        }
    }
}

/// The host's clock in µs since the epoch (0 if it refuses).
fn now_us() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_micros() as u64)
}

impl Host for ProxyHost {
    fn now_ms(&self) -> u64 {
        self.now_us() / 1000
    }

    fn now_us(&self) -> u64 {
        now_us()
    }

    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        hostcalls::get_shared_data(key).unwrap_or((None, None))
    }

    fn shared_set(
        &mut self,
        key: &str,
        value: &[u8],
        cas: Option<u32>,
    ) -> Result<(), WriteRefused> {
        hostcalls::set_shared_data(key, Some(value), cas).map_err(|_| WriteRefused)
    }

    fn queue_register(&mut self, name: &str) -> Option<u32> {
        hostcalls::register_shared_queue(name).ok()
    }

    fn queue_push(&mut self, queue: u32, message: &[u8]) -> bool {
        hostcalls::enqueue_shared_queue(queue, Some(message)).is_ok()
    }

    fn queue_pop(&mut self, queue: u32) -> Option<Vec<u8>> {
        hostcalls::dequeue_shared_queue(queue).ok().flatten()
    }

    fn http_call(&mut self, call: &HttpCall) -> Option<u32> {
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", call.method),
            (":path", call.path.as_str()),
            (":authority", call.authority.as_str()),
        ];
        headers.extend(call.headers.iter().map(|(k, v)| (k.as_ref(), v.as_str())));
        hostcalls::dispatch_http_call(
            &call.cluster,
            headers,
            call.body.as_deref(),
            vec![],
            Duration::from_millis(call.timeout_ms),
        )
        .ok()
    }

    fn export_decision_field(&mut self, name: &str, value: &str) {
        decision::set_filter_state(name, value);
    }

    fn count_in(&mut self, counter: Counter, labels: &Labels<'_>, n: u64) {
        self.stats.add(counter, labels, n);
    }

    fn gauge_in(&mut self, gauge: Gauge, labels: &Labels<'_>, value: u64) {
        self.stats.set(gauge, labels, value);
    }

    fn histogram_in(&mut self, histogram: Histogram, labels: &Labels<'_>, value: u64) {
        self.stats.record(histogram, labels, value);
    }
}

/// The status and body of a `dispatch_http_call` answer. A refused connection or a timeout
/// arrives as Envoy's own 503/504; a call Envoy ended itself (the pod reset the connection
/// mid-answer, the answer overflowed the async client's buffer) has no answer at all: status 0,
/// which every caller reads as a failed call.
fn call_response(body_size: usize) -> (u32, Vec<u8>) {
    let status = crate::headermap::status(
        abi::header(MapType::HttpCallResponseHeaders, ":status").as_deref(),
    );
    let body = if status == 0 {
        Vec::new()
    } else {
        abi::buffer(BufferType::HttpCallResponseBody, 0, body_size).unwrap_or_default()
    };
    (status, body)
}
