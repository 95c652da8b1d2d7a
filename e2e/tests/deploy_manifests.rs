//! The Kubernetes manifests of `deploy/kustomize`: every overlay renders with `kubectl kustomize`
//! and every rendered document passes strict schema validation (`tools/check_manifests.py`:
//! Kubernetes' own schemas from kubernetes-validate, the Istio, Gateway API, Gateway API Inference
//! Extension, LeaderWorkerSet, KEDA and Prometheus Operator CRD schemas in `deploy/schemas`), and
//! so does the GIE example `deploy/inferencepool/example.yaml`; a misspelt field in any kind is
//! caught; each overlay's kvroute-settings reach the resources that use them; the multi-node
//! overlay's pool is the LeaderWorkerSet's leaders only; placeholders left in place are refused by
//! name (`tools/check_placeholders.py`, the last step of `make manifests`).

use harness::{copy_tree, render_overlay, repo_root, tools_bin, OVERLAYS};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs the checker on a `deploy/` tree; its exit status and output.
fn check(deploy: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(tools_bin("python3").unwrap())
        .arg(repo_root().join("tools/check_manifests.py"))
        .arg("--kustomize")
        .arg(deploy.join("kustomize"))
        .arg("--schemas")
        .arg(deploy.join("schemas"))
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("python3");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn every_overlay_renders_and_every_document_passes_its_schema() {
    let (ok, out) = check(&repo_root().join("deploy"), &[]);
    assert!(ok, "{out}");
    for overlay in OVERLAYS {
        assert!(
            out.contains(&format!("ok   overlays/{overlay}:")),
            "{overlay}: {out}"
        );
    }
    assert!(
        out.contains("ok   inferencepool/example.yaml: 7 documents"),
        "{out}"
    );
    assert!(out.contains("0 error(s)"), "{out}");
}

/// Replaces the one occurrence of `from` in `file` (under the copied tree) by `to`.
fn misspell(root: &Path, file: &str, from: &str, to: &str) {
    let path = root.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches(from).count(), 1, "{file}: {from:?}");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn a_misspelt_field_is_caught_in_every_kind() {
    let dir = std::env::temp_dir().join(format!("kvroute-deploy-typos-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let deploy = dir.join("deploy");
    copy_tree(&repo_root().join("deploy"), &deploy).unwrap();
    let k = "kustomize/";
    // Four typical typos, each in a different schema: Istio Gateway, VirtualService and
    // EnvoyFilter, Kubernetes Deployment; then Gateway API, KEDA and HPA ones.
    misspell(
        &deploy,
        &format!("{k}components/model-gateway/gateway.yaml"),
        "protocol: HTTP",
        "protocl: HTTP",
    );
    misspell(
        &deploy,
        &format!("{k}components/model-gateway/gateway.yaml"),
        "attempts: 2",
        "attempt: 2",
    );
    misspell(
        &deploy,
        &format!("{k}base/envoyfilter.yaml"),
        "  workloadSelector:",
        "  priorty: 10\n  workloadSelector:",
    );
    misspell(
        &deploy,
        &format!("{k}components/vllm-pool/model-server.yaml"),
        "limits:",
        "limit:",
    );
    misspell(
        &deploy,
        &format!("{k}overlays/gateway-api/gateway.yaml"),
        "  gatewayClassName: istio",
        "  gatewayClass: istio",
    );
    misspell(
        &deploy,
        &format!("{k}components/autoscaling-keda/scaledobjects.yaml"),
        "{name: vllm-prefill}\n  minReplicaCount",
        "{name: vllm-prefill}\n  minReplicas",
    );
    misspell(
        &deploy,
        &format!("{k}components/autoscaling-hpa/hpa.yaml"),
        "name: vllm-prefill}\n  minReplicas:",
        "name: vllm-prefill}\n  minReplica:",
    );
    misspell(
        &deploy,
        &format!("{k}components/monitoring/podmonitor.yaml"),
        "  - port: http-envoy-prom",
        "  - prot: http-envoy-prom",
    );
    misspell(
        &deploy,
        &format!("{k}components/monitoring/prometheusrule.yaml"),
        "    for: 30m",
        "    fore: 30m",
    );
    misspell(
        &deploy,
        &format!("{k}components/vllm-lws-pool/model-server.yaml"),
        "    restartPolicy: RecreateGroupOnPodRestart",
        "    restartpolicy: RecreateGroupOnPodRestart",
    );
    // The GIE example (an input, checked beside the overlays): InferencePool v1 and
    // InferenceObjective v1alpha2.
    misspell(
        &deploy,
        "inferencepool/example.yaml",
        "  selector:\n    matchLabels:\n      app: vllm-llama3-8b-instruct\n",
        "  selectr:\n    matchLabels:\n      app: vllm-llama3-8b-instruct\n",
    );
    misspell(
        &deploy,
        "inferencepool/example.yaml",
        "  priority: 1\n",
        "  priorty: 1\n",
    );
    let (ok, out) = check(&deploy, &[]);
    assert!(!ok, "typos passed:\n{out}");
    for (kind, field) in [
        ("Gateway istio-system/inference", "'protocl' was unexpected"),
        ("VirtualService models/vllm", "'attempt' was unexpected"),
        (
            "EnvoyFilter istio-system/kvroute",
            "'priorty' was unexpected",
        ),
        ("Deployment models/vllm", "'limit' was unexpected"),
        ("Gateway models/inference", "'gatewayClass' was unexpected"),
        (
            "ScaledObject models/vllm-prefill",
            "'minReplicas' was unexpected",
        ),
        (
            "HorizontalPodAutoscaler models/vllm-prefill",
            "'minReplica' was unexpected",
        ),
        (
            "PodMonitor istio-system/kvroute-gateway",
            "'prot' was unexpected",
        ),
        (
            "PrometheusRule istio-system/kvroute",
            "'fore' was unexpected",
        ),
        (
            "LeaderWorkerSet models/vllm",
            "'restartpolicy' was unexpected",
        ),
        (
            "InferencePool vllm-llama3-8b-instruct",
            "'selectr' was unexpected",
        ),
        ("InferenceObjective food-review", "'priorty' was unexpected"),
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with("FAIL") && l.contains(kind) && l.contains(field)),
            "{kind}: {field} not reported:\n{out}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// The overlay's own `settings.yaml` (the kvroute-settings ConfigMap's data).
fn settings(overlay: &str) -> Value {
    let path = repo_root()
        .join("deploy/kustomize/overlays")
        .join(overlay)
        .join("settings.yaml");
    let doc = &docs(&std::fs::read_to_string(&path).unwrap())[0];
    assert_eq!(doc["metadata"]["name"], "kvroute-settings");
    doc["data"].clone()
}

#[test]
fn each_overlays_settings_reach_the_envoyfilter() {
    for overlay in OVERLAYS {
        let want = settings(overlay);
        let rendered = docs(&render_overlay(overlay).unwrap());
        assert!(
            rendered
                .iter()
                .all(|d| d["metadata"]["name"] != "kvroute-settings"),
            "overlays/{overlay}: the local settings ConfigMap is not applied"
        );
        let ef = rendered
            .iter()
            .find(|d| d["kind"] == "EnvoyFilter")
            .unwrap_or_else(|| panic!("overlays/{overlay}: no EnvoyFilter"));
        let patches = &ef["spec"]["configPatches"];
        let config = &patches[0]["patch"]["value"]["typed_config"]["config"];
        let remote = &config["vm_config"]["code"]["remote"];
        assert_eq!(
            remote["http_uri"]["uri"].as_str(),
            Some(format!("oci://{}", want["image"].as_str().unwrap()).as_str()),
            "overlays/{overlay}"
        );
        assert_eq!(remote["sha256"], want["sha256"], "overlays/{overlay}");
        let shipped: Value =
            serde_json::from_str(config["configuration"]["value"].as_str().unwrap()).unwrap();
        let written: Value = serde_json::from_str(want["kvroute.json"].as_str().unwrap()).unwrap();
        assert_eq!(shipped, written, "overlays/{overlay}: kvroute.json");
        assert_eq!(patches[3]["applyTo"], "CLUSTER", "overlays/{overlay}");
        assert_eq!(
            patches[3]["match"]["cluster"]["service"], want["pool-service"],
            "overlays/{overlay}"
        );
        // kvroute's routed pool is that Service's cluster.
        let cluster = format!("outbound|8000||{}", want["pool-service"].as_str().unwrap());
        assert!(
            written["pools"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["cluster"] == cluster.as_str()),
            "overlays/{overlay}: no pool on {cluster}"
        );
        // The monitoring component's PrometheusRule: deploy/monitoring's rules, with that cluster
        // as the pool cluster the fallback ratio counts retries on.
        let rule = rendered
            .iter()
            .find(|d| d["kind"] == "PrometheusRule")
            .unwrap_or_else(|| panic!("overlays/{overlay}: no PrometheusRule"));
        let mut want_rules = docs(
            &std::fs::read_to_string(repo_root().join("deploy/monitoring/kvroute-rules.yaml"))
                .unwrap(),
        )
        .remove(0);
        let pool_clusters: Vec<&mut Value> = want_rules["groups"][0]["rules"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .filter(|r| r["record"] == "kvroute:pool_cluster:info")
            .collect();
        assert_eq!(pool_clusters.len(), 2, "`pool` and the pool Service's");
        let default = pool_clusters.into_iter().nth(1).unwrap();
        assert_eq!(
            default["labels"]["envoy_cluster_name"],
            "outbound|8000||vllm.models.svc.cluster.local"
        );
        default["labels"]["envoy_cluster_name"] = Value::from(cluster.as_str());
        assert_eq!(
            rule["spec"], want_rules,
            "overlays/{overlay}: the PrometheusRule"
        );
    }
}

/// The multi-node overlay (components/vllm-lws-pool): the pool Service picks exactly the
/// LeaderWorkerSet's leaders, one per group, as the LWS controller labels them (the set's name
/// and `worker-index` "0"; workers 1..size-1), and each engine spans its group: tensor parallel
/// over one pod's GPUs, pipeline parallel over the group's pods.
#[test]
fn the_lws_pool_service_selects_only_the_groups_leaders() {
    let want = settings("lws");
    let rendered = docs(&render_overlay("lws").unwrap());
    let lws = rendered
        .iter()
        .find(|d| d["kind"] == "LeaderWorkerSet")
        .expect("a LeaderWorkerSet");
    let name = lws["metadata"]["name"].as_str().unwrap();
    let namespace = lws["metadata"]["namespace"].as_str().unwrap();
    let pool = want["pool-service"].as_str().unwrap();
    let service = rendered
        .iter()
        .find(|d| {
            d["kind"] == "Service"
                && pool.starts_with(&format!(
                    "{}.{}.svc.",
                    d["metadata"]["name"].as_str().unwrap(),
                    d["metadata"]["namespace"].as_str().unwrap()
                ))
        })
        .unwrap_or_else(|| panic!("no Service {pool}"));
    assert_ne!(
        service["metadata"]["name"], name,
        "the LWS controller owns a headless Service of the set's name"
    );
    assert_eq!(service["metadata"]["namespace"], namespace);
    assert!(
        service["spec"]["clusterIP"].is_null(),
        "ClusterIP, not headless"
    );
    assert_eq!(service["spec"]["ports"][0]["port"], 8000);
    let selector = service["spec"]["selector"].as_object().unwrap();
    let spec = &lws["spec"];
    let template = &spec["leaderWorkerTemplate"];
    let (groups, size) = (
        spec["replicas"].as_u64().unwrap(),
        template["size"].as_u64().unwrap(),
    );
    assert!(size >= 2, "a multi-node group");
    // Every pod of the set as the controller labels it: its template's labels, the set's name,
    // its index in the group.
    let mut selected = vec![];
    for group in 0..groups {
        for index in 0..size {
            let which = if index == 0 {
                "leaderTemplate"
            } else {
                "workerTemplate"
            };
            let mut labels = template[which]["metadata"]["labels"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            labels.insert("leaderworkerset.sigs.k8s.io/name".into(), name.into());
            labels.insert(
                "leaderworkerset.sigs.k8s.io/worker-index".into(),
                index.to_string().into(),
            );
            if selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                selected.push((group, index));
            }
        }
    }
    let leaders: Vec<(u64, u64)> = (0..groups).map(|g| (g, 0)).collect();
    assert_eq!(selected, leaders, "selector {selector:?}");
    // The leader serves the API on the Service's port; the engine spans the group.
    let leader = &template["leaderTemplate"]["spec"]["containers"][0];
    let worker = &template["workerTemplate"]["spec"]["containers"][0];
    assert_eq!(leader["ports"][0]["containerPort"], 8000);
    assert_eq!(leader["readinessProbe"]["httpGet"]["port"], 8000);
    assert!(worker["ports"].is_null(), "workers serve nothing");
    let command = leader["command"][2].as_str().unwrap();
    let gpus = leader["resources"]["limits"]["nvidia.com/gpu"]
        .as_u64()
        .unwrap();
    assert_eq!(
        worker["resources"]["limits"]["nvidia.com/gpu"].as_u64(),
        Some(gpus)
    );
    for arg in [
        "--port 8000".to_string(),
        format!("--tensor-parallel-size {gpus} "),
        "--pipeline-parallel-size $(LWS_GROUP_SIZE)".into(),
        "--ray_cluster_size=$(LWS_GROUP_SIZE)".into(),
    ] {
        assert!(command.contains(&arg), "{arg}: {command}");
    }
    assert!(
        worker["command"][2]
            .as_str()
            .unwrap()
            .contains("--ray_address=$(LWS_LEADER_ADDRESS)"),
        "{worker}"
    );
}

/// The body of `message NAME { … }` in a proto file (the first one, nested or not).
fn proto_message<'a>(proto: &'a str, name: &str) -> &'a str {
    let start = proto
        .find(&format!("message {name} {{"))
        .unwrap_or_else(|| panic!("message {name}"));
    let open = start + proto[start..].find('{').unwrap();
    let mut depth = 0;
    for (i, c) in proto[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &proto[open + 1..open + i];
                }
            }
            _ => {}
        }
    }
    panic!("message {name} is not closed")
}

/// The JSON (camelCase) names of a message body's own fields (not its nested messages').
fn proto_fields(body: &str) -> Vec<String> {
    let mut depth = 0;
    let mut fields = Vec::new();
    for line in body.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        if depth == 0 && code.ends_with(';') && code.contains('=') {
            let words: Vec<&str> = code.split_whitespace().collect();
            if let Some(eq) = words.iter().position(|w| *w == "=") {
                let snake = words[eq - 1];
                let mut camel = String::new();
                let mut upper = false;
                for ch in snake.chars() {
                    if ch == '_' {
                        upper = true;
                    } else if upper {
                        camel.push(ch.to_ascii_uppercase());
                        upper = false;
                    } else {
                        camel.push(ch);
                    }
                }
                fields.push(camel);
            }
        }
        depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
    }
    fields
}

/// The Istio proxy configuration that gives kvroute's series their labels: the same in the
/// gateway-api overlay's Gateway and in the patch for other proxies, every field one of Istio's
/// ProxyConfig (istio/api's proto, `deploy/schemas/istio-proxyconfig.proto`), `extraStatTags`
/// naming every label kvroute writes (istio-agent makes each the regex the shipped Envoy configs
/// carry), and the patched Deployment valid for Kubernetes.
#[test]
fn the_istio_proxy_configuration_extracts_every_kvroute_label() {
    const ANNOTATION: &str = "proxy.istio.io/config";
    let patch_path = repo_root().join("deploy/kustomize/proxy-stats/pod-annotations.yaml");
    let patch = docs(&std::fs::read_to_string(&patch_path).unwrap()).remove(0);
    let from_patch = patch["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
        .as_str()
        .expect("the annotation in the patch")
        .to_string();
    let rendered = docs(&render_overlay("gateway-api").unwrap());
    let gateway = rendered
        .iter()
        .find(|d| {
            d["kind"] == "Gateway"
                && d["apiVersion"]
                    .as_str()
                    .unwrap()
                    .contains("gateway.networking.k8s.io")
        })
        .expect("the Gateway");
    assert_eq!(
        gateway["spec"]["infrastructure"]["annotations"][ANNOTATION].as_str(),
        Some(from_patch.as_str()),
        "one proxy configuration"
    );

    let proxy_config = docs(&from_patch).remove(0);
    let proto = std::fs::read_to_string(repo_root().join("deploy/schemas/istio-proxyconfig.proto"))
        .unwrap();
    let config_fields = proto_fields(proto_message(&proto, "ProxyConfig"));
    let matcher_fields = proto_fields(proto_message(&proto, "ProxyStatsMatcher"));
    assert!(
        config_fields.contains(&"extraStatTags".to_string()),
        "{config_fields:?}"
    );
    assert!(
        !config_fields.contains(&"extraStatTag".to_string()),
        "the check can fail"
    );
    for key in proxy_config.as_object().unwrap().keys() {
        assert!(
            config_fields.contains(key),
            "ProxyConfig has no field `{key}`"
        );
    }
    for key in proxy_config["proxyStatsMatcher"]
        .as_object()
        .unwrap()
        .keys()
    {
        assert!(
            matcher_fields.contains(key),
            "ProxyStatsMatcher has no field `{key}`"
        );
    }
    let prefixes: Vec<&str> = proxy_config["proxyStatsMatcher"]["inclusionPrefixes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        prefixes
            .iter()
            .any(|p| "wasmcustom.kvroute.pods_healthy".starts_with(p)),
        "{prefixes:?} keep kvroute's stats"
    );
    // And the pool cluster's retries, the fallback ratio's numerator.
    let suffixes: Vec<&str> = proxy_config["proxyStatsMatcher"]["inclusionSuffixes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        suffixes.iter().any(|s| {
            "cluster.outbound|8000||vllm.models.svc.cluster.local.upstream_rq_retry".ends_with(s)
        }),
        "{suffixes:?} keep the pool cluster's retries"
    );
    let tags: Vec<&str> = proxy_config["extraStatTags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tags, kvroute::metrics::LABELS, "every label kvroute writes");
    // istio-agent's bootstrap template (tools/packaging/common/envoy_bootstrap.json) turns each
    // tag into `({{ $tag }}=\.=(.*?);\.;)`: the shipped configurations' regexes.
    let shipped = harness::stats_config();
    for (i, tag) in tags.iter().enumerate() {
        assert_eq!(
            shipped["stats_tags"][i]["regex"].as_str().unwrap(),
            format!(r"({tag}=\.=(.*?);\.;)")
        );
    }

    // Patched onto an ingress gateway Deployment (kubectl's own strategic merge), still valid.
    let dir = std::env::temp_dir().join(format!("kvroute-proxy-stats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let deployment = dir.join("istio-ingressgateway.yaml");
    std::fs::write(
        &deployment,
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: istio-ingressgateway, namespace: istio-system}
spec:
  selector: {matchLabels: {istio: ingressgateway}}
  template:
    metadata:
      labels: {istio: ingressgateway}
      annotations: {prometheus.io/scrape: "true"}
    spec:
      containers:
      - {name: istio-proxy, image: auto}
"#,
    )
    .unwrap();
    let out = Command::new(tools_bin("kubectl").unwrap())
        .args([
            "patch",
            "--local",
            "--type",
            "strategic",
            "-o",
            "yaml",
            "-f",
        ])
        .arg(&deployment)
        .arg("--patch-file")
        .arg(&patch_path)
        .stdin(Stdio::null())
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let patched = dir.join("patched.yaml");
    std::fs::write(&patched, &out.stdout).unwrap();
    let merged = docs(&String::from_utf8_lossy(&out.stdout)).remove(0);
    let annotations = &merged["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations[ANNOTATION].as_str(), Some(from_patch.as_str()));
    assert_eq!(
        annotations["prometheus.io/scrape"], "true",
        "merged, not replaced"
    );
    let (ok, text) = check(
        &repo_root().join("deploy"),
        &["--files", patched.to_str().unwrap()],
    );
    assert!(ok, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tools/check_placeholders.py` (the last step of `make manifests`) on a rendered overlay.
fn placeholders(text: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(tools_bin("python3").unwrap())
        .arg(repo_root().join("tools/check_placeholders.py"))
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("check_placeholders");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn unedited_placeholders_are_refused_naming_what_to_set() {
    for overlay in OVERLAYS {
        let rendered = render_overlay(overlay).unwrap();
        let (ok, out) = placeholders(&rendered);
        assert!(!ok, "overlays/{overlay} as shipped: {out}");
        for named in [
            "http_uri.uri: placeholder REGISTRY/kvroute:TAG left in place: set `image`",
            "remote.sha256: placeholder MANIFEST_DIGEST left in place: set `sha256`",
            "placeholder MODEL_NAME",
            "placeholder VLLM_VERSION",
        ] {
            assert!(out.contains(named), "overlays/{overlay}: {named}: {out}");
        }
        assert_eq!(
            out.contains("PROMETHEUS_URL"),
            overlay == "pd-keda",
            "overlays/{overlay}: {out}"
        );
        // Filled in, as a user's copy is: passes.
        let filled = rendered
            .replace(
                "REGISTRY/kvroute:TAG",
                "registry.example.com/ml/kvroute:0.1.0",
            )
            .replace("MANIFEST_DIGEST", &"3e".repeat(32))
            .replace("VLLM_VERSION", "v0.11.0")
            .replace("MODEL_NAME", "meta-llama/Llama-3.1-8B-Instruct")
            .replace("PROMETHEUS_URL", "http://prometheus.monitoring:9090");
        let (ok, out) = placeholders(&filled);
        assert!(ok, "overlays/{overlay} filled in: {out}");
    }
}
