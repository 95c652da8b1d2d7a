//! The Kubernetes manifests of `deploy/kustomize`: every overlay renders with `kubectl kustomize`
//! and every rendered document passes strict schema validation (`tools/check_manifests.py`:
//! Kubernetes' own schemas from kubernetes-validate, the Istio, Gateway API and KEDA CRD schemas
//! in `deploy/schemas`); a misspelt field in any kind is caught; each overlay's kvroute-settings
//! reach the resources that use them.

use serde::Deserialize;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use wasm_tests::harness::{copy_tree, render_overlay, repo_root, tools_bin};

const OVERLAYS: [&str; 5] = ["aggregated", "gateway-api", "pd", "pd-keda", "sidecar-mesh"];

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
    // The four typos of issue 12, each in a different schema: Istio Gateway, VirtualService and
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
    }
}
