//! One routed request's whole path through the core, natively, on the fake host: two VMs of one
//! Envoy (a leader that polls 4 pods and a worker), and on the worker, per request, the headers,
//! the 16 KB chat body (parse, hash, plan, the work board, observe), the upstream, the response
//! headers, two response body chunks and the end. What `plan_cost` leaves out: the work board's
//! reads and writes, the page ring, the metrics and the response side.
//!
//! `cargo run --release --example request_cost --features testing` prints µs per request, the
//! same prompt each time (`repeat`) and a new one each time (`fresh`; an argument runs one of
//! them, a second sets the requests per round, 400 by default), median of 5 rounds; `census`
//! prints the port calls (host calls in Envoy) one request makes, by kind. Built for
//! `wasm32-wasip1` it runs under Node (`tools/phase_profile/node_profile.mjs`, `node --cpu-prof`),
//! whose V8 names the functions the Envoy build's stripped binary cannot (see docs/results.md,
//! "Where the filter's time goes").
#![allow(
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::unwrap_used
)] // a measurement tool

use kvroute::config::Config;
use kvroute::flow::{BodyOutcome, RequestFlow};
use kvroute::port::Host;
use kvroute::testing::{FakeHost, Store};
use kvroute::vm::Vm;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

const PODS: [&str; 4] = [
    "10.0.0.1:8000",
    "10.0.0.2:8000",
    "10.0.0.3:8000",
    "10.0.0.4:8000",
];

fn page(pod: usize) -> String {
    format!(
        "vllm:num_requests_running{{model_name=\"m\"}} {}.0\n\
         vllm:num_requests_waiting{{model_name=\"m\"}} 0.0\n\
         vllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.3\n\
         vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"27042\"}} 1.0\n",
        pod % 3
    )
}

/// One leader tick, every poll answered at once.
fn lead(leader: &mut (Vm, FakeHost)) {
    let (vm, host) = leader;
    let now = host.now_ms();
    vm.tick(host, now);
    for (token, call) in host.take_calls() {
        let pod = PODS.iter().position(|p| *p == call.authority).unwrap_or(0);
        if call.path == "/metrics" {
            vm.on_call_response(host, token, 200, page(pod).as_bytes(), now);
        } else {
            vm.on_call_response(host, token, 200, br#"{"data":[{"id":"m"}]}"#, now);
        }
    }
}

fn request(worker: &mut (Vm, FakeHost), body: &[u8]) {
    let (vm, host) = worker;
    let headers = |name: &str| match name {
        ":method" => Some("POST".to_string()),
        ":path" => Some("/v1/chat/completions".to_string()),
        _ => None,
    };
    let mut flow = RequestFlow::new();
    flow.on_request_headers(vm, host, &headers, false);
    let BodyOutcome::Route(route) = flow.on_request_body(vm, host, Some(body)) else {
        panic!("not routed")
    };
    let pod = route.destinations.split(',').next().unwrap().to_string();
    flow.on_upstream(vm, host, &pod);
    flow.on_response_headers(vm, host, Some("200"), false);
    flow.on_response_body(vm, host, 200, None, false);
    flow.on_response_body(vm, host, 0, None, true);
    flow.on_done(vm, host, None, None);
}

fn main() {
    let config = Config::parse(
        serde_json::json!({"pools": [{"name": "p", "endpoints": PODS}]})
            .to_string()
            .as_bytes(),
    )
    .expect("config");
    let store = Rc::new(RefCell::new(Store::default()));
    let mut leader = (Vm::new(config.clone(), None, 1), FakeHost::new(&store));
    let mut worker = (Vm::new(config.clone(), None, 2), FakeHost::new(&store));
    for _ in 0..5 {
        lead(&mut leader);
        let (vm, host) = &mut worker;
        let now = host.now_ms();
        vm.tick(host, now);
        leader.1.advance_ms(100);
        worker.1.advance_ms(100);
    }
    let system = ("You are a careful assistant. ".repeat(600))[..16384].to_string();
    let body = |tag: &str| {
        serde_json::json!({"model": "m", "max_tokens": 1, "messages": [
            {"role": "system", "content": format!("{tag}{system}")},
            {"role": "user", "content": "hi"}]})
        .to_string()
        .into_bytes()
    };
    let only = std::env::args().nth(1);
    // Requests per round (a second argument; more for a profile with enough samples).
    let per_round: usize = std::env::args()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    if only.as_deref() == Some("census") {
        // The port calls one request makes on the worker (each a Proxy-Wasm host call in Envoy;
        // the filter's own header, body and property calls are on top, see `src/host/filter.rs`).
        for (kind, tag) in [("repeat", ""), ("repeat", ""), ("fresh", "census ")] {
            request(&mut worker, &body(tag));
            worker.1.advance_ms(1);
            let census = worker.1.take_census();
            let total: u64 = census.values().sum();
            println!("{kind:6} {total:3} port calls: {census:?}");
        }
        return;
    }
    for kind in ["repeat", "fresh"] {
        if only.as_deref().is_some_and(|o| o != kind) {
            continue;
        }
        let mut rounds = Vec::new();
        for round in 0..5 {
            let n = per_round;
            let bodies: Vec<Vec<u8>> = (0..n)
                .map(|i| {
                    body(&if kind == "fresh" {
                        format!("{round} {i} ")
                    } else {
                        String::new()
                    })
                })
                .collect();
            let start = Instant::now();
            for b in &bodies {
                request(&mut worker, b);
                worker.1.advance_ms(1);
            }
            rounds.push(start.elapsed().as_secs_f64() * 1e6 / n as f64);
            // The leader's tick between rounds, as a poll would come.
            lead(&mut leader);
            leader.1.advance_ms(100);
        }
        let mut sorted = rounds.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "{kind} 16 KB chat request, headers to end, 4 pods: {:.2} µs per request (median of 5; rounds {rounds:.1?})",
            sorted[2]
        );
    }
}
