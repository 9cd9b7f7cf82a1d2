//! One row per width and path: the numbers computed from what a sweep step measured (its
//! ledger records, wall and CPU time, the limiter's counters), the terminal table and the
//! verdict on `auto`.

use std::collections::BTreeMap;
use std::time::Duration;

use bridge::{Concurrency, FailureKind, LimiterStats, SubCallMetadata};
use serde::Serialize;

use crate::table::{self, Align};

/// How the calls were sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Path {
    /// `Endpoint::batch` from Rust.
    Bridge,
    /// `llm_query_batched` in the embedded Python session.
    Repl,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Self::Bridge => "bridge",
            Self::Repl => "repl",
        }
    }
}

/// What one step of the sweep measured.
#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) path: Path,
    pub(crate) width: Concurrency,
    pub(crate) wall: Duration,
    /// CPU time of the client (the process less the in-process mock's threads).
    pub(crate) client_cpu: Duration,
    pub(crate) records: Vec<SubCallMetadata>,
    pub(crate) limiter: LimiterStats,
    /// Connections opened before the clock started (the server's answers to the warm-up).
    pub(crate) warm_connections: usize,
}

/// Latency percentiles of the answered calls, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Percentiles {
    pub(crate) p50: f64,
    pub(crate) p95: f64,
    pub(crate) p99: f64,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Row {
    pub(crate) path: Path,
    /// The width asked for: a number or `auto`.
    pub(crate) width: String,
    /// The width in force at the end: the number, or where `auto` settled.
    pub(crate) effective_width: usize,
    /// `auto` only: the highest limit it reached.
    pub(crate) peak_width: Option<usize>,
    pub(crate) calls: usize,
    pub(crate) wall_s: f64,
    /// Answered calls per second (failed ones do not count as throughput).
    pub(crate) calls_per_s: f64,
    pub(crate) prompt_tokens_per_s: f64,
    pub(crate) completion_tokens_per_s: f64,
    /// `None` when no call was answered.
    pub(crate) latency_ms: Option<Percentiles>,
    /// `ceil(calls / width) × p50` (fixed widths only).
    pub(crate) ideal_s: Option<f64>,
    /// `wall / ideal`.
    pub(crate) ratio: Option<f64>,
    /// Failed calls by kind (after retries).
    pub(crate) errors: BTreeMap<String, usize>,
    /// Attempts beyond each call's first.
    pub(crate) retries: u64,
    /// Attempts answered HTTP 429, retried ones included.
    pub(crate) http_429: u64,
    pub(crate) client_cpu_ms_per_call: f64,
    /// Keep-alive connections opened before the clock started (`GET` of the model list,
    /// no model call): the row times calls, not connection set-up.
    pub(crate) warm_connections: usize,
}

/// The `q`-quantile (nearest rank) of an ascending slice.
fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let index = ((last as f64) * q).round() as usize;
    sorted.get(index.min(last)).copied()
}

impl Row {
    /// The row of one step.
    pub(crate) fn of(m: &Measured) -> Self {
        let calls = m.records.len();
        let wall_s = m.wall.as_secs_f64();
        let per_s = |n: f64| if wall_s > 0.0 { n / wall_s } else { 0.0 };
        let mut latencies: Vec<f64> = m
            .records
            .iter()
            .filter(|r| r.error.is_none())
            .map(|r| r.latency_ms)
            .collect();
        latencies.sort_by(f64::total_cmp);
        let latency_ms = (|| {
            Some(Percentiles {
                p50: percentile(&latencies, 0.50)?,
                p95: percentile(&latencies, 0.95)?,
                p99: percentile(&latencies, 0.99)?,
            })
        })();
        let effective_width = match m.width {
            Concurrency::Fixed(width) => width,
            Concurrency::Auto => m.limiter.limit,
        }
        .max(1);
        // `auto` has no one width over the run (it starts low, probes, settles), so no ideal.
        let ideal_s = latency_ms
            .filter(|_| m.width != Concurrency::Auto)
            .map(|l| calls.div_ceil(effective_width) as f64 * l.p50 / 1e3)
            .filter(|ideal| *ideal > 0.0);
        let mut errors = BTreeMap::new();
        for kind in m.records.iter().filter_map(|r| r.error_kind) {
            *errors.entry(kind.name().to_owned()).or_insert(0) += 1;
        }
        let sum = |f: fn(&SubCallMetadata) -> u64| m.records.iter().map(f).sum::<u64>();
        Self {
            path: m.path,
            width: m.width.to_string(),
            effective_width,
            peak_width: (m.width == Concurrency::Auto).then_some(m.limiter.peak_limit),
            calls,
            wall_s,
            calls_per_s: per_s(latencies.len() as f64),
            prompt_tokens_per_s: per_s(sum(|r| r.prompt_tokens) as f64),
            completion_tokens_per_s: per_s(sum(|r| r.completion_tokens) as f64),
            latency_ms,
            ideal_s,
            ratio: ideal_s.map(|ideal| wall_s / ideal),
            errors,
            retries: sum(|r| u64::from(r.attempts.saturating_sub(1))),
            http_429: m.limiter.rate_limited,
            client_cpu_ms_per_call: if calls == 0 {
                0.0
            } else {
                m.client_cpu.as_secs_f64() * 1e3 / calls as f64
            },
            warm_connections: m.warm_connections,
        }
    }

    /// Calls refused by a budget limit, and which limit.
    pub(crate) fn budget_stop(records: &[SubCallMetadata]) -> Option<bridge::BudgetLimit> {
        records
            .iter()
            .find_map(|r| r.error_kind.and_then(FailureKind::budget_limit))
    }

    fn width_label(&self) -> String {
        match self.peak_width {
            Some(peak) => format!("auto→{} (≤{peak})", self.effective_width),
            None => self.width.clone(),
        }
    }
}

/// The rows as an aligned table, one row a line.
pub(crate) fn table(rows: &[Row]) -> String {
    let header = [
        "path",
        "width",
        "calls",
        "wall s",
        "calls/s",
        "in tok/s",
        "out tok/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "ideal s",
        "wall/ideal",
        "retries",
        "429s",
        "CPU ms/call",
        "errors",
    ];
    let dash = || "-".to_owned();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let latency = |f: fn(&Percentiles) -> f64| {
                r.latency_ms
                    .as_ref()
                    .map_or_else(dash, |l| format!("{:.1}", f(l)))
            };
            let errors = if r.errors.is_empty() {
                "0".to_owned()
            } else {
                r.errors
                    .iter()
                    .map(|(kind, n)| format!("{kind}:{n}"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            vec![
                r.path.name().to_owned(),
                r.width_label(),
                r.calls.to_string(),
                format!("{:.3}", r.wall_s),
                format!("{:.1}", r.calls_per_s),
                format!("{:.0}", r.prompt_tokens_per_s),
                format!("{:.0}", r.completion_tokens_per_s),
                latency(|l| l.p50),
                latency(|l| l.p95),
                latency(|l| l.p99),
                r.ideal_s.map_or_else(dash, |i| format!("{i:.3}")),
                r.ratio.map_or_else(dash, |x| format!("{x:.2}")),
                r.retries.to_string(),
                r.http_429.to_string(),
                format!("{:.3}", r.client_cpu_ms_per_call),
                errors,
            ]
        })
        .collect();
    // Text columns left-aligned, numbers right-aligned.
    table::render(&header, &cells, |i| {
        if i < 2 || i == header.len() - 1 {
            Align::Left
        } else {
            Align::Right
        }
    })
}

/// How `auto` did against the fixed widths of the same path, if the sweep has both:
/// its throughput as a share of the best fixed width's, and its 429s against the widest's.
pub(crate) fn auto_verdict(rows: &[Row]) -> Vec<String> {
    let mut lines = Vec::new();
    for path in [Path::Bridge, Path::Repl] {
        let of_path: Vec<&Row> = rows.iter().filter(|r| r.path == path).collect();
        let fixed: Vec<&&Row> = of_path.iter().filter(|r| r.peak_width.is_none()).collect();
        let best = fixed
            .iter()
            .max_by(|a, b| a.calls_per_s.total_cmp(&b.calls_per_s));
        let widest = fixed.iter().max_by_key(|r| r.effective_width);
        let (Some(best), Some(widest)) = (best, widest) else {
            continue;
        };
        for auto in of_path.iter().filter(|r| r.peak_width.is_some()) {
            let share = if best.calls_per_s > 0.0 {
                100.0 * auto.calls_per_s / best.calls_per_s
            } else {
                0.0
            };
            lines.push(format!(
                "{}: auto reached {:.0} % of the best fixed width's throughput ({:.1} vs {:.1} \
                 calls/s at width {}), with {} 429s against {} at the widest fixed width ({})",
                path.name(),
                share,
                auto.calls_per_s,
                best.calls_per_s,
                best.width,
                auto.http_429,
                widest.http_429,
                widest.width,
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(latency_ms: f64, attempts: u32, error: Option<FailureKind>) -> SubCallMetadata {
        SubCallMetadata {
            call_index: 0,
            endpoint: "sub".into(),
            model: "m".into(),
            prompt_chars: 400,
            response_chars: 40,
            prompt_tokens: if error.is_some() { 0 } else { 100 },
            completion_tokens: if error.is_some() { 0 } else { 10 },
            tokens_estimated: false,
            latency_ms,
            attempts,
            batched: true,
            batch_size: 10,
            started_at_ms: 0,
            cost_usd: None,
            error: error.map(|k| k.name().to_owned()),
            error_kind: error,
            session: None,
            cache: None,
        }
    }

    fn measured(width: Concurrency, records: Vec<SubCallMetadata>) -> Measured {
        Measured {
            path: Path::Bridge,
            width,
            wall: Duration::from_secs(2),
            client_cpu: Duration::from_millis(50),
            records,
            warm_connections: 0,
            limiter: LimiterStats {
                limit: 3,
                peak_limit: 8,
                rate_limited: 4,
                ..LimiterStats::default()
            },
        }
    }

    #[test]
    fn a_row_derives_rates_percentiles_and_the_ideal_time() {
        // Ten calls: latencies 10..=90 ms answered, one timed out after three attempts.
        let mut records: Vec<_> = (1..=9).map(|i| record(10.0 * i as f64, 1, None)).collect();
        records.push(record(500.0, 3, Some(FailureKind::Timeout)));
        let row = Row::of(&measured(Concurrency::Fixed(4), records));
        assert_eq!(
            (row.calls, row.effective_width, row.peak_width),
            (10, 4, None)
        );
        assert_eq!(row.calls_per_s, 4.5, "9 answered in 2 s");
        assert_eq!(row.prompt_tokens_per_s, 450.0, "9 × 100 tokens in 2 s");
        assert_eq!(row.completion_tokens_per_s, 45.0);
        let latency = row.latency_ms.expect("answered calls");
        // Nearest rank over the nine answered calls, the failed one left out.
        assert_eq!((latency.p50, latency.p95, latency.p99), (50.0, 90.0, 90.0));
        // ceil(10 / 4) = 3 rounds of the median.
        assert_eq!(row.ideal_s, Some(0.15));
        assert!((row.ratio.expect("ratio") - 2.0 / 0.15).abs() < 1e-9);
        assert_eq!(row.errors, BTreeMap::from([("timeout".to_owned(), 1)]));
        assert_eq!((row.retries, row.http_429), (2, 4));
        assert_eq!(row.client_cpu_ms_per_call, 5.0);
    }

    #[test]
    fn auto_is_measured_at_the_width_it_settled_on() {
        let records = (0..6).map(|_| record(100.0, 1, None)).collect();
        let row = Row::of(&measured(Concurrency::Auto, records));
        assert_eq!((row.width.as_str(), row.effective_width), ("auto", 3));
        assert_eq!(row.peak_width, Some(8));
        assert_eq!(
            (row.ideal_s, row.ratio),
            (None, None),
            "no one width, no ideal"
        );
        assert_eq!(row.width_label(), "auto→3 (≤8)");
    }

    #[test]
    fn nothing_answered_leaves_latency_and_ideal_empty() {
        let records = vec![record(
            0.0,
            0,
            Some(FailureKind::Budget(bridge::BudgetLimit::Usd)),
        )];
        let row = Row::of(&measured(Concurrency::Fixed(1), records));
        assert_eq!((row.latency_ms, row.ideal_s, row.ratio), (None, None, None));
        assert!(
            table(&[row])
                .lines()
                .nth(1)
                .is_some_and(|l| l.contains("budget_max_usd:1"))
        );
    }

    #[test]
    fn the_verdict_compares_auto_with_the_best_and_the_widest_fixed_width() {
        let row = |width: &str, effective: usize, calls_per_s: f64, http_429: u64| Row {
            path: Path::Bridge,
            width: width.to_owned(),
            effective_width: effective,
            peak_width: (width == "auto").then_some(80),
            calls: 100,
            wall_s: 1.0,
            calls_per_s,
            prompt_tokens_per_s: 0.0,
            completion_tokens_per_s: 0.0,
            latency_ms: None,
            ideal_s: None,
            ratio: None,
            errors: BTreeMap::new(),
            retries: 0,
            http_429,
            client_cpu_ms_per_call: 0.0,
            warm_connections: 0,
        };
        let rows = [
            row("16", 16, 300.0, 0),
            row("64", 64, 1000.0, 0),
            row("256", 256, 700.0, 500),
            row("auto", 60, 950.0, 30),
        ];
        assert_eq!(
            auto_verdict(&rows),
            [
                "bridge: auto reached 95 % of the best fixed width's throughput (950.0 vs 1000.0 \
              calls/s at width 64), with 30 429s against 500 at the widest fixed width (256)"
            ]
        );
        assert!(auto_verdict(&rows[..3]).is_empty(), "no auto, no verdict");
    }
}
