//! The host port: the few things kvroute needs from a proxy, as one trait.
//!
//! Everything the plugin decides and keeps — the VM's state, leader election, publishing and
//! catch-up of the prefix index, the work and fits boards, one request from its body to an outcome
//! and its response back — is written against this trait and runs natively in tests against
//! [`crate::testing::FakeHost`] (several VMs sharing one store). `crate::host` implements it with
//! proxy-wasm and keeps only Envoy's callbacks. (Kuadrant's wasm-shim keeps proxy-wasm out of its
//! logic the same way.)

use crate::metrics::{Counter, Gauge, Histogram, Labels};

/// A shared-data write lost a compare-and-swap (someone wrote in between), or the host refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRefused;

/// An outgoing HTTP call (a metrics poll, the admin API, an inline prefill).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpCall {
    pub cluster: String,
    pub method: &'static str,
    pub path: String,
    pub authority: String,
    /// Further request headers (e.g. the destination header an ORIGINAL_DST cluster routes by).
    pub headers: Vec<(std::borrow::Cow<'static, str>, String)>,
    pub body: Option<Vec<u8>>,
    pub timeout_ms: u64,
}

pub trait Host {
    /// Milliseconds since the epoch.
    fn now_ms(&self) -> u64;
    /// Microseconds since the epoch (first-byte timing).
    fn now_us(&self) -> u64;

    /// A shared-data value and its compare-and-swap token.
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>);
    /// Writes a value; with `cas`, only if nobody wrote since that token was read. (Envoy does not
    /// guard a key's first insert by CAS.)
    fn shared_set(&mut self, key: &str, value: &[u8], cas: Option<u32>)
        -> Result<(), WriteRefused>;

    /// Registers the named queue for this VM (the last VM to register a name is notified).
    fn queue_register(&mut self, name: &str) -> Option<u32>;
    fn queue_push(&mut self, queue: u32, message: &[u8]) -> bool;
    fn queue_pop(&mut self, queue: u32) -> Option<Vec<u8>>;

    /// Sends a call; its answer comes back through the VM's (or the request's) call-response hook
    /// with the returned token.
    fn http_call(&mut self, call: &HttpCall) -> Option<u32>;

    /// Records one field of the current request's routing decision where the proxy's access logs
    /// and traces can read it (Envoy: filter state `wasm.<name>`); a later call with the same name
    /// replaces the value. Only meaningful inside a request's callbacks.
    fn export_decision_field(&mut self, name: &str, value: &str);

    /// Adds to the series of `counter` with these labels (in the order of `counter.labels()`).
    fn count_in(&mut self, counter: Counter, labels: &Labels<'_>, n: u64);
    fn gauge_in(&mut self, gauge: Gauge, labels: &Labels<'_>, value: u64);
    fn histogram_in(&mut self, histogram: Histogram, labels: &Labels<'_>, value: u64);

    /// A gateway-wide counter (one without labels).
    fn count(&mut self, counter: Counter, n: u64) {
        self.count_in(counter, &[], n);
    }
    fn gauge(&mut self, gauge: Gauge, value: u64) {
        self.gauge_in(gauge, &[], value);
    }
    fn histogram(&mut self, histogram: Histogram, value: u64) {
        self.histogram_in(histogram, &[], value);
    }
}
