//! The core's own cost per request, natively: parse a 16 KB chat body, hash it, plan (scheduler and
//! P/D) and observe, as the request path does, against 4 pods that hold part of the prompt.
//! `cargo run --release --example plan_cost` — prints µs per request (median of 5 rounds), and the
//! parse alone (with `--features testing`, also the whole-tree parser it replaced, in the same run).
//!
//! It only uses API that both the count-based scheduler (commit 4b8e149) and the predicted-TTFT one
//! share but the parser's path, so the same file times either (in a checkout of 4b8e149, copy it and
//! replace `kvroute::protocol::parse` with `kvroute::request`).
#![allow(clippy::too_many_lines)] // a measurement script, not production code
#![allow(clippy::expect_used, clippy::indexing_slicing)] // a measurement tool, not plugin code

use std::time::Instant;

fn main() {
    let pods = [
        "10.0.0.1:8000",
        "10.0.0.2:8000",
        "10.0.0.3:8000",
        "10.0.0.4:8000",
    ];
    let config = kvroute::config::Config::parse(
        format!(
            r#"{{"pools":[{{"name":"p","endpoints":["{}","{}","{}","{}"]}}]}}"#,
            pods[0], pods[1], pods[2], pods[3]
        )
        .as_bytes(),
    )
    .expect("config");
    let now = 1_000_000u64;
    let table = format!(
        r#"{{"format":2,"version":1,"published_ms":{now},"pods":[{}]}}"#,
        pods.iter()
            .map(|a| format!(
                r#"{{"addr":"{a}","role":"aggregated","metrics_at_ms":{now},"failing":false,
                   "metrics":{{"waiting":1,"running":4,"kv_usage":0.3,"block_size":16,"num_gpu_blocks":4096,"models":["m"]}}}}"#
            ))
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut router = kvroute::router::Router::new();
    router.apply_load_table(
        &config,
        kvroute::pod::load::LoadTable::decode(table.as_bytes()).expect("table"),
    );
    let system = "You are a careful assistant. ".repeat(560); // ~16 KB
    let rounds: Vec<f64> = (0..5)
        .map(|round| {
            let n = 4000;
            let start = Instant::now();
            for i in 0..n {
                let body = format!(
                    r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"question {round} {i}"}}]}}"#
                );
                let view = parse(&body);
                let blocks = kvroute::affinity::Blocks::of(&config.block, &view, None);
                let plan = router.plan(&config, &view.model, &blocks, Default::default(), now);
                if let kvroute::scheduler::Decision::Route { ranked, .. } = &plan.decision {
                    let addr = ranked[0].addr.clone();
                    router.affinity.observe(&kvroute::state::messages::Observation {
                        addr,
                        hashes: blocks.hashes,
                    });
                }
            }
            start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        })
        .collect();
    report(
        "parse + hash + plan + observe, 16 KB chat body, 4 pods",
        &rounds,
    );
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"question 0 0"}}]}}"#
    );
    let rounds: Vec<f64> = (0..5)
        .map(|_| {
            let n = 20_000;
            let start = Instant::now();
            for _ in 0..n {
                std::hint::black_box(parse(std::hint::black_box(&body)));
            }
            start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        })
        .collect();
    report("parse alone, 16 KB chat body", &rounds);
    // The whole-tree parser it replaced (`--features testing`), timed in the same run.
    #[cfg(feature = "testing")]
    {
        let rounds: Vec<f64> = (0..5)
            .map(|_| {
                let n = 20_000;
                let start = Instant::now();
                for _ in 0..n {
                    std::hint::black_box(kvroute::protocol::parse::reference::parse(
                        kvroute::protocol::parse::Endpoint::ChatCompletions,
                        std::hint::black_box(body.as_bytes()),
                    ));
                }
                start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
            })
            .collect();
        report(
            "parse alone, the whole-tree parser before, 16 KB chat body",
            &rounds,
        );
    }
}

fn report(what: &str, rounds: &[f64]) {
    let mut sorted = rounds.to_vec();
    sorted.sort_by(f64::total_cmp);
    println!(
        "{what}: {:.2} µs per request (median of 5; rounds {:?})",
        sorted[2],
        rounds
            .iter()
            .map(|r| (r * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    );
}

fn parse(body: &str) -> kvroute::protocol::parse::RequestView {
    kvroute::protocol::parse::parse(
        kvroute::protocol::parse::Endpoint::ChatCompletions,
        body.as_bytes(),
    )
    .expect("body")
}
