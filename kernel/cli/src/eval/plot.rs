//! `--plot FILE.svg`: score against context size, one line per task and method (RLM solid,
//! one line per depth in a sweep of depths; baseline dashed), as a self-contained SVG.

use anyhow::{Context as _, Result};
use kernel::eval::{TaskKind, format_size};
use plotters::prelude::*;

use super::runner::Method;
use super::summary::Row;
use crate::outputs::Document;

const COLOURS: [RGBColor; 4] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
];

/// Writes the plot of `rows` to `file`.
pub(super) fn write_plot(file: &Document, rows: &[Row], scripted: bool) -> Result<()> {
    let mut svg = String::new();
    draw(&mut svg, rows, scripted)
        .with_context(|| format!("Could not draw the plot `{}`", file.path().display()))?;
    file.write(svg.as_bytes())
}

fn draw(svg: &mut String, rows: &[Row], scripted: bool) -> Result<()> {
    let sizes = rows.iter().map(|r| r.size_tokens as f64);
    let lo = sizes.clone().fold(f64::INFINITY, f64::min).min(1e12);
    let hi = sizes.fold(1.0, f64::max);
    let root = SVGBackend::with_string(svg, (820, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = if scripted {
        "rlm eval — score vs context size (SCRIPTED mock models)"
    } else {
        "rlm eval — score vs context size"
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((lo / 1.6..hi * 1.6).log_scale(), -0.02f64..1.05f64)?;
    chart
        .configure_mesh()
        .x_desc("context size (tokens, 4 bytes each)")
        .y_desc("mean score")
        .x_label_formatter(&|x| format_size(x.round() as u64))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .light_line_style(WHITE)
        .draw()?;
    let mut series: Vec<(Method, Option<u32>)> = rows.iter().map(|r| (r.method, r.depth)).collect();
    series.sort_unstable();
    series.dedup();
    let depths = series.iter().filter(|(m, _)| *m == Method::Rlm).count();
    for (t, task) in TaskKind::ALL.iter().enumerate() {
        let colour = COLOURS[t % COLOURS.len()];
        for (s, &(method, depth)) in series.iter().enumerate() {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.task == *task && r.method == method && r.depth == depth)
                .map(|r| (r.size_tokens as f64, r.score))
                .collect();
            if points.is_empty() {
                continue;
            }
            let label = match depth {
                Some(depth) if depths > 1 => format!("{task} · {} depth {depth}", method.as_str()),
                _ => format!("{task} · {}", method.as_str()),
            };
            // In a sweep, deeper trees draw thicker lines (the RLM series sort first, by depth).
            let width = match method {
                Method::Rlm if depths > 1 => 1 + 2 * u32::try_from(s.min(3)).unwrap_or(0),
                _ => 2,
            };
            let style = colour.stroke_width(width);
            match method {
                Method::Rlm => chart
                    .draw_series(LineSeries::new(points.clone(), style))?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style)),
                Method::Base => chart
                    .draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))?
                    .label(label)
                    .legend(move |(x, y)| {
                        EmptyElement::at((x, y))
                            + PathElement::new(vec![(0, 0), (9, 0)], style)
                            + PathElement::new(vec![(15, 0), (24, 0)], style)
                    }),
            };
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, colour.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::MiddleLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
