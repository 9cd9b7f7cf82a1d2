//! `rlm bench`: a sweep against the mock whose numbers agree with the mock's configured
//! latency, `auto` against a capacity-limited mock, and the errors that stop a sweep.

use bridge::mock::MockConfig;
use serde_json::Value;

use crate::support::{Mock, Run, rlm};

fn bench(args: &[&str]) -> Run {
    let mut full = vec!["bench".to_owned()];
    full.extend(args.iter().map(|s| s.to_string()));
    rlm(&full, None)
}

fn number(row: &Value, key: &str) -> f64 {
    row[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is a number in {row}"))
}

#[test]
fn a_sweep_against_the_built_in_mock_agrees_with_its_latency() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plot = dir.path().join("bench.svg");
    let run = bench(&[
        "--width",
        "1,4,16",
        "--calls",
        "24",
        "--latency-ms",
        "50",
        "--json",
        "--plot",
        plot.to_str().expect("utf-8"),
    ]);
    run.assert_code(0);
    assert!(
        run.stderr.contains("built-in mock LM server") && run.stderr.contains("50 ms per call"),
        "{}",
        run.stderr
    );
    let doc = run.json();
    assert_eq!(doc["mock"]["latency_ms"], 50.0);
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 3);
    for (row, width) in rows.iter().zip([1.0, 4.0, 16.0]) {
        let context = row.to_string();
        assert_eq!(row["errors"], serde_json::json!({}), "{context}");
        assert_eq!(row["calls"], 24, "{context}");
        assert_eq!(number(row, "effective_width"), width);
        let latency = &row["latency_ms"];
        let (p50, p95, p99) = (
            number(latency, "p50"),
            number(latency, "p95"),
            number(latency, "p99"),
        );
        assert!(
            p50 >= 50.0,
            "no answer is faster than the mock's 50 ms: {context}"
        );
        assert!(p50 <= p95 && p95 <= p99, "{context}");
        let (wall, ideal, ratio) = (
            number(row, "wall_s"),
            number(row, "ideal_s"),
            number(row, "ratio"),
        );
        // ideal = ceil(calls / width) × p50; ratio = wall / ideal.
        let rounds = (24.0 / width).ceil();
        assert!((ideal - rounds * p50 / 1e3).abs() < 1e-9, "{context}");
        assert!((ratio - wall / ideal).abs() < 1e-9, "{context}");
        // Some slot makes `rounds` calls one after another, each at least 50 ms: the wall
        // time cannot beat rounds × 50 ms, so the ratio is at least 50 / p50.
        assert!(ratio >= 50.0 / p50 * 0.999, "{context}");
        // And it is not far above what the slowest calls explain.
        assert!(ratio <= 2.0 * p99 / p50 + 0.5, "{context}");
        assert!(
            (number(row, "calls_per_s") * wall - 24.0).abs() < 1e-6,
            "{context}"
        );
        // The mock reports ceil(bytes / 4) tokens: about the 100 asked for per prompt.
        let prompt_tokens = number(row, "prompt_tokens_per_s") * wall / 24.0;
        assert!((100.0..=110.0).contains(&prompt_tokens), "{context}");
        assert!(number(row, "client_cpu_ms_per_call") >= 0.0);
        assert_eq!(
            (row["retries"].as_u64(), row["http_429"].as_u64()),
            (Some(0), Some(0))
        );
    }
    let svg = std::fs::read_to_string(&plot).expect("the plot is written");
    assert!(
        svg.starts_with("<svg") && svg.contains("calls/s"),
        "{svg:.200}"
    );
}

#[test]
fn the_table_and_the_repl_path_come_side_by_side() {
    let run = bench(&[
        "--width",
        "4",
        "--calls",
        "12",
        "--latency-ms",
        "10",
        "--through-repl",
    ]);
    run.assert_code(0);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    for column in [
        "path",
        "width",
        "calls/s",
        "p50 ms",
        "p99 ms",
        "wall/ideal",
        "429s",
        "errors",
    ] {
        assert!(lines[0].contains(column), "{}", lines[0]);
    }
    assert!(lines[1].starts_with("bridge  4 "), "{}", lines[1]);
    assert!(lines[2].starts_with("repl    4 "), "{}", lines[2]);
    assert!(
        lines[1..].iter().all(|l| l.ends_with(" 0")),
        "no errors: {}",
        run.stdout
    );
}

#[test]
fn auto_meets_a_capacity_with_fewer_429s_than_the_widest_width() {
    let run = bench(&[
        "--width",
        "64,auto",
        "--calls",
        "160",
        "--latency-ms",
        "20",
        "--capacity",
        "8",
        "--json",
    ]);
    run.assert_code(0);
    let doc = run.json();
    assert_eq!(doc["mock"]["capacity"], 8);
    let rows = doc["rows"].as_array().expect("rows");
    let (wide, auto) = (&rows[0], &rows[1]);
    assert_eq!(
        (wide["width"].as_str(), auto["width"].as_str()),
        (Some("64"), Some("auto"))
    );
    let auto_429 = auto["http_429"].as_u64().expect("count");
    let wide_429 = wide["http_429"].as_u64().expect("count");
    assert!(auto_429 < wide_429, "auto {auto_429} vs 64: {wide_429}");
    assert_eq!(auto["errors"], serde_json::json!({}), "{auto}");
    // It backed off from its starting width (16) towards the capacity; AIMD probes one or two
    // above the capacity before each cut, so the settled width may sit a little over 8.
    assert!(
        auto["effective_width"].as_u64().is_some_and(|w| w < 16),
        "{auto}"
    );
    let verdict = doc["auto_verdict"][0].as_str().expect("a verdict line");
    assert!(verdict.starts_with("bridge: auto reached "), "{verdict}");
}

#[test]
fn an_unreachable_endpoint_stops_before_the_sweep() {
    let run = bench(&[
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "--calls",
        "5",
    ]);
    run.assert_code(1);
    assert!(
        run.stderr
            .contains("The first test call to model `m` at `http://127.0.0.1:9/v1` failed"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("Could not connect"), "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
}

#[test]
fn a_sweep_the_call_budget_cannot_cover_is_refused_before_any_call() {
    let mock = Mock::start_with(MockConfig::default());
    let run = bench(&[
        "--base-url",
        &mock.url(),
        "--model",
        "m",
        "--width",
        "1,4",
        "--calls",
        "100",
        "--max-calls",
        "150",
    ]);
    run.assert_code(3);
    assert!(
        run.stderr.contains("The sweep needs 201 calls")
            && run.stderr.contains("`--max-calls`")
            && run.stderr.contains("No call was sent"),
        "{}",
        run.stderr
    );
    assert!(mock.log().is_empty());
}

#[test]
fn a_usd_budget_stops_the_sweep_with_the_rows_so_far() {
    let run = bench(&[
        "--width",
        "1,2",
        "--calls",
        "20",
        "--latency-ms",
        "1",
        "--price",
        "1000:1000",
        "--max-usd",
        "0.5",
        "--json",
    ]);
    run.assert_code(3);
    let doc = run.json();
    assert_eq!(doc["stopped_by"], "max_usd");
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "the sweep stopped in its first width");
    let refused = rows[0]["errors"]["budget_max_usd"]
        .as_u64()
        .expect("refusals");
    assert!((1..20).contains(&refused), "{}", rows[0]);
    assert!(
        run.stderr
            .contains("The budget stopped the sweep: `--max-usd` refused calls"),
        "{}",
        run.stderr
    );
}

#[test]
fn mock_options_with_a_real_endpoint_and_bad_widths_are_usage_errors() {
    let run = bench(&[
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "--latency-ms",
        "5",
    ]);
    run.assert_code(2);
    assert!(
        run.stderr
            .contains("`--latency-ms` and `--capacity` set up the built-in mock")
    );
    let run = bench(&["--width", "4,0"]);
    run.assert_code(2);
    assert!(
        run.stderr
            .contains("must be a whole number ≥ 1 or `auto`, got `0`"),
        "{}",
        run.stderr
    );
}

#[test]
fn rlm_run_takes_batch_concurrency_auto_from_the_flag_and_rlm_toml() {
    let code = crate::support::repl(
        "r = llm_query_batched([f'item {i}' for i in range(50)])\nprint('answered', sum(x.startswith('item') for x in r))",
    );
    let replies = [code.as_str(), "FINAL(done)"];
    let (_, run) = crate::support::run_replies(&replies, &["--batch-concurrency", "auto"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "done");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = crate::support::file(
        dir.path(),
        "rlm.toml",
        "[run]\nbatch-concurrency = \"auto\"\n",
    );
    let (_, run) = crate::support::run_replies(
        &replies,
        &["--config", config.to_str().expect("utf-8"), "--trace"],
    );
    run.assert_code(0);
    assert!(
        run.stderr.contains("50"),
        "every call answered: {}",
        run.stderr
    );
}

#[test]
fn json_reports_a_sweep_that_fails_or_is_refused_before_it_starts() {
    // Refused by the call budget: exit 3, as for a budget stop, and no call sent.
    let mock = Mock::start_with(MockConfig::default());
    let refused = bench(&[
        "--base-url",
        &mock.url(),
        "--model",
        "m",
        "--width",
        "1,4",
        "--calls",
        "100",
        "--max-calls",
        "150",
        "--json",
    ]);
    refused.assert_code(3);
    let error = &refused.json()["error"];
    insta::assert_snapshot!(error["message"].as_str().expect("a message"), @"The sweep needs 201 calls (2 widths × 1 paths × 100 calls, plus one test call), more than the budget of 150 (`--max-calls`); lower `--calls` or `--width`, or raise `--max-calls`. No call was sent.");
    assert_eq!(error["exit_code"], 3);
    assert_eq!(error["usage_error"], false);
    assert!(refused.stderr.contains("error: The sweep needs 201 calls"));
    assert!(mock.log().is_empty(), "no call was sent");

    // The first test call fails: exit 1, the cause in `causes`.
    let unreachable = bench(&[
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "--width",
        "1",
        "--calls",
        "1",
        "--json",
    ]);
    unreachable.assert_code(1);
    let error = &unreachable.json()["error"];
    assert_eq!(
        error["message"],
        "The first test call to model `m` at `http://127.0.0.1:9/v1` failed, so the sweep did not start"
    );
    assert!(
        error["causes"][0]
            .as_str()
            .is_some_and(|c| c.starts_with("Could not connect")),
        "{error}"
    );
    assert_eq!(error["exit_code"], 1);

    // A usage error, with `json = true` from rlm.toml rather than the flag.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = crate::support::file(dir.path(), "rlm.toml", "[run]\njson = true\n");
    let usage = rlm(
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "bench",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "--latency-ms",
            "5",
        ]
        .map(str::to_owned),
        None,
    );
    usage.assert_code(2);
    let error = &usage.json()["error"];
    assert_eq!(error["usage_error"], true);
    assert_eq!(error["exit_code"], 2);
}

#[test]
fn batch_concurrency_is_refused_naming_the_width_to_pass() {
    let run = bench(&[
        "--batch-concurrency",
        "auto",
        "--calls",
        "1",
        "--width",
        "1",
    ]);
    run.assert_code(2);
    assert!(
        run.stderr
            .contains("`rlm bench` sweeps the widths of `--width`; pass `--width auto`"),
        "{}",
        run.stderr
    );
    // In a shared `rlm.toml` it is a run's setting: the sweep measures its own widths.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = crate::support::file(dir.path(), "rlm.toml", "[run]\nbatch-concurrency = 3\n");
    let mut full = vec![
        "--config".to_owned(),
        config.to_str().expect("utf-8").to_owned(),
    ];
    full.extend(
        [
            "bench",
            "--width",
            "2",
            "--calls",
            "4",
            "--latency-ms",
            "1",
            "--json",
        ]
        .map(str::to_owned),
    );
    let run = rlm(&full, None);
    run.assert_code(0);
    let rows = run.json()["rows"].clone();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    assert_eq!(rows[0]["width"], "2", "{rows}");
}

#[test]
fn each_width_is_measured_on_connections_opened_before_its_clock() {
    let mock = Mock::start_with(MockConfig {
        latency: bridge::mock::Latency::fixed(std::time::Duration::from_millis(20)),
        ..MockConfig::default()
    });
    let run = bench(&[
        "--base-url",
        &mock.url(),
        "--model",
        "m",
        "--width",
        "4,2",
        "--calls",
        "6",
        "--json",
    ]);
    run.assert_code(0);
    assert!(
        run.stderr.contains("keep-alive connections"),
        "{}",
        run.stderr
    );
    let doc = run.json();
    let warmed: Vec<&Value> = doc["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| &row["warm_connections"])
        .collect();
    assert_eq!(warmed, [4, 2], "{doc}");
    // In arrival order: the test call, then per width its warm-up (`GET /v1/models`, as many
    // as the width) before any of its 6 calls.
    let mut log = mock.log().entries();
    log.sort_by_key(|r| r.id);
    let kinds: Vec<&str> = log
        .iter()
        .map(|r| {
            if r.path == "/v1/models" {
                "get"
            } else {
                "call"
            }
        })
        .collect();
    let expected: Vec<&str> = std::iter::once("call")
        .chain(["get"; 4])
        .chain(["call"; 6])
        .chain(["get"; 2])
        .chain(["call"; 6])
        .collect();
    assert_eq!(kinds, expected);
}
