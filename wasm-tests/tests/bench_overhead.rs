//! Plumbing of `kvbench overhead`: a tiny run against real Envoy (with and without the built plugin)
//! and simulated pods yields every sample of both arms, all of them answered, the kvroute arm's
//! requests routed by kvroute and the plain arm untouched by it, plus the memory figures and the
//! output files. No timing is asserted: speed is what the benchmark measures, not what tests check.

use std::collections::BTreeMap;

use serde_json::Value;
use wasm_tests::bench::overhead::{self, OverheadOptions, PromptKind};

const PAIRS: usize = 20;
const WARMUP: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_overhead_run_has_every_sample_and_routes_only_the_kvroute_arm() {
    let opts = OverheadOptions {
        pods: 2,
        requests: PAIRS,
        warmup: WARMUP,
        bootstrap: 50,
        throughput_requests: 8,
        concurrency: 2,
        idle_s: 0.2,
        keep_samples: true,
        ..OverheadOptions::default()
    };
    let report = overhead::run(&opts).await.expect("the overhead run");

    assert!(report.wall_clock);
    assert_eq!(report.pods.len(), 2);
    let config: Value = serde_json::from_str(&report.plugin_config).expect("plugin config JSON");
    assert_eq!(config["block"]["mode"], "chars");
    let kinds: Vec<PromptKind> = report.kinds.iter().map(|k| k.kind).collect();
    assert_eq!(kinds, [PromptKind::Repeat, PromptKind::Fresh]);

    for k in &report.kinds {
        let name = k.kind.name();
        assert_eq!(k.prompt_bytes, opts.prompt_bytes, "{name}: prompt size");
        assert!(
            k.body_bytes > k.prompt_bytes,
            "{name}: body {}",
            k.body_bytes
        );
        for arm in [&k.kvroute, &k.plain] {
            let label = &arm.label;
            assert_eq!(arm.requests, PAIRS, "{name}/{label}: samples");
            assert_eq!(arm.ok, PAIRS, "{name}/{label}: errors {:?}", arm.errors);
            assert_eq!(
                arm.statuses,
                BTreeMap::from([(200, PAIRS)]),
                "{name}/{label}: statuses"
            );
            assert_eq!(arm.samples_us.len(), PAIRS, "{name}/{label}");
            assert!(
                arm.samples_us.iter().all(|s| s.is_finite() && *s > 0.0),
                "{name}/{label}: {:?}",
                arm.samples_us
            );
            assert_eq!(arm.latency_us.count, PAIRS, "{name}/{label}");
            assert!(arm.latency_us.p50.is_some() && arm.latency_us.p99.is_some());
            assert_eq!(
                arm.pods.values().sum::<usize>(),
                PAIRS,
                "{name}/{label}: every answer names its pod: {:?}",
                arm.pods
            );
            assert!(
                arm.pods.keys().all(|p| report.pods.contains(p)),
                "{name}/{label}: {:?} not among {:?}",
                arm.pods,
                report.pods
            );
        }
        assert_eq!(k.pairs, PAIRS, "{name}: pairs");
        assert!(
            k.diff_p50_us.is_some() && k.diff_mean_us.is_some(),
            "{name}"
        );
        let (lo, hi) = k.diff_p50_ci95_us.expect("a bootstrap interval");
        assert!(lo <= hi, "{name}: {lo} > {hi}");

        // Every request to the kvroute Envoy, warm-up included, was routed by kvroute ...
        let routed = k.kvroute_counters["kvroute.requests_routed_total"];
        assert_eq!(
            routed as usize,
            PAIRS + WARMUP,
            "{name}: {:?}",
            k.kvroute_counters
        );
        assert_eq!(k.kvroute_counters["kvroute.passthrough_total"], 0, "{name}");
        assert_eq!(k.kvroute_counters["kvroute.no_endpoint_total"], 0, "{name}");
        // ... the repeated system prompt is a prefix hit once kvroute has seen it ...
        let hits = k.kvroute_counters["kvroute.requests_routed_total{reason=\"prefix_hit\"}"];
        match k.kind {
            PromptKind::Repeat => assert!(hits as usize >= PAIRS, "{name}: {hits} hits"),
            PromptKind::Fresh => assert_eq!(hits, 0, "{name}: fresh prompts hit"),
        }
        // ... and the Envoy without the filter has no kvroute at all.
        assert!(
            k.plain_kvroute_stats.is_empty(),
            "{name}: {:?}",
            k.plain_kvroute_stats
        );
    }

    let t = report.throughput.as_ref().expect("throughput phase");
    assert_eq!((t.kvroute_ok, t.plain_ok), (8, 8));

    let m = &report.memory;
    assert_eq!(m.workers, opts.workers);
    assert!(
        m.kvroute_vms >= opts.workers as u64,
        "{} VMs",
        m.kvroute_vms
    );
    assert_eq!(m.plain_vms, 0);
    for f in [
        &m.kvroute_start,
        &m.plain_start,
        &m.kvroute_end,
        &m.plain_end,
    ] {
        assert!(f.allocated > 0 && f.heap_size > 0, "{f:?}");
    }
    assert!(report.idle_cpu.is_some());

    // The text and JSON outputs.
    let dir = std::env::temp_dir().join(format!("kvroute-overhead-test-{}", std::process::id()));
    overhead::write_outputs(&dir, &report).expect("writing outputs");
    let text = std::fs::read_to_string(dir.join("overhead.txt")).expect("overhead.txt");
    assert!(text.contains("Wall-clock"), "{text}");
    assert!(text.contains("repeat") && text.contains("fresh"), "{text}");
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("overhead.json")).expect("overhead.json"),
    )
    .expect("JSON");
    assert_eq!(json["wall_clock"], true);
    assert_eq!(json["kinds"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        json["kinds"][0]["kvroute"]["samples_us"]
            .as_array()
            .map(Vec::len),
        Some(PAIRS)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
