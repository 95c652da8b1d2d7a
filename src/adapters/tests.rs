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
        restarts: 0,
        seats: None,
    }
}

fn table(pods: Vec<PodLoad>) -> LoadTable {
    LoadTable {
        pods,
        ..LoadTable::default()
    }
}

/// The index's stamps of adapter blocks on one pod, as routing left them (later = larger).
fn routed(order: &[&str]) -> impl Fn(u64) -> Option<u64> {
    let stamps: hashbrown::HashMap<u64, u64> = order
        .iter()
        .enumerate()
        .map(|(i, a)| (adapter_block(a), i as u64 + 1))
        .collect();
    move |block| stamps.get(&block).copied()
}

#[test]
fn a_pod_holds_what_it_runs_and_what_was_routed_to_it_last_within_its_slots() {
    let config = AdapterConfig::default();
    let mut adapters = Adapters::default();
    let a = pod("a:1", &["chat-lora"], Some(2));
    adapters.list_pods(&table(vec![a.clone()]));
    for name in ["tiny", "math"] {
        adapters.names.insert(name.into(), adapter_block(name));
    }
    // (this request's load, the evicted adapter's reload)
    let split = |l: AdapterLoad| (l.load_ms, l.reload_ms);
    let cost = |order: &[&str], adapter| {
        split(adapters.load_ms_on(&config, &a, Some(adapter), routed(order)))
    };
    let load = DEFAULT_LOAD_MS;
    assert_eq!(cost(&[], "chat-lora"), (0.0, 0.0), "running: loaded");
    assert_eq!(cost(&[], "sql-lora"), (load, 0.0), "a slot is free");
    assert_eq!(
        cost(&["sql-lora"], "sql-lora"),
        (0.0, 0.0),
        "routed here: loaded"
    );
    // Two slots, one taken by the running chat-lora: of those routed, the latest holds the other.
    let order = ["tiny", "sql-lora", "math"];
    assert_eq!(cost(&order, "math"), (0.0, 0.0));
    // Evicted; and every slot holds another adapter: loading it costs the evicted one's reload,
    // which the request itself does not wait for.
    assert_eq!(cost(&order, "sql-lora"), (load, load), "evicted");
    assert_eq!(cost(&order, "tiny"), (load, load));
    // A pod that does not report its slots has the configured number (vLLM's default: one).
    let b = pod("b:1", &[], None);
    let on_b = |order: &[&str], adapter| {
        split(adapters.load_ms_on(&config, &b, Some(adapter), routed(order)))
    };
    assert_eq!(on_b(&["sql-lora", "math"], "math"), (0.0, 0.0));
    assert_eq!(on_b(&["sql-lora", "math"], "sql-lora"), (load, load));
    // No adapter, or loads not priced: nothing.
    assert_eq!(
        adapters.load_ms_on(&config, &b, None, routed(&[])),
        AdapterLoad::default()
    );
    let unpriced = AdapterConfig {
        price_loads: false,
        ..AdapterConfig::default()
    };
    assert_eq!(
        adapters.load_ms_on(&unpriced, &b, Some("sql-lora"), routed(&[])),
        AdapterLoad::default()
    );
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
