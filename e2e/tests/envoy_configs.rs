//! Every configuration under `envoy/`, as shipped: `envoy --mode validate -c envoy/FILE` from the
//! repository root accepts it (validation instantiates kvroute, so the plugin's own configuration
//! check runs too), every Wasm filter in it sets a failure policy, and a misspelt kvroute field in
//! a copy is refused by name, so the check can fail. And the limits they lift: the pool cluster's
//! circuit breakers are the harness's (the tests and benchmarks run what users deploy), and
//! Envoy's defaults would fail a burst of retries that the shipped limits serve.

use harness::{envoy_bin, repo_root, wasm_path};
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn shipped_configs() -> Vec<PathBuf> {
    let dir = repo_root().join("envoy");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "envoy/ holds the three wirings: {files:?}"
    );
    files
}

/// `envoy --mode validate -c CONFIG` started in the repository root, as the README says to run it.
fn validate(config: &Path) -> (bool, String) {
    let mut child = Command::new(envoy_bin().unwrap())
        .current_dir(repo_root())
        .args(["--mode", "validate", "-l", "info", "-c"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("envoy");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("envoy --mode validate {} took over 120 s", config.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Every object in `v` that has a `vm_config` (a Wasm plugin's `PluginConfig`).
fn plugin_configs(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(m) => {
            if m.contains_key("vm_config") {
                out.push(v.clone());
            }
            m.values().for_each(|c| plugin_configs(c, out));
        }
        Value::Array(a) => a.iter().for_each(|c| plugin_configs(c, out)),
        _ => {}
    }
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    Value::deserialize(serde_yaml_ng::Deserializer::from_str(&text))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_shipped_envoy_config_validates_as_shipped() {
    wasm_path().expect("make build first");
    for config in shipped_configs() {
        let relative = config.strip_prefix(repo_root()).unwrap().to_path_buf();
        let (ok, out) = validate(&relative);
        assert!(
            ok,
            "envoy --mode validate -c {} failed:\n{out}",
            relative.display()
        );
        assert!(out.contains("OK"), "{out}");

        let mut plugins = Vec::new();
        plugin_configs(&yaml(&config), &mut plugins);
        assert!(
            !plugins.is_empty(),
            "{}: no kvroute filter",
            relative.display()
        );
        for p in &plugins {
            assert!(
                p["failure_policy"].is_string(),
                "{}: a Wasm plugin without failure_policy: {p}",
                relative.display()
            );
            // The module path is relative to the repository root (runnable after `make build`).
            let module = p["vm_config"]["code"]["local"]["filename"]
                .as_str()
                .unwrap();
            assert!(
                repo_root().join(module).exists(),
                "{}: {module} is not the built module",
                relative.display()
            );
        }
    }
}

#[test]
fn a_misspelt_field_in_a_copy_is_refused_by_name() {
    wasm_path().expect("make build first");
    let dir = std::env::temp_dir().join(format!("kvroute-envoy-configs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for config in shipped_configs() {
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(text.contains("\"pools\""), "{}", config.display());
        let copy = dir.join(config.file_name().unwrap());
        std::fs::write(&copy, text.replace("\"pools\"", "\"pols\"")).unwrap();
        let (ok, out) = validate(&copy);
        assert!(
            !ok,
            "{}: a misspelt kvroute field passed:\n{out}",
            config.display()
        );
        assert!(out.contains("field `pols`"), "{out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `pool` cluster of a bootstrap.
fn pool_cluster(config: &Value) -> &Value {
    config["static_resources"]["clusters"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "pool"))
        .unwrap_or_else(|| panic!("no pool cluster"))
}

#[test]
fn every_shipped_config_lifts_envoys_request_and_retry_limits_as_the_tests_run() {
    for config in shipped_configs() {
        let v = yaml(&config);
        assert_eq!(
            pool_cluster(&v)["circuit_breakers"],
            harness::pool_circuit_breakers(),
            "{}",
            config.display()
        );
    }
}

/// A failing pod's refusals retried all at once on a slow fallback, through the override-host pool
/// as shipped (the client names primary and fallback, as kvroute does): how many of `burst`
/// requests were answered 200, and Envoy's count of retries it refused.
async fn burst_onto_a_fallback(envoy_default_limits: bool, burst: usize) -> (usize, u64) {
    use harness::{Envoy, EnvoyOptions, Lb, Sim};
    let sim = Sim::start(2, &["--time-scale", "0.05"]).unwrap();
    let (failing, slow) = (sim.pods[0].clone(), sim.pods[1].clone());
    let options = EnvoyOptions {
        envoy_default_limits,
        ..EnvoyOptions::new(&sim.pods, Lb::OverrideHost, None)
    };
    let envoy = Envoy::start(&options).await.unwrap();
    let client = reqwest::Client::new();
    for (pod, fault) in [
        (
            &failing,
            serde_json::json!({"fail_ratio": 1.0, "fail_status": 503}),
        ),
        (&slow, serde_json::json!({"stall_ms": 1500})),
    ] {
        let r = client
            .post(format!("http://{pod}/sim/fault"))
            .json(&fault)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    let url = envoy.url("/v1/completions");
    let sends = (0..burst).map(|i| {
        let (client, url) = (client.clone(), url.clone());
        let destinations = format!("{failing},{slow}");
        tokio::spawn(async move {
            let body = serde_json::json!({"model": "sim-model", "prompt": format!("burst {i}"), "max_tokens": 1});
            client
                .post(url)
                .header("x-gateway-destination-endpoint", destinations)
                .json(&body)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        })
    });
    let statuses = futures::future::join_all(sends).await;
    let ok = statuses
        .into_iter()
        .filter(|s| matches!(s, Ok(200)))
        .count();
    let refused = envoy.stat("cluster.pool.upstream_rq_retry_overflow").await;
    (ok, refused)
}

#[tokio::test]
async fn a_burst_of_retries_onto_a_fallback_is_served_where_envoys_defaults_fail_it() {
    // 24 requests refused by their primary at once, retried on a fallback that takes 1.5 s:
    // Envoy's default allows 3 retries in flight, the shipped limits all of them.
    let burst = 24;
    let (ok, refused) = burst_onto_a_fallback(false, burst).await;
    assert_eq!((ok, refused), (burst, 0), "shipped limits");
    let (ok, refused) = burst_onto_a_fallback(true, burst).await;
    eprintln!("Envoy's default limits: {ok} of {burst} served, {refused} retries refused");
    assert!(
        ok <= burst / 2 && refused >= (burst / 2) as u64,
        "Envoy's defaults: {ok} served, {refused} retries refused"
    );
}
