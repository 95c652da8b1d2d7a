//! The monitoring of `deploy/monitoring` against Debian's real `promtool`: the rules load
//! (`promtool check rules`), their unit tests pass (`promtool test rules`), every Grafana query
//! is valid PromQL, and every kvroute series a rule, a dashboard or an autoscaler reads is one the
//! plugin declares (src/metrics.rs), selected only by labels it carries, so a renamed metric or
//! label cannot leave them silently empty. `prometheus_scrape` runs them against live data.
//!
//! Skips, saying so, where promtool is not installed (Debian package `prometheus`: `make sysdeps`).

use harness::{on_path, repo_root};
use kvroute::metrics::{Counter, Gauge, Histogram};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn promtool() -> Option<PathBuf> {
    on_path("promtool")
}

fn promtool_ok(bin: &Path, args: &[&str], dir: &Path) -> (bool, String) {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("promtool");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn dashboard_queries() -> Vec<String> {
    let path = repo_root().join("deploy/monitoring/grafana-dashboard.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "the dashboard has its panels");
    panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("expr").to_string())
        .collect()
}

/// The Prometheus names of the plugin's stats, as Envoy exports them (`kvroute.a.b` → `kvroute_a_b`,
/// its labels extracted), each with the labels its series carry.
fn declared_series() -> BTreeMap<String, Vec<&'static str>> {
    let mut names = BTreeMap::new();
    let labels = |l: &[&'static str]| l.to_vec();
    for c in Counter::ALL {
        names.insert(c.name().replace('.', "_"), labels(c.labels()));
    }
    for g in Gauge::ALL {
        names.insert(g.name().replace('.', "_"), labels(g.labels()));
    }
    for h in Histogram::ALL {
        let name = h.name().replace('.', "_");
        for suffix in ["_sum", "_count"] {
            names.insert(format!("{name}{suffix}"), labels(h.labels()));
        }
        let mut with_le = labels(h.labels());
        with_le.push("le");
        names.insert(format!("{name}_bucket"), with_le);
    }
    names
}

/// Every `kvroute_…` series name in a text (recording rules are `kvroute:…`, not matched), with
/// the label names of the selector that follows it, if any (`kvroute_x{pool="a"}` → `pool`).
fn kvroute_series(text: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("kvroute_") {
        let start = i + at;
        let boundary = start == 0
            || !(bytes[start - 1].is_ascii_alphanumeric()
                || bytes[start - 1] == b'_'
                || bytes[start - 1] == b':');
        let end = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(text.len(), |e| start + e);
        if boundary {
            let mut labels = Vec::new();
            if text[end..].starts_with('{') {
                let close = text[end..].find('}').map_or(text.len(), |c| end + c);
                for matcher in text[end + 1..close].split(',') {
                    let name: String = matcher
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        labels.push(name);
                    }
                }
            }
            found.push((text[start..end].to_string(), labels));
        }
        i = end;
    }
    found
}

#[test]
fn rules_load_their_unit_tests_pass_and_dashboard_queries_parse() {
    let Some(bin) = promtool() else {
        eprintln!(
            "SKIP rules_load_their_unit_tests_pass_and_dashboard_queries_parse: promtool is not \
             installed (Debian package prometheus: `make sysdeps`)"
        );
        return;
    };
    let dir = repo_root().join("deploy/monitoring");
    let (ok, out) = promtool_ok(&bin, &["check", "rules", "kvroute-rules.yaml"], &dir);
    assert!(ok, "{out}");
    let (ok, out) = promtool_ok(&bin, &["test", "rules", "kvroute-rules.test.yaml"], &dir);
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS"), "{out}");

    // Each dashboard query as a recording rule: promtool parses every one.
    let scratch = std::env::temp_dir().join(format!("kvroute-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut rules = String::from("groups:\n- name: dashboard\n  rules:\n");
    for (i, q) in dashboard_queries().iter().enumerate() {
        rules.push_str(&format!(
            "  - record: dashboard:panel_{i}\n    expr: {}\n",
            serde_json::to_string(q).unwrap()
        ));
    }
    std::fs::write(scratch.join("dashboard.yaml"), &rules).unwrap();
    let (ok, out) = promtool_ok(&bin, &["check", "rules", "dashboard.yaml"], &scratch);
    assert!(ok, "a dashboard query is not PromQL:\n{out}\n{rules}");

    // A query that cannot parse is refused: the check can fail.
    std::fs::write(
        scratch.join("bad.yaml"),
        "groups:\n- name: bad\n  rules:\n  - record: bad:x\n    expr: sum(rate(kvroute_shed[5m])\n",
    )
    .unwrap();
    let (ok, _) = promtool_ok(&bin, &["check", "rules", "bad.yaml"], &scratch);
    assert!(!ok, "promtool accepted an unbalanced expression");
    let _ = std::fs::remove_dir_all(&scratch);
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to `-`, other punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every alert of the rules file has a `runbook_url` into docs/runbooks.md whose section exists,
/// and every section there is some alert's.
#[test]
fn every_alert_links_a_runbook_section_that_exists() {
    let root = repo_root();
    let rules: Value = {
        let text =
            std::fs::read_to_string(root.join("deploy/monitoring/kvroute-rules.yaml")).unwrap();
        serde::Deserialize::deserialize(serde_yaml_ng::Deserializer::from_str(&text)).unwrap()
    };
    let runbooks = std::fs::read_to_string(root.join("docs/runbooks.md")).unwrap();
    let sections: Vec<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(anchor)
        .collect();
    let mut alerts = Vec::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let Some(alert) = rule["alert"].as_str() else {
                continue;
            };
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{alert}: no annotations.runbook_url"));
            let (page, section) = url
                .split_once('#')
                .unwrap_or_else(|| panic!("{alert}: {url} names no section"));
            assert_eq!(page, "docs/runbooks.md", "{alert}: {url}");
            assert!(
                sections.iter().any(|s| s == section),
                "{alert}: {url}: no section `{section}` in docs/runbooks.md ({sections:?})"
            );
            alerts.push(anchor(alert));
        }
    }
    assert!(alerts.len() >= 7, "{alerts:?}");
    for section in &sections {
        assert!(
            alerts.contains(section),
            "docs/runbooks.md: section `{section}` is no alert's"
        );
    }
    // The check can fail: a heading's anchor, and a section that is not there.
    assert_eq!(anchor("KvrouteNoHealthyPods"), "kvroutenohealthypods");
    assert_eq!(anchor("What it is: a (b)"), "what-it-is-a-b");
    assert!(!sections.contains(&"kvroutenohealthypod".to_string()));
}

#[test]
fn every_kvroute_series_read_is_one_the_plugin_declares() {
    let declared = declared_series();
    let root = repo_root();
    let mut sources = vec![("dashboard".to_string(), dashboard_queries().join("\n"))];
    for file in [
        "deploy/monitoring/kvroute-rules.yaml",
        "deploy/kustomize/components/autoscaling-hpa/prometheus-adapter.yaml",
        "deploy/kustomize/components/autoscaling-hpa/hpa.yaml",
        "deploy/kustomize/components/autoscaling-keda/scaledobjects.yaml",
    ] {
        sources.push((
            file.to_string(),
            std::fs::read_to_string(root.join(file)).unwrap(),
        ));
    }
    let mut read = 0;
    for (name, text) in &sources {
        for (series, labels) in kvroute_series(text) {
            // The adapter's external metric names (kvroute_prefill_waiting_per_pod, …) are ours,
            // declared in the adapter rules themselves.
            if series.ends_with("_per_pod") {
                continue;
            }
            let Some(carried) = declared.get(&series) else {
                panic!("{name} reads {series}, which the plugin does not emit");
            };
            for label in &labels {
                // Prometheus' own target labels.
                if ["instance", "job"].contains(&label.as_str()) {
                    continue;
                }
                assert!(
                    carried.contains(&label.as_str()),
                    "{name} selects {series} by `{label}`, a label it does not carry ({carried:?})"
                );
            }
            read += 1;
        }
    }
    assert!(read >= 15, "{read} series read");
    // The checks can fail: an old name, and a label a series does not carry.
    let old = kvroute_series("rate(kvroute_requests_routed[5m]) + kvroute_pods_healthy{pod=\"x\"}");
    assert!(!declared.contains_key(&old[0].0));
    assert!(!declared[&old[1].0].contains(&old[1].1[0].as_str()));
}
