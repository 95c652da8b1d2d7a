//! A real Prometheus (Debian's `prometheus`) scraping a running Envoy + kvroute + simulated P/D
//! pods on loopback, with `deploy/monitoring/kvroute-rules.yaml` loaded: after a short load every
//! recording rule and every query of the Grafana dashboard returns data (a finite value), the
//! series carry the labels the README documents, and Envoy's own `/stats/prometheus` page has
//! every kvroute counter ending in `_total` and no label left in a name.
//!
//! Skips, saying so, where the `prometheus` binary is not installed (`make sysdeps`).

mod common;

use common::*;
use harness::{
    free_port, on_path, plugin_config, repo_root, wait_for, Envoy, EnvoyOptions, Lb, Proc, Sim,
};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn yaml(text: &str) -> Value {
    Value::deserialize(serde_yaml_ng::Deserializer::from_str(text)).unwrap()
}

/// Prometheus on a free loopback port, scraping `target`'s `/stats/prometheus` every second, with
/// the shipped rules (evaluated every second instead of every 15 s).
struct Prometheus {
    _proc: Proc,
    url: String,
    dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Prometheus {
    async fn start(bin: &Path, target: &str) -> Prometheus {
        let dir = std::env::temp_dir().join(format!(
            "kvroute-prometheus-{}-{}",
            std::process::id(),
            free_port().unwrap()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let rules =
            std::fs::read_to_string(repo_root().join("deploy/monitoring/kvroute-rules.yaml"))
                .unwrap();
        assert!(
            rules.contains("interval: 15s"),
            "the recording group's interval"
        );
        std::fs::write(
            dir.join("kvroute-rules.yaml"),
            rules.replace("interval: 15s", "interval: 1s"),
        )
        .unwrap();
        let config = json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["kvroute-rules.yaml"],
            "scrape_configs": [{
                "job_name": "kvroute-gateway",
                "metrics_path": "/stats/prometheus",
                "static_configs": [{"targets": [target]}]
            }]
        });
        std::fs::write(dir.join("prometheus.yml"), config.to_string()).unwrap();
        let port = free_port().unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let proc = Proc::spawn(
            "prometheus",
            Command::new(bin)
                .current_dir(&dir)
                .arg(format!(
                    "--config.file={}",
                    dir.join("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log),
        )
        .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let ready = wait_for(Duration::from_secs(30), "prometheus ready", || async {
            reqwest::get(format!("{url}/-/ready"))
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        if let Err(e) = ready {
            panic!(
                "{e}; log:\n{}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
        }
        Prometheus {
            _proc: proc,
            url,
            dir,
        }
    }

    /// The instant vector of `query`, as Prometheus's HTTP API returns it.
    async fn query(&self, query: &str) -> Vec<Value> {
        let v: Value = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", query)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["status"], "success", "{query}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Whether `query` returns at least one sample with a finite value.
    async fn has_data(&self, query: &str) -> bool {
        self.query(query).await.iter().any(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        })
    }
}

fn recording_rules() -> Vec<String> {
    let text =
        std::fs::read_to_string(repo_root().join("deploy/monitoring/kvroute-rules.yaml")).unwrap();
    let mut names: Vec<String> = yaml(&text)["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["record"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Every target of every dashboard panel, with the `pool` variable at "All".
fn dashboard_queries() -> Vec<String> {
    let path = repo_root().join("deploy/monitoring/grafana-dashboard.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().replace("$pool", ".*"))
        .collect()
}

/// The label values of `label` over the series `query` returns.
fn label_values(series: &[Value], label: &str) -> BTreeSet<String> {
    series
        .iter()
        .filter_map(|s| s["metric"][label].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_scrapes_every_documented_series_and_every_dashboard_query_has_data() {
    let Some(prometheus_bin) = on_path("prometheus") else {
        eprintln!(
            "SKIP prometheus_scrapes_every_documented_series_and_every_dashboard_query_has_data: \
             the prometheus binary is not installed (Debian package prometheus: `make sysdeps`)"
        );
        return;
    };
    let prefill = Sim::start(2, &["--time-scale", TIME_SCALE, "--role", "prefill"]).unwrap();
    let decode = Sim::start(2, &["--time-scale", TIME_SCALE, "--role", "decode"]).unwrap();
    let config = plugin_config(
        &decode.pods,
        json!({
            "pools": [
                {"name": "prefill", "role": "prefill", "endpoints": prefill.pods},
                {"name": "decode", "role": "decode", "endpoints": decode.pods}
            ],
            "pd": {"mode": "inline", "prefill_timeout_ms": 5000}
        }),
    );
    let envoy = Envoy::start(&EnvoyOptions::new(
        &decode.pods,
        Lb::OverrideHost,
        Some(config),
    ))
    .await
    .unwrap();
    wait_healthy(&envoy, 4).await;
    let prom = Prometheus::start(&prometheus_bin, &envoy.admin).await;

    // Load over several scrapes: tenants whose long prompts are split through a prefill pod and
    // then found cached on their decode pod, short prompts decoded alone, streamed with usage
    // (TTFT, cache confirmations), and a decode pod failing some requests for a while (failures
    // against it, retries onto its fallback).
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let mut ok = 0;
    // The decode pod that holds tenant 0's prompt is the one made to fail: its next requests are
    // drawn to it by their prefix, so failures against it are certain, not a matter of which pod
    // a short prompt happened to land on.
    let mut failing: Option<String> = None;
    for round in 0..8 {
        if round == 3 {
            let pod = failing
                .clone()
                .expect("tenant 0 was answered by a decode pod");
            sim_fault(&pod, json!({"fail_ratio": 1.0})).await;
        }
        if round == 5 {
            let failures = envoy
                .stat("wasmcustom.kvroute.health.request_failures_total")
                .await;
            assert!(failures > 0, "no request met the failing pod {failing:?}");
            sim_fault(failing.as_deref().unwrap(), json!({})).await;
        }
        if (3..5).contains(&round) {
            // Distinct short prompts: any that land on the failing pod are retried elsewhere.
            for i in 0..6 {
                let r = post(
                    &client,
                    &url,
                    &chat(&format!("Answer {round}-{i}."), "go", 4, true),
                    &[],
                )
                .await;
                ok += u32::from(r.status == 200);
            }
        }
        for tenant in 0..3 {
            let system = system_prompt(&format!("prom-{tenant}-"), 2500);
            let r = post(
                &client,
                &url,
                &chat(&system, &format!("q{round}"), 6, true),
                &[],
            )
            .await;
            ok += u32::from(r.status == 200);
            if tenant == 0 && round < 3 {
                failing = r.pod.clone().filter(|p| decode.pods.contains(p));
            }
        }
        let r = post(
            &client,
            &url,
            &chat("Be brief.", &format!("s{round}"), 4, true),
            &[],
        )
        .await;
        ok += u32::from(r.status == 200);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert!(ok >= 40, "{ok} of 44 requests answered 200");

    // Every recording rule and every dashboard query returns data once the rules have run.
    let mut queries: Vec<String> = recording_rules();
    assert!(queries.len() >= 10, "{queries:?}");
    queries.extend(dashboard_queries());
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut missing: Vec<String>;
    loop {
        missing = Vec::new();
        for q in &queries {
            if !prom.has_data(q).await {
                missing.push(q.clone());
            }
        }
        if missing.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        missing.is_empty(),
        "{} of {} queries returned no data:\n{}",
        missing.len(),
        queries.len(),
        missing.join("\n")
    );
    println!(
        "{} queries (recording rules and dashboard) returned data",
        queries.len()
    );
    // The check can fail: the series names before this scheme are gone.
    for old in [
        "kvroute_requests_routed",
        "kvroute_pd_prefill_pool_queue_x1000",
    ] {
        assert!(!prom.has_data(old).await, "{old} still has data");
    }

    // The labels, as documented.
    let routed = prom.query("kvroute_requests_routed_total").await;
    assert_eq!(
        label_values(&routed, "pool"),
        BTreeSet::from(["decode".into()])
    );
    assert_eq!(
        label_values(&routed, "role"),
        BTreeSet::from(["decode".into()])
    );
    assert_eq!(
        label_values(&routed, "model"),
        BTreeSet::from([MODEL.into()])
    );
    let reasons = label_values(&routed, "reason");
    assert!(
        reasons.contains("prefix_hit") && reasons.contains("load"),
        "{reasons:?}"
    );
    let known = prom.query("kvroute_pods_known").await;
    assert_eq!(
        label_values(&known, "pool"),
        BTreeSet::from(["decode".into(), "prefill".into()])
    );
    let speeds = prom.query("kvroute_pod_prefill_tokens_per_second").await;
    let all_pods: BTreeSet<String> = prefill.pods.iter().chain(&decode.pods).cloned().collect();
    assert_eq!(
        label_values(&speeds, "pod"),
        all_pods,
        "one series per pod, named ip:port"
    );
    let versions = label_values(&prom.query("kvroute_build_info").await, "version");
    assert_eq!(versions.len(), 1, "{versions:?}");
    assert!(
        versions
            .iter()
            .all(|v| v.split('.').all(|n| n.parse::<u32>().is_ok())),
        "{versions:?}"
    );

    // What Envoy itself serves: counters in _total, every label extracted from the names.
    let page = reqwest::get(format!("http://{}/stats/prometheus", envoy.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut counters = 0;
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE kvroute_") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(!name.contains('='), "a label left in the name: {line}");
            if kind == "counter" {
                counters += 1;
                assert!(name.ends_with("_total"), "{line}");
            }
        }
    }
    assert!(
        counters >= 20,
        "{counters} kvroute counters on Envoy's page"
    );
}
