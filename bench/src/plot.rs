//! PNG charts of benchmark results: line charts (optionally with log axes) and grouped bar charts
//! with min–max whiskers, one or several panels per picture, drawn with plotters' bitmap backend.
//!
//! Text needs a font file: plotters' `ab_glyph` renderer reads a TTF that this module loads at run
//! time ([`Plotter::load`]; by default Debian's `fonts-dejavu-core`, [`DEFAULT_FONT`], or the file
//! named by `KVBENCH_PLOT_FONT`), so nothing links fontconfig or freetype. A [`Plotter`] exists only
//! once a font is registered; without one a benchmark writes its tables and says the plots were
//! skipped (see [`Plotter::from_env`]). Colours are the Okabe–Ito palette (distinguishable with the
//! common colour-vision deficiencies), in series order, so the same policy order gives the same
//! colours in every chart of a run. Log axes are widened to whole decades so that every axis has
//! labelled ticks.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

/// Debian's `fonts-dejavu-core` (the Makefile's `fonts` target installs it).
pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// Names another TTF/OTF file to draw text with.
pub const FONT_ENV: &str = "KVBENCH_PLOT_FONT";

/// The font family every text is drawn in (plotters' default family for axis and legend labels).
const FAMILY: &str = "sans-serif";

/// Okabe–Ito, then black and grey; cycles beyond that.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(230, 159, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(128, 128, 128),
    RGBColor(170, 150, 0),
    RGBColor(140, 80, 40),
];

/// The colour of the `i`-th series.
pub fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// One line of a [`LineChart`].
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    /// Drawn in this order (sort by x for a line over x).
    pub points: Vec<(f64, f64)>,
}

/// Where a chart's legend goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Corner {
    UpperLeft,
    #[default]
    UpperRight,
    LowerLeft,
    LowerRight,
    /// Beside the plot, to its right (for charts whose data fills every corner).
    Outside,
    /// No legend (another panel of the figure has it).
    Hidden,
}

/// Lines over a shared x axis.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    /// Logarithmic axes (points with a coordinate ≤ 0 are left out).
    pub x_log: bool,
    pub y_log: bool,
    /// Fixed y range; `None` = from the data (from 0 on a linear axis).
    pub y_range: Option<(f64, f64)>,
    /// A dot on every point as well as the line (for a few measured points).
    pub markers: bool,
    pub legend: Corner,
    pub series: Vec<Series>,
}

/// One bar: a value and, where there is a spread (several seeds), its range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bar {
    pub value: f64,
    /// Drawn as a whisker when it differs from the value.
    pub range: Option<(f64, f64)>,
}

impl Bar {
    pub fn new(value: f64) -> Self {
        Bar { value, range: None }
    }

    /// A median with its min–max.
    pub fn spread(value: f64, min: f64, max: f64) -> Self {
        Bar {
            value,
            range: Some((min, max)),
        }
    }
}

/// One colour of a [`BarChart`]: a bar per group (`None` where it was not measured).
#[derive(Clone, Debug, PartialEq)]
pub struct BarSeries {
    pub name: String,
    pub bars: Vec<Option<Bar>>,
}

/// Grouped bars: one group per entry of `groups` along x, in each one bar per series.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub y_desc: String,
    pub groups: Vec<String>,
    /// Fixed y range; `None` = 0 to the largest bar or whisker.
    pub y_range: Option<(f64, f64)>,
    /// Decimals of the value written above each bar (none when there are too many bars to read).
    pub value_decimals: usize,
    pub legend: Corner,
    pub series: Vec<BarSeries>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Chart {
    Lines(LineChart),
    Bars(BarChart),
}

/// One picture: charts in a grid of `rows` × `cols` panels, filled row by row.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    /// Pixels, width × height.
    pub size: (u32, u32),
    pub rows: usize,
    pub cols: usize,
    pub charts: Vec<Chart>,
}

impl Figure {
    /// The size the benchmarks' pictures use: readable in a README, small as a file.
    pub const SIZE: (u32, u32) = (900, 500);

    pub fn single(chart: Chart) -> Self {
        Figure {
            size: Self::SIZE,
            rows: 1,
            cols: 1,
            charts: vec![chart],
        }
    }

    /// Panels side by side.
    pub fn row(charts: Vec<Chart>) -> Self {
        Figure {
            size: Self::SIZE,
            rows: 1,
            cols: charts.len().max(1),
            charts,
        }
    }

    /// Panels one above the other.
    pub fn column(charts: Vec<Chart>) -> Self {
        Figure {
            size: Self::SIZE,
            rows: charts.len().max(1),
            cols: 1,
            charts,
        }
    }
}

/// Draws [`Figure`]s; holding one means a font is registered, so text can be drawn.
#[derive(Clone, Copy, Debug)]
pub struct Plotter {
    _font: (),
}

/// The font file registered with plotters (registration is process-wide and happens once).
static REGISTERED: OnceLock<PathBuf> = OnceLock::new();

impl Plotter {
    /// With the font named by `KVBENCH_PLOT_FONT`, else [`DEFAULT_FONT`]. The error says which file
    /// is missing and how to install it: print it as the reason the plots were skipped.
    pub fn from_env() -> Result<Plotter> {
        let path = std::env::var_os(FONT_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_FONT));
        Self::load(&path)
    }

    /// With the TTF/OTF file at `path`. Fails when it cannot be read or is not a font. The first
    /// font loaded is the one text is drawn with (plotters' font table is process-wide); a later
    /// call only checks its own file.
    pub fn load(path: &Path) -> Result<Plotter> {
        let bytes = std::fs::read(path).map_err(|e| {
            anyhow!(
                "no font at {} ({e}); install Debian's fonts-dejavu-core (`make fonts`) or set {FONT_ENV} to a TTF file",
                path.display()
            )
        })?;
        ab_glyph::FontRef::try_from_slice(&bytes)
            .map_err(|e| anyhow!("{} is not a TTF/OTF font ({e})", path.display()))?;
        REGISTERED.get_or_init(|| {
            // plotters keeps `&'static` font data: leaked once per process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            // Cannot fail: ab_glyph parsed the same bytes above.
            let _ = plotters::style::register_font(FAMILY, FontStyle::Normal, bytes);
            path.to_path_buf()
        });
        Ok(Plotter { _font: () })
    }

    /// Draws `figure` into the PNG file `path` (replaced if it exists).
    pub fn write_png(&self, path: &Path, figure: &Figure) -> Result<()> {
        anyhow::ensure!(
            figure.rows * figure.cols >= figure.charts.len() && !figure.charts.is_empty(),
            "{} charts do not fit {} × {} panels",
            figure.charts.len(),
            figure.rows,
            figure.cols
        );
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let root = BitMapBackend::new(path, figure.size).into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        let panels = root.split_evenly((figure.rows, figure.cols));
        for (panel, chart) in panels.iter().zip(&figure.charts) {
            match chart {
                Chart::Lines(c) => draw_lines(panel, c),
                Chart::Bars(c) => draw_bars(panel, c),
            }
            .with_context(|| format!("drawing {:?}", chart_title(chart)))?;
        }
        root.present()
            .map_err(drawing)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }
}

fn chart_title(chart: &Chart) -> &str {
    match chart {
        Chart::Lines(c) => &c.title,
        Chart::Bars(c) => &c.title,
    }
}

fn drawing<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("{e}")
}

/// A tick label: integers without decimals, others with up to three.
fn tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

fn position(corner: Corner) -> SeriesLabelPosition {
    match corner {
        Corner::UpperLeft => SeriesLabelPosition::UpperLeft,
        Corner::UpperRight => SeriesLabelPosition::UpperRight,
        Corner::LowerLeft => SeriesLabelPosition::LowerLeft,
        Corner::LowerRight => SeriesLabelPosition::LowerRight,
        Corner::Outside | Corner::Hidden => SeriesLabelPosition::UpperRight,
    }
}

/// How a series looks in a legend.
#[derive(Clone, Copy)]
enum Swatch {
    Line,
    Block,
}

/// Splits `legend`'s width off the right of `area` when the legend goes outside: (plot, legend).
fn beside<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    legend: Corner,
    names: &[&str],
) -> (DrawingArea<DB, Shift>, Option<DrawingArea<DB, Shift>>) {
    if legend != Corner::Outside {
        return (area.clone(), None);
    }
    let font = TextStyle::from((FAMILY, 13).into_font());
    let text = names
        .iter()
        .map(|n| area.estimate_text_size(n, &font).map_or(0, |s| s.0))
        .max()
        .unwrap_or(0);
    let (w, _) = area.dim_in_pixel();
    let width = (text + 40).min(w * 2 / 5);
    let (plot, side) = area.split_horizontally(w - width);
    (plot, Some(side))
}

/// A legend drawn in its own area: a swatch and a name per series, from the top.
fn side_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    names: &[&str],
    swatch: Swatch,
) -> Result<()> {
    let font = (FAMILY, 13).into_font().color(&BLACK);
    for (i, name) in names.iter().enumerate() {
        let y = 50 + 20 * i as i32;
        let col = color(i);
        match swatch {
            Swatch::Line => area.draw(&PathElement::new(
                vec![(4, y), (22, y)],
                col.stroke_width(2),
            )),
            Swatch::Block => area.draw(&Rectangle::new([(6, y - 6), (20, y + 6)], col.filled())),
        }
        .map_err(drawing)?;
        area.draw(&Text::new(name.to_string(), (28, y - 7), font.clone()))
            .map_err(drawing)?;
    }
    Ok(())
}

/// The legend of `chart`: inside its plot at `corner`, or beside it in `side`; none for a single
/// series (the title names it).
fn legend<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    corner: Corner,
    side: Option<&DrawingArea<DB, Shift>>,
    names: &[&str],
    swatch: Swatch,
) -> Result<()>
where
    DB: DrawingBackend + 'a,
    X: Ranged,
    Y: Ranged,
{
    if names.len() <= 1 || corner == Corner::Hidden {
        return Ok(());
    }
    if let Some(side) = side {
        return side_legend(side, names, swatch);
    }
    chart
        .configure_series_labels()
        .position(position(corner))
        .label_font((FAMILY, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(drawing)
}

/// The axis range over `values`: whole decades on a log axis, from 0 on a linear one.
fn axis_range(values: impl Iterator<Item = f64>, log: bool, from_zero: bool) -> Result<(f64, f64)> {
    let v: Vec<f64> = values
        .filter(|x| x.is_finite() && (!log || *x > 0.0))
        .collect();
    let (lo, hi) = (
        v.iter().copied().reduce(f64::min),
        v.iter().copied().reduce(f64::max),
    );
    let (Some(lo), Some(hi)) = (lo, hi) else {
        bail!("no points to draw");
    };
    if log {
        let lo = 10f64.powf(lo.log10().floor());
        let hi = 10f64.powf(hi.log10().ceil());
        return Ok((lo, if hi > lo { hi } else { lo * 10.0 }));
    }
    let lo = if from_zero { lo.min(0.0) } else { lo };
    let span = hi - lo;
    Ok(if span > 0.0 {
        (lo, hi + span * if from_zero { 0.08 } else { 0.0 })
    } else {
        (lo - 1.0, hi + 1.0)
    })
}

fn draw_lines<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, c: &LineChart) -> Result<()> {
    let xs = c.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (x0, x1) = axis_range(xs, c.x_log, false)?;
    let (y0, y1) = match c.y_range {
        Some(r) => r,
        None => axis_range(
            c.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
            c.y_log,
            true,
        )?,
    };
    match (c.x_log, c.y_log) {
        (false, false) => lines_on(area, c, x0..x1, y0..y1),
        (true, false) => lines_on(area, c, (x0..x1).log_scale(), y0..y1),
        (false, true) => lines_on(area, c, x0..x1, (y0..y1).log_scale()),
        (true, true) => lines_on(area, c, (x0..x1).log_scale(), (y0..y1).log_scale()),
    }
}

fn lines_on<DB, X, Y>(area: &DrawingArea<DB, Shift>, c: &LineChart, x: X, y: Y) -> Result<()>
where
    DB: DrawingBackend,
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let names: Vec<&str> = c.series.iter().map(|s| s.name.as_str()).collect();
    let (plot, side) = beside(area, c.legend, &names);
    let mut chart = ChartBuilder::on(&plot)
        .caption(&c.title, (FAMILY, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(drawing)?;
    chart
        .configure_mesh()
        .x_desc(&c.x_desc)
        .y_desc(&c.y_desc)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 14))
        .light_line_style(WHITE)
        .draw()
        .map_err(drawing)?;
    let keep = |p: &&(f64, f64)| {
        p.0.is_finite() && p.1.is_finite() && (!c.x_log || p.0 > 0.0) && (!c.y_log || p.1 > 0.0)
    };
    for (i, s) in c.series.iter().enumerate() {
        let col = color(i);
        let points: Vec<(f64, f64)> = s.points.iter().filter(keep).copied().collect();
        chart
            .draw_series(LineSeries::new(points.clone(), col.stroke_width(2)))
            .map_err(drawing)?
            .label(&s.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
        if c.markers {
            chart
                .draw_series(points.iter().map(|p| Circle::new(*p, 3, col.filled())))
                .map_err(drawing)?;
        }
    }
    legend(&mut chart, c.legend, side.as_ref(), &names, Swatch::Line)
}

/// Bars are written with their value only while there are at most this many.
const MAX_VALUE_LABELS: usize = 24;

fn draw_bars<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, c: &BarChart) -> Result<()> {
    let groups = c.groups.len();
    anyhow::ensure!(groups > 0 && !c.series.is_empty(), "no bars to draw");
    let bars = || c.series.iter().flat_map(|s| s.bars.iter().flatten());
    let (y0, y1) = match c.y_range {
        Some(r) => r,
        None => axis_range(
            bars().flat_map(|b| [b.value, b.range.map_or(b.value, |r| r.1)]),
            false,
            true,
        )?,
    };
    let names: Vec<&str> = c.series.iter().map(|s| s.name.as_str()).collect();
    let (plot, side) = beside(area, c.legend, &names);
    let mut chart = ChartBuilder::on(&plot)
        .caption(&c.title, (FAMILY, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..groups as f64 - 0.5, y0..y1)
        .map_err(drawing)?;
    // Ticks at whole numbers only (at most one per group), each named after its group.
    let name = |v: &f64| -> String {
        let i = v.round();
        if (v - i).abs() < 1e-6 && i >= 0.0 {
            c.groups.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups)
        .x_label_formatter(&name)
        .y_label_formatter(&|v| tick(*v))
        .y_desc(&c.y_desc)
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 14))
        .light_line_style(WHITE)
        .draw()
        .map_err(drawing)?;
    let k = c.series.len() as f64;
    let width = 0.8 / k;
    let label_values = bars().count() <= MAX_VALUE_LABELS;
    for (j, s) in c.series.iter().enumerate() {
        let col = color(j);
        let placed: Vec<(f64, f64, &Bar)> = s
            .bars
            .iter()
            .enumerate()
            .take(groups)
            .filter_map(|(i, b)| {
                let b = b.as_ref().filter(|b| b.value.is_finite())?;
                let left = i as f64 - 0.4 + j as f64 * width;
                Some((left, left + width * 0.9, b))
            })
            .collect();
        chart
            .draw_series(
                placed.iter().map(|(l, r, b)| {
                    Rectangle::new([(*l, y0.max(0.0)), (*r, b.value)], col.filled())
                }),
            )
            .map_err(drawing)?
            .label(&s.name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], col.filled()));
        let whiskers: Vec<(f64, f64, f64)> = placed
            .iter()
            .filter_map(|(l, r, b)| {
                let (lo, hi) = b.range?;
                (hi > lo).then_some(((l + r) / 2.0, lo, hi))
            })
            .collect();
        let cap = width * 0.15;
        chart
            .draw_series(whiskers.iter().flat_map(|&(mid, lo, hi)| {
                [
                    PathElement::new(vec![(mid, lo), (mid, hi)], BLACK.stroke_width(1)),
                    PathElement::new(
                        vec![(mid - cap, lo), (mid + cap, lo)],
                        BLACK.stroke_width(1),
                    ),
                    PathElement::new(
                        vec![(mid - cap, hi), (mid + cap, hi)],
                        BLACK.stroke_width(1),
                    ),
                ]
            }))
            .map_err(drawing)?;
        if label_values {
            let style = TextStyle::from((FAMILY, 12).into_font()).color(&BLACK).pos(
                plotters::style::text_anchor::Pos::new(
                    plotters::style::text_anchor::HPos::Center,
                    plotters::style::text_anchor::VPos::Bottom,
                ),
            );
            let decimals = c.value_decimals;
            chart
                .draw_series(placed.iter().map(|(l, r, b)| {
                    let top = b.range.map_or(b.value, |r| r.1.max(b.value));
                    Text::new(
                        format!("{:.decimals$}", b.value),
                        ((l + r) / 2.0, top),
                        style.clone(),
                    )
                }))
                .map_err(drawing)?;
        }
    }
    legend(&mut chart, c.legend, side.as_ref(), &names, Swatch::Block)
}

/// The cumulative distribution of `samples` as the points of a step line: for each sorted value
/// the fraction of samples at or below it, at most `max_points` of them (evenly spaced ranks; the
/// first and last always kept).
pub fn cdf_points(samples: &[f64], max_points: usize) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(max_points.max(2)).max(1);
    let mut out: Vec<(f64, f64)> = v
        .iter()
        .enumerate()
        .filter(|(i, _)| i % step == 0 || *i == n - 1)
        .map(|(i, x)| (*x, (i + 1) as f64 / n as f64))
        .collect();
    // Equal values: one point, at the highest fraction.
    out.dedup_by(|next, kept| {
        let same = next.0 == kept.0;
        if same {
            kept.1 = kept.1.max(next.1);
        }
        same
    });
    out
}

/// Decoding the PNGs the tests draw.
#[cfg(test)]
pub(crate) mod check {
    use super::*;

    /// The font, or `None` after saying why the test that needs it is skipped.
    pub(crate) fn plotter_or_skip(test: &str) -> Option<Plotter> {
        match Plotter::from_env() {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("SKIPPED {test}: {e:#}");
                None
            }
        }
    }

    /// A fresh directory under the system's temporary one, removed when dropped (a failing test
    /// too).
    pub(crate) struct TempDir(pub PathBuf);

    impl TempDir {
        pub(crate) fn new(name: &str) -> TempDir {
            let dir =
                std::env::temp_dir().join(format!("kvbench-plot-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("temp dir");
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A decoded RGB(A) picture.
    pub(crate) struct Picture {
        pub width: u32,
        pub height: u32,
        pub pixels: Vec<[u8; 3]>,
    }

    impl Picture {
        /// Checks the PNG signature, then decodes `path`.
        pub(crate) fn read(path: &Path) -> Picture {
            let bytes = std::fs::read(path).expect("the PNG was written");
            assert_eq!(
                bytes.get(..8),
                Some(&b"\x89PNG\r\n\x1a\n"[..]),
                "{} is not a PNG",
                path.display()
            );
            let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
                .read_info()
                .expect("a PNG header");
            let mut buf = vec![0; reader.output_buffer_size()];
            let info = reader.next_frame(&mut buf).expect("a PNG frame");
            let channels = info.color_type.samples();
            assert!(channels >= 3, "{:?}", info.color_type);
            let pixels = buf[..info.buffer_size()]
                .chunks(channels)
                .map(|p| [p[0], p[1], p[2]])
                .collect();
            Picture {
                width: info.width,
                height: info.height,
                pixels,
            }
        }

        /// Pixels of exactly this colour.
        pub(crate) fn count(&self, c: RGBColor) -> usize {
            self.pixels
                .iter()
                .filter(|p| **p == [c.0, c.1, c.2])
                .count()
        }

        /// Pixels that are not white.
        pub(crate) fn inked(&self) -> usize {
            self.pixels
                .iter()
                .filter(|p| **p != [255, 255, 255])
                .count()
        }

        /// Pixels that differ from `other`'s in the top `rows` rows.
        pub(crate) fn differs_at_top(&self, other: &Picture, rows: u32) -> usize {
            let n = (self.width * rows) as usize;
            self.pixels
                .iter()
                .zip(&other.pixels)
                .take(n)
                .filter(|(a, b)| a != b)
                .count()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check::*;
    use super::*;

    fn lines(title: &str) -> Chart {
        let curve = |k: f64| Series {
            name: format!("k = {k}"),
            points: (0..40)
                .map(|i| {
                    let x = 10f64.powf(1.0 + f64::from(i) / 10.0);
                    (x, k * x.sqrt())
                })
                .collect(),
        };
        Chart::Lines(LineChart {
            title: title.to_owned(),
            x_desc: "prompt (tokens)".to_owned(),
            y_desc: "µs".to_owned(),
            x_log: true,
            y_log: true,
            markers: true,
            legend: Corner::Outside,
            series: vec![curve(1.0), curve(3.0), curve(9.0)],
            ..LineChart::default()
        })
    }

    #[test]
    fn line_and_bar_charts_draw_their_series_and_text_into_a_png() {
        let Some(plotter) =
            plotter_or_skip("line_and_bar_charts_draw_their_series_and_text_into_a_png")
        else {
            return;
        };
        let tmp = TempDir::new("charts");
        let dir = &tmp.0;
        let a = dir.join("a.png");
        plotter
            .write_png(&a, &Figure::single(lines("overhead")))
            .expect("drawn");
        let pic = Picture::read(&a);
        assert_eq!((pic.width, pic.height), Figure::SIZE);
        for i in 0..3 {
            assert!(
                pic.count(color(i)) > 200,
                "series {i} drawn: {} pixels",
                pic.count(color(i))
            );
        }
        assert_eq!(pic.count(color(3)), 0, "no fourth series");
        // Another title changes the caption's pixels: text is rendered.
        let b = dir.join("sub/b.png");
        plotter
            .write_png(&b, &Figure::single(lines("a much longer title")))
            .expect("drawn into a new directory");
        assert!(Picture::read(&b).differs_at_top(&pic, 40) > 100);

        let bars = Figure::row(vec![
            Chart::Bars(BarChart {
                title: "hit ratio".to_owned(),
                y_desc: "%".to_owned(),
                groups: vec!["one".to_owned(), "two".to_owned()],
                series: vec![
                    BarSeries {
                        name: "first".to_owned(),
                        bars: vec![Some(Bar::spread(60.0, 50.0, 70.0)), None],
                    },
                    BarSeries {
                        name: "second".to_owned(),
                        bars: vec![Some(Bar::new(30.0)), Some(Bar::new(90.0))],
                    },
                ],
                ..BarChart::default()
            }),
            lines("beside"),
        ]);
        let c = dir.join("c.png");
        plotter.write_png(&c, &bars).expect("drawn");
        let pic = Picture::read(&c);
        // Two bars of the second series, one of the first: filled rectangles of their colours.
        let (first, second) = (pic.count(color(0)), pic.count(color(1)));
        assert!(first > 2_000 && second > first, "{first} {second}");
        assert!(pic.inked() < pic.pixels.len() / 2, "mostly background");
        let size = std::fs::metadata(&c).map(|m| m.len()).unwrap_or(0);
        assert!(size < 150_000, "{size} bytes");
    }

    #[test]
    fn nothing_to_draw_is_an_error_and_a_missing_font_says_how_to_install_one() {
        let e = Plotter::load(Path::new("/nonexistent/DejaVuSans.ttf"))
            .expect_err("no such file")
            .to_string();
        assert!(
            e.contains("/nonexistent/DejaVuSans.ttf") && e.contains("fonts-dejavu-core"),
            "{e}"
        );
        let e = Plotter::load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/Cargo.toml"
        )))
        .expect_err("not a font")
        .to_string();
        assert!(e.contains("not a TTF/OTF font"), "{e}");
        let Some(plotter) = plotter_or_skip("nothing_to_draw_is_an_error") else {
            return;
        };
        let tmp = TempDir::new("empty");
        let dir = &tmp.0;
        let empty = Figure::single(Chart::Lines(LineChart::default()));
        let e = plotter
            .write_png(&dir.join("x.png"), &empty)
            .expect_err("no points");
        assert!(format!("{e:#}").contains("no points"), "{e:#}");
    }

    #[test]
    fn cdf_points_climb_to_one_in_sorted_order() {
        let p = cdf_points(&[3.0, 1.0, 2.0, 2.0, f64::NAN], 100);
        assert_eq!(p, vec![(1.0, 0.25), (2.0, 0.75), (3.0, 1.0)]);
        let many: Vec<f64> = (0..10_000).map(f64::from).collect();
        let p = cdf_points(&many, 500);
        assert!(p.len() <= 501, "{}", p.len());
        assert_eq!(p.first(), Some(&(0.0, 1.0 / 10_000.0)));
        assert_eq!(p.last(), Some(&(9_999.0, 1.0)));
        assert!(p.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        assert!(cdf_points(&[], 10).is_empty());
    }

    #[test]
    fn log_axes_cover_whole_decades() {
        assert_eq!(
            axis_range([35.0, 1200.0, -1.0].into_iter(), true, false).ok(),
            Some((10.0, 10_000.0))
        );
        assert_eq!(
            axis_range([100.0].into_iter(), true, false).ok(),
            Some((100.0, 1000.0))
        );
        assert_eq!(
            axis_range([2.0, 10.0].into_iter(), false, true).ok(),
            Some((0.0, 10.8))
        );
        assert!(axis_range([f64::NAN].into_iter(), false, true).is_err());
        assert_eq!(tick(1000.0), "1000");
        assert_eq!(tick(0.25), "0.25");
    }
}
