//! The bounded soak `make test` runs (`make soak` runs the same for 10 minutes): Envoy + kvroute +
//! four simulated pods at a steady rate while one pod at a time is refused, fails half its
//! requests, hangs or answers its metrics late, each fault followed by a healthy spell. No request
//! may be lost (a healthy pod could have served every one), no VM re-created, and Envoy's memory
//! must not climb.

use kvbench::soak::{soak, SoakOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_with_scheduled_faults_loses_no_request() {
    let out = std::env::temp_dir().join(format!("kvroute-soak-{}", std::process::id()));
    let opts = SoakOptions {
        seconds: 45,
        rate: 15.0,
        pods: 4,
        // Eight phases of 5 s: every fault of the schedule once, each followed by a healthy spell.
        phase_s: 5,
        window_s: 5,
        out: out.clone(),
        ..SoakOptions::default()
    };
    let report = soak(&opts).await.unwrap();
    eprintln!("{}", report.summary());
    for w in &report.windows {
        eprintln!("{w:?}");
    }
    assert!(
        report.requests as f64 >= 0.9 * opts.rate * opts.seconds as f64,
        "{} requests sent",
        report.requests
    );
    assert_eq!(report.lost(), 0, "{:?}", report.errors_by_cause);
    assert_eq!(report.vm_created_at_start, report.vm_created_at_end);
    let rss: Vec<f64> = report.windows.iter().map(|w| w.envoy_rss_mib).collect();
    let (first, max) = (rss[1], rss.iter().copied().fold(0.0, f64::max));
    assert!(max < first + 64.0, "Envoy RSS grew: {rss:?}");
    assert!(report.csv.exists());
    let _ = std::fs::remove_dir_all(&out);
}
