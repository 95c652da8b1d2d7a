//! `kvbench config check FILE...` and `kvbench config schema`: a configuration is checked by the
//! plugin's own parser (`kvroute::config::Config::parse`, compiled natively with the tiktoken
//! tables as in kvroute.wasm), so what passes here is what the plugin accepts at load time and a
//! failure prints the line the plugin would log. Checking before deploying matters because a
//! refused configuration is only seen in the gateway's log, after the rollout.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kvroute::config::wire::WireConfig;
use kvroute::config::Config;
use serde::Deserialize;
use serde_json::Value;

#[derive(Args, Debug)]
pub(crate) struct ConfigArgs {
    #[command(subcommand)]
    pub(crate) command: ConfigCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum ConfigCommand {
    /// Check every kvroute configuration in the files with the plugin's own parser: a `.json` file
    /// is one configuration; in YAML (an Envoy bootstrap, an EnvoyFilter, rendered manifests, a
    /// kustomize settings.yaml) every Wasm plugin with `root_id: kvroute` and every ConfigMap's
    /// `kvroute.json`. `-` reads standard input as YAML. Exits non-zero when any configuration is
    /// refused or a file holds none.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the JSON Schema of the configuration, derived from the plugin's wire types
    /// (deploy/schemas/kvroute-config.schema.json holds it).
    Schema,
}

pub(crate) fn config_main(args: &ConfigArgs) -> anyhow::Result<()> {
    match &args.command {
        ConfigCommand::Schema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&kvroute::config::json_schema())?
            );
            Ok(())
        }
        ConfigCommand::Check { files } => {
            let mut refused = 0;
            for file in files {
                refused += check_file(file)?;
            }
            if refused > 0 {
                bail!("{refused} configuration(s) refused");
            }
            Ok(())
        }
    }
}

/// Prints one line per configuration found; how many were refused.
fn check_file(path: &Path) -> anyhow::Result<usize> {
    let text = if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        text
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    let name = path.display();
    let found = if path.extension().is_some_and(|e| e == "json") {
        vec![("(file)".to_owned(), text)]
    } else {
        embedded_configurations(&text).with_context(|| format!("{name}: not YAML"))?
    };
    if found.is_empty() {
        bail!("{name}: no kvroute configuration (no Wasm plugin with root_id `kvroute`, no ConfigMap key `kvroute.json`)");
    }
    let mut refused = 0;
    for (place, json) in found {
        match check(&json) {
            Ok(summary) => println!("ok   {name}: {place}: {summary}"),
            Err(message) => {
                println!("FAIL {name}: {place}: {message}");
                refused += 1;
            }
        }
    }
    Ok(refused)
}

/// The plugin's verdict on one configuration: a summary, or the plugin's own error line.
fn check(json: &str) -> Result<String, String> {
    match Config::parse(json.as_bytes()) {
        Ok(config) => Ok(format!(
            "{} pool(s){}",
            config.pools.len(),
            if config.pools.is_empty() {
                " (pass-through)"
            } else {
                ""
            }
        )),
        Err(e) => {
            let mut message = e.to_string();
            // serde names only the innermost field of a wire error (`tokens_per_blok`); the whole
            // path says where to look in a long configuration.
            if let Some(path) = wire_error_path(json) {
                if path != e.field {
                    message.push_str(&format!(" (at `{path}`)"));
                }
            }
            Err(message)
        }
    }
}

fn wire_error_path(json: &str) -> Option<String> {
    let mut de = serde_json::Deserializer::from_str(json);
    match serde_path_to_error::deserialize::<_, WireConfig>(&mut de) {
        Ok(_) => None,
        Err(e) => {
            let path = e.path().to_string();
            (path != ".").then_some(path)
        }
    }
}

/// Every kvroute configuration in a YAML stream, with where it was found.
fn embedded_configurations(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut found = Vec::new();
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let doc = Value::deserialize(document)?;
        let label = describe(&doc, index);
        if doc["kind"] == "ConfigMap" {
            if let Some(json) = doc["data"]["kvroute.json"].as_str() {
                found.push((format!("{label} data[kvroute.json]"), json.to_owned()));
            }
        }
        walk(&doc, &mut String::new(), &label, &mut found);
    }
    Ok(found)
}

fn describe(doc: &Value, index: usize) -> String {
    match (doc["kind"].as_str(), doc["metadata"]["name"].as_str()) {
        (Some(kind), Some(name)) => format!("{kind} {name}"),
        _ => format!("document {}", index + 1),
    }
}

/// A Wasm `PluginConfig` of kvroute: an object with `vm_config` and `root_id: kvroute`; its
/// `configuration` is a `google.protobuf.StringValue` (absent: all defaults, as in Envoy).
fn walk(v: &Value, at: &mut String, label: &str, found: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            if m.contains_key("vm_config") && m.get("root_id") == Some(&Value::from("kvroute")) {
                let json = m
                    .get("configuration")
                    .and_then(|c| c.get("value"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                found.push((
                    format!("{label} {}", at.trim_start_matches('.')),
                    json.into(),
                ));
            }
            for (key, value) in m {
                let len = at.len();
                at.push('.');
                at.push_str(key);
                walk(value, at, label, found);
                at.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, value) in items.iter().enumerate() {
                let len = at.len();
                at.push_str(&format!("[{i}]"));
                walk(value, at, label, found);
                at.truncate(len);
            }
        }
        _ => {}
    }
}
