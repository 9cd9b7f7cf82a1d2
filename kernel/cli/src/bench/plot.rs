//! `--plot FILE`: calls/s and p99 latency against the width, one line per path, as an SVG
//! (plotters' SVG backend: text is left to the viewer's fonts, nothing is fetched).

use anyhow::Result;
use plotters::prelude::*;

use super::report::{Path as CallPath, Row};
use crate::outputs::Document;

/// What one panel plots of a row.
type Metric = fn(&Row) -> Option<f64>;

/// Draw `rows` into `file`.
pub(crate) fn write(file: &Document, rows: &[Row], title: &str) -> Result<()> {
    let svg = render(rows, title)
        .map_err(|e| anyhow::anyhow!("Could not draw the plot `{}`: {e}", file.path().display()))?;
    file.write(svg.as_bytes())
}

fn render(rows: &[Row], title: &str) -> Result<String, Box<dyn std::error::Error>> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 640)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, ("sans-serif", 20))?;
        let (upper, lower) = root.split_vertically(300);
        // The x axis is log2 of the width on a linear scale, labelled with widths: plotters'
        // own log scale labels only powers of ten.
        let widths = rows
            .iter()
            .map(|r| (r.effective_width.max(1) as f64).log2());
        let low = widths.clone().fold(f64::INFINITY, f64::min).min(10.0) - 0.5;
        let high = widths.fold(1.0, f64::max) + 0.5;
        let panels: [(_, _, Metric); 2] = [
            (&upper, "calls/s", |r| Some(r.calls_per_s)),
            (&lower, "p99 latency (ms)", |r| r.latency_ms.map(|l| l.p99)),
        ];
        for (area, label, value) in panels {
            let top = rows
                .iter()
                .filter_map(value)
                .fold(0.0f64, f64::max)
                .max(1.0)
                * 1.1;
            let mut chart = ChartBuilder::on(area)
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(64)
                .build_cartesian_2d(low..high, 0f64..top)?;
            chart
                .configure_mesh()
                .x_desc("width (requests in flight; auto at the width it settled on)")
                .y_desc(label)
                .x_labels(((high - low).ceil() as usize).clamp(2, 12))
                .x_label_formatter(&|x| format!("{:.0}", x.exp2()))
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()?;
            for (path, color) in [(CallPath::Bridge, BLUE), (CallPath::Repl, RED)] {
                let mut points: Vec<(f64, f64, bool)> = rows
                    .iter()
                    .filter(|r| r.path == path)
                    .filter_map(|r| {
                        let x = (r.effective_width.max(1) as f64).log2();
                        Some((x, value(r)?, r.peak_width.is_some()))
                    })
                    .collect();
                if points.is_empty() {
                    continue;
                }
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                let fixed: Vec<(f64, f64)> =
                    points.iter().filter(|p| !p.2).map(|p| (p.0, p.1)).collect();
                let name = match path {
                    CallPath::Bridge => "bridge",
                    CallPath::Repl => "through the REPL",
                };
                chart
                    .draw_series(LineSeries::new(
                        fixed.iter().copied(),
                        color.stroke_width(2),
                    ))?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
                chart.draw_series(
                    fixed
                        .iter()
                        .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
                )?;
                // `auto` as a hollow triangle with its label.
                for &(x, y, _) in points.iter().filter(|p| p.2) {
                    chart.draw_series([TriangleMarker::new((x, y), 7, color.stroke_width(2))])?;
                    chart.draw_series([Text::new("auto", (x, y), ("sans-serif", 14))])?;
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::bench::report::Percentiles;

    #[test]
    fn the_plot_is_an_svg_with_both_panels_and_no_remote_assets() {
        let row = |width: usize, auto: bool| Row {
            path: CallPath::Bridge,
            width: if auto {
                "auto".into()
            } else {
                width.to_string()
            },
            effective_width: width,
            peak_width: auto.then_some(width),
            calls: 10,
            wall_s: 1.0,
            calls_per_s: width as f64 * 10.0,
            prompt_tokens_per_s: 0.0,
            completion_tokens_per_s: 0.0,
            latency_ms: Some(Percentiles {
                p50: 50.0,
                p95: 55.0,
                p99: 60.0,
            }),
            ideal_s: None,
            ratio: None,
            errors: BTreeMap::new(),
            retries: 0,
            http_429: 0,
            client_cpu_ms_per_call: 0.0,
            warm_connections: 0,
        };
        let svg = render(&[row(1, false), row(16, false), row(12, true)], "t").expect("renders");
        assert!(svg.starts_with("<svg"), "{}", &svg[..40.min(svg.len())]);
        assert!(svg.contains("calls/s") && svg.contains("p99 latency (ms)"));
        assert!(
            svg.contains(">auto<") || svg.contains(">\nauto"),
            "auto is labelled"
        );
        assert!(!svg.contains("href="), "no linked assets");
    }
}
