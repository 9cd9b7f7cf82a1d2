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
    let mut args = vec!["--context", context.as_str(), "--query", "q", "--json"];
    args.extend_from_slice(extra);
    let run = mock.run(&args);
    run.assert_code(3);
    run.json()
}

#[test]
fn sub_call_budget_stops_the_run() {
    let result = budget_run(&["--max-sub-calls", "3"]);
    assert_eq!(result["termination_reason"], "call_budget");
    let ok = result["sub_calls"]
        .as_array()
        .expect("sub_calls")
        .iter()
        .filter(|c| c["error"].is_null())
        .count();
    assert_eq!(ok, 3, "exactly the budget's calls went through");
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
