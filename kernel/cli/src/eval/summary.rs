//! Per task, size, method and depth: the score and what it cost, as a table and as JSON.

use std::collections::BTreeMap;

use kernel::eval::{TaskKind, format_size};
use serde::Serialize;

use super::runner::{Method, RunRecord};
use crate::table::{self, Align};

/// The runs of one task at one size by one method (and, for RLM runs, one depth), summed up.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    pub(super) task: TaskKind,
    pub(super) size_tokens: u64,
    pub(super) method: Method,
    /// The runs' `--max-depth` (none for the baseline).
    pub(super) depth: Option<u32>,
    pub(super) runs: usize,
    /// Mean score, 0 to 1.
    pub(super) score: f64,
    /// Runs whose answer was entirely right.
    pub(super) exact: usize,
    /// Mean tokens (prompt + completion) per run, every model together.
    pub(super) tokens_per_run: f64,
    /// USD of all the runs, with `--price`.
    pub(super) cost_usd: Option<f64>,
    /// Wall time of a run: median and 95th percentile (nearest rank), in seconds.
    pub(super) latency_p50_s: f64,
    pub(super) latency_p95_s: f64,
    /// Mean iterations (root-model replies) per run.
    pub(super) iterations: f64,
    /// Mean sub-model calls of the root run's code per run.
    pub(super) sub_calls: f64,
    /// Mean requests to every model of the run tree per run.
    pub(super) model_calls: f64,
    /// Mean `rlm_query` child runs per run.
    pub(super) child_runs: f64,
    /// Runs that did not end with an answer, by how they ended.
    pub(super) failures: BTreeMap<String, usize>,
}

/// The rows, in the order of `tasks`, then `sizes`, then RLM (by depth) before the baseline.
pub(super) fn summarise(records: &[RunRecord], tasks: &[TaskKind], sizes: &[u64]) -> Vec<Row> {
    let mut groups: Vec<(Method, Option<u32>)> =
        records.iter().map(|r| (r.method, r.depth)).collect();
    groups.sort_unstable();
    groups.dedup();
    let mut rows = Vec::new();
    for task in tasks {
        for size in sizes {
            for (method, depth) in &groups {
                let runs: Vec<&RunRecord> = records
                    .iter()
                    .filter(|r| {
                        r.task == *task
                            && r.size_tokens == *size
                            && r.method == *method
                            && r.depth == *depth
                    })
                    .collect();
                if !runs.is_empty() {
                    rows.push(row(*task, *size, (*method, *depth), &runs));
                }
            }
        }
    }
    rows
}

fn row(
    task: TaskKind,
    size_tokens: u64,
    (method, depth): (Method, Option<u32>),
    runs: &[&RunRecord],
) -> Row {
    let n = runs.len() as f64;
    let mean = |f: &dyn Fn(&RunRecord) -> f64| runs.iter().map(|r| f(r)).sum::<f64>() / n;
    let mut latencies: Vec<f64> = runs.iter().map(|r| r.latency_ms / 1000.0).collect();
    latencies.sort_by(f64::total_cmp);
    let mut failures = BTreeMap::new();
    for r in runs {
        if r.outcome != "final_answer" && r.outcome != "answered" {
            *failures.entry(r.outcome.clone()).or_insert(0) += 1;
        }
    }
    let costs: Option<Vec<f64>> = runs.iter().map(|r| r.cost_usd).collect();
    Row {
        task,
        size_tokens,
        method,
        depth,
        runs: runs.len(),
        score: mean(&|r| r.score),
        exact: runs.iter().filter(|r| r.exact).count(),
        tokens_per_run: mean(&|r| (r.prompt_tokens + r.completion_tokens) as f64),
        cost_usd: costs.map(|c| c.iter().sum()),
        latency_p50_s: percentile(&latencies, 0.50),
        latency_p95_s: percentile(&latencies, 0.95),
        iterations: mean(&|r| f64::from(r.iterations)),
        sub_calls: mean(&|r| r.sub_calls as f64),
        model_calls: mean(&|r| r.model_calls as f64),
        child_runs: mean(&|r| r.child_runs as f64),
        failures,
    }
}

/// The nearest-rank percentile of sorted `values` (`q` in 0..=1); 0 for none.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The rows as an aligned text table: `calls` are requests to every model of a run's tree
/// (root iterations, sub-calls, children's), `children` its `rlm_query` child runs, `iters`
/// and `sub-calls` the root run's own; all per run.
pub(super) fn table(rows: &[Row]) -> String {
    let header = [
        "task",
        "size",
        "method",
        "depth",
        "runs",
        "score",
        "exact",
        "calls",
        "children",
        "tokens/run",
        "USD",
        "p50 s",
        "p95 s",
        "iters",
        "sub-calls",
        "failures",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let failures = if r.failures.is_empty() {
                "-".to_owned()
            } else {
                let parts: Vec<String> =
                    r.failures.iter().map(|(k, n)| format!("{k} {n}")).collect();
                parts.join(", ")
            };
            vec![
                r.task.to_string(),
                format_size(r.size_tokens),
                r.method.as_str().to_owned(),
                r.depth.map_or("-".to_owned(), |d| d.to_string()),
                r.runs.to_string(),
                format!("{:.3}", r.score),
                format!("{}/{}", r.exact, r.runs),
                format!("{:.1}", r.model_calls),
                format!("{:.1}", r.child_runs),
                format!("{:.0}", r.tokens_per_run),
                r.cost_usd.map_or("-".to_owned(), |c| format!("{c:.4}")),
                format!("{:.2}", r.latency_p50_s),
                format!("{:.2}", r.latency_p95_s),
                format!("{:.1}", r.iterations),
                format!("{:.1}", r.sub_calls),
                failures,
            ]
        })
        .collect();
    // Text columns to the left, numbers to the right.
    table::render(&header, &cells, |i| {
        if i < 3 || i == header.len() - 1 {
            Align::Left
        } else {
            Align::Right
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(score: f64, outcome: &str, latency_ms: f64) -> RunRecord {
        RunRecord {
            task: TaskKind::Needle,
            size_tokens: 8_000,
            index: 0,
            seed: 0,
            method: Method::Rlm,
            depth: Some(1),
            context_tokens: 8_000,
            score,
            exact: score == 1.0,
            outcome: outcome.to_owned(),
            iterations: 2,
            sub_calls: 3,
            model_calls: 5,
            child_runs: 0,
            prompt_tokens: 100,
            completion_tokens: 20,
            cost_usd: None,
            latency_ms,
            answer: None,
            trajectory: None,
        }
    }

    #[test]
    fn rows_average_scores_and_rank_latencies() {
        let mut records: Vec<RunRecord> = (1..=20)
            .map(|i| run(1.0, "final_answer", f64::from(i) * 100.0))
            .collect();
        records[0] = run(0.0, "max_iterations", 100.0);
        let rows = summarise(&records, &[TaskKind::Needle, TaskKind::Pairs], &[8_000]);
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!((r.runs, r.exact), (20, 19));
        assert!((r.score - 0.95).abs() < 1e-12);
        // Nearest rank: the 10th and the 19th of 20.
        assert_eq!((r.latency_p50_s, r.latency_p95_s), (1.0, 1.9));
        assert_eq!(
            r.failures,
            BTreeMap::from([("max_iterations".to_owned(), 1)])
        );
        assert_eq!(r.tokens_per_run, 120.0);
        assert_eq!(r.cost_usd, None);
        let text = table(&rows);
        assert!(
            text.starts_with("task    size  method  depth  runs  score  exact  calls  children"),
            "{text}"
        );
        assert!(
            text.contains("needle  8k    rlm         1    20  0.950  19/20    5.0       0.0"),
            "{text}"
        );
        assert!(text.trim_end().ends_with("max_iterations 1"), "{text}");
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn a_sweep_of_depths_has_a_row_per_depth_before_the_baseline() {
        let at = |depth: Option<u32>, score: f64, children: u64| RunRecord {
            depth,
            method: if depth.is_some() {
                Method::Rlm
            } else {
                Method::Base
            },
            child_runs: children,
            ..run(score, "final_answer", 100.0)
        };
        let records = [
            at(Some(2), 1.0, 4),
            at(None, 0.0, 0),
            at(Some(1), 0.0, 0),
            at(Some(2), 1.0, 4),
            at(Some(1), 0.5, 0),
        ];
        let rows = summarise(&records, &[TaskKind::Needle], &[8_000]);
        let keys: Vec<(Method, Option<u32>, usize, f64, f64)> = rows
            .iter()
            .map(|r| (r.method, r.depth, r.runs, r.score, r.child_runs))
            .collect();
        assert_eq!(
            keys,
            [
                (Method::Rlm, Some(1), 2, 0.25, 0.0),
                (Method::Rlm, Some(2), 2, 1.0, 4.0),
                (Method::Base, None, 1, 0.0, 0.0),
            ]
        );
        let text = table(&rows);
        let depths: Vec<&str> = text
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().nth(3).unwrap_or_default())
            .collect();
        assert_eq!(depths, ["1", "2", "-"], "{text}");
    }
}
