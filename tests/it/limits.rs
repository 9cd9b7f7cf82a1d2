//! Stops and failures: exceptions, cell timeouts, oversized output, iteration limit, budgets.

use crate::support::{Mock, file, repl};

fn context_file(dir: &tempfile::TempDir) -> String {
    file(dir.path(), "ctx.txt", "some context")
        .to_str()
        .expect("utf-8")
        .to_owned()
}

/// A root model that answers by rules on the feedback it receives (per turn), else `FINAL(wrong)`.
fn rules(turn0: &str, rules: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "models": {
            "root-model": {"rules": rules, "replies": [turn0, "FINAL(wrong)"], "fallback": "FINAL(wrong)"},
            "sub-model": {"replies": ["sub reply"]}
        }
    })
}

#[test]
fn exception_feedback_carries_the_traceback_and_state_survives() {
    let mock = Mock::start(rules(
        &repl("x = 41\n1 / 0"),
        serde_json::json!([
            {"turn": 1, "last_user": "ZeroDivisionError", "reply": repl("print('x is', x + 1)")},
            {"turn": 2, "last_user": "x is 42", "reply": "FINAL(recovered)"}
        ]),
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let run = mock.run(&["--context", &context_file(&dir), "--query", "q"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "recovered");
}

#[test]
fn cell_timeout_then_recovery() {
    let mock = Mock::start(rules(
        &repl("y = 5\nwhile True:\n    pass"),
        serde_json::json!([
            {"turn": 1, "last_user": "(?i)timed? ?out", "reply": repl("print('alive', y)")},
            {"turn": 2, "last_user": "alive 5", "reply": "FINAL(recovered)"}
        ]),
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let started = std::time::Instant::now();
    let run = mock.run(&[
        "--context",
        &context_file(&dir),
        "--query",
        "q",
        "--cell-timeout",
        "1",
    ]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "recovered");
    assert!(
        started.elapsed().as_secs() < 30,
        "the runaway cell was interrupted"
    );
}

#[test]
fn oversized_output_is_truncated_in_the_next_request() {
    let mock = Mock::start(rules(
        &repl("print('y' * 500000)"),
        serde_json::json!([
            {"turn": 1, "last_user": "characters omitted", "reply": "FINAL(truncated)"}
        ]),
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let run = mock.run(&["--context", &context_file(&dir), "--query", "q"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "truncated");
    let second = &mock.log().entries()[1];
    assert!(
        second.request_bytes < 60_000,
        "500 000 characters of output were cut to the feedback limit: {} bytes sent",
        second.request_bytes
    );
}

#[test]
fn max_iterations_then_answer_now() {
    let mock = Mock::start(serde_json::json!({
        "models": {"root-model": {"replies": [
            repl("print(1)"),
            repl("print(2)"),
            "My best estimate is 7."
        ]}}
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let run = mock.run(&[
        "--context",
        &context_file(&dir),
        "--query",
        "q",
        "--max-iterations",
        "2",
        "--json",
    ]);
    run.assert_code(3);
    let result = run.json();
    assert_eq!(result["termination_reason"], "max_iterations");
    assert_eq!(result["answer"], "My best estimate is 7.");
    assert_eq!(
        mock.root_requests(),
        3,
        "two iterations and one answer-now call"
    );
}

fn budget_run(extra: &[&str]) -> serde_json::Value {
    let mock = Mock::start(serde_json::json!({
        "models": {
            "root-model": {"replies": [
                repl("r = llm_query_batched(['a b c d e f g h'] * 10)\nprint(r)"),
                repl("r2 = llm_query('again')\nprint(r2)"),
                "FINAL(not reached)"
            ]},
            "sub-model": {"replies": [{"behaviour": "echo"}]}
        }
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = context_file(&dir);
    // Ten identical prompts: each is sent (and counted) without the sub-call cache.
    let mut args = vec![
        "--context",
        context.as_str(),
        "--query",
        "q",
        "--json",
        "--no-sub-call-cache",
    ];
    args.extend_from_slice(extra);
    let run = mock.run(&args);
    run.assert_code(3);
    run.json()
}

#[test]
fn sub_call_budget_stops_the_run() {
    let result = budget_run(&["--max-sub-calls", "3"]);
    assert_eq!(result["termination_reason"], "call_budget");
    let ok = result["iterations"]
        .as_array()
        .expect("iterations")
        .iter()
        .flat_map(|i| i["sub_calls"].as_array().expect("sub_calls"))
        .filter(|c| c["error"].is_null())
        .count();
    assert_eq!(ok, 3, "exactly the budget's calls went through");
    assert_eq!(result["metrics"]["sub_calls_sent"], 3);
    assert!(
        result["metrics"]["sub_calls_refused"].as_u64() >= Some(1),
        "{}",
        result["metrics"]
    );
}

#[test]
fn token_budget_stops_the_run() {
    let result = budget_run(&["--max-tokens", "2000"]);
    assert_eq!(result["termination_reason"], "token_budget");
}

#[test]
fn usd_budget_stops_the_run() {
    let result = budget_run(&["--max-usd", "0.002", "--price", "1:1"]);
    assert_eq!(result["termination_reason"], "cost_budget");
}

#[test]
fn failed_sub_calls_return_error_strings_or_raise_when_asked() {
    let mock = || {
        Mock::start_with(bridge::mock::MockConfig {
            script: bridge::mock::Script::from_json_value(serde_json::json!({
                "models": {"root-model": {"replies": [repl(
                    "try:\n    r = llm_query('boom')\n    outcome = 'returned ' + r[:6]\nexcept LlmQueryError as e:\n    outcome = 'raised ' + type(e).__name__\nFINAL_VAR(outcome)"
                )]}}
            }))
            .expect("script"),
            faults: bridge::mock::Faults::none().with_rule(bridge::mock::FaultRule::matching(
                "boom",
                bridge::mock::FaultKind::MalformedJson,
            )),
            ..bridge::mock::MockConfig::default()
        })
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let context = context_file(&dir);
    let run = mock().run(&["--context", &context, "--query", "q"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "returned Error:");
    let run = mock().run(&[
        "--context",
        &context,
        "--query",
        "q",
        "--sub-call-errors",
        "raise",
    ]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "raised LlmQueryError");
}

#[test]
fn consecutive_failures_stop_the_run_with_the_flag_value() {
    let mock = Mock::start(serde_json::json!({
        "models": {"root-model": {"replies": [repl("1 / 0")]}}
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let run = mock.run(&[
        "--context",
        &context_file(&dir),
        "--query",
        "q",
        "--max-consecutive-failures",
        "2",
        "--json",
    ]);
    run.assert_code(3);
    let result = run.json();
    assert_eq!(result["termination_reason"], "consecutive_failures");
    assert_eq!(result["metrics"]["iterations"], 2);
}

#[test]
fn output_limit_flag_sets_the_feedback_cut() {
    let mock = Mock::start(rules(
        &repl("print('y' * 5000)"),
        serde_json::json!([
            {"turn": 1, "last_user": "characters omitted", "reply": "FINAL(cut)"}
        ]),
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let run = mock.run(&[
        "--context",
        &context_file(&dir),
        "--query",
        "q",
        "--output-limit",
        "1000",
    ]);
    run.assert_code(0);
    assert_eq!(
        run.last_line(),
        "cut",
        "5 000 characters exceed a 1 000-character limit"
    );
}

#[test]
fn max_history_chars_keeps_root_requests_bounded() {
    let step = repl("print('z' * 6000)");
    let replies = [&step, &step, &step, &step, &step, "FINAL(done)"];
    let largest_request = |extra: &[&str]| {
        let mock = Mock::start(serde_json::json!({"models": {"root-model": {"replies": replies}}}));
        let dir = tempfile::tempdir().expect("tempdir");
        let context = context_file(&dir);
        let mut args = vec!["--context", context.as_str(), "--query", "q"];
        args.extend_from_slice(extra);
        mock.run(&args).assert_code(0);
        mock.log()
            .entries()
            .iter()
            .map(|r| r.request_bytes)
            .max()
            .expect("requests")
    };
    let unbounded = largest_request(&[]);
    let bounded = largest_request(&["--max-history-chars", "20000"]);
    assert!(
        unbounded > 30_000,
        "five outputs of 6 000 characters: {unbounded}"
    );
    assert!(
        bounded < 30_000,
        "old outputs elided: {bounded} bytes vs {unbounded}"
    );
}
