//! The pictures `kvbench compare` writes beside its tables: per workload the TTFT CDF of every
//! policy (`<workload>-ttft-cdf.png`; the successful requests of all seeds pooled, log x axis in
//! simulated ms) and, when rows come from several gateway counts (`--replicas 1,2`), the replica
//! agreement (`<workload>-replicas.png`: hit ratio and p90 TTFT per policy and gateway count); over
//! all workloads, the cache-hit ratio per policy (`hit-ratio.png`). Bars are medians over the seeds
//! with a min–max whisker. Plots never fail a benchmark: without a font they are skipped with one
//! line saying why, and a picture that cannot be drawn is reported and left out.

use std::path::{Path, PathBuf};

use super::plot::{
    cdf_points, Bar, BarChart, BarSeries, Chart, Corner, Figure, LineChart, Plotter, Series,
};
use super::summary::{PolicySummary, Spread};
use super::RunReport;

/// Points per CDF line: enough for a smooth curve, few enough for a small file.
const CDF_POINTS: usize = 600;

/// `seed 1`, `seeds 1–3`, or `seeds 1, 4` for a list with gaps.
fn seeds_phrase(seeds: &[u64]) -> String {
    let mut s: Vec<u64> = seeds.to_vec();
    s.sort_unstable();
    s.dedup();
    match s.as_slice() {
        [] => "no seeds".to_owned(),
        [one] => format!("seed {one}"),
        [first, .., last] if last - first + 1 == s.len() as u64 => {
            format!("seeds {first}–{last}")
        }
        _ => {
            let list: Vec<String> = s.iter().map(u64::to_string).collect();
            format!("seeds {}", list.join(", "))
        }
    }
}

/// The TTFT CDF of every row label of `runs` (one comparison per seed), the seeds' successful
/// requests pooled.
pub fn ttft_cdf(workload: &str, runs: &[Vec<(String, RunReport)>]) -> Figure {
    let mut labels: Vec<&str> = Vec::new();
    for (label, _) in runs.iter().flatten() {
        if !labels.contains(&label.as_str()) {
            labels.push(label);
        }
    }
    let seeds: Vec<u64> = runs.iter().flatten().map(|(_, r)| r.seed).collect();
    let series = labels
        .iter()
        .map(|label| {
            let samples: Vec<f64> = runs
                .iter()
                .flatten()
                .filter(|(l, _)| l == label)
                .flat_map(|(_, r)| r.ttft_samples_ms.iter().copied())
                .collect();
            Series {
                name: format!("{label} ({} requests)", samples.len()),
                points: cdf_points(&samples, CDF_POINTS),
            }
        })
        .collect();
    let pooled = if runs.len() > 1 { " pooled" } else { "" };
    Figure::single(Chart::Lines(LineChart {
        title: format!("{workload}: TTFT CDF, {}{pooled}", seeds_phrase(&seeds)),
        x_desc: "TTFT (ms, simulated time, log scale)".to_owned(),
        y_desc: "fraction of requests".to_owned(),
        x_log: true,
        y_range: Some((0.0, 1.0)),
        legend: Corner::LowerRight,
        series,
        ..LineChart::default()
    }))
}

fn bar(s: &Spread, scale: f64) -> Option<Bar> {
    let m = s.median?;
    Some(match (s.min, s.max) {
        (Some(lo), Some(hi)) if s.n > 1 => Bar::spread(m * scale, lo * scale, hi * scale),
        _ => Bar::new(m * scale),
    })
}

/// `over 3 seeds (median, min–max)` or `seed 1`.
fn over_seeds(seeds: &[u64]) -> String {
    let mut s = seeds.to_vec();
    s.sort_unstable();
    s.dedup();
    if s.len() > 1 {
        format!("median over {} seeds, min–max", s.len())
    } else {
        seeds_phrase(&s)
    }
}

/// Cache-hit ratio per policy (a colour each) per workload (a group each), from each workload's
/// summaries.
pub fn hit_ratio(overview: &[(String, Vec<PolicySummary>)]) -> Figure {
    let mut labels: Vec<&str> = Vec::new();
    for (_, summaries) in overview {
        for s in summaries {
            if !labels.contains(&s.label.as_str()) {
                labels.push(&s.label);
            }
        }
    }
    let seeds: Vec<u64> = overview
        .iter()
        .flat_map(|(_, s)| s.iter().flat_map(|p| p.seeds.iter().copied()))
        .collect();
    let series = labels
        .iter()
        .map(|label| BarSeries {
            name: (*label).to_owned(),
            bars: overview
                .iter()
                .map(|(_, summaries)| {
                    let s = summaries.iter().find(|s| s.label == *label)?;
                    bar(&s.cache_hit_ratio, 100.0)
                })
                .collect(),
        })
        .collect();
    Figure::single(Chart::Bars(BarChart {
        title: format!("Prefix-cache hit ratio ({})", over_seeds(&seeds)),
        y_desc: "hit ratio (%)".to_owned(),
        groups: overview.iter().map(|(w, _)| w.clone()).collect(),
        y_range: None,
        value_decimals: 0,
        legend: Corner::Outside,
        series,
    }))
}

/// A row label's policy and gateway count: `kvroute ×2` → (`kvroute`, 2), `kvroute` → (`kvroute`, 1).
pub fn gateways(label: &str) -> (&str, usize) {
    label
        .rsplit_once(" ×")
        .and_then(|(policy, n)| Some((policy, n.parse().ok()?)))
        .unwrap_or((label, 1))
}

/// Hit ratio and p90 TTFT per policy (a group each) and gateway count (a colour each); `None`
/// unless the rows come from more than one gateway count.
pub fn replicas(workload: &str, summaries: &[PolicySummary]) -> Option<Figure> {
    let mut policies: Vec<&str> = Vec::new();
    let mut counts: Vec<usize> = Vec::new();
    for s in summaries {
        let (policy, n) = gateways(&s.label);
        if !policies.contains(&policy) {
            policies.push(policy);
        }
        if !counts.contains(&n) {
            counts.push(n);
        }
    }
    if counts.len() < 2 {
        return None;
    }
    counts.sort_unstable();
    let seeds: Vec<u64> = summaries
        .iter()
        .flat_map(|s| s.seeds.iter().copied())
        .collect();
    let panel = |title: &str,
                 y_desc: &str,
                 figure: fn(&PolicySummary) -> &Spread,
                 scale: f64,
                 legend: Corner| {
        let series = counts
            .iter()
            .map(|&n| BarSeries {
                name: format!("{n} gateway{}", if n == 1 { "" } else { "s" }),
                bars: policies
                    .iter()
                    .map(|p| {
                        let s = summaries.iter().find(|s| gateways(&s.label) == (*p, n))?;
                        bar(figure(s), scale)
                    })
                    .collect(),
            })
            .collect();
        Chart::Bars(BarChart {
            title: title.to_owned(),
            y_desc: y_desc.to_owned(),
            groups: policies.iter().map(|p| (*p).to_owned()).collect(),
            y_range: None,
            value_decimals: 0,
            legend,
            series,
        })
    };
    let hit = panel(
        &format!("{workload}: hit ratio"),
        "hit ratio (%)",
        |s| &s.cache_hit_ratio,
        100.0,
        Corner::Hidden,
    );
    let p90 = panel(
        &format!("p90 TTFT ({})", over_seeds(&seeds)),
        "ms, simulated time",
        |s| &s.ttft_p90_ms,
        1.0,
        Corner::Outside,
    );
    Some(Figure::row(vec![hit, p90]))
}

/// Writes the pictures of a comparison, or says once why it cannot.
pub struct ComparePlots {
    plotter: Option<Plotter>,
}

impl ComparePlots {
    /// Looks for the font ([`Plotter::from_env`]); without it, prints the one line saying the
    /// plots are skipped and why.
    pub fn new() -> Self {
        match Plotter::from_env() {
            Ok(p) => ComparePlots { plotter: Some(p) },
            Err(e) => {
                eprintln!("plots skipped (tables and JSON are written as usual): {e:#}");
                ComparePlots { plotter: None }
            }
        }
    }

    /// With this plotter (`None`: write nothing).
    pub fn with(plotter: Option<Plotter>) -> Self {
        ComparePlots { plotter }
    }

    /// `<workload>-ttft-cdf.png` and, with several gateway counts, `<workload>-replicas.png` in
    /// `dir`; the paths written.
    pub fn workload(
        &self,
        dir: &Path,
        workload: &str,
        runs: &[Vec<(String, RunReport)>],
        summaries: &[PolicySummary],
    ) -> Vec<PathBuf> {
        let mut pictures = vec![(
            dir.join(format!("{workload}-ttft-cdf.png")),
            ttft_cdf(workload, runs),
        )];
        if let Some(f) = replicas(workload, summaries) {
            pictures.push((dir.join(format!("{workload}-replicas.png")), f));
        }
        self.write(pictures)
    }

    /// `hit-ratio.png` in `dir` over every workload of `overview`.
    pub fn overview(&self, dir: &Path, overview: &[(String, Vec<PolicySummary>)]) -> Vec<PathBuf> {
        self.write(vec![(dir.join("hit-ratio.png"), hit_ratio(overview))])
    }

    fn write(&self, pictures: Vec<(PathBuf, Figure)>) -> Vec<PathBuf> {
        let Some(plotter) = &self.plotter else {
            return Vec::new();
        };
        let mut written = Vec::new();
        for (path, figure) in pictures {
            match plotter.write_png(&path, &figure) {
                Ok(()) => {
                    eprintln!("wrote {}", path.display());
                    written.push(path);
                }
                Err(e) => eprintln!("plot {} not written: {e:#}", path.display()),
            }
        }
        written
    }
}

impl Default for ComparePlots {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::check::{plotter_or_skip, Picture, TempDir};
    use crate::plot::color;
    use crate::summary::summarize;
    use crate::{Load, RequestRecord, WorkloadKind, WorkloadSpec};

    /// A report with these TTFTs (ms; simulated = wall) and this hit ratio.
    fn report(seed: u64, ttfts_ms: &[f64], hit: f64) -> RunReport {
        let mut spec = WorkloadSpec::new(
            WorkloadKind::from_name("multi-tenant").expect("known"),
            Load::Open { rate: 1.0 },
        );
        spec.seed = seed;
        let records: Vec<RequestRecord> = ttfts_ms
            .iter()
            .map(|&t| RequestRecord {
                ttft_s: Some(t / 1000.0),
                e2e_s: Some(t / 1000.0 + 1.0),
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

    /// 40 TTFTs spread over 20 ms – 20 s, times `k`.
    fn ttfts(k: f64) -> Vec<f64> {
        (0..40)
            .map(|i| k * 20.0 * 10f64.powf(f64::from(i) / 13.0))
            .collect()
    }

    /// Two seeds of kvroute and round-robin, each with one and two gateways.
    fn runs() -> Vec<Vec<(String, RunReport)>> {
        (1..=2)
            .map(|seed| {
                let s = seed as f64;
                vec![
                    (
                        "kvroute".to_owned(),
                        report(seed, &ttfts(1.0), 0.7 + s / 100.0),
                    ),
                    ("round-robin".to_owned(), report(seed, &ttfts(3.0), 0.3)),
                    ("kvroute ×2".to_owned(), report(seed, &ttfts(1.5), 0.5)),
                    ("round-robin ×2".to_owned(), report(seed, &ttfts(4.5), 0.2)),
                ]
            })
            .collect()
    }

    #[test]
    fn the_charts_carry_every_policy_seed_and_gateway_count() {
        let runs = runs();
        assert_eq!(runs[0][0].1.ttft_samples_ms.len(), 40);
        assert!(runs[0][0]
            .1
            .ttft_samples_ms
            .windows(2)
            .all(|w| w[0] <= w[1]));
        let Chart::Lines(cdf) = &ttft_cdf("multi-tenant", &runs).charts[0] else {
            panic!("a line chart");
        };
        assert_eq!(cdf.title, "multi-tenant: TTFT CDF, seeds 1–2 pooled");
        assert!(cdf.x_log);
        assert_eq!(cdf.series.len(), 4);
        assert_eq!(cdf.series[0].name, "kvroute (80 requests)", "both seeds");
        assert_eq!(cdf.series[0].points.last().map(|p| p.1), Some(1.0));
        let s = summarize(&runs);
        let Chart::Bars(hit) = &hit_ratio(&[("multi-tenant".to_owned(), s.clone())]).charts[0]
        else {
            panic!("a bar chart");
        };
        assert_eq!(hit.groups, ["multi-tenant"]);
        assert_eq!(hit.series.len(), 4);
        let kv = hit.series[0].bars[0].expect("measured");
        assert!(
            (kv.value - 71.5).abs() < 1e-9,
            "median of 71 and 72: {kv:?}"
        );
        assert_eq!(
            kv.range.map(|(a, b)| (a.round(), b.round())),
            Some((71.0, 72.0))
        );
        let fig = replicas("multi-tenant", &s).expect("two gateway counts");
        let [Chart::Bars(h), Chart::Bars(p90)] = fig.charts.as_slice() else {
            panic!("two bar panels");
        };
        assert_eq!(h.groups, ["kvroute", "round-robin"]);
        let names: Vec<&str> = p90.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["1 gateway", "2 gateways"]);
        assert!((h.series[1].bars[0].expect("kvroute ×2").value - 50.0).abs() < 1e-9);
        assert!(p90.series[0].bars[1].expect("round-robin").value > 1000.0);
        let one: Vec<PolicySummary> = s.into_iter().filter(|p| !p.label.contains('×')).collect();
        assert!(replicas("multi-tenant", &one).is_none());
        assert_eq!(gateways("smg-rr ×12"), ("smg-rr", 12));
        assert_eq!(gateways("perfect-knowledge"), ("perfect-knowledge", 1));
        assert_eq!(seeds_phrase(&[4, 1, 1]), "seeds 1, 4");
    }

    #[test]
    fn compare_writes_a_cdf_a_hit_ratio_and_a_replica_picture() {
        let Some(plotter) =
            plotter_or_skip("compare_writes_a_cdf_a_hit_ratio_and_a_replica_picture")
        else {
            return;
        };
        let runs = runs();
        let s = summarize(&runs);
        let tmp = TempDir::new("compare");
        let dir = &tmp.0;
        let plots = ComparePlots::with(Some(plotter));
        let written = plots.workload(dir, "multi-tenant", &runs, &s);
        assert_eq!(
            written,
            [
                dir.join("multi-tenant-ttft-cdf.png"),
                dir.join("multi-tenant-replicas.png")
            ]
        );
        let overview = [
            ("multi-tenant".to_owned(), s.clone()),
            ("long-unique".to_owned(), s),
        ];
        assert_eq!(plots.overview(dir, &overview), [dir.join("hit-ratio.png")]);
        for (file, colours) in [
            ("multi-tenant-ttft-cdf.png", 4),
            ("multi-tenant-replicas.png", 2),
            ("hit-ratio.png", 4),
        ] {
            let pic = Picture::read(&dir.join(file));
            assert_eq!((pic.width, pic.height), Figure::SIZE, "{file}");
            for i in 0..colours {
                assert!(pic.count(color(i)) > 150, "{file}: series {i} drawn");
            }
            assert_eq!(
                pic.count(color(colours)),
                0,
                "{file}: {colours} series only"
            );
            let bytes = std::fs::metadata(dir.join(file))
                .map(|m| m.len())
                .unwrap_or(0);
            assert!(bytes < 150_000, "{file}: {bytes} bytes");
        }
        // Without a plotter nothing is written.
        let none = TempDir::new("compare-none");
        assert!(ComparePlots::with(None)
            .workload(&none.0, "multi-tenant", &runs, &[])
            .is_empty());
        assert_eq!(std::fs::read_dir(&none.0).map(|d| d.count()).ok(), Some(0));
    }
}
