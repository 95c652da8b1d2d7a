//! `overhead.png`: the latency kvroute adds (p50) against the prompt's size, one line per block
//! scheme and prompt kind, both axes logarithmic; beside it, kvroute's own body phase (the
//! decision as the filter times it inside the VM), so the picture shows how much of the added
//! latency is kvroute's work and how much the crossing into Envoy's Wasm machinery.

use super::hop_summary::{hops_and_sizes, HopRow};
use super::render::size_name;
use super::summary::LatencyRow;
use crate::plot::{Bar, BarChart, BarSeries, Chart, Corner, Figure, LineChart, Plotter, Series};
use std::path::Path;

/// The figure of `rows`.
pub fn figure(rows: &[LatencyRow]) -> Figure {
    let lines = |value: fn(&LatencyRow) -> Option<f64>| -> Vec<Series> {
        let mut keys: Vec<(String, String)> = Vec::new();
        for r in rows {
            let key = (r.mode.name().to_owned(), r.kind.name().to_owned());
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys.into_iter()
            .map(|(mode, kind)| {
                let mut points: Vec<(f64, f64)> = rows
                    .iter()
                    .filter(|r| r.mode.name() == mode && r.kind.name() == kind)
                    .filter_map(|r| Some((r.prompt_size as f64, value(r)?)))
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    name: format!("{mode}, {kind}"),
                    points,
                }
            })
            .collect()
    };
    let chart = |title: &str, y_desc: &str, series: Vec<Series>, legend: Corner| {
        Chart::Lines(LineChart {
            title: title.to_owned(),
            x_desc: "prompt bytes".to_owned(),
            y_desc: y_desc.to_owned(),
            x_log: true,
            y_log: true,
            markers: true,
            legend,
            series,
            ..LineChart::default()
        })
    };
    Figure::row(vec![
        chart(
            "latency added by kvroute (p50)",
            "µs",
            lines(|r| r.added_p50_us),
            Corner::UpperLeft,
        ),
        chart(
            "kvroute's body phase inside the VM (p50)",
            "µs",
            lines(|r| r.decision_p50_us),
            Corner::Hidden,
        ),
    ])
}

/// The hop phase's figure: the p50 each hop adds over calling the pod directly against the
/// prompt's size, one line per hop (medians of the runs, both axes logarithmic); beside it, each
/// hop's requests per CPU-second under load at every size, with the runs' min–max.
pub fn hops_figure(rows: &[HopRow]) -> Figure {
    let (hops, mut sizes) = hops_and_sizes(rows);
    sizes.sort_unstable();
    let at = |hop: &str, size: usize| rows.iter().find(|r| r.hop == hop && r.prompt_size == size);
    let lines = hops
        .iter()
        .map(|&hop| Series {
            name: hop.to_owned(),
            points: sizes
                .iter()
                .filter_map(|&s| Some((s as f64, at(hop, s)?.added_p50_us.median?)))
                .collect(),
        })
        .collect();
    let bars = hops
        .iter()
        .map(|&hop| BarSeries {
            name: hop.to_owned(),
            bars: sizes
                .iter()
                .map(|&s| {
                    let v = at(hop, s)?.rps_per_cpu_s;
                    Some(Bar::spread(v.median?, v.min?, v.max?))
                })
                .collect(),
        })
        .collect();
    Figure::row(vec![
        Chart::Lines(LineChart {
            title: "latency added over calling the pod (p50)".to_owned(),
            x_desc: "prompt bytes".to_owned(),
            y_desc: "µs".to_owned(),
            x_log: true,
            y_log: true,
            markers: true,
            legend: Corner::UpperLeft,
            series: lines,
            ..LineChart::default()
        }),
        Chart::Bars(BarChart {
            title: "requests per CPU-second of the hop".to_owned(),
            y_desc: "requests / CPU-s".to_owned(),
            groups: sizes.iter().map(|&s| size_name(s)).collect(),
            legend: Corner::Hidden,
            series: bars,
            ..BarChart::default()
        }),
    ])
}

/// Writes `path` from `figure`, or says in one line why not (a plot never fails the benchmark).
fn write_figure(path: &Path, figure: &Figure) {
    let written = Plotter::from_env().and_then(|p| p.write_png(path, figure));
    match written {
        Ok(()) => eprintln!("wrote {}", path.display()),
        Err(e) => eprintln!("plot {} not written: {e:#}", path.display()),
    }
}

/// Writes `DIR/overhead.png`.
pub fn write(dir: &Path, rows: &[LatencyRow]) {
    write_figure(&dir.join("overhead.png"), &figure(rows));
}

/// Writes `DIR/overhead-hops.png`.
pub fn write_hops(dir: &Path, rows: &[HopRow]) {
    write_figure(&dir.join("overhead-hops.png"), &hops_figure(rows));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overhead::options::{BlockMode, PromptKind};
    use crate::overhead::DIRECT;
    use crate::plot::check::{plotter_or_skip, Picture, TempDir};
    use crate::plot::color;

    fn row(mode: BlockMode, kind: PromptKind, size: usize, added: f64) -> LatencyRow {
        LatencyRow {
            mode,
            prompt_size: size,
            kind,
            pairs: 10,
            plain_p50_us: Some(800.0),
            kvroute_p50_us: Some(800.0 + added),
            added_p50_us: Some(added),
            added_p50_ci95_us: None,
            added_mean_us: Some(added),
            plain_cpu_us_per_request: None,
            kvroute_cpu_us_per_request: None,
            added_cpu_us_per_request: None,
            decision_p50_us: Some(added / 2.0),
            decision_mean_us: None,
            added_outside_decision_p50_us: None,
        }
    }

    fn rows() -> Vec<LatencyRow> {
        let mut rows = Vec::new();
        for (mode, k) in [(BlockMode::Chars, 1.0), (BlockMode::Tiktoken, 10.0)] {
            for kind in [PromptKind::Repeat, PromptKind::Fresh] {
                // Out of order: the chart sorts by size.
                for size in [16_384, 256, 262_144] {
                    rows.push(row(mode, kind, size, k * (100.0 + size as f64 / 100.0)));
                }
            }
        }
        rows
    }

    #[test]
    fn one_line_per_scheme_and_kind_over_the_sizes() {
        let f = figure(&rows());
        assert_eq!(f.charts.len(), 2);
        let Chart::Lines(added) = &f.charts[0] else {
            panic!("a line chart")
        };
        assert!(added.x_log && added.y_log);
        let names: Vec<&str> = added.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "chars, repeat",
                "chars, fresh",
                "tiktoken, repeat",
                "tiktoken, fresh"
            ]
        );
        let xs: Vec<f64> = added.series[0].points.iter().map(|p| p.0).collect();
        assert_eq!(xs, [256.0, 16_384.0, 262_144.0]);
        assert_eq!(added.series[2].points[0].1, 10.0 * (100.0 + 2.56));
        let Chart::Lines(decision) = &f.charts[1] else {
            panic!("a line chart")
        };
        assert_eq!(decision.series[0].points[0].1, (100.0 + 2.56) / 2.0);
    }

    fn hop_row(hop: &str, size: usize, added: f64) -> HopRow {
        let spread = |v: f64| crate::overhead::Spread {
            median: Some(v),
            min: Some(v * 0.9),
            max: Some(v * 1.2),
        };
        HopRow {
            prompt_size: size,
            hop: hop.to_owned(),
            runs: 3,
            failed: 0,
            p50_us: spread(300.0 + added),
            p99_us: spread(600.0 + added),
            added_p50_us: spread(added),
            cpu_us_per_request: spread(added),
            rps: spread(1000.0),
            rps_per_cpu_s: spread(1e6 / (added + 1.0)),
            cores: Some(1.0),
            p50_us_under_load: None,
        }
    }

    #[test]
    fn the_hop_figure_has_a_line_and_bars_per_hop_but_direct() {
        let mut rows = Vec::new();
        // Out of order: the figure sorts the sizes.
        for size in [16_384, 256] {
            for (hop, added) in [(DIRECT, 0.0), ("kvroute", 400.0), ("smg", 300.0)] {
                rows.push(hop_row(hop, size, added * size as f64 / 256.0));
            }
        }
        let f = hops_figure(&rows);
        let (Chart::Lines(lines), Chart::Bars(bars)) = (&f.charts[0], &f.charts[1]) else {
            panic!("a line chart and a bar chart")
        };
        let names: Vec<&str> = lines.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["kvroute", "smg"]);
        assert_eq!(
            lines.series[1].points,
            [(256.0, 300.0), (16_384.0, 19_200.0)]
        );
        assert_eq!(bars.groups, ["256 B", "16 KB"]);
        assert_eq!(bars.series.len(), 2);
        let bar = bars.series[0].bars[0].expect("kvroute at 256 B");
        let v = 1e6 / 401.0;
        assert_eq!(bar.value, v);
        assert_eq!(bar.range, Some((v * 0.9, v * 1.2)));
    }

    #[test]
    fn overhead_writes_its_picture() {
        let Some(plotter) = plotter_or_skip("overhead_writes_its_picture") else {
            return;
        };
        let tmp = TempDir::new("overhead");
        let path = tmp.0.join("overhead.png");
        plotter.write_png(&path, &figure(&rows())).expect("drawn");
        let picture = Picture::read(&path);
        for i in 0..4 {
            assert!(picture.count(color(i)) > 50, "series {i} drawn");
        }
    }
}
