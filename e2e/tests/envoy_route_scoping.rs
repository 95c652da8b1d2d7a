//! Real Envoy, the built plugin: kvroute scoped to the model routes. The filter is listed in the
//! listener disabled (`disabled: true`) and enabled per virtual host by an empty
//! `envoy.config.route.v3.FilterConfig`, so requests for other hosts on the same listener pass
//! Envoy's filter chain without entering the plugin at all: no body buffered, nothing parsed, no
//! routing header, no kvroute series. This is how the shipped Istio patch scopes kvroute to the
//! model hosts (deploy/README.md, "Scoping kvroute to the model routes").

mod common;

use common::*;
use harness::{envoy_config, plugin_config, wasm_path, Envoy, EnvoyOptions, Lb, Sim};
use serde_json::{json, Value};

const MODEL_HOST: &str = "models.example";
const OTHER_HOST: &str = "other.example";

/// The test bootstrap with kvroute disabled in the listener and enabled on one virtual host.
fn scoped_bootstrap(opts: &EnvoyOptions) -> Value {
    let mut bootstrap = envoy_config(opts, &wasm_path().unwrap(), 0);
    let hcm = &mut bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    let filter = &mut hcm["http_filters"][0];
    assert_eq!(filter["name"], "envoy.filters.http.wasm", "{filter}");
    filter["disabled"] = json!(true);
    let all = hcm["route_config"]["virtual_hosts"][0].clone();
    let mut models = all.clone();
    models["name"] = json!("models");
    models["domains"] = json!([MODEL_HOST, format!("{MODEL_HOST}:*")]);
    // `config: {}` (an empty Any) is what enables it: without `config` Envoy 1.40 refuses the
    // bootstrap ("Empty route/virtual host per filter configuration for envoy.filters.http.wasm").
    models["typed_per_filter_config"] = json!({"envoy.filters.http.wasm": {
        "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}});
    hcm["route_config"]["virtual_hosts"] = json!([models, all]);
    bootstrap
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_model_hosts_requests_enter_the_plugin() {
    let sim = Sim::start(2, &["--time-scale", TIME_SCALE]).unwrap();
    let opts = EnvoyOptions::new(
        &sim.pods,
        Lb::OverrideHost,
        Some(plugin_config(&sim.pods, json!({}))),
    );
    let envoy = Envoy::start_with_config(&scoped_bootstrap(&opts).to_string(), opts.concurrency)
        .await
        .unwrap();
    // The plugin's root context polls whatever routes say: the pool is known and healthy.
    wait_healthy(&envoy, 2).await;
    let client = fresh_client();
    let url = envoy.url("/v1/chat/completions");
    let body = chat(&system_prompt("scoped", 200), "hi", 4, false);

    let routed = post(&client, &url, &body, &[("host", MODEL_HOST)]).await;
    assert_eq!(routed.status, 200, "{}", routed.body);
    assert!(
        routed.debug_field("pod").is_some(),
        "the model host's request went through kvroute: {:?}",
        routed.debug
    );
    let after_model = envoy.stat("wasmcustom.kvroute.requests_routed_total").await;
    assert_eq!(after_model, 1, "one routed request counted");

    for _ in 0..3 {
        let other = post(&client, &url, &body, &[("host", OTHER_HOST)]).await;
        assert_eq!(other.status, 200, "{}", other.body);
        assert_eq!(
            other.debug, None,
            "another host's request never entered the plugin"
        );
    }
    // A body kvroute would refuse with its own 400 reaches a pod on the other host, which answers.
    let junk = post_raw(
        &client,
        &url,
        b"\xff not json".to_vec(),
        &[("host", OTHER_HOST)],
    )
    .await;
    assert!(
        junk.pod.is_some(),
        "the pod answered, not kvroute: {} {}",
        junk.status,
        junk.body
    );
    let stats = envoy.stats().await.unwrap();
    let kvroute_requests: u64 = stats
        .iter()
        .filter(|(k, _)| {
            k.starts_with("wasmcustom.kvroute.")
                && (k.ends_with("requests_routed_total") || k.ends_with("unparseable_body_total"))
        })
        .map(|(_, v)| *v)
        .sum();
    assert_eq!(
        kvroute_requests, 1,
        "only the model host's request is in kvroute's series: {stats:?}"
    );
}
