//! `kvbench matrix` (`make bench-matrix`): every routing change judged over a matrix of workloads
//! ("cells"), each cell one `kvbench compare` configuration run with every policy of the verdict
//! (kvroute, the previous version's module, round-robin, the peer routers, the bound) over several
//! seeds, and one overview table: per cell and policy the median p90 TTFT with its range over the
//! seeds, the hit ratio, kvroute's prediction error, and the cell's verdict
//! ([`summary::verdict`](super::summary::verdict)).
//!
//! The cells are chosen so that no single tuning wins them all: a pool that thrashes its caches
//! and stalls its decodes, the same with chunked prefill, many skewed tenants, chat, short prompts,
//! light load, other simulator speeds and poll intervals, the caches emptied mid-run, and
//! `make bench`'s own workloads.

use std::fmt::Write as _;

use serde::Serialize;

use super::compare::Policy;
use super::summary::{verdict_brief, verdict_line, PolicySummary, Spread, Verdict};
use super::table::Table;

/// One cell: a name and the `kvbench compare` flags that make it (on top of the matrix's own
/// `--seeds`, `--seed`, `--time-scale`, `--policies`, `--previous-wasm`; a cell's flag wins).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Cell {
    pub name: &'static str,
    /// What the cell tests, in a few words.
    pub about: &'static str,
    pub args: &'static [&'static str],
    /// Part of the short matrix (`kvbench matrix --short`, `make bench-matrix-short`).
    pub short: bool,
}

/// The thrashing pool: 12 tenants × 6,000 words on pods with 2,000 blocks (32,000 tokens: under
/// six tenants' prompts each) whose prefills (1 ms a token) run whole and stall their decodes.
const STALL: [&str; 4] = [
    "--workload=multi-tenant-stall",
    "--tenants=12",
    "--rate=2.5",
    "--duration=200",
];
const STALL_SIM: &str = "--sim-args=--num-gpu-blocks 2000 --prefill-us-per-token 1000";

/// Every cell, in the order the matrix runs them. New cells send for 200 simulated seconds;
/// `make bench`'s workloads keep their own settings (`compare::bench_defaults`).
pub const CELLS: &[Cell] = &[
    Cell {
        name: "tenants-stall",
        about: "12 tenants thrashing 2,000-block pods whose whole prefills stall decodes",
        args: &[STALL[0], STALL[1], STALL[2], STALL[3], STALL_SIM],
        short: true,
    },
    Cell {
        name: "tenants-chunked",
        about: "the same tenants on pods that chunk prefills (2,048 tokens a step)",
        args: &[
            "--workload=multi-tenant",
            "--tenants=12",
            "--tenant-system-words=6000",
            "--rate=2.5",
            "--duration=200",
            "--sim-args=--num-gpu-blocks 2000 --prefill-us-per-token 1000 --chunked-prefill-tokens 2048",
        ],
        short: false,
    },
    Cell {
        name: "tenants-64-skewed",
        about: "64 tenants × 2,000 words, Zipf 1.0 popularity",
        args: &[
            "--workload=multi-tenant",
            "--tenants=64",
            "--zipf=1.0",
            "--tenant-system-words=2000",
            "--rate=4",
            "--duration=200",
        ],
        short: false,
    },
    Cell {
        name: "chat",
        about: "24 conversations, 500-word system prompts",
        args: &[
            "--workload=multi-turn",
            "--conversations=24",
            "--conversation-system-words=500",
            "--rate=6",
            "--duration=200",
        ],
        short: true,
    },
    Cell {
        name: "chat-heavy",
        about: "the same at 8/s on pods with 2.5× dearer prefill",
        args: &[
            "--workload=multi-turn",
            "--conversations=24",
            "--conversation-system-words=500",
            "--rate=8",
            "--duration=200",
            "--sim-args=--prefill-us-per-token 1000",
        ],
        short: false,
    },
    Cell {
        name: "short-prompts",
        about: "16 tenants × 500 words at 8/s",
        args: &[
            "--workload=multi-tenant",
            "--tenants=16",
            "--tenant-system-words=500",
            "--rate=8",
            "--duration=200",
        ],
        short: false,
    },
    Cell {
        name: "light-load",
        about: "tenants-chunked at 0.5/s",
        args: &[
            "--workload=multi-tenant",
            "--tenants=12",
            "--tenant-system-words=6000",
            "--rate=0.5",
            "--duration=200",
            "--sim-args=--num-gpu-blocks 2000 --prefill-us-per-token 1000 --chunked-prefill-tokens 2048",
        ],
        short: false,
    },
    Cell {
        name: "tenants-stall-ts0.05",
        about: "tenants-stall, simulator 20× real time",
        args: &[
            STALL[0],
            STALL[1],
            STALL[2],
            STALL[3],
            STALL_SIM,
            "--time-scale=0.05",
        ],
        short: false,
    },
    Cell {
        name: "tenants-stall-ts0.25",
        about: "tenants-stall, simulator 4× real time",
        args: &[
            STALL[0],
            STALL[1],
            STALL[2],
            STALL[3],
            STALL_SIM,
            "--time-scale=0.25",
        ],
        short: false,
    },
    Cell {
        name: "tenants-stall-poll500",
        about: "tenants-stall, kvroute polling every 500 ms",
        args: &[
            STALL[0],
            STALL[1],
            STALL[2],
            STALL[3],
            STALL_SIM,
            "--poll-interval-ms=500",
        ],
        short: false,
    },
    Cell {
        name: "tenants-stall-reset",
        about: "tenants-stall for 240 s, every pod's cache emptied at 120 s",
        args: &[
            STALL[0],
            STALL[1],
            STALL[2],
            "--duration=240",
            STALL_SIM,
            "--reset-caches-at=120",
        ],
        short: false,
    },
    Cell {
        name: "tenants-stall-restart",
        about: "tenants-stall for 240 s, every pod restarted at 120 s (its process start time moves)",
        args: &[
            STALL[0],
            STALL[1],
            STALL[2],
            "--duration=240",
            STALL_SIM,
            "--reset-caches-at=120",
            "--reset-as-restart",
        ],
        short: false,
    },
    Cell {
        name: "tenants-stall-restart-one",
        about: "tenants-stall for 240 s, one pod of four restarted at 120 s (a crash, not a rollout)",
        args: &[
            STALL[0],
            STALL[1],
            STALL[2],
            "--duration=240",
            STALL_SIM,
            "--reset-caches-at=120",
            "--reset-as-restart",
            "--reset-pods=1",
        ],
        short: false,
    },
    Cell {
        name: "shared-agent",
        about: "make bench's shared-agent",
        args: &["--workload=shared-agent"],
        short: false,
    },
    Cell {
        name: "agent",
        about: "make bench's agent",
        args: &["--workload=agent"],
        short: false,
    },
    Cell {
        name: "long-unique",
        about: "make bench's long-unique",
        args: &["--workload=long-unique"],
        short: false,
    },
    Cell {
        name: "unequal-pool",
        about: "make bench's unequal-pool",
        args: &["--workload=unequal-pool"],
        short: false,
    },
];

/// The cells named in `names` (in the matrix's order; `all` = every one, `short` = the short
/// matrix's), failing on an unknown name.
pub fn select(names: &[String]) -> anyhow::Result<Vec<Cell>> {
    for n in names {
        anyhow::ensure!(
            n == "all" || n == "short" || CELLS.iter().any(|c| c.name == n),
            "unknown cell {n:?} (all, short, {})",
            CELLS.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
        );
    }
    let has = |n: &str| names.iter().any(|x| x == n);
    Ok(CELLS
        .iter()
        .filter(|c| has("all") || (has("short") && c.short) || has(c.name))
        .copied()
        .collect())
}

/// A cell's flags as one would type them.
pub fn shell_args(args: &[&str]) -> String {
    args.iter()
        .map(|a| match a.split_once('=') {
            Some((flag, value)) if value.contains(' ') => format!("{flag} \"{value}\""),
            Some((flag, value)) => format!("{flag} {value}"),
            None => (*a).to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One cell's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct CellResult {
    pub cell: Cell,
    /// Per policy over the seeds.
    pub summaries: Vec<PolicySummary>,
    pub verdict: Verdict,
    /// Policies that failed: (seed, label, why).
    pub failed: Vec<(u64, String, String)>,
    /// Why the whole cell failed, if it did (then nothing else is filled in).
    pub error: Option<String>,
    /// Wall-clock seconds the cell took.
    pub wall_s: f64,
}

/// Simulated seconds from milliseconds, as many decimals as make sense.
fn secs(ms: f64) -> String {
    let s = ms / 1000.0;
    if s >= 100.0 {
        format!("{s:.0}")
    } else if s >= 10.0 {
        format!("{s:.1}")
    } else {
        format!("{s:.2}")
    }
}

/// `median [min–max]` of a spread of milliseconds, in seconds.
fn render_secs(s: &Spread) -> String {
    match (s.median, s.min, s.max) {
        (Some(m), Some(lo), Some(hi)) if s.n > 1 => {
            format!("{} [{}–{}]", secs(m), secs(lo), secs(hi))
        }
        (Some(m), _, _) => secs(m),
        _ => "-".to_owned(),
    }
}

/// The overview of a matrix run: one row per cell and policy (median p90 TTFT [min–max] in
/// simulated seconds, hit% from the pods' counters, kvroute's prediction error, after a cache
/// reset the seconds until the hit ratio was back), each cell's verdict under its rows, then every
/// verdict on one line.
pub fn render(results: &[CellResult], seeds: usize, previous: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== matrix: {} cells × {seeds} seed{} (p90 TTFT in simulated s and hit% from the pods' counters: median [min–max] over the seeds; pred err = kvroute's median |predicted − observed| / observed TTFT, bias = its median (predicted − observed) / observed) ==",
        results.len(),
        if seeds == 1 { "" } else { "s" }
    );
    let _ = writeln!(out, "kvroute-previous: {previous}");
    let resets = results
        .iter()
        .any(|r| r.summaries.iter().any(|s| s.resets > 0));
    let mut head = vec!["cell", "policy", "p90 TTFT s", "hit%", "pred err, bias"];
    if resets {
        head.push("back after reset");
    }
    let mut table = Table::new(&head).left(2);
    for r in results {
        if let Some(e) = &r.error {
            table.row([r.cell.name, "-"]);
            table.note(format!("  cell FAILED: {e}"));
            continue;
        }
        for (i, s) in r.summaries.iter().enumerate() {
            let pred = if s.label == Policy::Kvroute.label() {
                crate::summary::render_prediction(s).unwrap_or_else(|| "n/a".to_owned())
            } else {
                String::new()
            };
            let mut row = vec![
                if i == 0 {
                    r.cell.name.to_owned()
                } else {
                    String::new()
                },
                s.label.clone(),
                render_secs(&s.ttft_p90_ms),
                s.cache_hit_ratio.render(1, 100.0),
                pred,
            ];
            if resets {
                row.push(match (s.resets, s.not_recovered) {
                    (0, _) => String::new(),
                    (_, 0) => format!("{} s", s.recovered_after_s.render(0, 1.0)),
                    (n, never) if never == n => "never".to_owned(),
                    (_, never) => {
                        format!("{} s, never ×{never}", s.recovered_after_s.render(0, 1.0))
                    }
                });
            }
            table.row(row);
        }
        table.note(format!(
            "  {} ({:.0} s wall)",
            verdict_line(&r.verdict),
            r.wall_s
        ));
        for (seed, label, why) in &r.failed {
            let why: String = why.chars().take(200).collect();
            table.note(format!("  {label} FAILED on seed {seed}: {why}"));
        }
    }
    out.push_str(&table.text());
    let _ = writeln!(out);
    let _ = writeln!(out, "== verdicts ==");
    let mut verdicts = Table::headless().left(2);
    for r in results {
        verdicts.row([
            r.cell.name.to_owned(),
            match &r.error {
                Some(e) => format!("cell failed: {e}"),
                None => verdict_brief(&r.verdict),
            },
        ]);
    }
    out.push_str(&verdicts.text());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::RequestRecord;
    use crate::summary::{summarize, verdict};
    use crate::workload::{Load, WorkloadKind, WorkloadSpec};
    use crate::RunReport;

    #[test]
    fn cells_are_selected_by_name_or_set() {
        let short = select(&["short".to_owned()]).unwrap();
        assert!((2..=3).contains(&short.len()), "{short:?}");
        assert_eq!(select(&["all".to_owned()]).unwrap().len(), CELLS.len());
        let two = select(&["chat".to_owned(), "tenants-stall".to_owned()]).unwrap();
        assert_eq!(
            two.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["tenants-stall", "chat"],
            "the matrix's order"
        );
        assert!(select(&["nope".to_owned()]).is_err());
        let mut names: Vec<&str> = CELLS.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CELLS.len(), "unique names");
        assert_eq!(
            shell_args(CELLS[0].args),
            "--workload multi-tenant-stall --tenants 12 --rate 2.5 --duration 200 --sim-args \"--num-gpu-blocks 2000 --prefill-us-per-token 1000\""
        );
    }

    fn report(seed: u64, ttft_s: f64, hit: f64) -> RunReport {
        let mut spec = WorkloadSpec::new(
            WorkloadKind::from_name("multi-tenant").expect("known"),
            Load::Open { rate: 1.0 },
        );
        spec.seed = seed;
        let records: Vec<RequestRecord> = (0..10)
            .map(|i| RequestRecord {
                index: i,
                ttft_s: Some(ttft_s),
                e2e_s: Some(ttft_s + 1.0),
                status: Some(200),
                ok: true,
                sent: true,
                ..RequestRecord::default()
            })
            .collect();
        let mut r = RunReport::build(&spec, 1.0, 100.0, &records, Vec::new());
        r.cache_hit_ratio = Some(hit);
        r
    }

    #[test]
    fn the_overview_has_a_row_per_cell_and_policy_and_each_cells_verdict() {
        let runs: Vec<Vec<(String, RunReport)>> = (1..=2)
            .map(|seed| {
                vec![
                    (
                        "kvroute".to_owned(),
                        report(seed, 88.0 + seed as f64, 0.715),
                    ),
                    ("vllm-router".to_owned(), report(seed, 0.18, 0.991)),
                ]
            })
            .collect();
        let summaries = summarize(&runs);
        let v = verdict("tenants-stall", &runs, &summaries);
        let ok = CellResult {
            cell: CELLS[0],
            summaries,
            verdict: v,
            failed: vec![(1, "smg".to_owned(), "smg not installed".to_owned())],
            error: None,
            wall_s: 321.0,
        };
        let broken = CellResult {
            cell: CELLS[3],
            summaries: Vec::new(),
            verdict: verdict("chat", &[], &[]),
            failed: Vec::new(),
            error: Some("no kvsim".to_owned()),
            wall_s: 1.0,
        };
        let text = render(&[ok, broken], 2, "/tmp/base.wasm");
        assert!(text.contains("2 cells × 2 seeds"), "{text}");
        let row = text
            .lines()
            .find(|l| l.starts_with("tenants-stall  kvroute"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(row.contains("89.5 [89.0–90.0]"), "{row}");
        assert!(row.contains("71.5"), "{row}");
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("vllm-router") && l.contains("0.18")),
            "{text}"
        );
        assert!(
            text.contains("VERDICT tenants-stall: not met: p90 TTFT kvroute / best peer"),
            "p90 way above vllm-router's: {text}"
        );
        assert!(
            text.contains("[not measured: p90 TTFT kvroute / round-robin;"),
            "{text}"
        );
        assert!(text.contains("smg FAILED on seed 1"), "{text}");
        assert!(text.contains("(321 s wall)"), "{text}");
        let verdicts = text.split("== verdicts ==").nth(1).expect("the list");
        assert!(
            verdicts.contains(
                "tenants-stall  NOT MET (p90 TTFT kvroute / best peer (vllm-router); hit ratio"
            ),
            "{verdicts}"
        );
        assert!(
            verdicts.contains("chat           cell failed: no kvsim"),
            "{verdicts}"
        );
    }
}
