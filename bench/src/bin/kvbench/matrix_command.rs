//! `kvbench matrix`: `kvbench compare` over the cells of `kvbench::matrix`, every policy
//! of the verdict, several seeds, and one overview table.

use std::path::PathBuf;

use clap::{Args, Parser, ValueEnum};
use kvbench::compare;
use kvbench::matrix::{self, Cell, CellResult};
use kvbench::summary;
use kvbench::table::Table;

use crate::*;

/// Every cell is a `kvbench compare` run (see `kvbench matrix --list`) with the flags below, a
/// cell's own flags winning (its time scale, say). A policy that fails is reported and its checks
/// are "not measured"; a cell that fails is reported and the matrix goes on.
#[derive(Args, Debug)]
pub(crate) struct MatrixArgs {
    /// Cells to run, in the matrix's order: names, `short` (the short matrix's) or `all`
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub(crate) cells: Vec<String>,
    /// Print the cells and their flags, run nothing
    #[arg(long)]
    pub(crate) list: bool,
    /// Seeds per cell: --seed, --seed + 1, …
    #[arg(long, default_value_t = 3)]
    pub(crate) seeds: u64,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// The simulator's time scale where a cell does not set its own
    #[arg(long, default_value_t = 0.1)]
    pub(crate) time_scale: f64,
    /// Policies in every cell
    #[arg(long, value_enum, value_delimiter = ',', default_values = [
        "kvroute", "kvroute-previous", "round-robin", "least-request", "sglang-router", "smg",
        "vllm-router", "perfect-knowledge-total",
    ])]
    pub(crate) policies: Vec<PolicyArg>,
    /// The module kvroute-previous runs [default: the build of the commit pinned in
    /// bench/previous-version, `make previous-module`]
    #[arg(long, value_name = "PATH")]
    pub(crate) previous_wasm: Option<PathBuf>,
    /// Write DIR/matrix.{txt,json} and each cell's runs and summary under DIR/<cell>/
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
}

/// A cell's command line, parsed as `kvbench compare`'s; a flag given twice takes the last.
#[derive(Parser, Debug)]
#[command(name = "cell", args_override_self = true)]
struct CellCli {
    #[command(flatten)]
    args: CompareArgs,
}

/// The `kvbench compare` arguments of `cell` in a matrix run with `args`.
fn cell_args(args: &MatrixArgs, cell: &Cell) -> anyhow::Result<CompareArgs> {
    let policies: Vec<String> = args
        .policies
        .iter()
        .filter_map(|p| p.to_possible_value().map(|v| v.get_name().to_owned()))
        .collect();
    let mut argv: Vec<String> = vec![
        "cell".to_owned(),
        "--keep-going".to_owned(),
        format!("--seeds={}", args.seeds),
        format!("--seed={}", args.seed),
        format!("--time-scale={}", args.time_scale),
        format!("--policies={}", policies.join(",")),
    ];
    if let Some(p) = &args.previous_wasm {
        argv.push(format!("--previous-wasm={}", p.display()));
    }
    if let Some(dir) = &args.out {
        argv.push(format!("--out={}", dir.join(cell.name).display()));
    }
    argv.extend(cell.args.iter().map(|a| (*a).to_owned()));
    let cli =
        CellCli::try_parse_from(&argv).map_err(|e| anyhow::anyhow!("cell {}: {e}", cell.name))?;
    Ok(cli.args)
}

/// What kvroute-previous runs, in words.
fn describe_previous(args: &MatrixArgs) -> String {
    if let Some(p) = &args.previous_wasm {
        return format!("--previous-wasm {}", p.display());
    }
    match compare::previous_version() {
        Ok(commit) => {
            let path = compare::previous_wasm_path(&commit);
            let state = if path.exists() {
                ""
            } else {
                " (missing: run `make previous-module`)"
            };
            format!(
                "commit {} ({}), {}{state}",
                &commit[..commit.len().min(12)],
                compare::PREVIOUS_VERSION_FILE,
                path.display()
            )
        }
        Err(e) => format!("unknown: {e:#}"),
    }
}

pub(crate) async fn matrix_main(args: &MatrixArgs) -> anyhow::Result<()> {
    let cells = matrix::select(&args.cells)?;
    if args.list {
        let mut table = Table::headless().left(2);
        for c in &cells {
            let short = if c.short { " [short]" } else { "" };
            table.row([c.name.to_owned(), format!("{}{short}", c.about)]);
            table.row([String::new(), matrix::shell_args(c.args)]);
        }
        print!("{}", table.text());
        return Ok(());
    }
    anyhow::ensure!(!cells.is_empty(), "no cells selected");
    // Parse every cell's flags before running anything.
    let parsed: Vec<(Cell, CompareArgs)> = cells
        .iter()
        .map(|c| Ok((*c, cell_args(args, c)?)))
        .collect::<anyhow::Result<_>>()?;
    let previous = describe_previous(args);
    let t0 = std::time::Instant::now();
    let mut results = Vec::new();
    for (i, (cell, cargs)) in parsed.iter().enumerate() {
        eprintln!(
            "== matrix cell {}/{}: {} — {} ({:.0} s wall so far) ==",
            i + 1,
            parsed.len(),
            cell.name,
            matrix::shell_args(cell.args),
            t0.elapsed().as_secs_f64()
        );
        let started = std::time::Instant::now();
        let result = match compare_cases(cargs, Some(cell.name)).await {
            Ok(mut cases) if cases.len() == 1 => {
                let case = cases.remove(0);
                CellResult {
                    cell: *cell,
                    summaries: case.summaries,
                    verdict: case.verdict,
                    failed: case.failed,
                    error: None,
                    wall_s: started.elapsed().as_secs_f64(),
                }
            }
            other => {
                let error = match other {
                    Err(e) => format!("{e:#}"),
                    Ok(cases) => format!("{} workloads in one cell", cases.len()),
                };
                eprintln!("matrix cell {}: FAILED: {error}", cell.name);
                CellResult {
                    cell: *cell,
                    summaries: Vec::new(),
                    verdict: summary::verdict(cell.name, &[], &[]),
                    failed: Vec::new(),
                    error: Some(error),
                    wall_s: started.elapsed().as_secs_f64(),
                }
            }
        };
        results.push(result);
        // The overview so far, so that an interrupted matrix leaves what it measured.
        if let Some(dir) = &args.out {
            write_outputs(dir, &results, args, &previous)?;
        }
    }
    let text = matrix::render(&results, args.seeds as usize, &previous);
    println!();
    print!("{text}");
    if let Some(dir) = &args.out {
        write_outputs(dir, &results, args, &previous)?;
        eprintln!("wrote {0}/matrix.txt and {0}/matrix.json", dir.display());
    }
    eprintln!("matrix: {:.0} s wall in all", t0.elapsed().as_secs_f64());
    Ok(())
}

fn write_outputs(
    dir: &std::path::Path,
    results: &[CellResult],
    args: &MatrixArgs,
    previous: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let text = matrix::render(results, args.seeds as usize, previous);
    std::fs::write(dir.join("matrix.txt"), text)?;
    let doc = serde_json::json!({
        "seeds": args.seeds,
        "seed": args.seed,
        "time_scale": args.time_scale,
        "previous": previous,
        "cells": results,
    });
    std::fs::write(
        dir.join("matrix.json"),
        serde_json::to_string_pretty(&doc)? + "\n",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Parser, Debug)]
    struct MatrixCli {
        #[command(flatten)]
        args: MatrixArgs,
    }

    fn matrix_args(argv: &[&str]) -> MatrixArgs {
        MatrixCli::try_parse_from(std::iter::once("matrix").chain(argv.iter().copied()))
            .expect("valid")
            .args
    }

    #[test]
    fn every_cell_parses_as_a_comparison_and_its_own_flags_win() {
        let args = matrix_args(&["--seeds", "2", "--previous-wasm", "/tmp/base.wasm"]);
        for cell in matrix::CELLS {
            let c = cell_args(&args, cell).unwrap_or_else(|e| panic!("{e:#}"));
            assert_eq!(c.seeds, 2, "{}", cell.name);
            assert!(c.keep_going);
            assert_eq!(c.policies.len(), 8, "every policy of the verdict");
            assert_eq!(
                c.previous_wasm.as_deref(),
                Some(std::path::Path::new("/tmp/base.wasm"))
            );
            assert_eq!(c.workload.len(), 1, "{}: one workload a cell", cell.name);
        }
        let by_name = |n: &str| {
            let cell = matrix::CELLS.iter().find(|c| c.name == n).expect("a cell");
            cell_args(&args, cell).expect("parses")
        };
        let stall = by_name("tenants-stall");
        assert_eq!(stall.time_scale, 0.1, "the matrix's default");
        assert_eq!(stall.spec.rate, Some(2.5));
        assert_eq!(stall.spec.duration, Some(200.0));
        assert_eq!(
            stall.sim_args,
            "--num-gpu-blocks 2000 --prefill-us-per-token 1000"
        );
        assert_eq!(stall.poll_interval_ms, 100);
        assert_eq!(by_name("tenants-stall-ts0.05").time_scale, 0.05);
        assert_eq!(by_name("tenants-stall-poll500").poll_interval_ms, 500);
        assert_eq!(by_name("tenants-stall-reset").reset_caches_at, Some(120.0));
        assert!(!by_name("tenants-stall-reset").reset_as_restart);
        assert!(by_name("tenants-stall-restart").reset_as_restart);
        assert_eq!(by_name("tenants-stall-restart").reset_pods, None);
        assert_eq!(by_name("tenants-stall-restart-one").reset_pods, Some(1));
        assert_eq!(by_name("tenants-64-skewed").spec.zipf, 1.0);
        let short = matrix_args(&["--cells", "short", "--seeds", "1", "--time-scale", "0.2"]);
        let cells = matrix::select(&short.cells).expect("known");
        assert_eq!(
            cell_args(&short, &cells[0]).expect("parses").time_scale,
            0.2
        );
    }
}
