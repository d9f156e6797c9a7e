//! SVG charts of a run, every implementation side by side: S1/S2 latency distributions, S3 throughput, S5
//! and S5p handoff gaps, and S6/S6L cost per lease. Drawn with `plotters`' SVG backend (text goes into the
//! SVG as `<text>` elements; no font is loaded).

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{DIST_QUANTILES, Row};

/// Width of every chart, in pixels.
const WIDTH: u32 = 960;
/// Height of one implementation's row in a panel.
const ROW_H: u32 = 24;
/// Room for a panel's caption and x axis.
const PANEL_EXTRA: u32 = 90;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn err<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// A colour per family: the raw floors grey, redlease on redis-rs blue, on fred green, in memory purple, the
/// peers orange.
fn colour(imp: &str) -> RGBColor {
    if imp.starts_with("raw") {
        RGBColor(120, 120, 120)
    } else if imp.starts_with("redlease/redis") {
        RGBColor(31, 100, 180)
    } else if imp.starts_with("redlease/fred") {
        RGBColor(30, 140, 80)
    } else if imp.starts_with("redlease/") {
        RGBColor(130, 80, 170)
    } else {
        RGBColor(220, 120, 30)
    }
}

/// The quantile `q` of a row's distribution.
fn q(row: &Row, q: f64) -> Option<f64> {
    DIST_QUANTILES
        .iter()
        .position(|&x| (x - q).abs() < 1e-9)
        .and_then(|i| row.dist_us.get(i).copied())
}

/// One panel of distributions: per row a line from p1 to p99, a box from p25 to p75 and the median.
fn distribution_panel(
    area: &Area<'_>,
    title: &str,
    unit: &str,
    rows: &[&Row],
) -> Result<(), String> {
    let n = rows.len() as i32;
    // A logarithmic axis: a loaded machine's p99 can be ten times the median.
    let hi = rows
        .iter()
        .filter_map(|r| q(r, 0.99))
        .fold(0.0f64, f64::max);
    let lo = rows
        .iter()
        .filter_map(|r| q(r, 0.01))
        .fold(f64::INFINITY, f64::min);
    let (lo, hi) = if lo.is_finite() && lo > 0.0 && hi > lo {
        (lo * 0.8, hi * 2.2)
    } else {
        (1.0, 10.0)
    };
    let names: Vec<&str> = rows.iter().map(|r| r.imp).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 17))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(250)
        .build_cartesian_2d((lo..hi).log_scale(), (0..n - 1).into_segmented())
        .map_err(err("chart"))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(rows.len())
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names
                .get((n - 1 - *i) as usize)
                .map_or(String::new(), |s| (*s).to_owned()),
            _ => String::new(),
        })
        .y_label_style(("sans-serif", 13))
        .x_desc(format!("{unit} (logarithmic)"))
        .x_label_style(("sans-serif", 12))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(err("mesh"))?;
    for (k, row) in rows.iter().enumerate() {
        let i = n - 1 - k as i32;
        let c = colour(row.imp);
        let (Some(p1), Some(p25), Some(p50), Some(p75), Some(p99)) = (
            q(row, 0.01),
            q(row, 0.25),
            q(row, 0.5),
            q(row, 0.75),
            q(row, 0.99),
        ) else {
            continue;
        };
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![
                    (p1, SegmentValue::CenterOf(i)),
                    (p99, SegmentValue::CenterOf(i)),
                ],
                c.stroke_width(2),
            )))
            .map_err(err("whisker"))?;
        let mut bx = Rectangle::new(
            [
                (p25, SegmentValue::Exact(i)),
                (p75, SegmentValue::Exact(i + 1)),
            ],
            c.mix(0.45).filled(),
        );
        bx.set_margin(4, 4, 0, 0);
        let mut median = Rectangle::new(
            [
                (p50 * 0.995, SegmentValue::Exact(i)),
                (p50 * 1.005, SegmentValue::Exact(i + 1)),
            ],
            BLACK.filled(),
        );
        median.set_margin(2, 2, 0, 0);
        chart.draw_series([bx, median]).map_err(err("box"))?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("p50 {p50:.0}, p99 {p99:.0}"),
                (p99 * 1.03, SegmentValue::CenterOf(i)),
                ("sans-serif", 11).into_font().color(&BLACK),
            )))
            .map_err(err("label"))?;
    }
    Ok(())
}

/// One panel of horizontal bars, each labelled with its value.
fn bar_panel(
    area: &Area<'_>,
    title: &str,
    unit: &str,
    bars: &[(String, &'static str, f64)],
    decimals: usize,
) -> Result<(), String> {
    let n = bars.len() as i32;
    let xmax = bars.iter().map(|b| b.2).fold(0.0f64, f64::max) * 1.18;
    let xmax = if xmax > 0.0 { xmax } else { 1.0 };
    let names: Vec<&str> = bars.iter().map(|b| b.0.as_str()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 17))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(250)
        .build_cartesian_2d(0.0..xmax, (0..n - 1).into_segmented())
        .map_err(err("chart"))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len())
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names
                .get((n - 1 - *i) as usize)
                .map_or(String::new(), |s| (*s).to_owned()),
            _ => String::new(),
        })
        .y_label_style(("sans-serif", 13))
        .x_desc(unit)
        .x_label_style(("sans-serif", 12))
        .x_label_formatter(&|v| {
            if xmax >= 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        })
        .draw()
        .map_err(err("mesh"))?;
    for (k, (_, imp, v)) in bars.iter().enumerate() {
        let i = n - 1 - k as i32;
        let mut bar = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (*v, SegmentValue::Exact(i + 1)),
            ],
            colour(imp).filled(),
        );
        bar.set_margin(4, 4, 0, 0);
        chart.draw_series([bar]).map_err(err("bar"))?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{v:.decimals$}"),
                (*v + xmax / 150.0, SegmentValue::CenterOf(i)),
                ("sans-serif", 11).into_font().color(&BLACK),
            )))
            .map_err(err("label"))?;
    }
    Ok(())
}

/// The rows of `scenario` (and `nodes`, when given) that have a distribution.
fn with_dist<'a>(rows: &'a [Row], scenario: &str, nodes: Option<u32>) -> Vec<&'a Row> {
    rows.iter()
        .filter(|r| r.scenario == scenario && (nodes.is_none() || r.nodes == nodes))
        .filter(|r| r.dist_us.len() == DIST_QUANTILES.len())
        .collect()
}

/// Stacks panels of `heights` rows each into one SVG at `path` and draws panel `i` with `draw(i, area)`.
fn stacked(
    path: &Path,
    heights: &[usize],
    mut draw: impl FnMut(usize, &Area<'_>) -> Result<(), String>,
) -> Result<(), String> {
    let panel_h: Vec<u32> = heights
        .iter()
        .map(|&h| PANEL_EXTRA + ROW_H * h as u32)
        .collect();
    let total: u32 = panel_h.iter().sum();
    let root = SVGBackend::new(path, (WIDTH, total)).into_drawing_area();
    root.fill(&WHITE).map_err(err("fill"))?;
    let mut rest = root.clone();
    for (i, h) in panel_h.iter().enumerate() {
        let (top, below) = rest.split_vertically(*h);
        draw(i, &top)?;
        rest = below;
    }
    root.present().map_err(err("write"))?;
    Ok(())
}

/// Writes every chart the rows allow into `dir`; returns the files written.
pub(crate) fn write_all(rows: &[Row], dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let mut written = Vec::new();

    // S1 and S2: latency of one acquire + release pair.
    let panels: Vec<(String, Vec<&Row>)> = [
        ("S1", Some(1), "S1: one node"),
        ("S2", Some(3), "S2: Redlock, 3 nodes"),
        ("S2", Some(5), "S2: Redlock, 5 nodes"),
    ]
    .into_iter()
    .map(|(s, n, t)| (t.to_owned(), with_dist(rows, s, n)))
    .filter(|(_, r)| !r.is_empty())
    .collect();
    if !panels.is_empty() {
        let path = dir.join("latency.svg");
        let heights: Vec<usize> = panels.iter().map(|p| p.1.len()).collect();
        stacked(&path, &heights, |i, area| {
            distribution_panel(
                area,
                &format!(
                    "{} — uncontended try_acquire + release pair (line p1–p99, box p25–p75, black p50)",
                    panels[i].0
                ),
                "µs",
                &panels[i].1,
            )
        })?;
        written.push(path);
    }

    // S3: throughput.
    let s3: Vec<(String, &'static str, f64)> = rows
        .iter()
        .filter(|r| r.scenario == "S3")
        .filter_map(|r| r.ops_per_s.map(|v| (r.imp.to_owned(), r.imp, v)))
        .collect();
    if !s3.is_empty() {
        let path = dir.join("throughput.svg");
        stacked(&path, &[s3.len()], |_, area| {
            bar_panel(
                area,
                "S3 — acquire + release pairs per second, 64 tasks on distinct keys, one client",
                "pairs per second",
                &s3,
                0,
            )
        })?;
        written.push(path);
    }

    // S5 and S5p: handoff gaps.
    let panels: Vec<(String, Vec<&Row>)> = [
        (
            "S5",
            "S5 — 8 tasks on one key: gap from a release to the next acquisition",
        ),
        (
            "S5p",
            "S5p — the releaser pauses 1 ms: every handoff to a waiting task",
        ),
    ]
    .into_iter()
    .map(|(s, t)| (t.to_owned(), with_dist(rows, s, Some(1))))
    .filter(|(_, r)| !r.is_empty())
    .collect();
    if !panels.is_empty() {
        let path = dir.join("handoff.svg");
        let heights: Vec<usize> = panels.iter().map(|p| p.1.len()).collect();
        stacked(&path, &heights, |i, area| {
            distribution_panel(area, &panels[i].0, "µs", &panels[i].1)
        })?;
        written.push(path);
    }

    // S6 and S6L: cost per lease.
    let s6: Vec<&Row> = rows
        .iter()
        .filter(|r| (r.scenario == "S6" || r.scenario == "S6L") && r.bytes_per_lease.is_some())
        .collect();
    if !s6.is_empty() {
        let label = |r: &Row| {
            format!(
                "{} ({})",
                r.imp,
                match r.leases {
                    Some(n) if n >= 1000 => format!("{}k", n / 1000),
                    Some(n) => n.to_string(),
                    None => "-".to_owned(),
                }
            )
        };
        let bars = |f: fn(&Row) -> Option<f64>| -> Vec<(String, &'static str, f64)> {
            s6.iter()
                .filter_map(|r| f(r).map(|v| (label(r), r.imp, v)))
                .collect()
        };
        let panels = [
            (
                "S6 — heap bytes per held, self-renewing lease (leases held in parentheses)",
                "bytes per lease",
                bars(|r| r.bytes_per_lease),
                0,
            ),
            (
                "S6 — client process CPU per renewal",
                "µs per renewal",
                bars(|r| r.cpu_us_per_renewal),
                2,
            ),
            (
                "S6 — server requests per renewal (EVALSHA / EVAL / SET calls ÷ renewals)",
                "requests per renewal",
                bars(|r| r.calls_per_op),
                3,
            ),
            (
                "S6 — p99 lateness of a renewal against its schedule",
                "µs",
                bars(|r| r.lateness_p99_us),
                0,
            ),
        ];
        let panels: Vec<_> = panels.into_iter().filter(|p| !p.2.is_empty()).collect();
        let path = dir.join("renewal.svg");
        let heights: Vec<usize> = panels.iter().map(|p| p.2.len()).collect();
        stacked(&path, &heights, |i, area| {
            let (title, unit, bars, decimals) = &panels[i];
            bar_panel(area, title, unit, bars, *decimals)
        })?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_written_with_every_implementation_named() {
        let mut rows = Vec::new();
        for (imp, base) in [("raw", 100.0), ("redlease/redis", 110.0)] {
            let mut r = Row::new("S1", imp, Some(1));
            r.dist_us = DIST_QUANTILES.iter().map(|q| base + 100.0 * q).collect();
            rows.push(r);
            let mut r = Row::new("S3", imp, Some(1));
            r.ops_per_s = Some(base * 1000.0);
            rows.push(r);
            let mut r = Row::new("S6L", imp, Some(1));
            r.leases = Some(100_000);
            r.bytes_per_lease = Some(base * 9.0);
            r.cpu_us_per_renewal = Some(base / 20.0);
            rows.push(r);
        }
        let dir =
            std::env::temp_dir().join(format!("redlease-bench-charts-{}", std::process::id()));
        let files = write_all(&rows, &dir).unwrap();
        let names: Vec<_> = files
            .iter()
            .filter_map(|f| f.file_name()?.to_str().map(str::to_owned))
            .collect();
        assert_eq!(names, ["latency.svg", "throughput.svg", "renewal.svg"]);
        for f in &files {
            let svg = std::fs::read_to_string(f).unwrap();
            assert!(svg.starts_with("<svg"), "{svg:.100}");
            assert!(svg.contains("redlease/redis"), "{}", f.display());
        }
        let renewal = std::fs::read_to_string(dir.join("renewal.svg")).unwrap();
        assert!(renewal.contains("redlease/redis (100k)"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
