//! Prefill/decode through real Envoy with the pods' localities (`pd.topology`): of two equally
//! loaded prefill pods, the one in the decode pod's zone prefills, whichever decode pod a request
//! goes to; and the simulated decode pods pull the KV at the speed of the link between the two.

mod common;

use common::*;
use harness::{plugin_config, Envoy, EnvoyOptions, Lb, Sim};
use serde_json::{json, Value};

/// Two prefill and two decode pods, the first of each in zone `a`, the second in zone `b`.
async fn zoned_stack(topology: bool) -> (Sim, Sim, Envoy, Value) {
    let args = |role: &'static str| vec!["--time-scale", TIME_SCALE, "--role", role];
    let prefill = Sim::start(2, &args("prefill")).unwrap();
    let decode = Sim::start(2, &args("decode")).unwrap();
    let mut localities = serde_json::Map::new();
    for pods in [&prefill.pods, &decode.pods] {
        for (pod, zone) in pods.iter().zip(["a", "b"]) {
            localities.insert(pod.clone(), json!({"region": "eu", "zone": zone}));
        }
    }
    let kv_bytes = if topology { 131_072 } else { 0 };
    let settings = json!({
        "pools": [
            {"name": "prefill", "role": "prefill", "endpoints": prefill.pods},
            {"name": "decode", "role": "decode", "endpoints": decode.pods}
        ],
        "pd": {"mode": "inline", "prefill_timeout_ms": 5000, "probe_interval_ms": 0,
               "topology": {"kv_bytes_per_token": kv_bytes, "localities": localities}}
    });
    let config = plugin_config(&decode.pods, settings);
    let envoy = Envoy::start(&EnvoyOptions::new(
        &decode.pods,
        Lb::OverrideHost,
        Some(config),
    ))
    .await
    .unwrap();
    wait_healthy(&envoy, 4).await;
    let zones = Value::Object(localities);
    (prefill, decode, envoy, zones)
}

/// Sends `n` long prompts, each new; returns (prefill pod's zone, decode pod's zone) of each split.
async fn split_zones(envoy: &Envoy, zones: &Value, n: usize) -> Vec<(String, String)> {
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let zone = |pod: &str| zones[pod]["zone"].as_str().unwrap_or("?").to_string();
    let mut pairs = Vec::new();
    for i in 0..n {
        let system = system_prompt(&format!("zoned-{i}-"), 3000);
        let r = post(&client, &url, &chat(&system, "q", 4, false), &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            r.debug_field("pd").as_deref(),
            Some("disaggregated"),
            "{:?}",
            r.debug
        );
        let prefill = r.debug_field("prefill").expect("a prefill pod");
        let decode = r.pod.expect("a decode pod answered");
        pairs.push((zone(&prefill), zone(&decode)));
    }
    pairs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_prefills_in_the_decode_pods_zone() {
    let (_prefill, _decode, envoy, zones) = zoned_stack(true).await;
    let pairs = split_zones(&envoy, &zones, 8).await;
    assert!(
        pairs.iter().all(|(p, d)| p == d),
        "every split paired within a zone: {pairs:?}"
    );
    // Both decode pods took requests: the pairing is by zone, not one pod pair throughout.
    let decode_zones: std::collections::BTreeSet<&String> = pairs.iter().map(|(_, d)| d).collect();
    assert_eq!(decode_zones.len(), 2, "{pairs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_link_pricing_the_zones_do_not_decide() {
    // The same pods and localities with `kv_bytes_per_token` 0: rendezvous spreads the prefills,
    // so some pair crosses zones (the test above could not pass by chance alone: 8 coin flips).
    let (_prefill, _decode, envoy, zones) = zoned_stack(false).await;
    let pairs = split_zones(&envoy, &zones, 16).await;
    assert!(
        pairs.iter().any(|(p, d)| p != d),
        "some split crossed zones: {pairs:?}"
    );
}

/// A cluster's load assignment with each pod in its own locality (zone `a`, then `b`).
fn zoned_assignment(name: &str, pods: &[String]) -> Value {
    let groups: Vec<Value> = pods
        .iter()
        .zip(["a", "b"])
        .map(|(pod, zone)| {
            let (host, port) = pod.rsplit_once(':').unwrap();
            json!({"locality": {"region": "eu", "zone": zone}, "lb_endpoints": [{"endpoint": {"address":
                {"socket_address": {"address": host, "port_value": port.parse::<u16>().unwrap()}}}}]})
        })
        .collect();
    json!({"cluster_name": name, "endpoints": groups})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zones_come_from_envoys_endpoint_localities() {
    // Both pools given as Envoy clusters whose endpoints carry their locality, as Istio's EDS
    // does; kvroute reads members and places from the admin API, no `localities` configured.
    let args = |role: &'static str| vec!["--time-scale", TIME_SCALE, "--role", role];
    let prefill = Sim::start(2, &args("prefill")).unwrap();
    let decode = Sim::start(2, &args("decode")).unwrap();
    let settings = json!({
        "pools": [
            {"name": "prefill", "role": "prefill", "cluster": "prefill_pods"},
            {"name": "decode", "role": "decode", "cluster": "pool"}
        ],
        "admin_cluster": "kvroute_admin",
        "discovery_interval_ms": 200,
        "pd": {"mode": "inline", "prefill_timeout_ms": 5000, "probe_interval_ms": 0,
               "topology": {"kv_bytes_per_token": 131_072}}
    });
    let mut opts = EnvoyOptions::new(
        &decode.pods,
        Lb::OverrideHost,
        Some(plugin_config(&decode.pods, settings)),
    );
    opts.admin_cluster = true;
    let admin_port = harness::free_port().unwrap();
    let mut bootstrap = harness::envoy_config(&opts, &harness::wasm_path().unwrap(), admin_port);
    let clusters = bootstrap["static_resources"]["clusters"]
        .as_array_mut()
        .unwrap();
    for c in clusters.iter_mut().filter(|c| c["name"] == "pool") {
        c["load_assignment"] = zoned_assignment("pool", &decode.pods);
    }
    clusters.push(
        json!({"name": "prefill_pods", "type": "STATIC", "connect_timeout": "0.5s",
        "load_assignment": zoned_assignment("prefill_pods", &prefill.pods)}),
    );
    let envoy = Envoy::start_with_config(&bootstrap.to_string(), opts.concurrency)
        .await
        .unwrap();
    wait_healthy(&envoy, 4).await;
    let mut zones = serde_json::Map::new();
    for pods in [&prefill.pods, &decode.pods] {
        for (pod, zone) in pods.iter().zip(["a", "b"]) {
            zones.insert(pod.clone(), json!({"zone": zone}));
        }
    }
    let pairs = split_zones(&envoy, &Value::Object(zones), 8).await;
    assert!(
        pairs.iter().all(|(p, d)| p == d),
        "every split paired within a zone: {pairs:?}"
    );
}
