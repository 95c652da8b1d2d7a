//! `kvbench soak`: Envoy + kvroute + simulated pods at a steady open-loop rate for a bounded time,
//! with one pod at a time faulted on a fixed schedule (refuse, 500s on half, a 30 s hang, late
//! metrics, each followed by a healthy phase). Every request is a stream (the route's first-byte
//! timeout is what saves a request sent to a hung pod) with recurring tenant prefixes. Since at
//! most one pod of several is faulted, every failed request is one a healthy pod could have served:
//! the run's verdict is that number, which must be 0. Per window it records requests, errors by
//! cause, p50/p99 of the whole request and Envoy's RSS, writes `soak.csv` and `soak.png` (p99 and
//! RSS over time) into the output directory.

use super::plot::{Chart, Figure, LineChart, Plotter, Series};
use anyhow::{Context, Result};
use harness::{plugin_config, wait_for, Envoy, EnvoyOptions, Lb, Sim};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct SoakOptions {
    pub seconds: u64,
    /// Requests per second, open loop.
    pub rate: f64,
    pub pods: usize,
    /// Length of each schedule phase (fault or healthy).
    pub phase_s: u64,
    pub window_s: u64,
    pub time_scale: f64,
    pub out: PathBuf,
}

impl Default for SoakOptions {
    fn default() -> Self {
        SoakOptions {
            seconds: 600,
            rate: 20.0,
            pods: 4,
            phase_s: 10,
            window_s: 10,
            time_scale: 0.05,
            out: PathBuf::from("bench-out"),
        }
    }
}

/// The fault schedule: phase `i` applies `SCHEDULE[i % len]` to pod `i / 2 % pods`.
const SCHEDULE: [(&str, &str); 8] = [
    ("refuse", r#"{"refuse": true}"#),
    ("healthy", "{}"),
    ("500 on half", r#"{"fail_ratio": 0.5}"#),
    ("healthy", "{}"),
    ("hang 30 s", r#"{"stall_ms": 30000}"#),
    ("healthy", "{}"),
    ("metrics late 3 s", r#"{"metrics_delay_ms": 3000}"#),
    ("healthy", "{}"),
];

#[derive(Debug, Clone, Default)]
pub struct Window {
    pub start_s: u64,
    pub fault: String,
    pub requests: u64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub envoy_rss_mib: f64,
}

#[derive(Debug, Default)]
pub struct SoakReport {
    pub requests: u64,
    /// Failed requests by cause (`status 500`, `cut stream`, `transport: …`).
    pub errors_by_cause: BTreeMap<String, u64>,
    pub windows: Vec<Window>,
    pub vm_created_at_start: u64,
    pub vm_created_at_end: u64,
    pub csv: PathBuf,
    pub plot: Option<PathBuf>,
}

impl SoakReport {
    /// Requests that failed while healthy pods existed (all of them: one pod is faulted at a time).
    pub fn lost(&self) -> u64 {
        self.errors_by_cause.values().sum()
    }

    /// The last full window's p99 over the first's.
    pub fn p99_drift(&self) -> f64 {
        let full: Vec<&Window> = self.windows.iter().filter(|w| w.requests > 0).collect();
        match (full.first(), full.last()) {
            (Some(a), Some(b)) if a.p99_ms > 0.0 => b.p99_ms / a.p99_ms,
            _ => 1.0,
        }
    }

    pub fn summary(&self) -> String {
        let rss: Vec<f64> = self.windows.iter().map(|w| w.envoy_rss_mib).collect();
        format!(
            "soak: {} requests, {} lost ({:?}); p99 first window {:.0} ms, last {:.0} ms (drift ×{:.2}); \
             Envoy RSS {:.0} → {:.0} MiB (max {:.0}); VMs created {} → {}; CSV {}",
            self.requests,
            self.lost(),
            self.errors_by_cause,
            self.windows.first().map_or(0.0, |w| w.p99_ms),
            self.windows.last().map_or(0.0, |w| w.p99_ms),
            self.p99_drift(),
            rss.first().copied().unwrap_or(0.0),
            rss.last().copied().unwrap_or(0.0),
            rss.iter().copied().fold(0.0, f64::max),
            self.vm_created_at_start,
            self.vm_created_at_end,
            self.csv.display()
        )
    }
}

struct Record {
    at_s: u64,
    latency_ms: f64,
    error: Option<String>,
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Sets `pod`'s faults through a sibling's control endpoint (a refusing pod answers nothing).
async fn set_fault(pods: &[String], pod: &str, fault: &str) -> Result<()> {
    let mut body: Value = serde_json::from_str(fault)?;
    body["pod"] = json!(pod);
    let via = pods.iter().find(|p| *p != pod).map_or(pod, String::as_str);
    let r = reqwest::Client::new()
        .post(format!("http://{via}/sim/fault"))
        .json(&body)
        .send()
        .await?;
    anyhow::ensure!(r.status().is_success(), "fault on {pod}: {}", r.status());
    Ok(())
}

/// One streamed chat request; the error cause when it did not complete.
async fn one_request(client: &reqwest::Client, url: &str, tenant: usize, i: u64) -> Option<String> {
    let system: String = (0..150)
        .map(|w| format!("soak{tenant}-{w}"))
        .collect::<Vec<_>>()
        .join(" ");
    let body = json!({
        "model": "sim-model",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": format!("q{i}")}],
        "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}
    });
    let mut resp = match client.post(url).json(&body).send().await {
        Ok(r) => r,
        Err(e) => return Some(format!("transport: {e}")),
    };
    let status = resp.status().as_u16();
    let mut text = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => text.extend_from_slice(&c),
            Ok(None) => break,
            Err(_) => return Some("cut stream".into()),
        }
    }
    if status != 200 {
        return Some(format!("status {status}"));
    }
    if !String::from_utf8_lossy(&text).contains("[DONE]") {
        return Some("cut stream".into());
    }
    None
}

pub async fn soak(opts: &SoakOptions) -> Result<SoakReport> {
    std::fs::create_dir_all(&opts.out)?;
    let sim = Sim::start(opts.pods, &["--time-scale", &opts.time_scale.to_string()])?;
    let config = plugin_config(
        &sim.pods,
        json!({"health": {"first_byte_timeout_ms": 800, "base_ejection_ms": 3000}}),
    );
    let envoy = Envoy::start(&EnvoyOptions::new(
        &sim.pods,
        Lb::OverrideHost,
        Some(config),
    ))
    .await?;
    let healthy = opts.pods as u64;
    wait_for(Duration::from_secs(20), "every pod healthy", || async {
        envoy.stat("wasmcustom.kvroute.pods_healthy").await == healthy
    })
    .await?;
    let mut report = SoakReport {
        vm_created_at_start: envoy.stat("wasm.envoy.wasm.runtime.v8.created").await,
        ..SoakReport::default()
    };
    let url = envoy.url("/v1/chat/completions");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let records: Arc<Mutex<Vec<Record>>> = Arc::default();
    let start = Instant::now();
    let total = Duration::from_secs(opts.seconds);
    let interval = Duration::from_secs_f64(1.0 / opts.rate.max(0.1));
    let mut tasks = Vec::new();
    let mut next_send = start;
    let mut phase = usize::MAX;
    let mut windows: Vec<Window> = Vec::new();
    let mut i = 0u64;
    while start.elapsed() < total {
        let elapsed = start.elapsed().as_secs();
        let now_phase = (elapsed / opts.phase_s.max(1)) as usize;
        if now_phase != phase {
            // Clear the previous phase's pod, fault the next one.
            if phase != usize::MAX {
                set_fault(&sim.pods, &sim.pods[(phase / 2) % sim.pods.len()], "{}").await?;
            }
            phase = now_phase;
            let (name, fault) = SCHEDULE[phase % SCHEDULE.len()];
            let pod = &sim.pods[(phase / 2) % sim.pods.len()];
            set_fault(&sim.pods, pod, fault).await?;
            eprintln!("soak {elapsed:>4} s: {name} on {pod}");
        }
        let window = (elapsed / opts.window_s.max(1)) as usize;
        while windows.len() <= window {
            windows.push(Window {
                start_s: windows.len() as u64 * opts.window_s,
                fault: SCHEDULE[phase % SCHEDULE.len()].0.to_string(),
                envoy_rss_mib: rss_mib(envoy.proc.pid()),
                ..Window::default()
            });
        }
        let (client, url, records) = (client.clone(), url.clone(), records.clone());
        let tenant = (i % 12) as usize;
        let n = i;
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let error = one_request(&client, &url, tenant, n).await;
            let rec = Record {
                at_s: sent.duration_since(start).as_secs(),
                latency_ms: sent.elapsed().as_secs_f64() * 1000.0,
                error,
            };
            if let Ok(mut r) = records.lock() {
                r.push(rec);
            }
        }));
        i += 1;
        next_send += interval;
        tokio::time::sleep_until(next_send.into()).await;
    }
    for t in tasks {
        t.await.context("a soak request task")?;
    }
    if phase != usize::MAX {
        set_fault(&sim.pods, &sim.pods[(phase / 2) % sim.pods.len()], "{}").await?;
    }
    let records = std::mem::take(&mut *records.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    let mut per_window: Vec<Vec<f64>> = vec![Vec::new(); windows.len()];
    for r in &records {
        let w = ((r.at_s / opts.window_s.max(1)) as usize).min(windows.len().saturating_sub(1));
        if let (Some(lat), Some(win)) = (per_window.get_mut(w), windows.get_mut(w)) {
            lat.push(r.latency_ms);
            win.requests += 1;
            if r.error.is_some() {
                win.errors += 1;
            }
        }
        if let Some(cause) = &r.error {
            *report.errors_by_cause.entry(cause.clone()).or_default() += 1;
        }
    }
    for (w, lat) in windows.iter_mut().zip(per_window.iter_mut()) {
        w.p50_ms = super::percentile(lat, 50.0).unwrap_or(0.0);
        w.p99_ms = super::percentile(lat, 99.0).unwrap_or(0.0);
    }
    report.requests = records.len() as u64;
    report.vm_created_at_end = envoy.stat("wasm.envoy.wasm.runtime.v8.created").await;
    report.windows = windows;
    report.csv = opts.out.join("soak.csv");
    let mut csv = String::from("start_s,fault,requests,errors,p50_ms,p99_ms,envoy_rss_mib\n");
    for w in &report.windows {
        csv.push_str(&format!(
            "{},{},{},{},{:.1},{:.1},{:.1}\n",
            w.start_s, w.fault, w.requests, w.errors, w.p50_ms, w.p99_ms, w.envoy_rss_mib
        ));
    }
    std::fs::write(&report.csv, csv)?;
    let plot = opts.out.join("soak.png");
    match Plotter::from_env().and_then(|p| p.write_png(&plot, &figure(&report.windows))) {
        Ok(()) => report.plot = Some(plot),
        Err(e) => eprintln!("soak: plot skipped: {e:#}"),
    }
    drop(envoy);
    drop(sim);
    Ok(report)
}

/// p99 (ms) and Envoy RSS (MiB) per window, one panel each.
pub fn figure(windows: &[Window]) -> Figure {
    let panel = |title: &str, y_desc: &str, value: fn(&Window) -> f64| {
        Chart::Lines(LineChart {
            title: title.to_owned(),
            x_desc: "seconds".to_owned(),
            y_desc: y_desc.to_owned(),
            series: vec![Series {
                name: title.to_owned(),
                points: windows
                    .iter()
                    .map(|w| (w.start_s as f64, value(w)))
                    .collect(),
            }],
            ..LineChart::default()
        })
    };
    Figure {
        size: (900, 600),
        ..Figure::column(vec![
            panel("p99 latency per window", "ms", |w| w.p99_ms),
            panel("Envoy RSS", "MiB", |w| w.envoy_rss_mib),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::check::{plotter_or_skip, Picture, TempDir};
    use crate::plot::color;

    #[test]
    fn the_soak_picture_has_a_p99_and_an_rss_panel() {
        let windows: Vec<Window> = (0..6)
            .map(|i| Window {
                start_s: i * 10,
                p99_ms: if i == 3 { 829.0 } else { 20.0 + i as f64 },
                envoy_rss_mib: 180.0 + i as f64 / 3.0,
                ..Window::default()
            })
            .collect();
        let fig = figure(&windows);
        assert_eq!((fig.rows, fig.cols, fig.charts.len()), (2, 1, 2));
        let Some(plotter) = plotter_or_skip("the_soak_picture_has_a_p99_and_an_rss_panel") else {
            return;
        };
        let tmp = TempDir::new("soak");
        let path = tmp.0.join("soak.png");
        plotter.write_png(&path, &fig).expect("drawn");
        let pic = Picture::read(&path);
        assert_eq!((pic.width, pic.height), (900, 600));
        // One series per panel, both in the first colour: both lines' pixels, top and bottom half.
        let c = color(0);
        let half = pic.pixels.len() / 2;
        let count = |px: &[[u8; 3]]| px.iter().filter(|p| **p == [c.0, c.1, c.2]).count();
        assert!(count(&pic.pixels[..half]) > 300, "p99 line");
        assert!(count(&pic.pixels[half..]) > 300, "RSS line");
    }
}
