//! The report as text (`overhead.txt`, also printed): the setup, the added latency per (block
//! scheme, prompt size, prompt kind) with its interval, CPU and kvroute's own body-phase time, each
//! arm's latency distribution, the throughput rounds, memory per VM, idle CPU, and the targets;
//! and the writing of both output files.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use super::hop_summary::{hops_and_sizes, HopRow};
use super::hops::DIRECT;
use super::report::{OverheadReport, Spread};
use crate::table::{Align, Table};

fn fmt_us(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"))
}

fn fmt_signed_us(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{x:+.1}"))
}

fn fmt_f(v: Option<f64>, digits: usize) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.digits$}"))
}

fn mib_signed(v: Option<i64>) -> String {
    v.map_or_else(
        || "-".to_owned(),
        |v| format!("{:+.1}", v as f64 / 1_048_576.0),
    )
}

pub(super) fn size_name(bytes: usize) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

fn spread(s: &Spread, digits: usize) -> String {
    format!(
        "{} [{} … {}]",
        fmt_f(s.median, digits),
        fmt_f(s.min, digits),
        fmt_f(s.max, digits)
    )
}

fn setup(out: &mut String, r: &OverheadReport) {
    let o = &r.options;
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
    let modes: Vec<&str> = o.modes.iter().map(|m| m.name()).collect();
    let sizes: Vec<String> = o.prompt_sizes.iter().map(|&s| size_name(s)).collect();
    let _ = writeln!(
        out,
        "Setup: per block scheme ({}) {} kvsim pod(s) answering at once ({}--time-scale {}) and\n\
         two Envoys with {} workers each and the same pool cluster (override_host, round-robin \
         fallback), one with kvroute\n(defaults otherwise{}), the other without{}; chat completions \
         with {} of prompt, max_tokens 1,\nnon-streaming; per cell at most {} warm-up + {} measured \
         pairs{}, one request at a time, alternating\nEnvoys (who goes first swaps every pair), the \
         same body to both.",
        modes.join(", "),
        r.sections.first().map_or(o.pods, |s| s.pods.len()),
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
        if o.plain_buffer {
            " but with Envoy's buffer filter (ablation: buffering cost left out)"
        } else {
            ""
        },
        sizes.join(", "),
        o.warmup,
        o.requests,
        if o.cell_s > 0.0 {
            format!(" or {} s of them", o.cell_s)
        } else {
            String::new()
        }
    );
}

fn latency_table(out: &mut String, r: &OverheadReport) {
    let _ = writeln!(
        out,
        "\nAdded latency, kvroute − plain (µs; p50 difference of paired requests with its bootstrap \
         95% CI; CPU = Envoy CPU µs/request;\ndecision = kvroute's body phase as the filter times it \
         inside the VM, p50; rest = added p50 − decision p50):"
    );
    let mut table = Table::new(&[
        "mode", "prompt", "kind", "pairs", "plain", "kvroute", "added", "95% CI", "add mean",
        "CPU pl", "CPU kv", "CPU add", "decision", "rest",
    ])
    .aligns(&[Align::Left, Align::Right, Align::Left]);
    for row in &r.summary.latency {
        let ci = row
            .added_p50_ci95_us
            .map_or_else(|| "-".to_owned(), |(lo, hi)| format!("{lo:+.1} … {hi:+.1}"));
        table.row([
            row.mode.name().to_owned(),
            size_name(row.prompt_size),
            row.kind.name().to_owned(),
            row.pairs.to_string(),
            fmt_us(row.plain_p50_us),
            fmt_us(row.kvroute_p50_us),
            fmt_signed_us(row.added_p50_us),
            ci,
            fmt_signed_us(row.added_mean_us),
            fmt_us(row.plain_cpu_us_per_request),
            fmt_us(row.kvroute_cpu_us_per_request),
            fmt_signed_us(row.added_cpu_us_per_request),
            fmt_us(row.decision_p50_us),
            fmt_signed_us(row.added_outside_decision_p50_us),
        ]);
    }
    out.push_str(&table.text());
}

fn arm_table(out: &mut String, r: &OverheadReport) {
    let _ = writeln!(
        out,
        "\nEach arm (µs), with what kvroute counted over the cell (warm-up included) and its index \
         at the cell's end:"
    );
    let mut table = Table::new(&[
        "mode", "prompt", "kind", "envoy", "reqs", "ok", "mean", "p50", "p90", "p99", "routed",
        "hits", "index",
    ])
    .aligns(&[Align::Left, Align::Right, Align::Left, Align::Left]);
    for c in r.sections.iter().flat_map(|s| &s.cells) {
        let counter = |name: &str| c.kvroute_counters.get(name).copied().unwrap_or(0);
        for arm in [&c.kvroute, &c.plain] {
            let l = &arm.latency_us;
            let mut row = vec![
                c.mode.name().to_owned(),
                size_name(c.prompt_size),
                c.kind.name().to_owned(),
                arm.label.clone(),
                arm.requests.to_string(),
                arm.ok.to_string(),
                fmt_us(l.mean),
                fmt_us(l.p50),
                fmt_us(l.p90),
                fmt_us(l.p99),
            ];
            if arm.label == super::KVROUTE {
                row.extend([
                    counter("kvroute.requests_routed_total").to_string(),
                    counter("kvroute.requests_routed_total{reason=\"prefix_hit\"}").to_string(),
                    c.index_entries.to_string(),
                ]);
            }
            table.row(row);
            for e in &arm.errors {
                table.note(format!("    error: {e}"));
            }
        }
    }
    out.push_str(&table.text());
}

fn throughput_table(out: &mut String, r: &OverheadReport) {
    let Some(first) = r.sections.iter().flat_map(|s| &s.throughput).next() else {
        return;
    };
    let _ = writeln!(
        out,
        "\nThroughput: {} connections to one Envoy at a time, each sending its next request when \
         the last is answered,\n{} rounds of {} s per Envoy (after {} s of warm-up each), who goes \
         first alternating; {} prompts. Medians over the rounds [min … max];\nratio = kvroute/plain \
         within a round; req/CPU-s = requests per CPU-second of the loaded Envoy; cores = CPU \
         seconds per second\nof the loaded Envoy (plain/kvroute), of this load generator, of kvsim \
         and of the whole machine (all tenants), which has {} cores:",
        first.concurrency,
        first.rounds.len(),
        first.round_s,
        first.warmup_s,
        first.kind.name(),
        first.machine_cores
    );
    let mut table = Table::new(&[
        "mode",
        "prompt",
        "plain/s",
        "kv/s",
        "ratio",
        "pl/CPU-s",
        "kv/CPU-s",
        "ratio per CPU",
        "Envoy cores",
        "client",
        "kvsim",
        "machine",
    ])
    .left(1);
    for t in &r.summary.throughput {
        table.row([
            t.mode.name().to_owned(),
            size_name(t.prompt_size),
            fmt_f(t.plain_rps.median, 0),
            fmt_f(t.kvroute_rps.median, 0),
            spread(&t.ratio, 3),
            fmt_f(t.plain_rps_per_envoy_cpu_s.median, 0),
            fmt_f(t.kvroute_rps_per_envoy_cpu_s.median, 0),
            spread(&t.ratio_per_envoy_cpu, 3),
            format!(
                "{}/{}",
                fmt_f(t.plain_envoy_cores, 2),
                fmt_f(t.kvroute_envoy_cores, 2)
            ),
            fmt_f(t.client_cores, 2),
            fmt_f(t.sim_cores, 2),
            fmt_f(t.machine_busy_cores, 2),
        ]);
    }
    out.push_str(&table.text());
    for t in &r.summary.throughput {
        if !t.client_below_envoy {
            let _ = writeln!(
                out,
                "  {} {}: in some load the load generator used as much CPU as the Envoy it loaded \
                 or more: requests/s may be the client's limit; req/CPU-s is not",
                t.mode.name(),
                size_name(t.prompt_size)
            );
        }
    }
    let _ = writeln!(
        out,
        "p50 under that load (µs), plain/kvroute: {}",
        r.summary
            .throughput
            .iter()
            .map(|t| format!(
                "{} {} {}/{}",
                t.mode.name(),
                size_name(t.prompt_size),
                fmt_us(t.plain_p50_us_under_load),
                fmt_us(t.kvroute_p50_us_under_load)
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// `+median [min … max]` of an added latency, µs to whole numbers.
fn added(s: &Spread) -> String {
    let f = |v: Option<f64>| {
        v.filter(|x| x.is_finite())
            .map_or_else(|| "-".to_owned(), |x| format!("{x:+.0}"))
    };
    format!("{} [{} … {}]", f(s.median), f(s.min), f(s.max))
}

/// The hop phase's headline: per prompt size, the pod's own p50 and every other hop's added p50
/// over it (median of the runs [min … max]).
pub fn hop_table(rows: &[HopRow]) -> Table {
    let (hops, sizes) = hops_and_sizes(rows);
    let mut header = vec!["prompt".to_owned(), "direct p50".to_owned()];
    header.extend(hops.iter().map(|h| format!("{h} added")));
    let mut table = Table::new(&header).left(1);
    for size in sizes {
        let at = |hop: &str| rows.iter().find(|r| r.prompt_size == size && r.hop == hop);
        let mut cells = vec![
            size_name(size),
            fmt_f(at(DIRECT).and_then(|r| r.p50_us.median), 0),
        ];
        cells.extend(
            hops.iter()
                .map(|h| at(h).map_or_else(|| "-".to_owned(), |r| added(&r.added_p50_us))),
        );
        table.row(cells);
    }
    table
}

fn hops_section(out: &mut String, r: &OverheadReport) {
    let Some(h) = r.sections.iter().find_map(|s| s.hops.as_ref()) else {
        return;
    };
    let runs = h.runs.iter().map(|x| x.run + 1).max().unwrap_or(0);
    let requests = h
        .runs
        .first()
        .and_then(|x| x.arms.first())
        .map_or(0, |a| a.sequential.requests);
    let _ = writeln!(
        out,
        "\nThe hop: what each way of reaching the same pods adds over calling a pod directly. Run(s): \
         {runs}; per run and size, {requests}\nsequential {} requests per hop, one hop after the \
         other in rotating order, then each hop loaded by {} connections for {} s.\nAdded p50 = \
         p50 of the hop − p50 of direct in the same run; median of the runs [min … max], µs:",
        h.kind.name(),
        h.concurrency,
        h.load_s
    );
    out.push_str(&hop_table(&r.summary.hops).text());
    let _ = writeln!(
        out,
        "\nEach hop (medians of the runs; CPU = the hop's processes, the Envoy or the router with \
         everything below it, per\nsequential request; req/s and req/CPU-s under load [min … max]; \
         cores = the hop's CPU per second under load):"
    );
    let mut table = Table::new(&[
        "prompt",
        "hop",
        "failed",
        "p50",
        "p99",
        "added p50",
        "CPU µs/req",
        "req/s",
        "req/CPU-s",
        "cores",
        "p50 loaded",
    ])
    .aligns(&[Align::Right, Align::Left]);
    for row in &r.summary.hops {
        table.row([
            size_name(row.prompt_size),
            row.hop.clone(),
            row.failed.to_string(),
            fmt_f(row.p50_us.median, 0),
            fmt_f(row.p99_us.median, 0),
            added(&row.added_p50_us),
            fmt_f(row.cpu_us_per_request.median, 0),
            spread(&row.rps, 0),
            spread(&row.rps_per_cpu_s, 0),
            fmt_f(row.cores, 2),
            fmt_f(row.p50_us_under_load, 0),
        ]);
    }
    out.push_str(&table.text());
}

fn memory_table(out: &mut String, r: &OverheadReport) {
    let _ = writeln!(
        out,
        "\nMemory, kvroute Envoy − plain Envoy (MiB; process RSS and /stats server.memory_allocated), \
         at rest (ready, before any\nrequest) and at the section's end (index full after the fresh \
         prompts); per VM = ÷ wasm.wasm_vm_count:"
    );
    let mut table = Table::new(&[
        "mode",
        "VMs",
        "RSS rest",
        "per VM",
        "RSS full",
        "per VM",
        "alloc rest",
        "per VM",
        "alloc full",
        "per VM",
        "index blocks",
    ])
    .left(1);
    for m in &r.summary.memory {
        table.row([
            m.mode.name().to_owned(),
            m.vms.to_string(),
            mib_signed(m.rss_added_at_rest),
            mib_signed(m.rss_per_vm_at_rest),
            mib_signed(m.rss_added_full),
            mib_signed(m.rss_per_vm_full),
            mib_signed(Some(m.allocated_added_at_rest)),
            mib_signed(Some(m.allocated_per_vm_at_rest)),
            mib_signed(Some(m.allocated_added_full)),
            mib_signed(Some(m.allocated_per_vm_full)),
            m.index_entries_peak.to_string(),
        ]);
    }
    out.push_str(&table.text());
}

fn held_section(out: &mut String, r: &OverheadReport) {
    let Some(h) = &r.held else {
        return;
    };
    let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
    let _ = writeln!(
        out,
        "\nThe queue path (flow control, one pod, queue_depth 1): {} pairs, {} measured (B alone \
         held behind A; {} held, {} released in all);\nan unheld request took p50 {} µs; what \
         holding added to B beyond the wait for room: p50 {} µs [p10 {} … p90 {}].",
        h.pairs,
        h.measured,
        h.held,
        h.released,
        opt(h.unheld_p50_us),
        opt(h.added_p50_us),
        opt(h.added_p10_us),
        opt(h.added_p90_us),
    );
    if let Some(d) = &h.decisions {
        // A, C and D are planned once each; the rest are B's: its first plan, its retries while
        // at the head of the queue, its release.
        let held_plans = d.count as f64 / h.pairs.max(1) as f64 - 3.0;
        let _ = writeln!(
            out,
            "kvroute's decisions over the phase: {}, p50 {:.0} µs, mean {:.0} µs; a held request \
             was planned {held_plans:.1} times (first plan, retries at the head, release).",
            d.count, d.p50, d.mean
        );
    }
}

/// The text report.
pub fn render_text(r: &OverheadReport) -> String {
    let mut out = String::new();
    setup(&mut out, r);
    latency_table(&mut out, r);
    arm_table(&mut out, r);
    throughput_table(&mut out, r);
    memory_table(&mut out, r);
    hops_section(&mut out, r);
    held_section(&mut out, r);
    for s in &r.sections {
        if let Some(idle) = &s.idle_cpu {
            let _ = writeln!(
                out,
                "Without requests ({:.1} s, {} section): kvroute Envoy {:.2} ms CPU/s, plain {:.2} ms \
                 CPU/s (kvroute polls {} pods every {} ms).",
                idle.seconds,
                s.mode.name(),
                idle.kvroute_ms_per_s,
                idle.plain_ms_per_s,
                s.pods.len(),
                serde_json::from_str::<Value>(&s.plugin_config)
                    .ok()
                    .and_then(|v| v.get("poll_interval_ms").and_then(Value::as_u64))
                    .unwrap_or(200)
            );
        }
    }
    if !r.summary.targets.is_empty() {
        let _ = writeln!(out, "\nTargets:");
        for t in &r.summary.targets {
            let verdict = match t.met {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "not measured",
            };
            let _ = writeln!(
                out,
                "  {}: {} (limit {}): {verdict}",
                t.what,
                fmt_f(t.value, 3),
                (t.limit * 1000.0).round() / 1000.0
            );
        }
    }
    let _ = writeln!(out, "Run took {:.1} s wall.", r.wall_s);
    out
}

/// Writes `DIR/overhead.json` (the report), `DIR/overhead.txt` (the text of [`render_text`]) and
/// `DIR/overhead.png` (`super::chart`).
pub fn write_outputs(dir: &Path, r: &OverheadReport) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json_path = dir.join("overhead.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(r)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let txt_path = dir.join("overhead.txt");
    std::fs::write(&txt_path, render_text(r))
        .with_context(|| format!("writing {}", txt_path.display()))?;
    super::chart::write(dir, &r.summary.latency);
    if !r.summary.hops.is_empty() {
        super::chart::write_hops(dir, &r.summary.hops);
    }
    Ok(())
}
