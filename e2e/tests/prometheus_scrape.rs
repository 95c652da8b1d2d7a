//! A real Prometheus (Debian's `prometheus`) scraping a running Envoy + kvroute + simulated P/D
//! pods on loopback, with nothing loaded but the monitoring objects the chart and the overlays
//! apply (`deploy/kustomize/components/monitoring`: the PrometheusRule's spec as its rule file, the
//! dashboard out of its ConfigMap; `tools/check_helm.py` checks the chart renders the same): after a
//! short load every recording rule (the GIE-named ones too) and every query of the Grafana
//! dashboard returns data (a finite value), every rule evaluates without error and every alert's
//! expression is a valid query on the live data, the series carry the labels docs/metrics.md
//! documents, and Envoy's own `/stats/prometheus` page has every kvroute counter ending in
//! `_total` and no label left in a name.
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

/// The monitoring component's objects (what the overlays apply; the chart renders the same).
const MONITORING: &str = "deploy/kustomize/components/monitoring";

/// The PrometheusRule's spec: the rule groups Prometheus Operator loads.
fn rule_spec() -> Value {
    let text =
        std::fs::read_to_string(repo_root().join(MONITORING).join("prometheusrule.yaml")).unwrap();
    let rule = yaml(&text);
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"].clone()
}

/// The rules of every group of the spec.
fn rules(spec: &Value) -> Vec<Value> {
    spec["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Prometheus on a free loopback port, scraping `target`'s `/stats/prometheus` every second, with
/// the PrometheusRule's rules and no other (its groups evaluated every second instead of every
/// 15 s).
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
        let mut spec = rule_spec();
        for group in spec["groups"].as_array_mut().unwrap() {
            if group.get("interval").is_some() {
                assert_eq!(group["interval"], "15s", "{}", group["name"]);
                group["interval"] = json!("1s");
            }
        }
        // JSON is YAML: the spec as Prometheus' rule file.
        std::fs::write(dir.join("kvroute-rules.yaml"), spec.to_string()).unwrap();
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

fn recording_rules(spec: &Value) -> Vec<String> {
    let mut names: Vec<String> = rules(spec)
        .iter()
        .filter_map(|r| r["record"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Every alert's name and expression.
fn alert_exprs(spec: &Value) -> Vec<(String, String)> {
    rules(spec)
        .iter()
        .filter_map(|r| {
            Some((
                r["alert"].as_str()?.to_string(),
                r["expr"].as_str().unwrap().to_string(),
            ))
        })
        .collect()
}

/// Every target of every panel of the dashboard in the component's ConfigMap, with the `pool`
/// variable at "All".
fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(repo_root().join(MONITORING).join("grafana-dashboard.yaml"))
        .unwrap();
    let config_map = yaml(&text);
    assert_eq!(config_map["kind"], "ConfigMap");
    let dash: Value = serde_json::from_str(
        config_map["data"]["kvroute-dashboard.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
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
    // Prometheus scrapes a new target only after its first discovery cycle (seconds): the load
    // starts once a scrape has seen the gateway, so rates over the load (the retries of the
    // failing pod's requests among them) count from its start.
    wait_for(Duration::from_secs(30), "the first scrape", || {
        prom.has_data("up{job=\"kvroute-gateway\"} == 1")
    })
    .await
    .unwrap();

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
    let spec = rule_spec();
    let mut queries: Vec<String> = recording_rules(&spec);
    assert!(queries.len() >= 10, "{queries:?}");
    for gie in [
        "inference_pool_ready_pods",
        "inference_pool_average_queue_size",
        "inference_pool_average_running_requests",
        "inference_pool_average_kv_cache_utilization",
        "inference_objective_request_total",
        "inference_objective_request_error_total",
    ] {
        assert!(queries.iter().any(|q| q == gie), "{gie} is recorded");
    }
    // A retry happened on the pool's cluster (`pool`), the only one the fallback ratio counts.
    queries.push("kvroute:fallback_ratio:rate5m > 0".into());
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

    // Every alert's expression is a query Prometheus evaluates on these series (the query helper
    // asserts the API's `success`), and Prometheus' own evaluation of every rule went without
    // error.
    let alerts = alert_exprs(&spec);
    assert!(alerts.len() >= 7, "{alerts:?}");
    for (alert, expr) in &alerts {
        let firing = prom.query(expr).await;
        println!("alert {alert}: {} series now", firing.len());
    }
    let v: Value = reqwest::get(format!("{}/api/v1/rules", prom.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["status"], "success", "{v}");
    let mut evaluated = 0;
    for group in v["data"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            assert_eq!(
                rule["health"], "ok",
                "{}: {} ({})",
                group["name"], rule["name"], rule["lastError"]
            );
            evaluated += 1;
        }
    }
    assert_eq!(evaluated, rules(&spec).len(), "every rule loaded: {v}");

    // The GIE-named series, labelled as GIE labels them.
    let ready = prom.query("inference_pool_ready_pods").await;
    assert_eq!(
        label_values(&ready, "name"),
        BTreeSet::from(["decode".into(), "prefill".into()])
    );
    // Averages per pod of the pools' live figures, GIE's KV use a fraction as GIE's is.
    for (series, most) in [
        ("inference_pool_average_kv_cache_utilization", 1.0),
        ("inference_pool_average_running_requests", 64.0),
    ] {
        let found = prom.query(series).await;
        assert_eq!(
            label_values(&found, "name"),
            BTreeSet::from(["decode".into(), "prefill".into()]),
            "{series}"
        );
        for s in &found {
            let v: f64 = s["value"][1].as_str().unwrap_or("").parse().unwrap_or(-1.0);
            assert!((0.0..=most).contains(&v), "{series}: {s}");
        }
    }
    let requests = prom.query("inference_objective_request_total").await;
    assert_eq!(
        label_values(&requests, "model_name"),
        BTreeSet::from([MODEL.into()])
    );
    assert_eq!(
        label_values(&requests, "target_model_name"),
        BTreeSet::from([MODEL.into()])
    );
    assert!(
        requests.iter().all(|s| s["metric"]["pool"].is_null()),
        "{requests:?}"
    );
    let errors = prom.query("inference_objective_request_error_total").await;
    assert_eq!(
        label_values(&errors, "error_code"),
        BTreeSet::from([
            "BadRequest".into(),
            "ResourceExhausted".into(),
            "ServiceUnavailable".into()
        ])
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
