//! The report as text (`overhead.txt`, also printed): the setup, the latency table per prompt kind,
//! kvroute's difference with its interval and CPU, throughput, idle CPU and memory; and the writing
//! of both output files.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use super::process::{MemoryDiff, MemoryFigures};
use super::report::OverheadReport;

fn fmt_us(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"))
}

fn fmt_signed_us(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{x:+.1}"))
}

fn mib(v: u64) -> String {
    format!("{:.1}", v as f64 / 1_048_576.0)
}

fn mib_signed(v: i64) -> String {
    format!("{:+.1}", v as f64 / 1_048_576.0)
}

/// The text report: setup, the latency table per kind with the differences, throughput, memory.
pub fn render_text(r: &OverheadReport) -> String {
    let o = &r.options;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "kvroute filter cost: Envoy{} with kvroute against the same Envoy without it, in one run.",
        r.envoy_version
            .as_deref()
            .map(|v| format!(" {v}"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "Wall-clock microseconds (not simulated time), measured by the client on loopback; CPU = the \
         Envoy process's CPU time\nover the measured requests (all threads) per request."
    );
    let _ = writeln!(
        out,
        "Setup: {} kvsim pod(s) answering at once ({}--time-scale {}),\n\
         two Envoys with {} workers each and the same pool cluster (override_host, round-robin fallback),\n\
         one with kvroute (chars mode, defaults otherwise{}); chat completions with ~{} bytes of prompt,\n\
         max_tokens 1, non-streaming; per prompt kind {} warm-up + {} measured pairs, one request at a \
         time,\nalternating Envoys (who goes first swaps every pair), the same body to both.",
        r.pods.len(),
        o.sim_args
            .iter()
            .map(|a| format!("{a} "))
            .collect::<String>(),
        o.time_scale,
        o.workers,
        match &o.plugin_extra {
            Value::Object(m) if !m.is_empty() => format!(", plus {}", o.plugin_extra),
            _ => String::new(),
        },
        o.prompt_bytes,
        o.warmup,
        o.requests
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<7} {:<8} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "prompt", "envoy", "reqs", "ok", "mean µs", "p50", "p90", "p99", "CPU µs/req"
    );
    for k in &r.kinds {
        for arm in [&k.kvroute, &k.plain] {
            let l = &arm.latency_us;
            let _ = writeln!(
                out,
                "{:<7} {:<8} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>10}",
                k.kind.name(),
                arm.label,
                arm.requests,
                arm.ok,
                fmt_us(l.mean),
                fmt_us(l.p50),
                fmt_us(l.p90),
                fmt_us(l.p99),
                fmt_us(arm.cpu_us_per_request)
            );
        }
    }
    let _ = writeln!(out);
    for k in &r.kinds {
        let ci = k
            .diff_p50_ci95_us
            .map(|(lo, hi)| format!(" (95% CI {lo:+.1} … {hi:+.1})"))
            .unwrap_or_default();
        let c = |name: &str| k.kvroute_counters.get(name).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "{}: kvroute − plain over {} pairs: p50 {} µs{ci}, mean {} µs; Envoy CPU {} µs/request",
            k.kind.name(),
            k.pairs,
            fmt_signed_us(k.diff_p50_us),
            fmt_signed_us(k.diff_mean_us),
            fmt_signed_us(k.diff_cpu_us_per_request),
        );
        if let (Some(idle), true) = (&r.idle_cpu, k.wall_s > 0.0 && k.kvroute.requests > 0) {
            let per_s = k.kvroute.requests as f64 / k.wall_s;
            let background = (idle.kvroute_ms_per_s - idle.plain_ms_per_s) * 1e3 / per_s;
            let _ = writeln!(
                out,
                "  of that CPU, ≈ {background:.1} µs/request is background work that runs without \
                 requests too (idle rate below, at {per_s:.0} requests/s per Envoy)"
            );
        }
        let mut threads: Vec<(&String, &f64)> =
            k.kvroute.cpu_threads_us_per_request.iter().collect();
        threads.sort_by(|a, b| b.1.total_cmp(a.1));
        let busiest = threads
            .iter()
            .take(3)
            .map(|(name, v)| format!("{name} {v:.1}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "  kvroute routed {} (prefix hit {}, by load {}), index {} blocks at the end; \
             kvroute Envoy's busiest threads, CPU µs/request: {}",
            c("kvroute.requests_routed"),
            c("kvroute.routed_prefix_hit"),
            c("kvroute.routed_load"),
            k.index_entries,
            if busiest.is_empty() {
                "-".to_owned()
            } else {
                busiest
            }
        );
    }
    if let Some(t) = &r.throughput {
        let change = if t.plain_rps > 0.0 {
            format!(" ({:+.1}%)", (t.kvroute_rps / t.plain_rps - 1.0) * 100.0)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "\nThroughput, {} in flight, {} {} requests per arm (two halves, order swapped): kvroute \
             {:.0} req/s ({} ok), plain {:.0} req/s ({} ok){change}; client, kvsim and both Envoys \
             share the machine.",
            t.concurrency,
            t.requests_per_arm,
            t.kind.name(),
            t.kvroute_rps,
            t.kvroute_ok,
            t.plain_rps,
            t.plain_ok
        );
    }
    if let Some(idle) = &r.idle_cpu {
        let _ = writeln!(
            out,
            "\nWithout requests ({:.1} s): kvroute Envoy {:.2} ms CPU/s, plain {:.2} ms CPU/s (kvroute polls \
             {} pods every {} ms).",
            idle.seconds,
            idle.kvroute_ms_per_s,
            idle.plain_ms_per_s,
            r.pods.len(),
            serde_json::from_str::<Value>(&r.plugin_config)
                .ok()
                .and_then(|v| v.get("poll_interval_ms").and_then(Value::as_u64))
                .unwrap_or(200)
        );
    }
    let m = &r.memory;
    let _ = writeln!(
        out,
        "\nMemory (MiB; /stats server.memory_* and the process RSS), {} workers, kvroute Envoy \
         wasm.wasm_vm_count {} (plain {}):",
        m.workers, m.kvroute_vms, m.plain_vms
    );
    let _ = writeln!(
        out,
        "{:<14} {:>10} {:>10} {:>10} {:>8}",
        "", "allocated", "heap", "physical", "RSS"
    );
    let row = |name: &str, f: &MemoryFigures| {
        format!(
            "{:<14} {:>10} {:>10} {:>10} {:>8}\n",
            name,
            mib(f.allocated),
            mib(f.heap_size),
            mib(f.physical_size),
            f.rss.map_or_else(|| "-".to_owned(), mib)
        )
    };
    let diff_row = |name: &str, d: &MemoryDiff| {
        format!(
            "{:<14} {:>10} {:>10} {:>10} {:>8}\n",
            name,
            mib_signed(d.allocated),
            mib_signed(d.heap_size),
            mib_signed(d.physical_size),
            d.rss.map_or_else(|| "-".to_owned(), mib_signed)
        )
    };
    out.push_str(&row("kvroute start", &m.kvroute_start));
    out.push_str(&row("plain start", &m.plain_start));
    out.push_str(&diff_row("diff start", &m.diff_start));
    out.push_str(&row("kvroute end", &m.kvroute_end));
    out.push_str(&row("plain end", &m.plain_end));
    out.push_str(&diff_row("diff end", &m.diff_end));
    let vms = m.kvroute_vms.max(1);
    let _ = writeln!(
        out,
        "kvroute's memory at the end: {} MiB allocated, {} MiB RSS over {} VMs (≈ {} / {} MiB per VM); \
         prefix index {} blocks.",
        mib_signed(m.diff_end.allocated),
        m.diff_end
            .rss
            .map_or_else(|| "-".to_owned(), mib_signed),
        m.kvroute_vms,
        mib_signed(m.diff_end.allocated / vms as i64),
        m.diff_end
            .rss
            .map_or_else(|| "-".to_owned(), |v| mib_signed(v / vms as i64)),
        m.index_entries
    );
    let _ = writeln!(out, "Run took {:.1} s wall.", r.wall_s);
    out
}

/// Writes `DIR/overhead.json` (the report) and `DIR/overhead.txt` (the text of [`render_text`]).
pub fn write_outputs(dir: &Path, r: &OverheadReport) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json_path = dir.join("overhead.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(r)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let txt_path = dir.join("overhead.txt");
    std::fs::write(&txt_path, render_text(r))
        .with_context(|| format!("writing {}", txt_path.display()))?;
    Ok(())
}
