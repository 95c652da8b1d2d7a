//! `kvbench config check` and the configuration's JSON Schema: every configuration the repository
//! ships (the Envoy bootstraps of `envoy/`, the kustomize overlays' settings and their rendered
//! EnvoyFilters; the Helm chart's renderings: `make helm-check`) passes the plugin's own parser,
//! a misspelt field is refused naming its whole path, and
//! `deploy/schemas/kvroute-config.schema.json` is what the wire types generate today and agrees
//! with the parser on the same configurations (checked by Python's `jsonschema`, as an editor or
//! CI would).

use harness::{render_overlay, repo_root, scratch_dir, sibling_bin, tools_bin, OVERLAYS};
use serde::Deserialize;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `kvbench config ARGS` with `stdin` as its standard input: success and everything it printed.
fn kvbench_config(args: &[&str], stdin: &str) -> (bool, String) {
    let mut child = Command::new(sibling_bin("kvbench"))
        .current_dir(repo_root())
        .arg("config")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvbench");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn shipped_files() -> Vec<String> {
    let mut files = vec![];
    for dir in ["envoy"] {
        for entry in std::fs::read_dir(repo_root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                files.push(format!(
                    "{dir}/{}",
                    path.file_name().unwrap().to_string_lossy()
                ));
            }
        }
    }
    for overlay in OVERLAYS {
        files.push(format!("deploy/kustomize/overlays/{overlay}/settings.yaml"));
    }
    files.push("deploy/kustomize/base/envoyfilter.yaml".into());
    files.sort();
    files
}

#[test]
fn every_shipped_configuration_passes_the_plugins_parser() {
    let files = shipped_files();
    assert!(files.len() >= 9, "{files:?}");
    let args: Vec<&str> = std::iter::once("check")
        .chain(files.iter().map(String::as_str))
        .collect();
    let (ok, out) = kvbench_config(&args, "");
    assert!(ok, "{out}");
    for file in &files {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("ok   {file}: "))),
            "{file} not checked:\n{out}"
        );
    }
    // The discovery wiring has two kvroute plugins (the singleton and the filter).
    assert_eq!(
        out.matches("ok   envoy/kvroute-discovery.yaml").count(),
        2,
        "{out}"
    );
    assert!(!out.contains("FAIL"), "{out}");
}

#[test]
fn every_rendered_overlay_passes_the_plugins_parser() {
    for overlay in OVERLAYS {
        let rendered = render_overlay(overlay).expect("make tools (kubectl) first");
        let (ok, out) = kvbench_config(&["check", "-"], &rendered);
        assert!(ok, "{overlay}: {out}");
        assert!(
            out.contains("ok   -: EnvoyFilter kvroute spec.configPatches[0]"),
            "{overlay}: the EnvoyFilter's configuration was not checked:\n{out}"
        );
        // The rendered configuration is the overlay's own, not the base's empty placeholder.
        assert!(!out.contains("pass-through"), "{overlay}: {out}");
    }
}

/// A copy of `file` with `from` (once) replaced by `to`, under a scratch directory.
fn misspelt_copy(file: &str, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
    assert_eq!(text.matches(from).count(), 1, "{file}: {from:?}");
    let dir = scratch_dir("config-check").unwrap();
    let path = dir.join(Path::new(file).file_name().unwrap());
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    path
}

#[test]
fn a_misspelt_field_is_refused_naming_its_path() {
    let bootstrap = misspelt_copy(
        "envoy/kvroute.yaml",
        r#"{"name": "llama", "endpoints":"#,
        r#"{"name": "llama", "endpoint":"#,
    );
    let (ok, out) = kvbench_config(&["check", bootstrap.to_str().unwrap()], "");
    assert!(!ok, "a misspelt field passed:\n{out}");
    assert!(
        out.lines().any(|l| l.starts_with("FAIL")
            && l.contains("invalid kvroute configuration: field `endpoint`: unknown field")
            && l.contains("(at `pools[0].endpoint`)")),
        "{out}"
    );
    assert!(out.contains("1 configuration(s) refused"), "{out}");

    let settings = misspelt_copy(
        "deploy/kustomize/overlays/aggregated/settings.yaml",
        r#""stale_after_ms": 2000"#,
        r#""stale_after_ms": "2s""#,
    );
    let (ok, out) = kvbench_config(&["check", settings.to_str().unwrap()], "");
    assert!(!ok, "a mistyped field passed:\n{out}");
    // serde's type errors name no field, so the plugin logs `(document)`; the check adds the path.
    assert!(
        out.lines().any(|l| l.starts_with("FAIL")
            && l.contains("invalid type: string \"2s\", expected u64")
            && l.ends_with("(at `stale_after_ms`)")),
        "{out}"
    );
}

#[test]
fn a_rule_between_fields_is_refused_as_the_plugin_refuses_it() {
    // Valid JSON, every name right: only the parser's own checks can refuse it.
    let (ok, out) = kvbench_config(
        &["check", "-"],
        "root_id: kvroute\nvm_config: {}\nconfiguration:\n  value: '{\"pools\": [{\"name\": \"p\", \"role\": \"prefill\", \"endpoints\": [\"10.0.0.1:8000\"]}]}'\n",
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("field `pools`: a `prefill` pool needs a `decode` or `both` pool"),
        "{out}"
    );
}

#[test]
fn a_file_without_a_configuration_is_an_error_not_a_pass() {
    let (ok, out) = kvbench_config(
        &[
            "check",
            "deploy/kustomize/components/vllm-pool/model-server.yaml",
        ],
        "",
    );
    assert!(!ok, "{out}");
    assert!(out.contains("no kvroute configuration"), "{out}");
}

const SCHEMA_FILE: &str = "deploy/schemas/kvroute-config.schema.json";

#[test]
fn the_checked_in_schema_is_what_the_wire_types_generate() {
    let (ok, generated) = kvbench_config(&["schema"], "");
    assert!(ok, "{generated}");
    let checked_in = std::fs::read_to_string(repo_root().join(SCHEMA_FILE)).unwrap();
    assert!(
        generated.trim_end() == checked_in.trim_end(),
        "{SCHEMA_FILE} is out of date: run `make config-schema`"
    );
    let schema: Value = serde_json::from_str(&checked_in).unwrap();
    assert_eq!(schema["additionalProperties"], false);
    for field in ["pools", "block", "pd", "health", "session"] {
        assert!(schema["properties"][field].is_object(), "{field}");
    }
}

/// Every kvroute configuration (the JSON text) in a YAML file, as `kvbench config check` finds them.
fn embedded(path: &Path) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if m.get("root_id") == Some(&Value::from("kvroute")) {
                    out.push(
                        v["configuration"]["value"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned(),
                    );
                }
                if let Some(json) = m.get("kvroute.json").and_then(Value::as_str) {
                    out.push(json.to_owned());
                }
                m.values().for_each(|c| walk(c, out));
            }
            Value::Array(a) => a.iter().for_each(|c| walk(c, out)),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = vec![];
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        walk(&Value::deserialize(doc).unwrap(), &mut out);
    }
    out
}

/// Python's `jsonschema` (draft 2020-12) on each configuration: one line per configuration,
/// `ok` or the first error's path and message.
fn schema_verdicts(configs: &[String]) -> Vec<String> {
    let script = r#"
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
validator = jsonschema.Draft202012Validator(schema)
for text in json.load(sys.stdin):
    errors = sorted(validator.iter_errors(json.loads(text or "{}")), key=str)
    print("ok" if not errors else "/".join(map(str, errors[0].absolute_path)) + ": " + errors[0].message)
"#;
    let mut child = Command::new(tools_bin("python3").expect("make tools first"))
        .args(["-c", script])
        .arg(repo_root().join(SCHEMA_FILE))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(configs).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_schema_accepts_every_shipped_configuration_and_refuses_a_misspelt_one() {
    let mut configs = vec![];
    for file in shipped_files() {
        configs.extend(embedded(&repo_root().join(file)));
    }
    assert!(configs.len() >= 10, "{configs:?}");
    // Shapes no shipped configuration uses, where the schema is written by hand (debug_header).
    for accepted in [
        r#"{"debug_header": true}"#,
        r#"{"debug_header": {"trigger_header": "x-dbg", "token": "0123456789abcdef0123"}}"#,
    ] {
        kvroute::config::Config::parse(accepted.as_bytes()).expect(accepted);
        configs.push(accepted.to_owned());
    }
    let verdicts = schema_verdicts(&configs);
    assert_eq!(verdicts.len(), configs.len());
    for (config, verdict) in configs.iter().zip(&verdicts) {
        assert_eq!(verdict, "ok", "{config}");
    }
    let mut misspelt = vec![
        r#"{"pools": [{"name": "a", "endpoints": ["10.0.0.1:8000"]}], "block": {"tokens_per_blok": 8}}"#.to_owned(),
        r#"{"pools": [{"name": "a", "role": "prefil", "endpoints": ["10.0.0.1:8000"]}]}"#.to_owned(),
    ];
    misspelt.push(r#"{"debug_header": {"tokn": "0123456789abcdef0123"}}"#.to_owned());
    for config in &misspelt {
        assert!(
            kvroute::config::Config::parse(config.as_bytes()).is_err(),
            "{config}"
        );
    }
    let verdicts = schema_verdicts(&misspelt);
    assert!(
        verdicts[0].starts_with("block: ") && verdicts[0].contains("'tokens_per_blok'"),
        "{verdicts:?}"
    );
    assert!(verdicts[1].starts_with("pools/0/role: "), "{verdicts:?}");
    assert!(verdicts[2].starts_with("debug_header: "), "{verdicts:?}");
}

/// kvroute's dependencies and features as `cargo metadata` reads them from a package's manifest.
fn manifest_dependencies(package: &str) -> (Value, Value) {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(repo_root())
        .args([
            "metadata",
            "--offline",
            "--no-deps",
            "--format-version",
            "1",
        ])
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == package)
        .unwrap_or_else(|| panic!("no package {package}"))
        .clone();
    let mut deps: Vec<Value> = p["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        // proxy-wasm is the wasm32 host's alone; the native tools never build `host`.
        .filter(|d| d["target"].is_null())
        .map(|d| {
            serde_json::json!([
                d["name"],
                d["req"],
                d["features"],
                d["optional"],
                d["uses_default_features"]
            ])
        })
        .collect();
    deps.sort_by_key(|d| d.to_string());
    (Value::Array(deps), p["features"].clone())
}

#[test]
fn the_native_build_of_the_parser_has_the_plugins_dependencies_and_features() {
    let (plugin_deps, plugin_features) = manifest_dependencies("kvroute");
    let (native_deps, native_features) = manifest_dependencies("kvroute-native");
    assert!(plugin_deps.as_array().unwrap().len() >= 5, "{plugin_deps}");
    assert_eq!(
        plugin_deps, native_deps,
        "tools/kvroute-native/Cargo.toml differs from Cargo.toml"
    );
    assert_eq!(plugin_features, native_features);
}
