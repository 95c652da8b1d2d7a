use super::*;
use crate::common::Role;
use crate::pod::models::ServedModel;
use crate::pod::prom::PodMetrics;

fn pod(addr: &str, running: &[&str], slots: Option<u32>) -> PodLoad {
    PodLoad {
        addr: addr.to_string(),
        role: Role::Aggregated,
        pool: String::new(),
        metrics_at_ms: 1,
        failing: false,
        late: false,
        ejected_until_ms: 0,
        metrics: PodMetrics {
            adapters: running.iter().map(|a| a.to_string()).collect(),
            adapters_running: running.iter().map(|a| a.to_string()).collect(),
            adapter_slots: slots,
            ..PodMetrics::default()
        },
        served: vec![ServedModel {
            id: "sql-lora".into(),
            parent: Some("llama".into()),
            root: None,
            max_model_len: None,
        }],
        serves: Vec::new(),
        locality: None,
    }
}

fn table(pods: Vec<PodLoad>) -> LoadTable {
    LoadTable {
        pods,
        ..LoadTable::default()
    }
}

#[test]
fn a_pod_holds_what_it_runs_and_what_it_was_sent_within_its_slots() {
    let config = AdapterConfig::default();
    let mut adapters = Adapters::default();
    let a = pod("a:1", &["chat-lora"], Some(2));
    adapters.list_pods(&table(vec![a.clone()]));
    let cost = |adapters: &Adapters, adapter| adapters.load_ms_on(&config, &a, Some(adapter));
    assert_eq!(cost(&adapters, "chat-lora"), 0.0, "running: loaded");
    assert_eq!(cost(&adapters, "sql-lora"), DEFAULT_LOAD_MS);
    adapters.on_routed(&config, &a, "sql-lora");
    assert_eq!(cost(&adapters, "sql-lora"), 0.0, "sent here: loaded");
    // Two slots: the third adapter sent evicts the least recently sent.
    adapters.on_routed(&config, &a, "tiny");
    adapters.on_routed(&config, &a, "sql-lora");
    adapters.on_routed(&config, &a, "math");
    assert_eq!(cost(&adapters, "sql-lora"), 0.0);
    assert_eq!(cost(&adapters, "math"), 0.0);
    // Evicted; and every slot now holds another adapter in use (chat-lora runs): loading it
    // costs the one it evicts a load too.
    assert_eq!(cost(&adapters, "tiny"), 2.0 * DEFAULT_LOAD_MS, "evicted");
    // A pod that does not report its slots has the configured number (vLLM's default: one).
    let b = pod("b:1", &[], None);
    adapters.on_routed(&config, &b, "sql-lora");
    adapters.on_routed(&config, &b, "math");
    assert_eq!(adapters.load_ms_on(&config, &b, Some("math")), 0.0);
    assert_eq!(
        adapters.load_ms_on(&config, &b, Some("sql-lora")),
        2.0 * DEFAULT_LOAD_MS
    );
    // A pod with a free slot costs one load.
    assert_eq!(
        adapters.load_ms_on(&config, &pod("c:1", &[], Some(2)), Some("sql-lora")),
        DEFAULT_LOAD_MS
    );
    // No adapter, or loads not priced: nothing.
    assert_eq!(adapters.load_ms_on(&config, &b, None), 0.0);
    let unpriced = AdapterConfig {
        price_loads: false,
        ..AdapterConfig::default()
    };
    assert_eq!(adapters.load_ms_on(&unpriced, &b, Some("sql-lora")), 0.0);
}

#[test]
fn adapters_are_the_names_listed_with_a_parent_or_reported_running() {
    let mut adapters = Adapters::default();
    adapters.list_pods(&table(vec![pod("a:1", &["chat-lora"], None)]));
    assert!(adapters.is_adapter("sql-lora"));
    assert!(adapters.is_adapter("chat-lora"));
    assert!(!adapters.is_adapter("llama"));
    adapters.list_pods(&table(Vec::new()));
    assert!(!adapters.is_adapter("sql-lora"), "follows the table");
}

#[test]
fn the_load_time_is_learned_from_first_bytes() {
    let config = AdapterConfig::default();
    let mut adapters = Adapters::default();
    assert_eq!(adapters.load_ms(&config), DEFAULT_LOAD_MS);
    // Loads that take 400 ms more than the tokens' prediction: the prior gives way.
    for _ in 0..400 {
        adapters.learn(&config, 100.0, 500.0);
    }
    let learned = adapters.load_ms(&config);
    assert!((learned - 400.0).abs() < 1.0, "{learned}");
    // A first byte sooner than the tokens' prediction teaches a free load, not a negative one.
    for _ in 0..400 {
        adapters.learn(&config, 100.0, 50.0);
    }
    let learned = adapters.load_ms(&config);
    assert!((0.0..1.0).contains(&learned), "{learned}");
    // The first sample moves the prior by 1/(prior_samples + 1) of the difference.
    let mut once = Adapters::default();
    once.learn(&config, 0.0, DEFAULT_LOAD_MS + 600.0);
    assert!((once.load_ms(&config) - (DEFAULT_LOAD_MS + 100.0)).abs() < 1e-9);
}

#[test]
fn a_removed_pod_is_forgotten() {
    let config = AdapterConfig::default();
    let mut adapters = Adapters::default();
    let a = pod("a:1", &[], Some(4));
    adapters.list_pods(&table(vec![a.clone()]));
    adapters.on_routed(&config, &a, "sql-lora");
    adapters.list_pods(&table(Vec::new()));
    adapters.list_pods(&table(vec![a.clone()]));
    assert_eq!(
        adapters.load_ms_on(&config, &a, Some("sql-lora")),
        DEFAULT_LOAD_MS
    );
}

#[test]
fn the_configuration_is_checked() {
    let bad = |c: AdapterConfig| c.validate().unwrap_err().field;
    let base = AdapterConfig::default();
    assert!(base.validate().is_ok());
    assert_eq!(
        bad(AdapterConfig {
            load_ms: -1.0,
            ..base.clone()
        }),
        "adapters.load_ms"
    );
    assert_eq!(
        bad(AdapterConfig {
            prior_samples: f64::NAN,
            ..base.clone()
        }),
        "adapters.prior_samples"
    );
    assert_eq!(
        bad(AdapterConfig {
            default_slots: 0,
            ..base
        }),
        "adapters.default_slots"
    );
}
