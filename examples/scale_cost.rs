//! What the pool's size costs, natively, on the fake host: for pools of 8, 64 and 512 pods, two
//! VMs (a leader and a worker) of one Envoy share the store; every 200 ms the leader polls every
//! pod (a vLLM `/metrics` page of 3 KB, answered at once) and publishes the load table, and the
//! worker adopts it. Per pool size it prints the leader's cost per tick (issuing the polls, reading
//! the answers, publishing), the worker's cost to adopt the table, the table's and the page ring's
//! sizes in shared data, and the cost of one request's decision (hash a 16 KB prompt, plan against
//! every pod, observe) while one pod holds the prompt's prefix, and of learning from one
//! request's first byte (the pod's speed, once every pod has been timed).
//!
//! `cargo run --release --example scale_cost --features testing` (fastest of 30 ticks and of 5
//! rounds of 1,000 requests). Native
//! figures; V8 in Envoy runs the same code 1.5–3× slower.
#![allow(clippy::too_many_lines)] // a measurement script, not production code
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)] // a measurement tool

use kvroute::config::Config;
use kvroute::port::Host;
use kvroute::testing::{FakeHost, Store};
use kvroute::vm::Vm;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

const POLL_MS: u64 = 200;

/// A vLLM V1 metrics page as a pod serves it: the gauges kvroute reads among the counters and
/// histograms it skips (about 3 KB).
fn metrics_page(pod: usize) -> Vec<u8> {
    let mut page = format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} {}.0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} {}.0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} 0.4375\n\
         vllm:cache_config_info{{block_size=\"16\",enable_prefix_caching=\"True\",engine=\"0\",num_gpu_blocks=\"27042\"}} 1.0\n\
         vllm:prefix_cache_queries_total{{engine=\"0\",model_name=\"m\"}} 1.2e+06\n\
         vllm:prefix_cache_hits_total{{engine=\"0\",model_name=\"m\"}} 9.1e+05\n",
        pod % 7,
        pod % 3
    );
    for le in [
        "0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5",
    ] {
        for name in [
            "time_to_first_token_seconds",
            "inter_token_latency_seconds",
            "e2e_request_latency_seconds",
        ] {
            page.push_str(&format!(
                "vllm:{name}_bucket{{engine=\"0\",le=\"{le}\",model_name=\"m\"}} 1234.0\n"
            ));
        }
    }
    page.into_bytes()
}

/// The fastest of several runs: on a shared machine the others are slowed by whatever else runs.
fn fastest(xs: Vec<f64>) -> f64 {
    xs.into_iter().fold(f64::INFINITY, f64::min)
}

struct Figures {
    leader_tick_us: f64,
    adopt_us: f64,
    table_bytes: usize,
    shared_bytes: usize,
    decision_us: f64,
    learn_us: f64,
}

fn measure(pods: usize) -> Figures {
    let addrs: Vec<String> = (0..pods)
        .map(|i| format!("10.{}.{}.{}:8000", i / 65536, (i / 256) % 256, i % 256))
        .collect();
    let config = Config::parse(
        serde_json::json!({
            "pools": [{"name": "p", "endpoints": addrs}],
            "poll_interval_ms": POLL_MS,
            "stale_after_ms": 5 * POLL_MS,
        })
        .to_string()
        .as_bytes(),
    )
    .expect("config");
    let store = Rc::new(RefCell::new(Store::default()));
    let mut leader = (Vm::new(config.clone(), None, 1), FakeHost::new(&store));
    let mut worker = (Vm::new(config.clone(), None, 2), FakeHost::new(&store));
    let pages: std::collections::HashMap<&str, Vec<u8>> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (a.as_str(), metrics_page(i)))
        .collect();
    let mut leader_ticks = Vec::new();
    let mut adopts = Vec::new();
    for round in 0..40 {
        let (vm, host) = &mut leader;
        let now = host.now_ms();
        let start = Instant::now();
        vm.tick(host, now);
        for (token, call) in host.take_calls() {
            let body = pages
                .get(call.authority.as_str())
                .map_or(&b""[..], |p| &p[..]);
            if call.path == "/metrics" {
                vm.on_call_response(host, token, 200, body, now);
            } else {
                vm.on_call_response(host, token, 404, b"{}", now);
            }
        }
        let elapsed = start.elapsed().as_secs_f64() * 1e6;
        let (wvm, whost) = &mut worker;
        let wnow = whost.now_ms();
        let start = Instant::now();
        wvm.tick(whost, wnow);
        let adopt = start.elapsed().as_secs_f64() * 1e6;
        // The first ticks take the lease and read the models; count the steady state.
        if round >= 10 {
            leader_ticks.push(elapsed);
            adopts.push(adopt);
        }
        leader.1.advance_ms(POLL_MS);
        worker.1.advance_ms(POLL_MS);
    }
    assert_eq!(
        worker.0.router.load_table().pods.len(),
        pods,
        "the worker sees every pod"
    );
    let table_bytes = store
        .borrow()
        .data
        .iter()
        .filter(|(k, _)| k.contains("load"))
        .map(|(_, (v, _))| v.len())
        .sum();
    // One request's decision on the worker: a 16 KB prompt whose system part one pod holds.
    let system = "You are a careful assistant. ".repeat(560);
    let (wvm, whost) = &mut worker;
    let now = whost.now_ms();
    let holder = addrs[pods / 2].clone();
    let view = |q: usize| {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"question {q}"}}]}}"#
        );
        kvroute::protocol::parse::parse(
            kvroute::protocol::parse::Endpoint::ChatCompletions,
            body.as_bytes(),
        )
        .expect("parse")
    };
    let first = kvroute::affinity::Blocks::of(&config.block, &view(0), None);
    wvm.router
        .affinity
        .observe(&kvroute::state::messages::Observation {
            addr: holder.clone(),
            hashes: first.hashes,
        });
    let mut decisions = Vec::new();
    for round in 0..5 {
        let n = 1000;
        let views: Vec<_> = (0..n).map(|i| view(round * n + i + 1)).collect();
        let start = Instant::now();
        for v in &views {
            let blocks = kvroute::affinity::Blocks::of(&config.block, v, None);
            let plan = wvm
                .router
                .plan(&config, &v.model, &blocks, Default::default(), now);
            if let kvroute::scheduler::Decision::Route { ranked, .. } = &plan.decision {
                assert_eq!(ranked[0].addr, holder, "the holder is idle enough to win");
                wvm.router
                    .affinity
                    .observe(&kvroute::state::messages::Observation {
                        addr: ranked[0].addr.clone(),
                        hashes: blocks.hashes,
                    });
            }
        }
        decisions.push(start.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    // One request's first byte on the worker: learning the pod's speed from it, every pod timed.
    let mut learns = Vec::new();
    for round in 0..5 {
        let n = 1000;
        let start = Instant::now();
        for i in 0..n {
            let addr = &addrs[(round * n + i) % pods];
            let first = kvroute::router::FirstToken {
                addr: addr.clone(),
                uncached_tokens: 3000.0,
                prompt_tokens: 3000.0,
                held_prefix: 0,
                tokens: 3000.0,
                decoding: 4.0,
                predicted_ms: 300.0,
                adapter_load_ms: 0.0,
                warm_load_ms: 0.0,
            };
            wvm.router
                .costs
                .learn(&config.costs(), &first, 250.0 + (i % 7) as f64 * 20.0);
        }
        learns.push(start.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    let shared_bytes = store.borrow().data.values().map(|(v, _)| v.len()).sum();
    Figures {
        leader_tick_us: fastest(leader_ticks),
        adopt_us: fastest(adopts),
        table_bytes,
        shared_bytes,
        decision_us: fastest(decisions),
        learn_us: fastest(learns),
    }
}

fn main() {
    println!(
        "{:>5}  {:>16}  {:>14}  {:>11}  {:>17}  {:>18}  {:>20}",
        "pods",
        "leader µs/tick",
        "adopt µs/tick",
        "table KiB",
        "shared data KiB",
        "decision µs/req",
        "first byte µs/req"
    );
    for pods in [8, 64, 512] {
        let f = measure(pods);
        println!(
            "{pods:>5}  {:>16.0}  {:>14.0}  {:>11.1}  {:>17.1}  {:>18.2}  {:>20.2}",
            f.leader_tick_us,
            f.adopt_us,
            f.table_bytes as f64 / 1024.0,
            f.shared_bytes as f64 / 1024.0,
            f.decision_us,
            f.learn_us
        );
    }
    println!(
        "poll interval {POLL_MS} ms: the leader's share of one core = leader µs/tick ÷ {} µs",
        POLL_MS * 1000
    );
}
